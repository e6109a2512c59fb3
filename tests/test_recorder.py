"""RunRecorder against a real MLflow store (SQLite file, no server, no Ray)."""

import pytest
from mlflow import MlflowClient

from jupyter_trainfactory.tracking import TAG, sanitize_key
from ray_backend.recorder import RunRecorder


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp)
    return uri, client, run.info.run_id


def test_steps_first_write_wins_and_samples_per_s(store):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)  # flush by hand
    rec.set_state("RUNNING")
    t0 = 1_000.0
    assert rec.report([{"loss": 1.0, "samples": 10}, {"loss": 9.0, "samples": 30}], None, t0) == 1
    assert rec.report([{"loss": 0.5, "samples": 10}, {"samples": 30}], "/ckpt/1", t0 + 2) == 2
    # a restored worker reports step 2 again: first write wins
    assert rec.report([{"loss": 7.0, "step": 2}], None, t0 + 3) is None
    assert rec.report([{"loss": 0.25, "step": 5, "name": "text is skipped"}], None, t0 + 4) == 5
    rec.flush()
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss == [(1, 1.0), (2, 0.5), (5, 0.25)]
    sps = {m.step: m.value for m in client.get_metric_history(run_id, "train/samples_per_s")}
    assert sps[2] == pytest.approx(40 / 2.0)  # rank 0 + rank 1 samples over 2 s
    tags = client.get_run(run_id).data.tags
    assert tags[TAG.CKPT_PATH] == "/ckpt/1" and tags[TAG.CKPT_STEP] == "2"
    assert tags[TAG.STEP] == "5"
    assert "name" not in client.get_run(run_id).data.metrics


def test_finish_closes_run_with_error(store):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.report([{"acc": 0.5}], None)
    rec.finish("FAILED", "FAILED", error="ValueError: bad batch")
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[TAG.ERROR] == "ValueError: bad batch"
    assert run.data.metrics["acc"] == 0.5


def test_key_hygiene():
    assert sanitize_key("val/acc@top-1 (%)") == "val/acc_top-1 ___"
    assert sanitize_key("/x/") == "x"
