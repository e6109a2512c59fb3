"""The reliability report over real jobs on the embedded services: a chaos kill (a drill,
recovered: counted apart from real failures), a failure in the training code (a user
error, its cost the user's), two planned stops of one job (stopped, resumed, stopped
again); the notebook's API and the command line print the same report."""

import subprocess
import sys
import time
import uuid

import cloudpickle
import pytest
import train_fns

from jupyter_trainfactory import launch, reliability
from jupyter_trainfactory.fleet import rest_runs

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/
pytestmark = pytest.mark.job


def _wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.mark.timeout(540)
def test_report_counts_a_drill_apart_one_user_error_and_every_stop(
    manager, mlflow_client, tmp_path, monkeypatch
):
    experiment = f"reliability-{uuid.uuid4().hex[:8]}"
    since = time.time() - 1
    killed = launch(
        train_fns.fault_loop,
        workers=1,
        max_failures=1,
        config={
            # 40 s of steps in 80 reports (not 400: on a loaded machine each report
            # costs the recorder time, and 400 of them ran past the test's timeout)
            "steps": 80,
            "every": 5,
            "fail_step": -1,
            "marker": str(tmp_path / "m"),
            "sleep": 0.5,
        },
        experiment=experiment,
    )
    failing = launch(train_fns.failing_loop, workers=1, max_failures=0, experiment=experiment)
    # waits for a CPU (two on this machine) until the failing job gives its up
    stopped = launch(
        train_fns.stoppable_loop, workers=1, config={"every": 5}, experiment=experiment
    )
    jobs = [killed, failing, stopped]
    try:
        metrics = lambda job: mlflow_client.get_run(job.run_id).data.metrics  # noqa: E731
        _wait_for(lambda: "loss" in metrics(killed), 180, "the job did not step")
        killed.chaos(rank=0)
        assert failing.wait(timeout=180) == "FAILED"
        _wait_for(lambda: "loss" in metrics(stopped), 180, "the stopped job did not step")
        stopped.stop()
        assert stopped.wait(timeout=120) == "STOPPED"
        assert killed.wait(timeout=240) == "SUCCEEDED", killed.info().error
        # resumed (it has checkpoints), then stopped again: both stops count (issue 48, 7)
        stopped.resume()
        _wait_for(lambda: stopped.info().state == "RUNNING", 180, "the resume did not run")
        stopped.stop(now=True)
        assert stopped.wait(timeout=120) == "STOPPED"
    finally:
        for job in jobs:
            job.stop(now=True)
    until = time.time() + 1
    report = reliability(since=since, until=until, experiment=experiment)
    (cpu,) = report.fleet
    assert cpu.unit == "vCPU" and cpu.jobs == 3 and cpu.live == 0
    # the chaos kill is a drill: its own kind, in no rate, MTBF or MTTR of real failures
    assert cpu.kinds == {"user_error": 1} and cpu.drills == {"worker_crash": 1}
    assert cpu.infrastructure == 0 and cpu.user_errors == 1 and cpu.stops == 2
    assert cpu.mttr_of == 0 and cpu.mttr_s is None and cpu.mtbf_h is None
    # its record keeps its MTTR: from the kill to the first step past the one it reached
    record = next(f for j in report.jobs for f in j.failures if f.drill)
    assert record.kind == "worker_crash" and 0 < record.mttr_s < 120
    assert record.mttr_s == pytest.approx(metrics(killed)["faults/mttr_s"])
    assert metrics(killed)["badput/drill_s"] > 0
    assert metrics(killed).get("badput/infrastructure_recovery_s", 0.0) == 0.0
    # the user's ValueError: its time and cost are the user's, never infrastructure's
    assert "cost/infrastructure_recovery_usd" not in metrics(failing)
    assert metrics(failing).get("badput/infrastructure_recovery_s", 0.0) == 0.0
    # exposure: the vCPUs each job held, from its cost meter
    assert 0 < cpu.exposure_h == pytest.approx(sum(j.exposure_h for j in report.jobs))
    assert cpu.rate.per_day is None  # minutes of one vCPU: too little for a rate
    text = report.text()
    print(text)  # the closing note shows it
    assert "0 infrastructure (none)" in text and "1 user error" in text
    assert "2 planned stops" in text and "drills:    1 injected failure (worker_crash 1)" in text
    # the command line computes the same report
    cli = subprocess.run(
        [sys.executable, "-m", "jupyter_trainfactory.cli", "reliability", "--experiment",
         experiment, "--since", _iso(since), "--until", _iso(until)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    again = reliability(since=_parse(_iso(since)), until=_parse(_iso(until)), experiment=experiment)
    assert cli.stdout.strip() == again.text().strip()
    # the REST search's JSON (the server's path) and the client's entities read the same
    assert rest_runs.page_reader(mlflow_client) is not None
    monkeypatch.setattr(rest_runs, "page_reader", lambda client: None)
    by_client = reliability(since=since, until=until, experiment=experiment)
    assert by_client.jobs == report.jobs and by_client.text() == report.text()


def _iso(t: float) -> str:
    import datetime as dt

    return dt.datetime.fromtimestamp(t).isoformat(timespec="seconds")


def _parse(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text).timestamp()
