"""Telemetry of real two-worker jobs: worker-side logging, derived numbers, checkpoint I/O,
and delivery through a tracking-server outage."""

import os
import signal
import subprocess
import time

import cloudpickle
import pytest
import train_fns
from mlflow import MlflowClient

from jupyter_trainfactory import launch
from jupyter_trainfactory.services import _free_port, _prepare_sqlite, _tool

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/
pytestmark = pytest.mark.job

BATCH, SEQ = 16, 8  # telemetry_loop's batch and sequence length
FLOPS_PER_TOKEN = 6 * 33 + 12 * 1 * 2 * 4 * 8  # Linear(32, 1): 33 parameters; PaLM 6N + 12LHQT


def _history(client, run_id, key):
    return sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)


@pytest.mark.timeout(300)
def test_worker_telemetry_reaches_the_run(manager, mlflow_client):
    steps = 120
    job = launch(
        train_fns.telemetry_loop,
        workers=2,
        config={"steps": steps, "report_every": 40, "nan_step": 7},
        experiment="tests",
        peak_tflops=1.0,  # a made-up CPU peak, so that MFU is computed here
    )
    try:
        assert job.wait(timeout=240) == "SUCCEEDED", job.info().error
    finally:
        job.stop(now=True)
    run = mlflow_client.get_run(job.run_id)
    m, tags = run.data.metrics, run.data.tags

    # trainfactory.log every step, rank 0: each step written exactly once
    assert [p.step for p in _history(mlflow_client, job.run_id, "loss")] == list(
        range(1, steps + 1)
    )
    # counters summed over both ranks
    assert m["train/samples"] == 2 * steps * BATCH
    assert m["train/tokens"] == 2 * steps * BATCH * SEQ
    tps = {p.step: p.value for p in _history(mlflow_client, job.run_id, "train/tokens_per_s")}
    per_worker = _history(mlflow_client, job.run_id, "train/tokens_per_s_per_worker")
    mfu = {p.step: p.value for p in _history(mlflow_client, job.run_id, "train/mfu")}
    assert per_worker and all(p.value > 0 for p in per_worker)
    for p in per_worker:
        assert p.value == pytest.approx(tps[p.step] / 2)
        assert mfu[p.step] == pytest.approx(p.value * FLOPS_PER_TOKEN / 1e12)
    assert "train/tokens_per_s_per_gpu" not in m  # a CPU job has no GPUs
    assert tags["trainfactory.flops_per_token"] == str(FLOPS_PER_TOKEN)
    assert tags["trainfactory.model.n_params"] == "33"
    # step time and its split
    assert 0 < m["train/step_time_p50_s"] <= m["train/step_time_p95_s"]
    assert m["train/step_time_s"] >= 0.01  # the loop sleeps 10 ms inside each step
    assert 0 < m["train/data_wait_fraction"] < 1
    assert m["train/comm_s"] > 0 and 0 < m["train/comm_fraction"] < 1  # DDP comm hook
    # checkpoint I/O, timed around ray.train.report
    saves = _history(mlflow_client, job.run_id, "checkpoint/save_s")
    sizes = _history(mlflow_client, job.run_id, "checkpoint/bytes")
    rates = _history(mlflow_client, job.run_id, "checkpoint/mb_per_s")
    assert [p.step for p in saves] == [1, 2, 3] and all(p.value > 0 for p in saves)
    assert all(p.value > 2**20 for p in sizes)  # 1 MiB of padding plus the weights
    for save, size, rate in zip(saves, sizes, rates, strict=True):
        assert rate.value == pytest.approx(size.value / 1e6 / save.value)
    # the NaN at step 7 is counted and flagged, never written
    assert tags["trainfactory.nonfinite.first_step"] == "7"
    assert tags["trainfactory.nonfinite.first_key"] == "bad"
    assert "bad" not in m
    # node sampling
    assert any(k.startswith("system/") and k.endswith("/cpu_utilization") for k in m)


class MlflowServer:
    """An MLflow server of this test's own (SQLite), stoppable and restartable on one port."""

    def __init__(self, root):
        self.root = root
        self.port = _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.db = root / "mlflow.db"
        _prepare_sqlite(self.db)
        self.proc = None

    def start(self):
        argv = [
            _tool("mlflow"),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{self.db}",
            "--artifacts-destination",
            str(self.root / "artifacts"),
        ]
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        client = MlflowClient(self.uri)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                client.search_experiments(max_results=1)
                return
            except Exception:
                time.sleep(0.5)
        raise AssertionError("the test's MLflow server did not start")

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)  # its own session: only what we started
            self.proc.wait(30)


@pytest.mark.timeout(420)
def test_a_tracking_outage_loses_no_user_point(services, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")  # this process's own reads
    server = MlflowServer(tmp_path)
    server.start()
    steps = 1500
    try:
        job = launch(
            train_fns.telemetry_loop,
            workers=2,
            config={"steps": steps, "sleep": 0.01},
            experiment="outage",
            tracking_uri=server.uri,
        )
        client = MlflowClient(server.uri)
        deadline = time.monotonic() + 180
        while len(client.get_metric_history(job.run_id, "loss")) < 50:
            assert time.monotonic() < deadline, "the job logged nothing"
            time.sleep(0.5)
        server.stop()
        time.sleep(20)
        server.start()
        assert job.wait(timeout=300) == "SUCCEEDED", job.info().error
        loss = _history(client, job.run_id, "loss")
        assert [p.step for p in loss] == list(range(1, steps + 1))  # each exactly once
        tags = client.get_run(job.run_id).data.tags
        assert float(tags["trainfactory.tracking.offline_s"]) >= 15
        assert tags["trainfactory.tracking.dropped_points"] == "0"
        assert "tracking server back after" in job.logs()
    finally:
        job.stop(now=True)
        server.stop()
