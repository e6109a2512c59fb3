"""`jupyter trainfactory` as a user runs it: a real subprocess."""

import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]  # tests/
CLI = [str(Path(sys.executable).parent / "jupyter"), "trainfactory"]


def _run(*args, timeout=240):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args, message",
    [
        (["launch", "nofile.py:train"], "No such file: nofile.py"),
        (["launch", "no_colon.py"], "launch takes path/to/file.py:function"),
        (["launch", f"{TESTS}/train_fns.py:missing"], "defines no 'missing'"),
        (["launch", f"{TESTS}/train_fns.py:short_loop", "--workers", "-1"], "at least 1"),
        (["status"], "status needs a job id"),
        (["bogus"], "invalid choice"),
        (
            ["sweep", f"{TESTS}/train_fns.py:sweep_loop", "--param", "lr=exp(1)", "--metric", "m"],
            "exp() is not one of",
        ),
        (
            ["sweep", f"{TESTS}/train_fns.py:sweep_loop", "--param", "lr=grid(1,2)"],
            "needs --metric",
        ),
    ],
)
def test_bad_input_is_one_line_exit_2(services, args, message):
    result = _run(*args)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.job
@pytest.mark.timeout(300)
def test_launch_a_file_function_and_wait(services):
    result = _run(
        "launch",
        f"{TESTS}/train_fns.py:short_loop",
        "--workers",
        "1",
        "--config",
        "{'steps': 3}",
        "--experiment",
        "cli",
        "--wait",
    )
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.split()[1]
    assert f"job {job_id}: SUCCEEDED" in result.stdout
    listed = _run("list")
    assert job_id in listed.stdout and "SUCCEEDED" in listed.stdout
    status = _run("status", job_id)
    assert "SUCCEEDED" in status.stdout and "step: 3" in status.stdout
    assert "Running entrypoint" in _run("logs", job_id, "--tail", "200").stdout
    refused = _run("resume", job_id)
    assert refused.returncode == 2
    assert "SUCCEEDED; only a STOPPED or FAILED job can be resumed" in refused.stderr
    refused = _run("chaos", job_id, "--kill-worker", "0")
    assert refused.returncode == 2 and "chaos needs a RUNNING job" in refused.stderr
