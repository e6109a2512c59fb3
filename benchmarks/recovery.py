"""How long a job takes to recover from a killed worker, next to plain Ray Train.

The same two-worker function steps every ``--step-s`` s and reports a checkpoint every 5
steps; in its first attempt, rank 1 kills its own process (SIGKILL) at step ``--kill-at``
(the last checkpoint is then 5 steps old). Ray Train restarts the worker group from that
checkpoint (``FailureConfig(max_failures=1)`` in both). Measured: the time from the kill
(written to a file just before it) to the end of the first step after the restart (rank 0,
``time.time()``), in alternated rounds:

- (t) ``trainfactory.launch(fn, workers=2, max_failures=1)``;
- (p) ``TorchTrainer(fn, ..., failure_config=FailureConfig(max_failures=1)).fit()`` in a
  new driver process on the same cluster, with the same controller poll interval
  (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` = ``payload.REPORT_POLL_INTERVAL_S``): the
  difference is what trainfactory's recorder and callbacks add.

Each measurement starts once the machine's CPUs are idle (``common.settle``). This
script asks (t) its state every second meanwhile (``Job.wait``), as a notebook that
watches the job does; each ask costs the MLflow server's and Ray dashboard's CPU on the
same node. ``--quiet`` asks nothing until the job has recovered (the marks file), as
(p)'s driver is not asked either. Prints both
medians with their spread, t/p round by round (a round's t and p ran back to back), and
on the last line the ratio of the medians, t/p (goal <= 1.1).

Usage: python benchmarks/recovery.py [--rounds 3]  (short mode: --rounds 1)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import embedded_services, plain_fit, settle, spread  # noqa: E402


def recovery_fn(config):
    """Steps, checkpoints every 5 steps; rank 1 dies at ``kill_at`` in the first attempt;
    rank 0 writes the end of its first step after a restore to ``<marks>/recovered``."""
    import os
    import signal
    import tempfile
    import time

    import ray.train
    import torch

    rank = ray.train.get_context().get_world_rank()
    start, restored = 0, ray.train.get_checkpoint()
    if restored:
        with restored.as_directory() as d:
            start = torch.load(os.path.join(d, "state.pt"))["step"]
    for step in range(start + 1, config["steps"] + 1):
        time.sleep(config["step_s"])
        if restored and step == start + 1 and rank == 0:
            with open(os.path.join(config["marks"], "recovered"), "w") as fh:
                fh.write(repr(time.time()))
        if not restored and rank == 1 and step == config["kill_at"]:
            with open(os.path.join(config["marks"], "killed"), "w") as fh:
                fh.write(repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        checkpoint = None
        with tempfile.TemporaryDirectory() as d:
            if step % 5 == 0 and rank == 0:
                torch.save({"step": step}, os.path.join(d, "state.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            if step % 5 == 0:
                ray.train.report({"step": step}, checkpoint=checkpoint)


def _recovery_s(marks: Path) -> float:
    return float((marks / "recovered").read_text()) - float((marks / "killed").read_text())


def via_trainfactory(config: dict) -> float:
    from jupyter_trainfactory import launch

    job = launch(recovery_fn, workers=2, config=config, max_failures=1, experiment="benchmarks")
    if config.get("quiet"):  # the job is not asked its state until it has recovered
        recovered = Path(config["marks"]) / "recovered"
        deadline = time.monotonic() + 900
        while not recovered.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    state = job.wait(timeout=900)
    if state != "SUCCEEDED":
        raise SystemExit(f"job {job.id} ended {state}; log tail:\n{job.logs()[-3000:]}")
    return _recovery_s(Path(config["marks"]))


def via_plain_ray(services, config: dict, scratch: Path) -> float:
    from jupyter_trainfactory.payload import HEALTH_CHECK_ENV, REPORT_POLL_INTERVAL_S

    env = {HEALTH_CHECK_ENV: str(REPORT_POLL_INTERVAL_S)}
    plain_fit(services, recovery_fn, config, scratch, max_failures=1, env=env)
    return _recovery_s(Path(config["marks"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.05)
    parser.add_argument("--kill-at", type=int, default=20)
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="(t): do not ask the job's state until it has recovered",
    )
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict[str, list[float]] = {"t": [], "p": []}
    started = time.time()
    with embedded_services() as services:
        for _ in range(args.rounds):
            for mode in ("t", "p"):
                with tempfile.TemporaryDirectory() as scratch:
                    config = {
                        "steps": args.kill_at + 10,
                        "kill_at": args.kill_at,
                        "step_s": args.step_s,
                        "marks": scratch,
                        "quiet": args.quiet,
                    }
                    settle()  # the job before it has ended its processes
                    if mode == "t":
                        results[mode].append(via_trainfactory(config))
                    else:
                        results[mode].append(via_plain_ray(services, config, Path(scratch)))

    print(f"two workers, rank 1 killed at step {args.kill_at}, checkpoint 5 steps before")
    print(
        "(t) not asked its state until it recovered"
        if args.quiet
        else "(t) its state asked every second"
    )
    print(f"{args.rounds} round(s) of t p (ran {time.time() - started:.0f} s)")
    print(spread("(t) trainfactory: kill to next step", results["t"], "s"))
    print(spread("(p) plain Ray Train: kill to next step", results["p"], "s"))
    med = {k: statistics.median(v) for k, v in results.items()}
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": results, "median": med}, indent=2))
    pairs = [t / p for t, p in zip(results["t"], results["p"], strict=True)]
    print(spread("t/p round by round", pairs, "", 2))  # each pair ran back to back
    ratio = med["t"] / med["p"]
    print(f"t/p = {ratio:.2f} (goal <= 1.1: {'met' if ratio <= 1.1 else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
