"""Any config is recorded: MLflow's limits on params, tags and names (tracking.py)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from mlflow import MlflowClient
from mlflow.entities import Param
from mlflow.utils.validation import (
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    _validate_param,
)

from jupyter_trainfactory import tracking
from jupyter_trainfactory.spec import JobSpec
from jupyter_trainfactory.tracking import TAG

LONG_A = "k" * 299 + "a"  # 300 characters, the same first 299 as LONG_B
LONG_B = "k" * 299 + "b"


def _valid(key: str, value: str) -> None:
    """Raises as MLflow's server would on a param it refuses."""
    _validate_param(key, value)
    assert len(value) <= MAX_PARAM_VAL_LENGTH


def test_param_keys_take_the_metric_keys_mapping():
    config = {
        "timing(s)/gen": 1.5,
        "timing_s_/gen": 2.5,  # what the first one maps to: told apart
        "extra": {"a+b": 1, "ok key": 2, "α": 3},
        LONG_A: 1,
        LONG_B: 2,
        7: "int key",
        (1, 2): "tuple key",
        "7": "the text of an int key already taken",
    }
    flat = tracking.flatten_config(config, "config")
    assert list(flat) == [
        "config.timing(s)/gen",
        "config.timing_s_/gen",
        "config.extra.a+b",
        "config.extra.ok key",
        "config.extra.α",
        f"config.{LONG_A}",
        f"config.{LONG_B}",
        "config.7",
        "config.(1, 2)",
        "config.7~str",
    ]
    out = tracking.prepare_params({"workers": "2", **flat})
    assert len(out.params) == len(flat) + 1  # nothing merged, nothing lost
    for key, value in out.params.items():
        _valid(key, value)
    renamed = out.renamed
    assert renamed["config.timing(s)/gen"] == "config.timing_s_/gen"
    assert renamed["config.timing_s_/gen"] == "config.timing_s_/gen_"
    assert renamed["config.extra.a+b"] == "config.extra.a_b"
    assert renamed["config.extra.α"] == "config.extra._"
    assert "config.extra.ok key" not in renamed and "workers" not in renamed
    long_a, long_b = renamed[f"config.{LONG_A}"], renamed[f"config.{LONG_B}"]
    assert len(long_a) == len(long_b) == 250 and long_a != long_b and long_a[-9] == "-"
    assert renamed["config.(1, 2)"] == "config._1_ 2_"
    assert out.params["config.7"] == "int key" and out.params["config.7_str"].startswith("the")
    # the same config maps the same way every time, and the renames are the tag
    again = tracking.prepare_params({"workers": "2", **tracking.flatten_config(config, "config")})
    assert again.params == out.params
    assert json.loads(out.tags()[TAG.RENAMED_PARAMS]) == renamed
    assert TAG.PARAMS_OMITTED not in out.tags() and not out.needs_artifact()


class _HugeRepr:
    def __repr__(self):
        return "H" * 2_000_000


def test_values_over_the_limit_or_not_text_are_described():
    big = "x" * 50_000 + "y" * 50_000  # 100 kB
    text = tracking.param_value(big)
    assert len(text) == MAX_PARAM_VAL_LENGTH and text.startswith("x" * 5000)
    assert "100,000 characters" in text and "sha256 " in text
    assert tracking.param_value(big) == text != tracking.param_value(big[:-1] + "z")

    array = np.arange(1_000_000, dtype=np.float32).reshape(1000, 1000)
    shown = tracking.param_value(array)
    assert shown.startswith("<numpy.ndarray shape=(1000, 1000) dtype=float32 sha256=")
    assert len(shown) < 100
    changed = array.copy()
    changed[999, 999] = -1
    assert tracking.param_value(changed) != shown
    assert tracking.param_value(array.copy()) == shown  # a digest of the values

    tensor = torch.ones(2, 3, requires_grad=True)
    assert tracking.param_value(tensor).startswith(
        "<torch.Tensor shape=(2, 3) dtype=torch.float32 sha256="
    )
    assert tracking.param_value(np.float32(1.5)) == "1.5"
    # np.float64 and np.bool_/IntEnum-like subclasses of the builtins: their number, not repr
    assert tracking.param_value(np.float64(0.999)) == "0.999"
    assert tracking.param_value(np.int64(7)) == "7"
    assert tracking.param_value(np.bool_(True)) == "True"
    assert tracking.param_value(torch.tensor(3)) == "3"
    assert tracking.param_value(np.mean) == "<function numpy.mean>"
    assert tracking.param_value(JobSpec) == "<class jupyter_trainfactory.spec.JobSpec>"
    huge = tracking.param_value(_HugeRepr())
    assert len(huge) == MAX_PARAM_VAL_LENGTH and "2,000,000 characters" in huge
    assert tracking.param_value(10**5000).startswith("<int of 16610 bits sha256=")
    assert tracking.param_value(None) == "None" and tracking.param_value(True) == "True"
    for value in (big, array, tensor, _HugeRepr(), 10**5000, list(range(10_000))):
        _valid("config.v", tracking.param_value(value))


def test_nested_configs_flatten_the_same_way_at_every_depth():
    leaf = {"lr": 0.1, "betas": (0.9, 0.99), "sizes": list(range(17)), "none": {}, "no": []}
    config = {**leaf, "a": {**leaf, "b": [leaf, {"c": leaf}]}}
    flat = tracking.flatten_config(config)
    for prefix in ("", "a.", "a.b.0.", "a.b.1.c."):
        assert flat[f"{prefix}lr"] == 0.1
        assert flat[f"{prefix}betas.0"] == 0.9 and flat[f"{prefix}betas.1"] == 0.99
        assert flat[f"{prefix}sizes"] == list(range(17))  # over 16 items: one value
        assert flat[f"{prefix}none"] == {} and flat[f"{prefix}no"] == []
    assert tracking.flatten_config({}) == {} and tracking.flatten_config(5) == {"value": 5}
    cyclic: dict = {"x": 1}
    cyclic["self"] = cyclic
    assert tracking.flatten_config(cyclic) == {"x": 1, "self": "<cycle>"}
    deep: dict = {}
    node = deep
    for _ in range(3000):  # deeper than Python's recursion limit
        node["d"] = {}
        node = node["d"]
    node["end"] = 1
    (key,) = tracking.flatten_config(deep, "config")
    assert key.endswith(".end") and tracking.prepare_params({key: 1}).params


def test_the_job_json_copy_of_a_config_is_json_whatever_it_holds():
    config = {7: 1, (1, 2): "t", "arr": np.zeros(3), "big": "b" * 100_000, "tup": (1, [2])}
    spec = JobSpec("train", config=config)
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["config"]["7"] == 1 and data["config"]["(1, 2)"] == "t"
    assert data["config"]["big"] == "b" * 100_000  # the full value is kept here
    assert data["config"]["arr"].startswith("<numpy.ndarray shape=(3,) dtype=float64")
    assert data["config"]["tup"] == [1, [2]]
    assert spec.config is config  # the spec keeps the original


class _BatchClient:
    def __init__(self):
        self.batches: list[list[Param]] = []

    def log_batch(self, run_id, params=()):
        self.batches.append(list(params))


def test_thousands_of_params_go_in_batches_up_to_a_cap():
    flat = tracking.flatten_config({f"p{i}": i for i in range(10_000)}, "config")
    out = tracking.prepare_params({"workers": "1", **flat})
    assert len(out.params) == tracking.MAX_PARAMS and "workers" in out.params
    assert len(out.omitted) == 10_001 - tracking.MAX_PARAMS
    assert "config.p9999" in out.omitted and out.needs_artifact()
    assert out.tags()[TAG.PARAMS_OMITTED].startswith("9001 of 10001 params are not logged")
    fake = _BatchClient()
    tracking.log_params(fake, "r", out.params)
    assert [len(b) for b in fake.batches] == [MAX_PARAMS_TAGS_PER_BATCH] * 10
    # long values: batches stay under MLflow's 1 MB request limit
    fake = _BatchClient()
    tracking.log_params(fake, "r", {f"k{i}": "é" * 6000 for i in range(300)})
    assert sum(len(b) for b in fake.batches) == 300
    assert all(len(json.dumps([[p.key, p.value] for p in b])) < 1_000_000 for b in fake.batches)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A SQLite MLflow store (no server) and its directory, shared by this module."""
    tmp = tmp_path_factory.mktemp("store")
    client = MlflowClient(f"sqlite:///{tmp}/mlflow.db")
    client.create_experiment("t", artifact_location=str(tmp / "artifacts"))
    return client, tmp


def test_renames_that_do_not_fit_a_tag_are_listed_in_an_artifact(store, tmp_path):
    client = store[0]
    flat = tracking.flatten_config({f"p({i})": i for i in range(2000)}, "config")
    tags = {TAG.JOB_ID: "tf-0", TAG.ERROR: "Traceback\n" * 2000, f"{TAG.DATA}données": "{}"}
    run = tracking.create_job_run(client, "t", "ünïcode run " + "r" * 400, tags, flat)
    assert len(run.data.params) == tracking.MAX_PARAMS
    assert run.data.params["config.p_0_"] == "0"
    assert run.info.run_name == ("ünïcode run " + "r" * 400)[:250]
    assert len(run.data.tags[TAG.ERROR]) == MAX_TAG_VAL_LENGTH
    assert run.data.tags[f"{TAG.DATA}donn_es"] == "{}"  # an identifier MLflow refuses
    shown = json.loads(run.data.tags[TAG.RENAMED_PARAMS])
    assert len(run.data.tags[TAG.RENAMED_PARAMS]) <= MAX_TAG_VAL_LENGTH
    assert shown["config.p(0)"] == "config.p_0_" and "more in" in shown["..."]
    path = client.download_artifacts(run.info.run_id, tracking.PARAMS_ARTIFACT, str(tmp_path))
    listing = json.loads(Path(path).read_text())
    assert len(listing["renamed"]) == tracking.MAX_PARAMS
    assert listing["omitted"]["config.p(1999)"] == "1999"


def test_experiments_open_in_the_model_training_view(store):
    client, tmp_path = store
    kind = tracking.EXPERIMENT_KIND_TAG
    new = tracking.experiment_id(client, "made by the tool")
    assert client.get_experiment(new).tags[kind] == "custom_model_development"
    older = client.create_experiment("older", artifact_location=str(tmp_path / "a"))
    assert tracking.experiment_id(client, "older") == older
    assert client.get_experiment(older).tags[kind] == "custom_model_development"
    genai = client.create_experiment("genai", tags={kind: "genai_development"})
    tracking.experiment_id(client, "genai")
    assert client.get_experiment(genai).tags[kind] == "genai_development"  # the user's choice
    run = client.create_run(new)
    url = tracking.run_url("http://mlflow:5000/", run)  # the UI's view: its URL parameter
    assert (
        url == f"http://mlflow:5000/#/experiments/{new}/runs/{run.info.run_id}?{tracking.UI_QUERY}"
    )
    assert tracking.UI_QUERY == "workflowType=machine_learning"
    long_name = "e" * 300
    exp = tracking.experiment_id(client, long_name)
    assert tracking.experiment_id(client, long_name) == exp  # found again by the same name
    assert len(client.get_experiment(exp).name) == 256


def test_the_driver_gets_the_config_as_given(monkeypatch):
    from jupyter_trainfactory import payload as packing
    from ray_backend.driver import load_payload

    config = {(1, 2): np.arange(3), 7: {"t": torch.ones(2)}, "api_token": "s3cret"}
    payload = packing.write_payload("tf-0000c0f1", len, None, config)
    meta = {"job_id": "tf-0000c0f1", "config": tracking.json_safe(config)}
    (payload / "job.json").write_text(json.dumps(meta))
    monkeypatch.syspath_prepend(str(payload.parent))
    got, fn = load_payload(payload.name)
    assert fn is len and list(got["config"]) == [(1, 2), 7, "api_token"]
    assert np.array_equal(got["config"][(1, 2)], config[(1, 2)])
    assert torch.equal(got["config"][7]["t"], config[7]["t"])

    class _Artifacts:
        def log_artifacts(self, run_id, local_dir, artifact_path):
            self.files = sorted(p.name for p in Path(local_dir).iterdir())

    sent = _Artifacts()
    packing.log_payload(sent, "r", payload, {"redacted": ["config.api_token"]})
    assert packing.CONFIG_FILE not in sent.files and "job.json" in sent.files  # no secret sent
    packing.log_payload(sent, "r", payload, {"redacted": []})
    assert packing.CONFIG_FILE in sent.files  # a resume from another machine finds it
