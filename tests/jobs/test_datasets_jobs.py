"""Real jobs fed by Ray Data (issue 21, parts 1 and 2): a ``torch_regression_example``-style
loop over ``get_dataset_shard("train").iter_torch_batches(...)`` with a Dataset built in
the test (the notebook), and an existing ``TorchTrainer`` whose dataset function the
job's driver calls, launched with one override."""

from __future__ import annotations

import hashlib
import json
import sys

import cloudpickle
import numpy as np
import pytest

from jupyter_trainfactory import launch
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the cluster cannot import tests/
pytestmark = pytest.mark.job

FEATURES, ROWS, EPOCHS, BATCH = 4, 256, 3, 16


def regression_train_func(config):
    """Ray's ``torch_regression_example.train_func``, shortened: a linear model on the
    ``train`` shard's torch batches, one report per epoch."""
    import time

    import torch
    from ray import train
    from ray.train.torch import prepare_model
    from torch import nn

    shard = train.get_dataset_shard("train")
    model = prepare_model(nn.Linear(FEATURES, 1))
    loss_fn = nn.MSELoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.get("lr", 0.05))
    for epoch in range(config["epochs"]):
        total, batches = 0.0, 0
        for batch in shard.iter_torch_batches(
            batch_size=config["batch_size"], dtypes=torch.float32
        ):
            x = torch.stack([batch[f"x{i:03d}"] for i in range(FEATURES)], dim=1)
            loss = loss_fn(model(x).squeeze(1), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, batches = total + loss.item(), batches + 1
            time.sleep(config.get("pause_s", 0.1))  # a few seconds of training in all
        train.report({"loss": total / max(batches, 1), "epoch": epoch, "batches": batches})


def _write_csv(tmp_path):
    """A regression CSV of the example's shape (columns ``x000``.., ``y``), from numpy."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, FEATURES))
    y = x @ np.arange(1, FEATURES + 1) + 0.1 * rng.normal(size=ROWS)
    path = tmp_path / "regression.csv"
    header = ",".join([f"x{i:03d}" for i in range(FEATURES)] + ["y"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="")
    return path


def _content_digest(path):
    sha = hashlib.sha256(f"{path}\0{path.stat().st_size}\0".encode())
    sha.update(path.read_bytes())
    return sha.hexdigest()


@pytest.mark.timeout(240)
def test_a_ray_data_loop_is_fed_measured_and_recorded(manager, mlflow_client, tmp_path):
    import ray

    from jupyter_trainfactory.services import ensure_services

    csv = _write_csv(tmp_path)
    # the notebook's Ray: the embedded head the manager uses now (ensure_services also
    # gives this process its token), not the session fixture's, should it have restarted
    services = ensure_services()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in services.client_env().items():
            mp.setenv(key, value)
        ray.init(address=services.ray_address, logging_level="WARNING", log_to_driver=False)
        job = None
        try:
            train_ds = ray.data.read_csv(str(csv))  # lazy: planned here, read in the job
            job = launch(
                regression_train_func,
                workers=2,
                cpus_per_worker=0.5,  # Ray Data's read tasks need a CPU beside the workers
                config={"epochs": EPOCHS, "batch_size": BATCH},
                datasets={"train": train_ds},
                experiment="tests",
                run_name="ray-data",
            )
            # a Dataset made in the notebook is owned by the notebook's Ray connection
            assert job.wait(timeout=180) == "SUCCEEDED", job.info().error
        finally:
            if job is not None:
                job.stop(now=True)
            ray.shutdown()
    run = mlflow_client.get_run(job.run_id)
    history = mlflow_client.get_metric_history(job.run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1))  # one per epoch
    assert job.info().step == EPOCHS
    batches = mlflow_client.get_metric_history(job.run_id, "batches")
    assert {m.value for m in batches} == {ROWS / 2 / BATCH}  # each rank: half the rows
    waits = mlflow_client.get_metric_history(job.run_id, "train/data_wait_fraction")
    assert max(m.value for m in waits) > 0  # iter_torch_batches' waits, timed
    rows = mlflow_client.get_metric_history(job.run_id, "train/ingest_rows")
    assert max(m.value for m in rows) == ROWS * EPOCHS  # every row, both ranks, each epoch
    assert run.data.metrics["train/ingest_rows_per_s"] > 0

    lineage = json.loads(run.data.tags[f"{TAG.DATASET}train"])
    assert lineage["source"] == str(csv) and lineage["paths"] == [str(csv)]
    assert (lineage["digest"], lineage["digest_of"]) == (_content_digest(csv), "content")
    assert lineage["ray_dataset"] == "kernel" and lineage["rows"] == "unknown"
    names = [d.dataset.name for d in run.inputs.dataset_inputs]
    assert names == ["train"]


@pytest.mark.timeout(240)
def test_an_existing_trainer_runs_with_one_override(manager, mlflow_client, tmp_path):
    import ray.train
    from ray.train.torch import TorchTrainer

    csv = str(_write_csv(tmp_path))
    trainer = TorchTrainer(
        regression_train_func,
        train_loop_config={"epochs": 2, "batch_size": 32, "pause_s": 0.0},
        scaling_config=ray.train.ScalingConfig(num_workers=3, resources_per_worker={"CPU": 0.5}),
        run_config=ray.train.RunConfig(checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1)),
        datasets={"train": lambda: ray.data.read_csv(csv)},  # built in the job's driver
    )
    job = launch(trainer, workers=1, experiment="tests")
    try:
        assert job.wait(timeout=180) == "SUCCEEDED", job.info().error
    finally:
        job.stop(now=True)
    run = mlflow_client.get_run(job.run_id)
    params = run.data.params
    assert params["workers"] == "1" and params["cpus_per_worker"] == "0.5"  # override; trainer
    assert params["keep_checkpoints"] == "1" and params["config.epochs"] == "2"
    batches = mlflow_client.get_metric_history(job.run_id, "batches")
    assert sorted(m.step for m in batches) == [1, 2] and {m.value for m in batches} == {8}
    lineage = json.loads(run.data.tags[f"{TAG.DATASET}train"])
    assert lineage["ray_dataset"] == "driver" and lineage["paths"] == [csv]
    assert lineage["digest_of"] == "content"
