"""The side panel's server extension: REST handlers against the session's real services."""

import asyncio
import json
import re
import socket
import time

import cloudpickle
import pytest
import train_fns
from tornado.httpclient import HTTPClientError
from tornado.web import RequestHandler

from jupyter_trainfactory import launch
from jupyter_trainfactory.server.manager import TrainingJobsManager

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/
pytest_plugins = ["pytest_jupyter.jupyter_server"]

#: Values for the path groups of the extension's routes; a route with a group not listed
#: here fails the authentication test until it is added.
_GROUP_EXAMPLES = {
    r"(tf-[0-9a-f]{8})": "tf-0123abcd",
    r"(mlflow|ray)": "mlflow",
    r"(/.*)?": "/",
    r"(.+)": "not-a-job",
}


@pytest.fixture
def jp_server_config():
    return {"ServerApp": {"jpserver_extensions": {"jupyter_trainfactory.server": True}}}


async def _json(jp_fetch, *parts, method="GET", body=None, **kwargs):
    if method == "POST" and body is None:
        body = "{}"
    reply = await jp_fetch("trainfactory", *parts, method=method, body=body, **kwargs)
    return json.loads(reply.body)


async def _error(jp_fetch, *parts, method="GET", **kwargs):
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch(
            "trainfactory",
            *parts,
            method=method,
            body="{}" if method == "POST" else None,
            **kwargs,
        )
    return err.value.code, json.loads(err.value.response.body)["message"]


def _extension_routes(web_app):
    """(regex pattern, handler class) of every route under ``/trainfactory/`` in the app."""
    found = []

    def walk(rules):
        for rule in rules:
            if hasattr(rule.target, "rules"):
                walk(rule.target.rules)
            elif "trainfactory" in getattr(rule.matcher, "regex", re.compile("")).pattern:
                found.append((rule.matcher.regex.pattern, rule.target))

    walk(web_app.default_router.rules)
    walk(web_app.wildcard_router.rules)
    return found


def _example_path(pattern):
    path = pattern.rstrip("$")
    for group, value in _GROUP_EXAMPLES.items():
        path = path.replace(group, value)
    path = path.replace("/?", "")
    assert "(" not in path, f"route {pattern} has a path group the test does not know"
    assert re.fullmatch(pattern, path), f"{path} does not match {pattern}"
    return path


async def test_every_route_requires_authentication(jp_serverapp, http_server_client):
    routes = _extension_routes(jp_serverapp.web_app)
    assert len(routes) >= 7, routes
    checked = 0
    for pattern, handler in routes:
        path = _example_path(pattern)
        for method in handler.SUPPORTED_METHODS:
            if getattr(handler, method.lower()) is getattr(RequestHandler, method.lower()):
                continue  # not implemented: tornado answers 405
            reply = await http_server_client.fetch(
                path,
                method=method,
                body="{}" if method in ("POST", "PUT", "PATCH") else None,
                allow_nonstandard_methods=True,
                follow_redirects=False,
                raise_error=False,
            )
            login = reply.code == 302 and "/login" in reply.headers.get("Location", "")
            # jupyter_server's own CORS preflight answer carries no data
            preflight = method == "OPTIONS" and reply.code in (200, 204) and not reply.body
            refused = reply.code in (401, 403) or login or preflight
            assert refused, f"{method} {path} answered {reply.code} without authentication"
            checked += 1
    assert checked >= 14


async def _browser_login(http_server_client, base_url, token):
    """Log in like a browser: the cookies of a password login with the server's token."""
    page = await http_server_client.fetch(f"{base_url}login", raise_error=False)
    xsrf = re.search(r"_xsrf=([^;]+)", page.headers["Set-Cookie"]).group(1)
    login = await http_server_client.fetch(
        f"{base_url}login",
        method="POST",
        body=f"_xsrf={xsrf}&password={token}",
        headers={"Cookie": f"_xsrf={xsrf}"},
        follow_redirects=False,
        raise_error=False,
    )
    assert login.code == 302, login.code
    cookies = [c.split(";")[0] for c in login.headers.get_list("Set-Cookie")]
    return xsrf, "; ".join([f"_xsrf={xsrf}", *cookies])


async def test_a_logged_in_post_needs_the_xsrf_token(
    services, jp_serverapp, http_server_client, jp_base_url
):
    token = jp_serverapp.identity_provider.token
    xsrf, cookie = await _browser_login(http_server_client, jp_base_url, token)
    url = f"{jp_base_url}trainfactory/jobs/tf-00000000/stop"
    reads = await http_server_client.fetch(
        f"{jp_base_url}trainfactory/services", headers={"Cookie": cookie}
    )
    assert reads.code == 200  # the cookie alone logs in
    forged = await http_server_client.fetch(
        url, method="POST", body="{}", headers={"Cookie": cookie}, raise_error=False
    )
    assert forged.code == 403
    real = await http_server_client.fetch(
        url,
        method="POST",
        body="{}",
        headers={"Cookie": cookie, "X-XSRFToken": xsrf},
        raise_error=False,
    )
    assert real.code == 404  # past authentication and XSRF: no such job


async def test_unknown_and_malformed_job_ids_are_404(services, jp_fetch):
    code, message = await _error(jp_fetch, "jobs", "tf-00000000")
    assert code == 404 and "No job tf-00000000" in message
    code, message = await _error(jp_fetch, "jobs", "rm -rf", "stop", method="POST")
    assert code == 404 and "is not a job id" in message
    code, message = await _error(jp_fetch, "jobs", "tf-00000000", "resume", method="POST")
    assert code == 404


async def test_mlflow_down_is_503_with_a_message(services, jp_serverapp, jp_fetch, monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]  # nothing listens once the socket is closed
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setitem(
        jp_serverapp.web_app.settings,
        "trainfactory_manager",
        TrainingJobsManager(
            address=services.dashboard_url, tracking_uri=f"http://127.0.0.1:{dead}", timeout_s=20
        ),
    )
    code, message = await _error(jp_fetch, "jobs")
    assert code == 503 and f"127.0.0.1:{dead}" in message
    code, message = await _error(jp_fetch, "jobs", "tf-00000000")
    assert code == 503


async def test_services_and_the_proxy_to_their_uis(services, jp_fetch, jp_base_url):
    model = await _json(jp_fetch, "services")
    assert model["running"] is True and model["embedded"] is True
    names = {row["name"]: row for row in model["services"]}
    assert set(names) == {"ray", "mlflow"}
    assert names["mlflow"]["ui"] == services.tracking_uri
    assert names["mlflow"]["link"] == f"{jp_base_url}trainfactory/proxy/mlflow/"
    again = await _json(jp_fetch, "services", "start", method="POST")  # reuses them
    assert again["running"] is True
    bare = await jp_fetch(
        "trainfactory", "proxy", "mlflow", follow_redirects=False, raise_error=False
    )
    assert bare.code == 302 and bare.headers["Location"].endswith("/trainfactory/proxy/mlflow/")
    ui = await jp_fetch("trainfactory/proxy/mlflow/")
    assert b"<html" in ui.body.lower()
    search = await jp_fetch(
        "trainfactory",
        "proxy",
        "mlflow",
        "ajax-api",
        "2.0",
        "mlflow",
        "experiments",
        "search",
        params={"max_results": "5"},
    )
    assert "experiments" in json.loads(search.body)
    # The Ray dashboard needs the cluster's token: the proxy adds it.
    version = await jp_fetch("trainfactory", "proxy", "ray", "api", "version")
    assert "ray_version" in json.loads(version.body)


async def test_the_reliability_summary_of_a_period(services, jp_fetch):
    model = await _json(jp_fetch, "reliability", params={"since": "30d"})
    assert model["since_text"] == "30d"
    assert model["until"] - model["since"] == pytest.approx(30 * 86400, abs=60)
    assert set(model) >= {"jobs", "units", "lemons", "text"}
    if model["jobs"]:  # jobs of the session's other tests
        assert "ETTR" in model["text"] and model["units"]
        assert {"unit", "exposure_days", "rate", "mttr_p50_s", "ettr"} <= set(model["units"][0])
    else:
        assert model["text"] == "no jobs in the period" and model["units"] == []
    assert (await _json(jp_fetch, "reliability"))["since_text"] == "30d"  # the default
    code, message = await _error(jp_fetch, "reliability", params={"since": "last month"})
    assert code == 400 and "since takes a date" in message and "'last month'" in message
    code, message = await _error(jp_fetch, "reliability", params={"since": "2999-01-01"})
    assert code == 400 and "in the past" in message


async def test_reads_are_shared_within_the_cache_time(services, monkeypatch):
    manager = TrainingJobsManager(ttl_s=30)
    calls = []
    real = manager._read_jobs
    monkeypatch.setattr(manager, "_read_jobs", lambda *a: calls.append(a) or real(*a))
    first = await asyncio.gather(*(manager.list_jobs() for _ in range(10)))
    await manager.list_jobs()
    assert len(calls) == 1 and all(f == first[0] for f in first)
    await manager.list_jobs(all_users=True)
    assert len(calls) == 2


async def _until(jp_fetch, job_id, states, timeout=120):
    deadline = time.monotonic() + timeout
    while True:
        model = await _json(jp_fetch, "jobs", job_id)
        if model["state"] in states:
            return model
        assert time.monotonic() < deadline, f"{job_id} is still {model['state']}"
        await asyncio.sleep(1)


@pytest.mark.job
@pytest.mark.timeout(420)
async def test_list_get_stop_and_resume_a_real_job(services, jp_fetch, jp_base_url):
    job = launch(
        train_fns.stoppable_loop, workers=2, config={"every": 20}, experiment="panel-tests"
    )
    try:
        model = await _until(jp_fetch, job.id, {"RUNNING"})
        deadline = time.monotonic() + 120
        while model["step"] is None or model["throughput"] is None:
            assert time.monotonic() < deadline, model
            await asyncio.sleep(1)
            model = await _json(jp_fetch, "jobs", job.id)
        assert model["experiment"] == "panel-tests" and model["id"] == job.id
        assert model["throughput_unit"] == "samples/s" and model["throughput"] > 0
        assert model["utilization_kind"] == "CPU" or model["utilization"] is None
        assert model["run_link"].startswith(
            f"{jp_base_url}trainfactory/proxy/mlflow/#/experiments/"
        )
        assert model["run_url"].startswith(services.tracking_uri)

        listed = await _json(jp_fetch, "jobs")
        assert [j["id"] for j in listed][0] == job.id  # newest first
        everyone = await _json(jp_fetch, "jobs", params={"all": "1"})
        assert job.id in [j["id"] for j in everyone]

        code, message = await _error(jp_fetch, "jobs", job.id, "resume", method="POST")
        assert code == 409 and "RUNNING" in message

        stopped = await _json(jp_fetch, "jobs", job.id, "stop", method="POST")
        assert stopped["state"] in ("RUNNING", "STOPPED")  # graceful: after the next checkpoint
        stopped = await _until(jp_fetch, job.id, {"STOPPED"})
        assert stopped["checkpoint_step"] is not None and stopped["ended"] is not None

        resumed = await _json(jp_fetch, "jobs", job.id, "resume", method="POST")
        assert resumed["state"] in ("PENDING", "RUNNING") and resumed["resumes"] == 1
        await _until(jp_fetch, job.id, {"RUNNING"})
        now = await _json(jp_fetch, "jobs", job.id, "stop", method="POST", body='{"now": true}')
        assert now["state"] == "STOPPED"
        assert job.manager.mlflow_client.get_run(job.run_id).info.status == "KILLED"
    finally:
        job.stop(now=True)


async def test_bokehjs_comes_from_the_installed_bokeh(jp_fetch, jp_base_url):
    """What the front-end plugin loads (labextension/src/bokeh.ts): bokeh's own files."""
    import os

    import bokeh

    from jupyter_trainfactory.server.bokehjs import bokehjs_dir
    from jupyter_trainfactory.server.links import BASE_URL_ENV

    info = await _json(jp_fetch, "bokehjs")
    assert info["version"] == bokeh.__version__ and info["files"][0] == "bokeh.min.js"
    core = await jp_fetch("trainfactory", "bokehjs", "bokeh.min.js", params={"v": info["version"]})
    assert core.body == (bokehjs_dir() / "bokeh.min.js").read_bytes()
    assert "immutable" in core.headers["Cache-Control"]
    other = await jp_fetch("trainfactory", "bokehjs", "bokeh-api.min.js", raise_error=False)
    assert other.code == 404  # not one of the page's files
    # the kernels this server starts inherit its base URL (the dashboard's proxied links)
    assert os.environ[BASE_URL_ENV] == jp_base_url


def test_run_links_go_through_the_proxy_only_for_its_mlflow(monkeypatch):
    from jupyter_trainfactory.server.links import BASE_URL_ENV, proxied_run_url

    monkeypatch.delenv(BASE_URL_ENV, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    assert proxied_run_url("http://mlflow.internal:5000", "3", "abc") is None  # no Jupyter
    monkeypatch.setenv(BASE_URL_ENV, "/user/alice/")
    assert (
        proxied_run_url("http://mlflow.internal:5000/", "3", "abc")
        == "/user/alice/trainfactory/proxy/mlflow/#/experiments/3/runs/abc"
        "?workflowType=machine_learning"  # the MLflow UI's model-training view
    )
    assert proxied_run_url("http://other:5000", "3", "abc") is None  # not what it proxies
