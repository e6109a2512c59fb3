"""A sweep's parent record (``ray_backend.sweep_record``) against a SQLite MLflow store:
the best trial as the leaderboard sees it, and the parent's params of swept keys."""

from __future__ import annotations

import json
import math

import pytest
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from ray import tune

from jupyter_trainfactory.sweeps.space import SweepSettings
from jupyter_trainfactory.sweeps.submit import sweep_kind
from jupyter_trainfactory.tracking import TAG
from ray_backend.sweep_record import SweepRecord


@pytest.fixture
def client(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    return client


def _record(client, mode: str) -> SweepRecord:
    """A SweepRecord on a parent run of ``client`` (what ``__init__`` reads from the job
    left out: no Ray, no job.json)."""
    experiment = client.get_experiment_by_name("t").experiment_id
    record = SweepRecord.__new__(SweepRecord)
    record.client = client
    record.parent = client.create_run(experiment).info.run_id
    record.settings = SweepSettings(metric="loss", mode=mode, trials=3, concurrent=2)
    record.children, record.best, record._results = {}, None, 0
    for index, losses in enumerate(([3.0, 1.5, 2.0], [0.9, float("nan"), 0.4, 0.4], [])):
        run_id = client.create_run(experiment).info.run_id
        record.children[f"abc_{index:05d}"] = run_id
        metrics = [Metric("loss", v, 0, step) for step, v in enumerate(losses)]
        if metrics:
            client.log_batch(run_id, metrics=metrics)
    return record


@pytest.mark.parametrize(
    ("mode", "trial", "value", "step"), [("min", 1, 0.4, 2), ("max", 0, 3.0, 0)]
)
def test_the_best_a_trial_logged_reaches_the_parent_without_tune_reports(
    client, mode, trial, value, step
):
    # a function that logs its metric with trainfactory.log reports nothing to Tune:
    # the parent's best is read from the trials' runs as each one ends
    record = _record(client, mode)
    for trial_id in record.children:
        record._read_best(trial_id)
    parent = client.get_run(record.parent)
    assert parent.data.metrics["sweep/best"] == value
    best = json.loads(parent.data.tags[TAG.SWEEP_BEST])
    assert best == {
        "trial": trial,
        "run_id": record.children[f"abc_{trial:05d}"],
        "value": value,
        "iteration": step,
    }
    # a worse or non-finite value later changes nothing
    record._offer_best(math.nan, "abc_00002", 9)
    record._offer_best(99.0 if mode == "min" else -99.0, "abc_00002", 9)
    assert json.loads(client.get_run(record.parent).data.tags[TAG.SWEEP_BEST]) == best


def test_the_parents_swept_keys_name_their_domain_not_the_base_value():
    settings = SweepSettings(metric="loss", trials=4, concurrent=2)
    kind = sweep_kind({"lr": tune.loguniform(1e-3, 1e-1)}, settings, 1, print)
    assert kind.params["config.lr"] == "swept: loguniform(0.001, 0.1)"
    assert kind.params["sweep.space.lr"] == "loguniform(0.001, 0.1)"


def test_a_resumed_sweep_reopens_a_stopped_trials_run_with_its_stop_kept(client):
    # a sweep stopped, then resumed: each stopped trial's child run is reopened (its
    # planned stop kept in trainfactory.stops, the stale stop request deleted)
    record = _record(client, "min")
    record.counts = {"finished": 0, "stopped_early": 0, "failed": 0, "stopped": 1}
    run_id = record.children["abc_00000"]
    client.set_tag(run_id, TAG.STOP, "user")
    client.set_tag(run_id, TAG.RESUMES, "1")
    client.set_terminated(run_id, "KILLED")
    assert record._reopen("tf-0000abcd-t0", run_id) == 2
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING"
    assert run.data.tags[TAG.RESUMES] == "2" and run.data.tags[TAG.STOPS] == "1"
    assert run.data.tags[TAG.SUBMISSION] == "tf-0000abcd-t0-2" and TAG.STOP not in run.data.tags
    assert record._reopen("tf-0000abcd-t0", run_id) == 0  # open already: nothing to do
