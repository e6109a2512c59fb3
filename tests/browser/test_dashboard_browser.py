"""The job dashboard in a real browser (labextension/ui-tests/tests/dashboard.spec.ts).

JupyterLab 4 and Notebook 7, Debian's chromium, no internet: each notebook launches a
short two-worker job and the browser checks that its plots draw (BokehJS comes from the
installed bokeh package, through the server extension), move while the job runs and that
the job ends SUCCEEDED; a sweep's leaderboard shows a row per trial, best first, and
their curves; in JupyterLab also that after a page reload ``%train attach`` draws
the history with its points, that ``%train reliability`` prints the report and draws its plot,
and that the cell keeps a static summary without its kernel.
Here: that summary is in the saved notebook and in ``jupyter nbconvert --to html``.
"""

import subprocess

import nbformat
import pytest
from browser import (
    BIN,
    browser_env,
    free_port,
    jupyter_lab,
    playwright,
    screenshots,
    this_trees_panel,
)

SETUP = """\
%load_ext jupyter_trainfactory
import time
import ray.train

def falling_loss(config):
    for step in range(config["steps"]):
        time.sleep(config["sleep_s"])
        ray.train.report({"loss": 1.0 / (step + 1), "accuracy": step / config["steps"], "step": step})

config = {"steps": 50, "sleep_s": 0.3}"""
LAUNCH = (
    "job = %train launch falling_loss --workers 2 --config config --experiment dashboard-browser"
)


SWEEP_SETUP = """\
%load_ext jupyter_trainfactory
import time
import ray.train

def lr_loss(config):
    for step in range(config["steps"]):
        time.sleep(0.3)
        ray.train.report({"loss": 10 * config["lr"] + 1.0 / (step + 1), "step": step})

base = {"steps": 20}"""
SWEEP = (
    "sweep = %train sweep lr_loss --param lr=grid(0.01,0.05) --trials 1 --concurrent 2"
    " --metric loss --workers 1 --config base --experiment sweep-browser"
)


def _notebook(path, *cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, path)


@pytest.mark.job
@pytest.mark.timeout(1500)
def test_the_dashboard_draws_in_jupyterlab_and_notebook_7(services, tmp_path):
    sources = tmp_path / "sources"  # each browser test uploads its copy into its own folder
    sources.mkdir()
    _notebook(
        sources / "dashboard-lab.ipynb",
        SETUP,
        LAUNCH,
        "job.wait(timeout=300)",
        "%train attach {job.id}",
        "%train reliability --experiment dashboard-browser --since 1d",
    )
    _notebook(tmp_path / "dashboard-nb7.ipynb", SETUP, LAUNCH)  # Notebook 7 opens it at the root
    _notebook(
        tmp_path / "sweep-lab.ipynb",
        SWEEP_SETUP,
        SWEEP,
        "sweep.wait(timeout=300)",
        "%train attach {sweep.id}",
    )
    env = browser_env(
        services.home,
        tmp_path,
        free_port(),
        TF_NOTEBOOKS=str(sources),
        JUPYTER_PATH=this_trees_panel(tmp_path / "jupyter"),  # the panel built from this tree
    )
    with jupyter_lab(env, tmp_path / "jupyterlab.log"):
        playwright("dashboard.spec.ts", env, timeout=840)
        shots = screenshots()  # each Playwright run starts a fresh test-results/
        playwright("dashboard-nb7.spec.ts", env, timeout=600)
        shots |= screenshots()
        playwright("sweep.spec.ts", env, timeout=540)  # a sweep's leaderboard, in the lab
        shots |= screenshots()
    expected = {"dashboard-running.png", "dashboard-ended.png", "dashboard-attach.png"}
    expected |= {"dashboard-summary.png", "nb7-running.png", "nb7-ended.png", "reliability.png"}
    expected |= {"sweep-running.png", "sweep-ended.png", "panel-sweep.png", "sweep-summary.png"}
    assert expected <= shots

    # the saved notebook keeps the summary as HTML, in the launch cell's outputs
    (lab_nb,) = [p for p in tmp_path.rglob("dashboard-lab.ipynb") if sources not in p.parents]
    saved = nbformat.read(lab_nb, as_version=4)
    html = [
        o["data"]["text/html"] for o in saved.cells[1].outputs if "text/html" in o.get("data", {})
    ]
    summary = [h for h in html if "trainfactory-summary" in h and "SUCCEEDED" in h]
    assert summary and "data:image/svg+xml;base64," in summary[0], html
    exported = subprocess.run(
        [str(BIN / "jupyter"), "nbconvert", "--to", "html", "--stdout", str(lab_nb)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "trainfactory-summary" in exported and "SUCCEEDED" in exported
    assert "data:image/svg+xml;base64," in exported
