"""Real two-worker jobs on the embedded services: recording, stop, and a killed driver."""

import os
import signal
import time

import cloudpickle
import pytest
import train_fns

from jupyter_trainfactory import attach, launch, list_jobs
from jupyter_trainfactory.jobs import JobNotFound
from jupyter_trainfactory.jobstate import SETTING_UP
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/
pytestmark = pytest.mark.job


@pytest.fixture
def jobs():
    """Jobs a test launched; any still running at the end are stopped, so the next test
    gets the cluster's CPUs."""
    launched = []
    yield launched
    for job in launched:
        if job.status() not in ("SUCCEEDED", "FAILED", "STOPPED"):
            job.stop(now=True)


def _wait_for(predicate, timeout=180, poll=0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError("condition not reached in time")


@pytest.mark.timeout(300)
def test_two_worker_job_is_recorded(manager, mlflow_client, jobs):
    job = launch(
        train_fns.short_loop,
        workers=2,
        config={"steps": 6, "lr": 0.05},
        experiment="tests",
        run_name="short",
    )
    jobs.append(job)
    assert job.status() in ("PENDING", "RUNNING")
    assert job.wait(timeout=240) == "SUCCEEDED"

    run = mlflow_client.get_run(job.run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "short"
    assert mlflow_client.get_experiment(run.info.experiment_id).name == "tests"
    params = run.data.params
    assert params["workers"] == "2" and params["config.steps"] == "6"
    assert params["config.lr"] == "0.05" and params["max_failures"] == "0"
    tags = run.data.tags
    assert tags[TAG.JOB_ID] == job.id and tags[TAG.SUBMISSION] == f"{job.id}-0"
    assert tags[TAG.OWNER] and len(tags[TAG.FUNCTION_SHA]) == 64
    assert tags[TAG.STATE] == "SUCCEEDED"

    history = mlflow_client.get_metric_history(job.run_id, "loss")
    steps = [m.step for m in sorted(history, key=lambda m: m.timestamp)]
    assert steps == [1, 2, 3, 4, 5, 6]  # one point per report, unique and increasing
    assert [m.value for m in sorted(history, key=lambda m: m.step)][-1] == pytest.approx(1 / 6)
    samples = mlflow_client.get_metric_history(job.run_id, "train/samples")
    assert max(m.value for m in samples) == 6 * 8 * 2  # summed over both ranks
    assert "system/" in " ".join(run.data.metrics)  # the node sampler ran
    assert job.id in [j.job_id for j in list_jobs()]
    assert "Running entrypoint" in job.logs()


@pytest.mark.timeout(300)
def test_stopped_job_reads_stopped_and_run_killed(manager, mlflow_client, jobs):
    job = launch(train_fns.long_loop, workers=2, experiment="tests")
    jobs.append(job)
    _wait_for(lambda: job.info().step is not None and job.info().step >= 2)
    assert job.status() == "RUNNING"
    # The cluster's 2 CPUs are busy: a third worker exists but must wait, it is no error.
    waiting = launch(train_fns.long_loop, workers=1, experiment="tests")
    jobs.append(waiting)
    # Ray sets up the submission (its supervisor and driver start) first: that is said
    assert waiting.info().reason == SETTING_UP
    info = _wait_for(lambda: (i := waiting.info()).reason.startswith("waiting") and i)
    assert info.state == "PENDING"
    assert info.reason == (  # and who holds them: the first job's two workers
        "waiting for resources: 1 worker x (1 CPU), placement pack; free now 0 of 1 CPU;"
        f" held by job {job.id} (2 CPU)"
    )
    assert info.waiting == f"0 of 1 CPU free; held by job {job.id}"  # the panel's line
    assert waiting.stop(now=True) == "STOPPED"
    assert job.stop(now=True) == "STOPPED"
    run = mlflow_client.get_run(job.run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags[TAG.REASON] == "user-now"
    assert attach(job.id).status() == "STOPPED"


@pytest.mark.timeout(300)
def test_killed_driver_is_reconciled_to_failed(manager, mlflow_client, jobs):
    job = launch(train_fns.long_loop, workers=2, experiment="tests")
    jobs.append(job)
    _wait_for(lambda: job.info().step is not None)
    info = manager.jobs_client.get_job_info(f"{job.id}-0")
    os.kill(int(info.driver_info.pid), signal.SIGKILL)  # a driver we started, by its pid
    _wait_for(lambda: manager.jobs_client.get_job_status(f"{job.id}-0").value == "FAILED")
    assert mlflow_client.get_run(job.run_id).info.status == "RUNNING"  # nobody closed it yet
    assert job.status() == "FAILED"  # the next status call reconciles
    run = mlflow_client.get_run(job.run_id)
    assert run.info.status == "FAILED" and run.data.tags[TAG.ERROR]


@pytest.mark.timeout(300)
def test_training_error_fails_the_job_with_its_last_line(manager, mlflow_client, jobs):
    job = launch(train_fns.failing_loop, workers=1, experiment="tests")
    jobs.append(job)
    assert job.wait(timeout=240) == "FAILED"
    run = mlflow_client.get_run(job.run_id)
    assert run.info.status == "FAILED"
    assert "bad batch at step 2" in run.data.tags[TAG.ERROR]
    info = job.info()
    assert "bad batch at step 2" in info.error
    # the root cause: rank, type and the user's own traceback lines
    assert info.failure["rank"] == 0 and info.failure["type"] == "ValueError"
    tb = info.failure["traceback"].splitlines()
    assert tb[0] == "Traceback (most recent call last):" and "in failing_loop" in tb[-2]
    assert "session.py" not in info.failure["traceback"]  # our own frames are left out
    # one rank's log, and the same followed to the job's end
    assert "failing_loop: first report done" in job.logs(rank=0)
    followed = []
    assert manager.follow_logs(job.id, rank=0, write=followed.append) == "FAILED"
    assert "failing_loop: first report done" in "\n".join(followed)
    followed = []
    assert manager.follow_logs(job.id, write=followed.append) == "FAILED"
    assert "trainfactory: " in "\n".join(followed)  # the driver's log
    with pytest.raises(JobNotFound, match="has no rank 3"):
        job.logs(rank=3)


def _fake_job_run(mlflow_client, job_id, **tags):
    from jupyter_trainfactory.tracking import create_job_run

    base = {TAG.JOB_ID: job_id, TAG.SUBMISSION: f"{job_id}-0", TAG.STATE: "RUNNING"}
    return create_job_run(mlflow_client, "tests", "orphan", {**base, **tags}, {})


def test_job_of_a_stopped_local_head_is_reconciled(manager, mlflow_client):
    # Recorded by an earlier local head (other port, pid 1 with another start time).
    run = _fake_job_run(
        mlflow_client,
        "tf-0badc0de",
        **{TAG.DASHBOARD: "http://127.0.0.1:1", TAG.LOCAL_HEAD: "1:12.5"},
    )
    info = manager.info("tf-0badc0de")
    assert info.state == "FAILED"
    assert "local Ray head that ran it (pid 1) has stopped" in info.error
    assert mlflow_client.get_run(run.info.run_id).info.status == "FAILED"


def test_job_of_another_cluster_is_left_alone(manager, mlflow_client):
    run = _fake_job_run(mlflow_client, "tf-0ddba11a", **{TAG.DASHBOARD: "http://10.9.9.9:8265"})
    assert manager.info("tf-0ddba11a").state == "RUNNING"  # only that cluster can say
    assert mlflow_client.get_run(run.info.run_id).info.status == "RUNNING"
    mlflow_client.set_terminated(run.info.run_id, "KILLED")
