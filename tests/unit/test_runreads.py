"""Finding a job's run (runreads.JobRuns) on a real MLflow store (SQLite): searched once,
then read by id; a deleted or foreign run is searched again (no services)."""

import pytest
from mlflow.tracking import MlflowClient

from jupyter_trainfactory.runreads import JobRuns
from jupyter_trainfactory.tracking import TAG


class Counting:
    """An MlflowClient that counts its searches and reads."""

    def __init__(self, client):
        self.client, self.calls = client, []

    def __getattr__(self, name):
        attr = getattr(self.client, name)
        if not name.startswith(("search_", "get_run")):
            return attr

        def call(*args, **kwargs):
            self.calls.append(name)
            return attr(*args, **kwargs)

        return call


@pytest.fixture()
def store(tmp_path):
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("e", artifact_location=str(tmp_path / "a"))
    return client, exp


def test_a_job_run_is_searched_once_then_read_by_id(store):
    client, exp = store
    run = client.create_run(exp, tags={TAG.JOB_ID: "tf-00000001"})
    client.create_run(exp, tags={TAG.JOB_ID: "tf-00000002"})
    counting = Counting(client)
    runs = JobRuns(counting)
    assert runs.find("tf-00000001").info.run_id == run.info.run_id
    assert counting.calls == ["search_experiments", "search_runs"]
    counting.calls.clear()
    for _ in range(3):
        assert runs.find("tf-00000001").info.run_id == run.info.run_id
    assert counting.calls == ["get_run"] * 3
    assert runs.find("tf-0000000f") is None  # never recorded: searched, not remembered
    assert runs.find("tf-0000000f") is None
    assert counting.calls.count("search_runs") == 2


def test_a_deleted_or_foreign_run_is_searched_again(store):
    client, exp = store
    run = client.create_run(exp, tags={TAG.JOB_ID: "tf-00000001"})
    runs = JobRuns(client)
    runs.remember("tf-00000001", run.info.run_id)
    assert runs.find("tf-00000001").info.run_id == run.info.run_id
    client.delete_run(run.info.run_id)
    assert runs.find("tf-00000001") is None  # a deleted run is no job, as for a search
    client.restore_run(run.info.run_id)
    assert runs.find("tf-00000001").info.run_id == run.info.run_id
    other = client.create_run(exp, tags={TAG.JOB_ID: "tf-00000002"})
    runs.remember("tf-00000001", other.info.run_id)  # wrong: the tag says otherwise
    assert runs.find("tf-00000001").info.run_id == run.info.run_id
    runs.remember("tf-00000001", "0" * 32)  # a run id the server never had
    assert runs.find("tf-00000001").info.run_id == run.info.run_id
