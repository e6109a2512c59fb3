"""`jupyter trainfactory --help` as a user runs it: a real subprocess, no services."""

import subprocess
import sys
from pathlib import Path

CLI = [str(Path(sys.executable).parent / "jupyter"), "trainfactory"]


def _run(*args, timeout=60):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_help_at_every_level():
    assert "launch" in _run("--help").stdout
    for args in (["launch", "-h"], ["help", "launch"]):
        result = _run(*args)
        assert result.returncode == 0 and "--workers" in result.stdout, args
    result = _run("launch", "f.py:x", "--bogus")
    assert (
        result.stderr.strip()
        == "jupyter trainfactory: error: launch: unrecognized arguments: --bogus"
    )
