"""The dashboard's model and widget against a real MLflow run, polled by hand (no timing)."""

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from jupyter_trainfactory.dashboard import DashboardModel, JobDashboard, RunSource
from jupyter_trainfactory.tracking import TAG


@pytest.fixture
def run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp, tags={TAG.JOB_ID: "tf-0000abcd", TAG.STATE: "RUNNING"})
    return uri, client, run.info.run_id


def _log(client, run_id, steps, key="loss"):
    client.log_batch(run_id, metrics=[Metric(key, 1.0 / s, 1000 + s, s) for s in steps])


def test_points_grow_and_are_capped_at_rollover(run):
    uri, client, run_id = run
    board = JobDashboard(source=RunSource(uri, run_id), rollover=5, start=False)
    model: DashboardModel = board.model
    assert model.series == {} and not board.polling

    for step in range(1, 9):
        _log(client, run_id, [step])
        client.log_metric(run_id, "system/node-1/cpu_utilization", 40.0 + step, step=step)
        assert board.poll_once() is True
        assert len(model.series["loss"]) == min(step, 5)
    assert [s for s, _ in model.series["loss"]] == [4, 5, 6, 7, 8]
    assert model.nodes["node-1"]["cpu_utilization"] == 48.0
    view, cds = board._figures["loss"]
    assert len(cds.data["step"]) == 5  # the bokeh source rolls over too
    assert "system/node-1/cpu_utilization" not in board._figures

    board.poll_once()  # nothing new: nothing appended
    assert len(cds.data["step"]) == 5 and model.polls == 10  # 1 on creation + 9
    assert "RUNNING" in board._header.value and "step" in board._header.value

    client.set_tag(run_id, TAG.ERROR, "ValueError: boom")
    client.set_terminated(run_id, "FAILED")
    assert board.poll_once() is False  # the job ended: polling stops
    assert model.info.state == "FAILED" and "ValueError: boom" in board._header.value
    board.close()


def test_attach_reads_history_once_downsampled(run):
    uri, client, run_id = run
    _log(client, run_id, range(1, 101))
    client.set_terminated(run_id, "FINISHED")
    board = JobDashboard(source=RunSource(uri, run_id), rollover=10, start=False)
    steps = [s for s, _ in board.model.series["loss"]]
    assert len(steps) == 10 and steps[-1] == 100 and steps == sorted(steps)
    assert board.model.info.state == "SUCCEEDED"


def test_background_poller_stops_when_the_job_ends(run):
    uri, client, run_id = run
    board = JobDashboard(source=RunSource(uri, run_id), interval_s=0.01, start=True)
    assert board.polling
    client.set_terminated(run_id, "KILLED")
    board.wait(timeout=30)
    assert not board.polling and board.model.info.state == "STOPPED"
    board.close()
