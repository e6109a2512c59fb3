"""A real ``%train poc --quick`` on the embedded cluster (gloo, 2 CPU workers): every
stage's figures, the MLflow run in ``trainfactory-poc`` with its metrics and the HTML and
JSON artifacts, the recovery's MTTR, and the report opened in Debian's chromium (the
screenshot is kept in labextension/ui-tests/test-results-kept/poc-report.png)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest
from browser import KEPT
from conftest import ipython_shell
from IPython.core.error import UsageError

from jupyter_trainfactory.dashboard.plots import PALETTE
from jupyter_trainfactory.poc.checks import NA, PASS

pytestmark = pytest.mark.job


@pytest.fixture(scope="module")
def shell(manager):
    ip = ipython_shell()
    ip.run_line_magic("load_ext", "jupyter_trainfactory")
    return ip


def test_bad_thresholds_file_is_one_sentence_and_submits_nothing(shell, tmp_path, manager):
    bad = tmp_path / "t.toml"
    bad.write_text("[thresholds]\nallreduce = { min = 1 }\n")
    before = len(manager.list(all_users=True))
    with pytest.raises(UsageError, match="unknown checks: allreduce"):
        shell.run_line_magic("train", f"poc --quick --thresholds {bad}")
    assert len(manager.list(all_users=True)) == before


@pytest.mark.timeout(420)
def test_quick_poc_measures_every_stage_and_writes_its_report(shell, tmp_path, mlflow_client):
    page = tmp_path / "poc.html"
    report = shell.run_line_magic("train", f"poc --quick --html {page}")
    text = report.text()
    print(text)
    assert report.state == "SUCCEEDED", text
    checks = {c.name: c for c in report.checks}
    for name in (
        "nodes_healthy",
        "compute_tflops",
        "allreduce_busbw_gb_per_s",
        "all_gather_busbw_gb_per_s",
        "reduce_scatter_busbw_gb_per_s",
        "tokens_per_s_per_accelerator",
        "mfu_measured_peak",
        "comm_fraction",
        "checkpoint_save_gb_per_s",
        "checkpoint_restore_gb_per_s",
        "recovery_mttr_s",
        "steps_lost",
    ):
        assert checks[name].status != NA and checks[name].value > 0, (name, text)
    # killed 5 steps after a checkpoint, read from the failure record as the report says:
    # 4 when the kill step's own point did not reach the run, 6 when rank 0's next one did
    run = mlflow_client.get_run(report.run_id)
    (record, *_) = json.loads(run.data.tags["trainfactory.faults.records"])
    # the poc's own kill is a drill (issue 48, 7): the dying rank told the recorder first
    assert record["kind"] == "worker_crash" and record.get("drill") is True, record
    counts = json.loads(run.data.tags["trainfactory.faults.counts"])
    assert counts["kinds"] == {} and counts["drills"] == {"worker_crash": 1}, counts
    assert "cost/infrastructure_recovery_usd" not in run.data.metrics
    lost = record["step_reached"] - record["restored_step"]
    assert checks["steps_lost"].value == lost and 4 <= lost <= 6, (record, text)
    assert checks["recovery_mttr_s"].status == PASS, text
    assert report.passed, text  # this machine passes the shipped CPU floors
    # the run: experiment trainfactory-poc, every figure a metric, the report's artifacts
    run = mlflow_client.get_run(report.run_id)
    experiment = mlflow_client.get_experiment(run.info.experiment_id)
    assert experiment.name == "trainfactory-poc"
    assert run.data.metrics["poc/passed"] == 1.0
    assert run.data.metrics["poc/check/recovery_mttr_s"] == checks["recovery_mttr_s"].value
    assert run.data.tags["trainfactory.poc.nodes"] == "1"
    artifacts = {a.path for a in mlflow_client.list_artifacts(report.run_id, "poc")}
    assert artifacts == {"poc/report.html", "poc/report.json"}
    # the same report read back from the run, beside itself: every ratio 1
    side = shell.run_line_magic("train", f"poc --compare {report.run_id} {report.job_id}")
    assert side is None
    # the page opens in a real browser, BokehJS inlined (no network here)
    shot = tmp_path / "poc-report.png"
    done = subprocess.run(
        [
            shutil.which("chromium") or "/usr/bin/chromium",
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,1500",
            "--virtual-time-budget=8000",
            f"--screenshot={shot}",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shot.exists(), done.stderr[-2000:]
    KEPT.mkdir(parents=True, exist_ok=True)
    shutil.copy2(shot, KEPT / shot.name)
    # BokehJS drew the bandwidth curves: each collective's line colour is on the page
    from PIL import Image

    colours = {rgb for _, rgb in Image.open(shot).convert("RGB").getcolors(1 << 24)}
    for hex_colour in PALETTE[:3]:  # all-gather, allreduce, reduce-scatter
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        assert rgb in colours, f"no {hex_colour} line in the screenshot {KEPT / shot.name}"
