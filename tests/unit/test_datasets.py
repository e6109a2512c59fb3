"""Ray Data datasets and existing TorchTrainers as jobs (issue 21, parts 1 and 2), without
Ray running: option parsing, the trainer's settings, lineage, the driver's build step, the
timed shard, and bad input as one sentence with nothing submitted."""

from __future__ import annotations

import hashlib
import time

import pytest
from conftest import ipython_shell
from IPython.core.error import UsageError

from jupyter_trainfactory import api, datasets
from jupyter_trainfactory.arguments import (
    CommandError,
    build_parser,
    datasets_from_args,
    parse,
    spec_from_args,
)
from jupyter_trainfactory.spec import JobSpec
from jupyter_trainfactory.spec_values import SpecError, dataset_config_text, datasets_to_split
from jupyter_trainfactory.trainers import is_torch_trainer, trainer_parts
from ray_backend.ingest import TimedShard, batch_rows, build_datasets, timed_get_dataset_shard


class FakeDataset:
    """Stands for a lazy ``ray.data.Dataset``: its plan's input files, schema unknown."""

    def __init__(self, *files, lineage=True):
        self.files = list(files)
        self.lineage = lineage

    def has_serializable_lineage(self):
        return self.lineage

    def input_files(self):
        return self.files

    def schema(self, fetch_if_missing=True):
        assert not fetch_if_missing, "fetching the schema would execute the dataset"
        return None


FakeDataset.__module__ = "ray.data.dataset"  # what datasets.is_dataset looks at


def train(config):
    pass


def _trainer(**kwargs):
    import ray.train
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        train,
        train_loop_config={"lr": 0.1},
        scaling_config=ray.train.ScalingConfig(num_workers=3, resources_per_worker={"CPU": 2}),
        run_config=ray.train.RunConfig(
            failure_config=ray.train.FailureConfig(max_failures=2),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=4),
        ),
        **kwargs,
    )


# -- --dataset-config ---------------------------------------------------------------
@pytest.mark.parametrize(
    "given, text, split",
    [
        (None, None, "all"),
        ("all", "split=all", "all"),
        ("split=none", "split=none", []),
        ("split=train", "split=train", ["train"]),
        ("train, validation", "split=train,validation", ["train", "validation"]),
        (["train"], "split=train", ["train"]),
        ([], "split=none", []),
    ],
)
def test_dataset_config_is_normalized(given, text, split):
    assert dataset_config_text(given) == text
    assert datasets_to_split(text) == split


@pytest.mark.parametrize("given", ["shuffle=train", "split=", "split=1x"])
def test_a_bad_dataset_config_is_one_sentence(given):
    with pytest.raises(SpecError, match="--dataset-config"):
        JobSpec("train", dataset_config=given)


def test_the_spec_logs_its_dataset_config():
    assert JobSpec("train", dataset_config="train").params()["dataset_config"] == "split=train"
    assert "dataset_config" not in JobSpec("train").params()


# -- --dataset NAME=EXPR -------------------------------------------------------------
def test_dataset_expressions_are_evaluated_in_the_namespace():
    ns = {"ds": FakeDataset(), "make": lambda n=2: n}
    got = datasets_from_args(["train=ds", "validation=make(n=3)"], ns)
    assert got == {"train": ns["ds"], "validation": 3}  # the first = splits NAME from EXPR
    args = parse('launch train --dataset train=ds --dataset "validation=make(n=3)"')
    assert args.datasets == ["train=ds", "validation=make(n=3)"]


@pytest.mark.parametrize(
    "items, message",
    [
        (["train"], "--dataset takes NAME=EXPR, got 'train'."),
        (["1x=ds"], "--dataset takes NAME=EXPR, got '1x=ds'."),
        (["train=ds", "train=ds"], "--dataset train is given twice."),
        (["train=1/0"], "--dataset train=1/0 failed: ZeroDivisionError: division by zero"),
        (["train=nope"], "--dataset train=nope failed: NameError: name 'nope' is not defined"),
    ],
)
def test_a_bad_dataset_option_is_one_sentence(items, message):
    with pytest.raises(CommandError) as err:
        datasets_from_args(items, {"ds": FakeDataset()})
    assert str(err.value) == message


# -- the kernel's checks --------------------------------------------------------------
def test_datasets_are_checked_before_submission(tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("x,y\n1,2\n")
    good = {"train": FakeDataset(str(data)), "validation": lambda: FakeDataset()}
    assert datasets.check_datasets(good, "split=train") == good
    assert datasets.check_datasets(None) == {}
    remote = {"train": FakeDataset("s3://bucket/train.csv")}  # the cluster's to read
    assert datasets.check_datasets(remote) == remote


@pytest.mark.parametrize(
    "given, config, message",
    [
        ({"train": 42}, None, "Dataset 'train' is a int; give a Ray Dataset"),
        ({"train": lambda path: path}, None, "Dataset 'train' is a function with arguments;"),
        ({"1x": FakeDataset()}, None, "A dataset's name must be an identifier, got '1x'."),
        (
            {"train": FakeDataset("/no/such/train.csv")},
            None,
            "Dataset 'train' reads '/no/such/train.csv', which does not exist here;",
        ),
        ({"train": FakeDataset()}, "split=validation", "names 'validation', which is none"),
        ({}, "split=train", "--dataset-config needs datasets"),
        (
            {"train": FakeDataset(lineage=False)},
            None,
            "Dataset 'train' holds blocks of this kernel's Ray session (ray.data.from_*)",
        ),
        ([FakeDataset()], None, "datasets must be a dict of name -> Dataset, got list."),
    ],
)
def test_bad_datasets_are_one_sentence(given, config, message):
    with pytest.raises(SpecError) as err:
        datasets.check_datasets(given, config)
    assert message in str(err.value)
    assert "\n" not in str(err.value)


# -- lineage ---------------------------------------------------------------------------
def test_a_datasets_lineage_is_what_its_plan_knows(tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("x,y\n1,2\n")
    described = datasets.describe("train", FakeDataset(str(data)))
    sha = hashlib.sha256(f"{data}\0{data.stat().st_size}\0".encode() + data.read_bytes())
    assert (described.source, described.source_type) == (str(data), "local")
    assert (described.digest, described.digest_of) == (sha.hexdigest(), "content")
    assert described.size_bytes == data.stat().st_size
    assert described.profile == {
        "ray_dataset": "kernel",
        "files": 1,
        "paths": [str(data)],
        "schema": "unknown",  # not fetched: that executes the dataset
        "rows": "unknown",
    }
    tag = datasets.lineage_tags([described])["trainfactory.dataset.train"]
    assert '"digest_of": "content"' in tag and str(data) in tag


def test_a_read_that_lists_its_files_in_the_plan_is_described_by_its_paths(tmp_path):
    # Ray 2.60's read_parquet: input_files() is [] before execution; the plan's
    # ListFiles operator holds the paths given to the read (a directory here)
    class Op:
        def __init__(self, deps=(), **attrs):
            self._input_dependencies = list(deps)
            self.__dict__.update(attrs)

    folder = tmp_path / "train"
    folder.mkdir()
    for name, body in (("part-1.parquet", b"b"), ("part-0.parquet", b"a"), ("_SUCCESS", b"")):
        (folder / name).write_bytes(body)
    dataset = FakeDataset()
    dataset._logical_plan = Op(dag=Op([Op(source_paths=[str(folder)])]))
    described = datasets.describe("train", dataset, where="driver")
    files = [str(folder / "part-0.parquet"), str(folder / "part-1.parquet")]
    assert described.profile["paths"] == files and described.profile["files"] == 2
    assert (described.source, described.digest_of) == (str(folder), "content")


def test_what_is_not_known_is_said_so():
    fn = datasets.describe("train", lambda: FakeDataset())
    assert fn.source.startswith("<function ") and fn.source.endswith("<lambda>>")
    assert (fn.digest, fn.digest_of) == ("unknown", "unknown")
    assert fn.profile["rows"] == fn.profile["schema"] == fn.profile["files"] == "unknown"
    remote = datasets.describe("train", FakeDataset("s3://bucket/a.csv"))
    assert (remote.source_type, remote.digest_of) == ("s3", "unknown")


# -- the driver builds the datasets ----------------------------------------------------
def test_the_driver_calls_the_functions_and_records_what_they_built(tmp_path):
    data = tmp_path / "v.csv"
    data.write_text("x\n1\n")
    given = {"train": FakeDataset(), "validation": lambda: FakeDataset(str(data))}
    built, tags = build_datasets(given)
    assert built["train"] is given["train"]
    assert built["validation"].files == [str(data)]
    assert list(tags) == ["trainfactory.dataset.validation"]  # the kernel recorded train
    assert '"ray_dataset": "driver"' in tags["trainfactory.dataset.validation"]


def test_a_dataset_function_that_fails_in_the_driver_says_which():
    with pytest.raises(RuntimeError, match="Building dataset 'train' in the driver failed"):
        build_datasets({"train": lambda: 1 / 0})
    with pytest.raises(RuntimeError, match="returned a int, not a Ray Dataset"):
        build_datasets({"train": lambda: 3})


# -- data wait on a worker -------------------------------------------------------------
class FakeShard:
    def iter_torch_batches(self, batch_size=2):
        for i in range(3):
            time.sleep(0.02)
            yield {"x": [i] * batch_size}

    def stats(self):
        return "stats"


def test_the_wait_for_each_batch_of_a_shard_is_data_wait():
    waits = []
    get = timed_get_dataset_shard(lambda name: FakeShard() if name else None, waits.append)
    shard = get("train")
    assert isinstance(shard, TimedShard) and shard.stats() == "stats"
    assert [b["x"] for b in shard.iter_torch_batches(batch_size=1)] == [[0], [1], [2]]
    assert len(waits) == 3 and all(w >= 0.015 for w in waits)
    assert get(None) is None


def test_a_shards_rows_are_its_ingest():
    rows = []
    get = timed_get_dataset_shard(lambda name: FakeShard(), [].append, rows.append)
    shard = get("train")
    list(shard.iter_torch_batches(batch_size=4))
    assert rows == [4, 4, 4]


def test_the_rows_of_each_kind_of_batch():
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import torch

    assert batch_rows({"x": np.zeros((5, 3)), "y": np.zeros(5)}) == 5
    assert batch_rows({"x": torch.zeros(7, 2)}) == 7
    assert batch_rows(pd.DataFrame({"a": [1, 2, 3]})) == 3
    assert batch_rows(pa.table({"a": [1, 2]})) == 2
    assert batch_rows([1, 2, 3, 4]) == 4
    assert batch_rows(object()) is None
    assert batch_rows({}) is None


# -- an existing TorchTrainer ----------------------------------------------------------
def test_a_torch_trainers_settings_become_the_jobs():
    import ray.train

    make = lambda: FakeDataset()  # noqa: E731
    trainer = _trainer(
        datasets={"train": make},
        dataset_config=ray.train.DataConfig(datasets_to_split=["train"]),
    )
    assert is_torch_trainer(trainer) and not is_torch_trainer(train)
    parts = trainer_parts(trainer)
    assert parts.fn is train and parts.datasets == {"train": make}
    assert parts.options == {
        "config": {"lr": 0.1},
        "workers": 3,
        "cpus_per_worker": 2.0,
        "gpus_per_worker": 0.0,
        "placement": "pack",
        "max_failures": 2,
        "max_preemptions": -1,
        "keep_checkpoints": 4,
        "dataset_config": "split=train",
    }


def test_options_on_the_line_override_the_trainers():
    parts = trainer_parts(_trainer())
    ns = parse("launch trainer --workers 1 --keep-checkpoints 2", build_parser())
    spec = spec_from_args(ns, "train", {}, "", trainer=parts.options)
    assert (spec.workers, spec.cpus_per_worker, spec.max_failures) == (1, 2.0, 2)
    assert spec.config == {"lr": 0.1}
    # an option left at its default cannot be told from one not given: the trainer's
    assert spec.keep_checkpoints == 4
    ns = parse("launch trainer --config x", build_parser())
    assert spec_from_args(ns, "train", {"lr": 1}, "", trainer=parts.options).config == {"lr": 1}


def test_a_target_that_is_neither_function_nor_trainer_is_one_sentence():
    with pytest.raises(SpecError) as err:
        trainer_parts(42, "x")
    assert str(err.value) == "'x' is a int, not a function or a ray.train.torch.TorchTrainer."


# -- the doors: one sentence, nothing submitted ----------------------------------------
@pytest.fixture
def no_submission(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("nothing may be submitted, nor a service started")

    monkeypatch.setattr(api, "get_manager", refuse)


@pytest.mark.usefixtures("no_submission")
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"fn": 42}, "The job's target is a int, not a function or a"),
        ({"fn": train, "datasets": {"train": 42}}, "Dataset 'train' is a int"),
        (
            {"fn": train, "datasets": {"train": FakeDataset("/no/such.csv")}},
            "reads '/no/such.csv', which does not exist here",
        ),
        ({"fn": train, "dataset_config": "split=train"}, "--dataset-config needs datasets"),
    ],
)
def test_launch_refuses_bad_input(kwargs, message):
    with pytest.raises(SpecError, match=message):
        api.launch(**kwargs)


@pytest.fixture
def ip(monkeypatch):
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_trainfactory")
    shell.user_ns.update(
        train=train,
        not_a_trainer=object(),
        missing=FakeDataset("/no/such/train.csv"),
        good=FakeDataset(),
        make=lambda: FakeDataset(),
    )
    return shell


@pytest.mark.usefixtures("no_submission")
@pytest.mark.parametrize(
    "line, message",
    [
        ("launch train --dataset train=1/0", "--dataset train=1/0 failed: ZeroDivisionError"),
        ("launch train --dataset train=missing", "reads '/no/such/train.csv', which does not"),
        ("launch train --dataset train=42", "Dataset 'train' is a int; give a Ray Dataset"),
        ("launch train --dataset train", "--dataset takes NAME=EXPR"),
        ("launch not_a_trainer", "'not_a_trainer' is a object, not a function or a ray.train"),
        (
            "launch train --dataset train=good --dataset-config split=validation",
            "--dataset-config names 'validation', which is none of the datasets (train).",
        ),
        ("launch train --dataset-config split=train", "--dataset-config needs datasets"),
    ],
)
def test_the_magic_refuses_bad_input_in_one_sentence(ip, line, message):
    with pytest.raises(UsageError) as err:
        ip.run_line_magic("train", line)
    assert message in str(err.value)
    assert "\n" not in str(err.value).strip()


class _Submitted(Exception):
    pass


def test_the_magic_launches_a_trainer_with_its_datasets(ip, monkeypatch):
    got = {}

    class Manager:
        def submit(self, fn, spec, inputs=None, model_fn=None, datasets=None):
            got.update(fn=fn, spec=spec, datasets=datasets)
            raise _Submitted

    monkeypatch.setattr(api, "get_manager", lambda *a, **k: Manager())
    ip.user_ns["trainer"] = _trainer(datasets={"train": ip.user_ns["good"]})
    with pytest.raises(_Submitted):
        ip.run_line_magic("train", "launch trainer --workers 1 --dataset validation=make")
    spec = got["spec"]
    assert got["fn"] is train and spec.function_name == "train"
    assert (spec.workers, spec.cpus_per_worker, spec.max_failures, spec.keep_checkpoints) == (
        1,
        2.0,
        2,
        4,
    )
    assert got["datasets"] == {"train": ip.user_ns["good"], "validation": ip.user_ns["make"]}


def test_the_datasets_travel_in_the_payload():
    import cloudpickle

    from jupyter_trainfactory.payload import DATASETS_FILE, write_payload

    path = write_payload("tf-0000da7a", train, datasets={"train": lambda: "built"})
    shipped = cloudpickle.loads((path / DATASETS_FILE).read_bytes())
    assert shipped["train"]() == "built"
    assert not (write_payload("tf-0000da7b", train) / DATASETS_FILE).exists()
