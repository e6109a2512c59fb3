"""What per-step telemetry costs a training loop: no logging vs trainfactory.log vs report.

One two-worker Ray Train job (DDP over gloo, one torch thread per worker) runs the same
training step in alternating segments, A B C A B C ..., so that every mode sees the same
machine state:

- (a) no logging;
- (b) ``trainfactory.log({"loss": ...}, step=i)`` and ``trainfactory.step(...)`` every step;
- (c) ``ray.train.report({"loss": ...})`` every step (paced by the Ray Train controller's poll,
  every ``payload.REPORT_POLL_INTERVAL_S`` as trainfactory sets it; Ray's default is 2 s).

Each segment runs for ``--segment`` seconds; rank 0 measures steps/s with
``time.perf_counter``. Prints per-mode medians with their min-max spread and the ratios
``b/a`` (target >= 0.98) and ``c/a``. Runs on the embedded services (started if needed,
stopped at the end only if this script started them).

Usage: python benchmarks/overhead.py [--rounds 4] [--segment 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def overhead_loop(config):
    """Alternates the modes in segments; reports each segment's steps/s at the end."""
    import time

    import ray.train
    import ray.train.torch
    import torch

    import jupyter_trainfactory.train as trainfactory

    torch.set_num_threads(1)
    torch.manual_seed(0)
    width = config["width"]
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(config["layers"])])
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(config["batch"], width)
    rank = ray.train.get_context().get_world_rank()
    results: dict[str, list[float]] = {"a": [], "b": [], "c": []}
    step = 0

    def train_step():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    for _ in range(20):  # warm-up
        train_step()
    for _round in range(config["rounds"]):
        for mode in ("a", "b", "c"):
            # every rank must agree on when a segment ends: count steps, not seconds
            n = config["steps"][mode]
            t0 = time.perf_counter()
            for _ in range(n):
                step += 1
                if mode == "a":
                    train_step()
                elif mode == "b":
                    with trainfactory.step(samples=config["batch"]):
                        loss = train_step()
                    trainfactory.log({"loss": loss.item()}, step=step)
                else:
                    loss = train_step()
                    ray.train.report({"loss": loss.item(), "step": step})
            results[mode].append(n / (time.perf_counter() - t0))
    if rank == 0:
        print("OVERHEAD_RESULT " + json.dumps(results), flush=True)


def _calibrate(args) -> dict[str, int]:
    """Steps per segment: a and b last about ``args.segment`` s; c makes ``segment`` reports."""
    a_rate = args.expected_steps_per_s
    return {
        "a": max(20, int(a_rate * args.segment)),
        "b": max(20, int(a_rate * args.segment)),
        "c": max(4, int(args.segment)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--segment", type=float, default=8.0, help="seconds per segment (about)")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument(
        "--expected-steps-per-s", type=float, default=40.0, help="to size the a/b segments"
    )
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    import cloudpickle

    from jupyter_trainfactory import launch
    from jupyter_trainfactory import services as svc

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    before = svc.load_services()
    running = {n for n, p in (before.processes.items() if before else []) if p.alive()}
    svc.ensure_services()
    try:
        config = {
            "rounds": args.rounds,
            "width": args.width,
            "layers": args.layers,
            "batch": args.batch,
            "steps": _calibrate(args),
        }
        started = time.time()
        job = launch(overhead_loop, workers=2, config=config, experiment="benchmarks")
        state = job.wait(timeout=1800)
        logs = job.logs()
        line = next((x for x in logs.splitlines() if "OVERHEAD_RESULT " in x), None)
        if state != "SUCCEEDED" or line is None:
            print(f"job {job.id} ended {state}; log tail:\n{logs[-3000:]}")
            return 1
        results = json.loads(line.split("OVERHEAD_RESULT ", 1)[1])
    finally:
        mine = tuple(n for n in ("ray", "mlflow") if n not in running)
        if mine:
            svc.stop_services(mine)

    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"two workers, {os.cpu_count()} CPUs, {args.rounds} rounds of A B C, job {job.id}")
    print(f"(ran {time.time() - started:.0f} s including the job's start)")
    names = {
        "a": "(a) no logging",
        "b": "(b) trainfactory.log every step",
        "c": "(c) ray.train.report every step",
    }
    for key, label in names.items():
        values = results[key]
        print(
            f"{label:34s} median {med[key]:8.2f} steps/s"
            f"  (min {min(values):.2f}, max {max(values):.2f}, n={len(values)})"
        )
    ratio_b, ratio_c = med["b"] / med["a"], med["c"] / med["a"]
    paired = [b / a for a, b in zip(results["a"], results["b"], strict=True)]
    print(
        "b/a per round (each b segment right after its a): "
        + ", ".join(f"{r:.3f}" for r in paired)
        + f"; median {statistics.median(paired):.3f}"
    )
    print(f"b/a = {ratio_b:.3f}  (target >= 0.98: {'met' if ratio_b >= 0.98 else 'NOT met'})")
    print(f"c/a = {ratio_c:.4f}")
    out = {
        "steps_per_s": results,
        "median": med,
        "b_over_a": ratio_b,
        "b_over_a_paired_median": statistics.median(paired),
        "c_over_a": ratio_c,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
