"""Resident memory of one live dashboard fed a million points: does the rollover hold?

A live plot keeps at most ``2 * max_points`` points per line (``dashboard.model.thin``, in
the Python model and in the bokeh ``ColumnDataSource`` alike), so a kernel that watches a
long job must not grow. This builds the real ``JobDashboard`` (its ``DashboardModel``,
``PlotGrid`` figures, bokeh sources and jupyter_bokeh widgets; no kernel, so the widgets'
comm messages go nowhere) on a fake run source, with no MLflow server and no Ray, and
drives it with ``poll_once()`` as its poller does. Each poll's ``Snapshot`` holds
``--batch`` new ``MetricPoint``\\ s spread over a few keys: a user metric (``loss``),
``train/loss``, throughput, the step time split, and a node's CPU utilization and host
memory (each key gets the next ``batch / keys`` steps).

RSS (psutil, MiB, after ``gc.collect()``) is read after ``--first`` points (the warm-up:
imports, first figures, first rollovers) and after ``--points`` points. Prints both, the
lengths of every model series and bokeh source at the end (bounded: about
``max_points`` to ``2 * max_points``), and, on its last line, the ratio
rss(points) / rss(first) (goal: <= 1.10).

Usage: python benchmarks/dashboard_memory.py [--points 1000000] [--first 10000]
       [--batch 1000] [--max-points 500] [--json PATH]
Short: python benchmarks/dashboard_memory.py --points 20000 --first 2000
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from jupyter_trainfactory.dashboard import JobDashboard, Snapshot  # noqa: E402
from jupyter_trainfactory.dashboard.model import DEFAULT_MAX_POINTS  # noqa: E402
from jupyter_trainfactory.jobstate import JobInfo  # noqa: E402
from jupyter_trainfactory.runreads import MetricPoint  # noqa: E402

#: The keys fed: one user metric, train/* series (throughput and the step time split
#: make plots; train/loss is a series only) and two per-node system series.
KEYS = (
    "loss",
    "train/loss",
    "train/samples_per_s",
    "train/step_time_s",
    "train/data_wait_fraction",
    "train/comm_fraction",
    "system/node-1/cpu_utilization",
    "system/node-1/memory_used_mb",
)


class FakeSource:
    """A RunSource-like feed: each ``snapshot()`` is the next ``steps_per_poll`` steps of
    every key of :data:`KEYS` (``len(KEYS) * steps_per_poll`` points), 0.1 s per step."""

    def __init__(self, steps_per_poll: int):
        self.run_id = "r-bench"
        self.tracking_uri = ""
        self.steps_per_poll = steps_per_poll
        self.step = 0
        self.t0_ms = int(time.time() * 1000)
        self.info = JobInfo(
            job_id="tf-bench000",
            name="bench",
            state="RUNNING",
            owner="me",
            experiment_id="1",
            run_id=self.run_id,
            run_status="RUNNING",
            submission_id="",
            step=None,
            started=self.t0_ms / 1000,
            ended=None,
            reason="",
            error="",
            checkpoint_path="",
            checkpoint_step=None,
            run_url="",
        )

    def snapshot(self) -> Snapshot:
        points = []
        for _ in range(self.steps_per_poll):
            self.step += 1
            s, ts = self.step, self.t0_ms + 100 * self.step
            values = (1.0 / s, 1.0 / s, 500.0 + s % 7, 0.1, 0.2, 0.3, 40.0 + s % 50, 2048.0)
            points += [MetricPoint(k, v, s, ts) for k, v in zip(KEYS, values, strict=True)]
        return Snapshot(self.info, points, {})

    def history(self, keys, max_points):
        return {}


def rss_mib() -> float:
    """This process's resident set size in MiB, after a full garbage collection."""
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def lengths(board: JobDashboard) -> dict[str, dict[str, int]]:
    """Points held per model series and rows per bokeh source (``plot:line``)."""
    model = {k: len(v) for k, v in {**board.model.series, **board.model.timeseries}.items()}
    sources = {}
    for grid in (board._user, board._system, board._cost):
        for plot_id, lines in grid.sources.items():
            for line, cds in lines.items():
                sources[f"{plot_id}:{line}" if line else plot_id] = len(cds.data["x"])
    return {"model": model, "sources": sources}


def run(points: int, first: int, batch: int, max_points: int) -> dict:
    """Feed one dashboard ``points`` points in polls of ``batch``; RSS after ``first``."""
    steps_per_poll = max(1, batch // len(KEYS))
    source = FakeSource(steps_per_poll)
    board = JobDashboard(source=source, max_points=max_points, start=False, history=False)
    fed = lambda: source.step * len(KEYS)  # noqa: E731
    t = time.perf_counter()
    while fed() < first:
        board.poll_once()
    rss_first, fed_first = rss_mib(), fed()
    while fed() < points:
        board.poll_once()
    rss_last, fed_last = rss_mib(), fed()
    seconds = time.perf_counter() - t
    held = lengths(board)
    board.close()
    return {
        "keys": len(KEYS),
        "batch": steps_per_poll * len(KEYS),
        "polls": board.model.polls,
        "max_points": max_points,
        "fed_first": fed_first,
        "fed": fed_last,
        "rss_first_mib": round(rss_first, 1),
        "rss_last_mib": round(rss_last, 1),
        "ratio": round(rss_last / rss_first, 4),
        "seconds": round(seconds, 1),
        **held,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=1_000_000, help="points fed in all")
    parser.add_argument("--first", type=int, default=10_000, help="points before the 1st RSS")
    parser.add_argument("--batch", type=int, default=1000, help="points per poll")
    parser.add_argument("--max-points", type=int, default=DEFAULT_MAX_POINTS)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    if not 0 < args.first < args.points:
        parser.error("need 0 < --first < --points")

    r = run(args.points, args.first, args.batch, args.max_points)
    print(
        f"dashboard: {r['keys']} keys, {r['batch']} points per poll, {r['polls']} polls,"
        f" max_points {r['max_points']}, {r['seconds']} s"
    )
    print(f"rss after {r['fed_first']} points: {r['rss_first_mib']:.1f} MiB")
    print(f"rss after {r['fed']} points: {r['rss_last_mib']:.1f} MiB")
    print("model series lengths : " + ", ".join(f"{k} {n}" for k, n in r["model"].items()))
    print("bokeh source lengths : " + ", ".join(f"{k} {n}" for k, n in r["sources"].items()))
    if args.json:
        args.json.write_text(json.dumps(r, indent=2) + "\n")
    print(f"ratio rss({r['fed']})/rss({r['fed_first']}): {r['ratio']:.4f}")
    return r


if __name__ == "__main__":
    main()
