"""benchmarks/dashboard_memory.py still runs, once in its short mode (no services): it
prints its ratio (its value is the full run's business, not a test's). The benchmarks that
run jobs are tested in tests/jobs/test_benchmarks.py."""

import importlib.util
import re
from pathlib import Path

from jupyter_trainfactory.dashboard.model import DEFAULT_MAX_POINTS

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dashboard_memory_short_mode_prints_a_ratio_and_bounded_sources(capsys):
    bench = _load("dashboard_memory")
    result = bench.main(["--points", "20000", "--first", "2000"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"ratio rss\(\d+\)/rss\(\d+\): \d+\.\d+", lines[-1]), lines[-1]
    assert float(lines[-1].rsplit(" ", 1)[1]) > 0  # its value is the full run's business
    assert result["fed"] >= 20000 and result["fed_first"] >= 2000
    # every key held and every plot line drawn, rolled over (thinned) but never past 2x
    assert len(result["model"]) == len(bench.KEYS) and len(result["sources"]) == 5
    for held in (*result["model"].values(), *result["sources"].values()):
        assert DEFAULT_MAX_POINTS <= held <= 2 * DEFAULT_MAX_POINTS
    assert any("bokeh source lengths" in line for line in lines)
