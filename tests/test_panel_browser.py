"""The side panel in a real browser: Galata/Playwright with Debian's chromium against a real
JupyterLab server, a real job launched here, stopped from the panel.

The browser test (labextension/ui-tests/tests/panel.spec.ts) checks the panel at the
sidebar's default width (Job, State, Step and the actions, reachable without scrolling),
widened (every column) and opened in the main area, and saves a screenshot of each."""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import cloudpickle
import pytest
import train_fns

from jupyter_trainfactory import launch
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/

UI_TESTS = Path(__file__).resolve().parent.parent / "labextension" / "ui-tests"
#: Where Playwright writes each test's output (screenshots).
RESULTS = UI_TESTS / "test-results"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url, proc, timeout, log):
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"JupyterLab exited: {log.read_text()[-3000:]}"
        try:
            with urllib.request.urlopen(url, timeout=5) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"JupyterLab did not answer at {url}"
        time.sleep(1)


@pytest.mark.job
@pytest.mark.timeout(600)
def test_the_panel_shows_a_running_job_and_stops_it(services, manager, tmp_path):
    bin_dir = Path(sys.executable).parent
    assert (UI_TESTS / "node_modules" / "@jupyterlab" / "galata").is_dir(), "run `make install`"
    job = launch(
        train_fns.stoppable_loop, workers=2, config={"every": 40}, experiment="panel-browser"
    )
    port = _free_port()
    env = {
        **os.environ,
        "TRAINFACTORY_HOME": services.home,  # the same services and jobs as this session
        "TF_LAB_PORT": str(port),
        "TF_JOB_ID": job.id,
        "TARGET_URL": f"http://127.0.0.1:{port}",
        "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1",
        "JUPYTERLAB_GALATA_ROOT_DIR": str(tmp_path),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "CI": "1",
    }
    with open(tmp_path / "jupyterlab.log", "w") as log:
        lab = subprocess.Popen(
            [str(bin_dir / "jupyter"), "lab", "--config", "jupyter_server_test_config.py"],
            cwd=UI_TESTS,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _check_in_browser(lab, port, env, bin_dir, tmp_path / "jupyterlab.log")
            info = manager.info(job.id)
            assert info.state == "STOPPED" and info.reason == "user"
            assert manager._mlflow.get_run(job.run_id).data.tags[TAG.STOP] == "user"
        finally:
            job.stop(now=True)
            lab.terminate()
            try:
                lab.wait(30)
            except subprocess.TimeoutExpired:
                lab.kill()


def _check_in_browser(lab, port, env, bin_dir, log):
    """Run the Galata test against the server; it opens the panel, widens it, opens it in
    the main area and stops the job from the sidebar at its default width."""
    _wait_http(f"http://127.0.0.1:{port}/lab", lab, 120, log)
    ui = subprocess.run(
        [str(bin_dir / "jlpm"), "playwright", "test", "tests/panel.spec.ts"],
        cwd=UI_TESTS,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    output = (ui.stdout + ui.stderr)[-6000:]
    print(output)  # the browser test's log (it says the sidebar's default width)
    assert ui.returncode == 0, f"the browser test failed:\n{output}"
    shots = {p.name for p in RESULTS.rglob("*.png")}
    expected = {"panel-default.png", "panel-wide.png", "panel-main.png", "panel-stopped.png"}
    assert expected <= shots, output
