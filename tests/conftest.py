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
