"""examples/quickstart.ipynb executed in a real kernel (nbclient): the main job, end to end."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).parents[2]


def _run_notebook(name: str, *settings: str) -> subprocess.CompletedProcess:
    """``examples/run_notebook.py examples/NAME`` in a real kernel; fails the test if a cell
    raises. ``settings``: ``NAME=VALUE`` overrides of its parameters cell (``--set``)."""
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "run_notebook.py"),
            str(ROOT / "examples" / name),
            "--timeout",
            "500",
            *(arg for setting in settings for arg in ("--set", setting)),
        ],
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.job
@pytest.mark.timeout(600)
def test_quickstart_notebook_reaches_090(services):
    result = _run_notebook("quickstart.ipynb")
    assert "SUCCEEDED, run FINISHED" in result.stdout
    accuracy = float(result.stdout.split("final validation accuracy: ")[1].split()[0])
    assert accuracy >= 0.90
    # the best checkpoint, registered under an alias, loads and predicts
    registered = result.stdout.split("models:/digits-quickstart@champion (version ")[1]
    assert float(registered.split("accuracy ")[1].split()[0]) >= 0.90
    # the executed copy keeps the dashboard's static summary: the launch cell's own output
    # (needs no kernel: nbconvert and a reopened notebook show it)
    executed = nbformat.read(ROOT / "examples" / "quickstart.out.ipynb", as_version=4)
    launch = next(
        c for c in executed.cells if c.cell_type == "code" and "%train launch" in c.source
    )
    html = [o["data"].get("text/html", "") for o in launch.outputs if "data" in o]
    summary = [h for h in html if "trainfactory-summary" in h]
    assert summary and "SUCCEEDED" in summary[0]
    assert summary[0].count("data:image/svg+xml;base64,") >= 2  # loss and val_accuracy


@pytest.mark.job
@pytest.mark.timeout(600)
def test_tiny_gpt_notebook_beats_the_unigram_entropy(services):
    """examples/tiny_gpt.ipynb: its last cell asserts, from the MLflow run, that the
    validation loss ends below the unigram entropy, that every step was logged once, and
    that tokens/s, allreduce time and checkpoint bandwidth were recorded. 35 s of training
    instead of the notebook's 75 (its claim holds with room: 2.12 against an entropy of
    3.11 nats/char at 35 s, 2026-12-07)."""
    result = _run_notebook("tiny_gpt.ipynb", "time_budget_s=35.0")
    assert ": SUCCEEDED," in result.stdout
    final, entropy = result.stdout.split("-> ")[1].split(
        " nats/char (unigram entropy of the validation text: "
    )
    assert float(final) < float(entropy.split(")")[0]) - 0.3
    assert "tokens/s per worker" in result.stdout and "MB/s" in result.stdout


@pytest.mark.job
@pytest.mark.timeout(600)
def test_ray_data_notebook_trains_from_parquet(services):
    """examples/ray_data.ipynb: the digits from Parquet through Ray Data on 2 workers; its
    last cell asserts the accuracy, the rows ingested and the data wait from MLflow."""
    result = _run_notebook("ray_data.ipynb")
    assert ": SUCCEEDED, run FINISHED" in result.stdout
    accuracy = float(result.stdout.split("final validation accuracy: ")[1].split()[0])
    assert accuracy >= 0.90
    assert "dataset train: [" in result.stdout and "dataset validation: [" in result.stdout


@pytest.mark.job
@pytest.mark.timeout(600)
def test_sweep_notebook_finds_a_digits_classifier_above_095(services):
    """examples/sweep.ipynb: 8 trials of the digits classifier under ASHA, one worker each,
    two at a time; its last cell asserts from MLflow 8 children and a best >= 0.95."""
    result = _run_notebook("sweep.ipynb")
    line = next(s for s in result.stdout.splitlines() if " trials (" in s)
    assert line.startswith("8 trials"), line
    best = float(line.split("best val_accuracy ")[1].split()[0])
    assert best >= 0.95, line
    executed = nbformat.read(ROOT / "examples" / "sweep.out.ipynb", as_version=4)
    shown = [
        o
        for c in executed.cells
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert shown, "the sweep cell showed no leaderboard widget"
