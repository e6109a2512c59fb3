"""The embedded default: one Ray head and one MLflow server, reused, stopped only by pid."""

import os
import stat
import urllib.request

import psutil
import pytest

from jupyter_trainfactory import services as svc


def test_services_run_and_are_reused(services):
    assert services.processes["ray"].alive() and services.processes["mlflow"].alive()
    token = services.token_path
    assert stat.S_IMODE(os.stat(token).st_mode) == 0o600
    assert os.environ["RAY_AUTH_TOKEN_PATH"] == token and os.environ["RAY_AUTH_MODE"] == "token"
    assert len(str(svc._ray_temp_dir(svc.state_dir()))) <= svc._MAX_RAY_TEMP_DIR
    again = svc.ensure_services()  # a second caller reuses them
    assert {n: p.pid for n, p in again.processes.items()} == {
        n: p.pid for n, p in services.processes.items()
    }
    with urllib.request.urlopen(f"{services.tracking_uri}/health", timeout=5) as resp:
        assert resp.status == 200


def test_dashboard_requires_the_token(services):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(f"{services.dashboard_url}/api/jobs/", timeout=5)
    assert err.value.code in (401, 403)


def test_sqlite_is_in_wal_mode(services):
    import sqlite3

    db = svc.state_dir() / "mlflow" / "mlflow.db"
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_stop_checks_the_process_start_time(services):
    ray = services.processes["ray"]
    impostor = svc.ServiceProcess("ray", ray.pid, ray.create_time + 12.5, ray.url, ray.log)
    assert not impostor.alive()  # same pid, other start time: another process
    assert svc._terminate(impostor) is False
    assert psutil.pid_exists(ray.pid) and ray.alive()


def test_describe_lists_urls_and_pids(services):
    rows = {r["service"]: r for r in svc.describe()}
    assert rows["Ray head"]["state"] == "running"
    assert rows["Ray head"]["pid"] == str(services.processes["ray"].pid)
    assert rows["MLflow server"]["ui"] == services.tracking_uri
