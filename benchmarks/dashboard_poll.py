"""Cost of one dashboard poll against a long run: latest values only vs the whole history.

The dashboard reads only the latest point of each metric per poll (one ``get_run``) and
the full history once, on attach. This measures both, side by side, on one MLflow run of
``--metrics`` keys x ``--steps`` steps in a SQLite store, and prints the ratio.

Usage: python benchmarks/dashboard_poll.py [--metrics 8] [--steps 5000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from mlflow import MlflowClient
from mlflow.entities import Metric

from jupyter_trainfactory.dashboard import JobDashboard, RunSource
from jupyter_trainfactory.runreads import metric_history


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", type=int, default=8)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        uri = f"sqlite:///{tmp}/mlflow.db"
        client = MlflowClient(uri)
        exp = client.create_experiment("bench", artifact_location=f"{tmp}/artifacts")
        run_id = client.create_run(exp).info.run_id
        keys = [f"metric_{i}" for i in range(args.metrics)]
        batch = []
        for step in range(1, args.steps + 1):
            batch += [Metric(k, 1.0 / step, step, step) for k in keys]
            if len(batch) >= 900:
                client.log_batch(run_id, metrics=batch)
                batch = []
        if batch:
            client.log_batch(run_id, metrics=batch)

        board = JobDashboard(source=RunSource(uri, run_id), start=False)
        latest, full = [], []
        for _ in range(args.repeats):  # alternate A B A B so drift hits both alike
            t = time.perf_counter()
            board.poll_once()
            latest.append(time.perf_counter() - t)
            t = time.perf_counter()
            for k in keys:
                metric_history(client, run_id, k)
            full.append(time.perf_counter() - t)
        board.close()

    a, b = statistics.median(latest), statistics.median(full)
    print(f"run: {args.metrics} metrics x {args.steps} steps, {args.repeats} repeats each")
    print(
        f"latest-only poll : median {a * 1e3:8.1f} ms (min {min(latest) * 1e3:.1f}, max {max(latest) * 1e3:.1f})"
    )
    print(
        f"full-history read: median {b * 1e3:8.1f} ms (min {min(full) * 1e3:.1f}, max {max(full) * 1e3:.1f})"
    )
    print(f"ratio full / latest: {b / a:.1f}x")


if __name__ == "__main__":
    main()
