"""Worker failures of real two-worker jobs: recovery from the last checkpoint, accounting."""

import json
import time

import cloudpickle
import pytest
import train_fns

from jupyter_trainfactory import launch
from jupyter_trainfactory.commands import format_status
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/
pytestmark = pytest.mark.job


def _history(client, run_id, key):
    return sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)


@pytest.mark.timeout(300)
def test_a_worker_failure_is_recovered_from_the_last_checkpoint(manager, mlflow_client, tmp_path):
    steps, every, fail_step = 60, 20, 30
    job = launch(
        train_fns.fault_loop,
        workers=2,
        max_failures=1,
        config={
            "steps": steps,
            "every": every,
            "fail_step": fail_step,
            "marker": str(tmp_path / "failed-once"),
        },
        experiment="tests",
    )
    try:
        assert job.wait(timeout=260) == "SUCCEEDED", job.info().error
    finally:
        job.stop(now=True)
    run = mlflow_client.get_run(job.run_id)
    m, tags = run.data.metrics, run.data.tags
    assert run.info.status == "FINISHED"
    # every step once, although steps 21-30 ran twice (first write wins)
    loss = _history(mlflow_client, job.run_id, "loss")
    assert [p.step for p in loss] == list(range(1, steps + 1))
    assert m["faults/count"] == 1 and m["faults/restarts"] == 1
    assert m["faults/restore_step"] == 20  # the last checkpoint before the failure
    assert tags["trainfactory.faults.restore_step"] == "20"
    assert "rank 1" in tags["trainfactory.faults.last"]
    # goodput and badput tile the wall time
    badput = sum(v for k, v in m.items() if k.startswith("badput/"))
    assert m["goodput/goodput_s"] + badput == pytest.approx(m["goodput/wall_s"], rel=0.01)
    assert 0 < m["goodput/ettr"] < 1
    assert m["badput/wasted_progress_s"] > 0 and m["badput/infrastructure_recovery_s"] > 0
    assert m["faults/mttr_s"] > 0
    resumed = [(p.step, p.value) for p in _history(mlflow_client, job.run_id, "resumed_at")]
    assert resumed == [(1, 0.0), (21, 20.0)]
    # the failure's record: rank 1 dies at 30, rank 0 may be a little behind or step on
    # alone until the next checkpoint's barrier (it logs step 40, then waits there); the
    # steps a rank logged in its last 0.5 s shipping interval die with it, so the step
    # reached is at least the checkpoint's (sent before the checkpoint committed)
    (record,) = json.loads(tags[TAG.FAILURES])
    assert record["restored_step"] == 20 and 20 <= record["step_reached"] <= 40
    assert record["steps_lost"] == record["step_reached"] - 20
    assert record["time"] <= record["detected"] <= record["restored"]
    assert record["restored"] - record["time"] <= record["mttr_s"]
    assert record["mttr_s"] == pytest.approx(m["faults/mttr_s"])
    # wasted progress: from the checkpoint of step 20 to the failure
    (saved,) = [p for p in _history(mlflow_client, job.run_id, "checkpoint/step") if p.step == 20]
    expected = record["time"] - saved.timestamp / 1000
    assert m["badput/wasted_progress_s"] == pytest.approx(expected, abs=1.0)


@pytest.mark.timeout(300)
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(
    manager, mlflow_client, tmp_path
):
    # checkpoints at 10, 20, 30; rank 1 truncates the newest (30) and dies at 35
    job = launch(
        train_fns.fault_loop,
        workers=2,
        max_failures=1,
        keep_checkpoints=3,
        config={
            "steps": 40,
            "every": 10,
            "fail_step": 35,
            "corrupt": True,
            "marker": str(tmp_path / "failed-once"),
        },
        experiment="tests",
    )
    try:
        assert job.wait(timeout=260) == "SUCCEEDED", job.info().error
    finally:
        job.stop(now=True)
    resumed = [(p.step, p.value) for p in _history(mlflow_client, job.run_id, "resumed_at")]
    assert resumed == [(1, 0.0), (21, 20.0)]  # step 30's checkpoint failed its manifest
    m = mlflow_client.get_run(job.run_id).data.metrics
    assert m["faults/restore_step"] == 20
    assert "skipping checkpoint" in job.logs() and "state.json has 3 bytes" in job.logs()
    loss = _history(mlflow_client, job.run_id, "loss")
    assert [p.step for p in loss] == list(range(1, 41))


@pytest.mark.timeout(240)
def test_without_a_failure_budget_the_job_fails_naming_the_rank(manager, mlflow_client, tmp_path):
    job = launch(
        train_fns.fault_loop,
        workers=2,
        max_failures=0,
        config={"steps": 40, "every": 10, "fail_step": 15, "marker": str(tmp_path / "m")},
        experiment="tests",
    )
    try:
        assert job.wait(timeout=200) == "FAILED"
    finally:
        job.stop(now=True)
    run = mlflow_client.get_run(job.run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[TAG.ERROR].startswith("rank 1: ActorDiedError")
    info = job.info()
    assert info.failure["rank"] == 1 and info.failure["type"] == "ActorDiedError"
    assert info.failure["node"] and info.failure["pid"]
    status = format_status(info)
    assert "failure: rank 1 on node" in status and "ActorDiedError" in status
    # a process that died has no traceback of its own (Ray's frames are left out)
    assert info.failure["traceback"] == "" and len(info.failure_lines()) == 1
    assert "worker process has died" in info.failure_lines()[0]


@pytest.mark.timeout(300)
def test_a_hung_worker_is_detected_and_the_job_stopped_for_stall(manager, mlflow_client):
    # steps take 0.05 s; rank 1 hangs at step 20, so nothing arrives for 8 s: a stall
    job = launch(
        train_fns.hanging_loop,
        workers=2,
        config={"hang_step": 20, "every": 5},
        stall_timeout=8,
        on_stall="stop",
        experiment="tests",
    )
    try:
        assert job.wait(timeout=240) == "STOPPED"
    finally:
        job.stop(now=True)
    run = mlflow_client.get_run(job.run_id)
    assert run.info.status == "KILLED" and run.data.tags[TAG.REASON] == "stall"
    assert "stalled: no step or report for" in job.logs()
    loss = _history(mlflow_client, job.run_id, "loss")
    assert loss[-1].step <= 21  # nothing after the hang
    assert float(run.data.tags[TAG.STALL_SUGGESTED]) >= 60


@pytest.mark.timeout(300)
def test_a_hung_worker_is_restarted_from_its_checkpoint_on_stall(manager, mlflow_client, tmp_path):
    job = launch(
        train_fns.hanging_loop,
        workers=2,
        max_failures=1,
        config={"hang_step": 20, "every": 5, "steps": 40, "marker": str(tmp_path / "hung")},
        stall_timeout=8,
        on_stall="restart",
        experiment="tests",
    )
    try:
        assert job.wait(timeout=240) == "SUCCEEDED", job.info().error
    finally:
        job.stop(now=True)
    m = mlflow_client.get_run(job.run_id).data.metrics
    assert m["faults/count"] == 1 and m["faults/restarts"] == 1
    assert m["faults/restore_step"] == 15  # rank 1 hung at 20, before that checkpoint
    failure = job.info().failure
    assert failure["rank"] == 1 and failure["cause"].startswith("no step or report for")
    loss = _history(mlflow_client, job.run_id, "loss")
    assert [p.step for p in loss] == list(range(1, 41))


@pytest.mark.timeout(300)
def test_a_restore_rewinds_the_report_count_of_a_loop_without_a_step_key(
    manager, mlflow_client, tmp_path
):
    # checkpoints at epochs 5, 10, 15; rank 1 dies at epoch 8, after reports 6 and 7:
    # the restore from 5 repeats them, and they are not written again under new steps
    epochs = 15
    job = launch(
        train_fns.epoch_loop,
        workers=2,
        max_failures=1,
        config={"epochs": epochs, "fail_epoch": 8, "marker": str(tmp_path / "failed-once")},
        experiment="tests",
    )
    try:
        assert job.wait(timeout=260) == "SUCCEEDED", job.info().error
    finally:
        job.stop(now=True)
    epoch = _history(mlflow_client, job.run_id, "epoch")
    assert [(p.step, p.value) for p in epoch] == [(e, float(e)) for e in range(1, epochs + 1)]
    m = mlflow_client.get_run(job.run_id).data.metrics
    assert m["faults/restarts"] == 1 and m["faults/restore_step"] == 5


@pytest.mark.timeout(300)
def test_a_stop_that_waits_for_a_hung_rank_says_so_and_books_stop_wait(manager, mlflow_client):
    # rank 1 hangs at step 20 before it hears the stop; rank 0 steps on, checking
    # should_stop() every step: the stop cannot complete, and that is said and booked
    job = launch(
        train_fns.hanging_loop,
        workers=2,
        config={"hang_step": 20, "every": 10**9, "obey": True},
        experiment="tests",
    )
    waiting = "waiting for rank 1 at step 20"
    try:
        deadline = time.monotonic() + 180
        while mlflow_client.get_run(job.run_id).data.metrics.get("loss", 1) > 1 / 40:
            assert time.monotonic() < deadline, "rank 0 did not step past the hang"
            time.sleep(0.5)
        requested = time.monotonic()
        job.stop(grace_s=50)
        while waiting not in job.info().reason:  # within max(30 s, 3 x the longest step)
            assert time.monotonic() - requested < 45, job.info().reason
            time.sleep(0.5)
        said = time.monotonic() - requested
        assert job.info().state == "RUNNING"
        assert f"stopping: {waiting}" in format_status(job.info())
        row = next(j for j in manager.list() if j.job_id == job.id).as_row()
        assert row["state"] == "RUNNING" and row["detail"] == f"stopping: {waiting}"  # the panel
        assert job.wait(timeout=120) == "STOPPED"
        ended = time.monotonic() - requested
    finally:
        job.stop(now=True)
    run = mlflow_client.get_run(job.run_id)
    m, tags = run.data.metrics, run.data.tags
    assert run.info.status == "KILLED"
    assert tags[TAG.REASON] == f"user: grace ended {waiting}"
    assert 30 <= said < 45 and 50 <= ended < 80, (said, ended)
    # from when the wait was found to the end: its own badput category, not "other"
    assert m["badput/stop_wait_s"] >= ended - said - 10, m["badput/stop_wait_s"]
    assert m["badput/stop_wait_s"] > m.get("badput/other_s", 0)
