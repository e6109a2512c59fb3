"""The side panel in a real browser: Galata/Playwright with Debian's chromium against a real
JupyterLab server, a real job launched here, stopped from the panel.

The browser test (labextension/ui-tests/tests/panel.spec.ts) checks the panel at the
sidebar's default width (Job, State, Step and the actions, reachable without scrolling),
widened (every column) and opened in the main area, the reliability line under the table,
a second job waiting for the first's CPUs (what it waits for and who holds it, under its
state; stopped from the panel before it ran), and saves a screenshot of each.

JupyterLab serves the side panel built next to the imported package (this tree's
``jupyter_trainfactory/labextension``), ahead of the one the environment installed."""

import time

import cloudpickle
import pytest
import train_fns
from browser import (
    UI_TESTS,
    browser_env,
    free_port,
    jupyter_lab,
    playwright,
    screenshots,
    this_trees_panel,
)

from jupyter_trainfactory import launch
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/


@pytest.mark.job
@pytest.mark.timeout(600)
def test_the_panel_shows_a_running_job_and_stops_it(services, manager, tmp_path):
    assert (UI_TESTS / "node_modules" / "@jupyterlab" / "galata").is_dir(), "run `make install`"
    job = launch(
        train_fns.stoppable_loop, workers=2, config={"every": 40}, experiment="panel-browser"
    )
    waiting = None
    try:
        _wait_until_running(manager, job.id)
        # the same again, on the CPUs the first holds: PENDING, the panel says who holds them
        waiting = launch(train_fns.stoppable_loop, workers=2, experiment="panel-browser")
        env = browser_env(
            services.home,
            tmp_path,
            free_port(),
            TF_JOB_ID=job.id,
            TF_WAITING_JOB_ID=waiting.id,
            JUPYTER_PATH=this_trees_panel(tmp_path / "jupyter"),
        )
        with jupyter_lab(env, tmp_path / "jupyterlab.log"):
            # it opens the panel, widens it, opens it in the main area and stops the job
            # from the sidebar at its default width
            output = playwright("panel.spec.ts", env, timeout=420)
        expected = {"panel-default.png", "panel-wide.png", "panel-main.png", "panel-stopped.png"}
        expected |= {"panel-reliability.png", "panel-waiting.png", "panel-start-over.png"}
        assert expected <= screenshots(), output
        info = manager.info(job.id)
        assert info.state == "STOPPED" and info.reason == "user"
        assert manager.mlflow_client.get_run(job.run_id).data.tags[TAG.STOP] == "user"
        # stopped from the panel while it waited: it never ran
        info = manager.info(waiting.id)
        assert info.state == "STOPPED" and info.step is None
        # its Resume was cancelled at the start-over question: no new job, no link
        tags = manager.mlflow_client.get_run(waiting.run_id).data.tags
        assert TAG.STARTED_OVER_AS not in tags
    finally:
        for each in (waiting, job):
            if each is not None:
                each.stop(now=True)


def _wait_until_running(manager, job_id: str, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while (info := manager.info(job_id)).state != "RUNNING":
        assert time.monotonic() < deadline, f"{job_id} is still {info.state} ({info.reason})"
        time.sleep(1.0)
