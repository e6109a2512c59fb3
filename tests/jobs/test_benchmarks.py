"""The benchmarks still run, each once in its short mode: it prints its ratio (its value
is the full run's business, not a test's). reliability_report starts its own MLflow server
(no Ray); the others run their jobs on the test session's cluster. dashboard_memory needs
no services: tests/unit/test_benchmark_dashboard_memory.py."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _run(name: str, *args: str) -> list[str]:
    """The benchmark's output lines, run as a script on the test session's cluster."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()


@pytest.mark.job
@pytest.mark.timeout(600)
def test_launch_latency_short_mode_prints_its_ratios(services):
    lines = _run("launch_latency", "--rounds", "1", "--steps", "2", "--warmup", "0")
    match = re.match(r"a/b = (\d+\.\d+) .*, c/b = (\d+\.\d+) ", lines[-1])
    assert match, lines[-1]
    assert all(float(x) > 0 for x in match.groups())
    assert sum(": first step" in line for line in lines) == 4  # a, c, b and w each measured
    assert any(re.match(r"w/b = \d+\.\d+ ", line) for line in lines), lines
    assert any(line.split()[:1] == ["RayTrainWorker"] for line in lines), lines  # the timeline
    assert sum("CPU of all processes" in line for line in lines) == 4
    assert sum("waited for idle CPUs before" in line for line in lines) == 4
    assert sum(line.split()[:1] == ["total"] for line in lines) == 2  # a's and b's tables


@pytest.mark.job
@pytest.mark.timeout(400)
def test_report_latency_short_mode_prints_its_ratio(services):
    lines = _run(
        "report_latency", "--rounds", "1", "--reports", "2", "--quiet", "1.5", "--only-tool"
    )
    match = re.match(r"\(t\) report with checkpoint / raw save = (\d+\.\d+) \((\d+) ms", lines[-1])
    assert match, lines[-1]
    assert float(match.group(1)) > 0
    assert any("controller CPU while polling" in line for line in lines)


@pytest.mark.job
@pytest.mark.timeout(500)
def test_recovery_short_mode_prints_its_ratio(services):
    lines = _run("recovery", "--rounds", "1")
    match = re.match(r"t/p = (\d+\.\d+) ", lines[-1])
    assert match, lines[-1]
    assert float(match.group(1)) > 0
    assert lines[-2].startswith("t/p round by round"), lines[-2]


@pytest.mark.timeout(300)
def test_reliability_report_short_mode_reads_every_run_through_the_server():
    # its own MLflow server in its own TRAINFACTORY_HOME: no Ray, not the session's services
    lines = _run("reliability_report", "--runs", "300")
    match = re.fullmatch(r"report time / 60 s = (\d+\.\d+) \((met|NOT met)\)", lines[-1])
    assert match, lines[-1]
    assert float(match.group(1)) > 0
    assert re.fullmatch(r"report: \d+\.\d s, 300 runs read, \d+ runs/s", lines[-2]), lines[-2]
    assert any(line.endswith("all experiments: 300 jobs") for line in lines), lines[:4]
    assert any(line.startswith("exposure:") and "GPU-days" in line for line in lines)
