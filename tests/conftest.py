"""One set of embedded services (Ray head + MLflow server) per test session.

``TRAINFACTORY_HOME`` points at a temporary directory unless the caller set one
(.ci/run does); services the session started are stopped at the end, by pid.
"""

from __future__ import annotations

import os
import tempfile

import pytest

os.environ.setdefault("TRAINFACTORY_HOME", tempfile.mkdtemp(prefix="tf-test-", dir="/tmp"))
# The jobs poll their reports as a user's do (payload.REPORT_POLL_INTERVAL_S), unless the
# one who runs the tests sets RAY_TRAIN_HEALTH_CHECK_INTERVAL_S.


def ipython_shell():
    """The one IPython shell of the test session (IPython's test shell starts only once:
    a second ``start_ipython()`` returns None)."""
    from IPython.testing import globalipapp

    globalipapp.start_ipython()
    return globalipapp.get_ipython()


@pytest.fixture(autouse=True)
def _mlflow_request_settings():
    """A RunRecorder turns the MLflow client's own retries off in its process (a job's
    recorder actor, which retries by itself); one built in this process by a test must not
    leave every later test's requests without them (CI: one connection reset failed a sweep
    test). The variables are put back as they were after each test."""
    names = ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def services():
    from jupyter_trainfactory import services as svc

    before = svc.load_services()
    running_before = {n for n, p in (before.processes.items() if before else []) if p.alive()}
    started = svc.ensure_services()
    yield started
    mine = tuple(n for n in ("ray", "mlflow") if n not in running_before)
    if mine:
        svc.stop_services(mine)


@pytest.fixture(scope="session")
def manager(services):
    from jupyter_trainfactory import get_manager

    return get_manager()


@pytest.fixture
def mlflow_client(manager):
    return manager.mlflow_client


#: How long a job module's Ray jobs may take to end after its last test (s).
LEFTOVER_GRACE_S = 60.0


@pytest.fixture(scope="module", autouse=True)
def _no_ray_job_outlives_its_module(request):
    """After a module of job tests, every Ray job on the session's cluster has ended.

    The cluster is shared: one still running (a driver that did not exit) holds its CPUs
    and leaves the next module's jobs PENDING until they time out (CI: two modules failed
    after the sweep tests). One still running :data:`LEFTOVER_GRACE_S` s after the module
    is stopped, and the module's teardown fails naming it, so the failure is the leaking
    module's and no other's."""
    yield
    if request.node.get_closest_marker("job") is None:
        return
    import time

    from jupyter_trainfactory import get_manager

    client = get_manager().jobs_client
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while True:
        running = [j for j in client.list_jobs() if not j.status.is_terminal()]
        if not running or time.monotonic() > deadline:
            break
        time.sleep(2)
    for job in running:
        client.stop_job(job.submission_id)
    names = ", ".join(f"{j.submission_id} ({j.status.value}: {j.entrypoint})" for j in running)
    assert not running, f"Ray jobs still running {LEFTOVER_GRACE_S:g} s after the module: {names}"
    held = _held_after(deadline)
    assert not held, f"Still held {LEFTOVER_GRACE_S:g} s after the module's jobs ended: {held}"


def _held_after(deadline: float) -> str:
    """Who still holds the cluster's resources (placement groups, actors) once every job
    has ended, asked until ``deadline``: a leaked worker group leaves the next module's jobs
    PENDING (CI once: 1 of 2 CPUs held after the sweep tests, every later job short)."""
    import time

    from jupyter_trainfactory import get_manager
    from jupyter_trainfactory.holders import holdings_text, read_holdings, state_lister

    manager = get_manager()
    lister = state_lister(manager.address, manager.ray.headers(manager.address))
    while True:
        held = holdings_text(read_holdings(lister), limit=10)
        if not held or time.monotonic() > deadline:
            return held
        time.sleep(2)
