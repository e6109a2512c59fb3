"""The test tiers, and one set of embedded services (Ray head + MLflow server) per session.

The tree says where a test runs (tests/README.md):

- ``tests/unit/``: no Ray, no MLflow server, no browser; ``make check`` runs them in
  parallel after every edit. A test here that asks for the services, or starts a Ray head,
  an MLflow server, ``ray.init`` or JupyterLab, fails with a sentence naming its tier.
- ``tests/package/``: the built wheel and binder/ (needs ``make test``'s wheel).
- ``tests/jobs/``: the real services: the session's Ray head and MLflow server, real jobs.
- ``tests/browser/``: a real JupyterLab and Debian's chromium, over the same services.

``TRAINFACTORY_HOME`` points at a temporary directory unless the caller set one
(.ci/run does); services the session started are stopped at the end, by pid. Each
pytest-xdist worker gets a directory of its own under it.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("TRAINFACTORY_HOME", tempfile.mkdtemp(prefix="tf-test-", dir="/tmp"))
if os.environ.get("PYTEST_XDIST_WORKER"):  # workers share the parent's variable: split it
    _home = Path(os.environ["TRAINFACTORY_HOME"]) / os.environ["PYTEST_XDIST_WORKER"]
    _home.mkdir(parents=True, exist_ok=True)
    os.environ["TRAINFACTORY_HOME"] = str(_home)

TESTS = Path(__file__).resolve().parent
#: tier -> what its tests may start (the sentence a misplaced test fails with)
TIERS = {
    "unit": "nothing: no Ray, no MLflow server, no browser",
    "package": "the built wheel in a new virtual environment",
    "jobs": "the session's Ray head and MLflow server, and real jobs on them",
    "browser": "JupyterLab and Debian's chromium, over the session's services",
}
#: Fixtures that start the session's services.
SERVICE_FIXTURES = ("services", "manager", "mlflow_client")


def tier_of(path: Path) -> str | None:
    """The tier of a test file: the name of its directory under tests/, if one of TIERS."""
    try:
        first = Path(path).resolve().relative_to(TESTS).parts[0]
    except ValueError:
        return None
    return first if first in TIERS else None


def pytest_collection_modifyitems(config, items):
    """Each test carries its tier as a marker (``pytest -m unit``); a test outside the four
    tier directories is refused, so that none runs in no tier."""
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            raise pytest.UsageError(
                f"{item.nodeid} is outside the test tiers: put it under one of "
                + ", ".join(f"tests/{t}/" for t in TIERS)
                + " (tests/conftest.py says what each may start)."
            )
        item.add_marker(getattr(pytest.mark, tier))


class TierError(AssertionError):
    """A test started what its tier does not allow."""


def _refuse(what: str, nodeid: str):
    def refused(*args, **kwargs):
        raise TierError(
            f"{nodeid} starts {what}, which tests/unit/ does not allow: move it to "
            f"tests/jobs/ ({TIERS['jobs']})."
        )

    return refused


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A test in tests/unit/ that asks for the session's services fails before they start."""
    if tier_of(item.path) != "unit":
        return
    asked = [f for f in SERVICE_FIXTURES if f in item.fixturenames]
    if asked:
        pytest.fail(
            f"{item.nodeid} asks for {asked[0]!r} (the session's Ray head and MLflow server), "
            f"which tests/unit/ does not allow: move it to tests/jobs/ ({TIERS['jobs']}).",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _unit_tests_start_nothing(request, monkeypatch):
    """In tests/unit/, a Ray head, an MLflow server, ``ray.init`` or JupyterLab started by any
    path raises :class:`TierError`."""
    if tier_of(request.node.path) != "unit":
        return
    import ray

    from jupyter_trainfactory import services

    nodeid = request.node.nodeid
    monkeypatch.setattr(services, "_spawn", _refuse("a Ray head or an MLflow server", nodeid))
    monkeypatch.setattr(ray, "init", _refuse("Ray (ray.init)", nodeid))
    if "browser" in sys.modules:
        monkeypatch.setattr(sys.modules["browser"], "jupyter_lab", _refuse("JupyterLab", nodeid))


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
