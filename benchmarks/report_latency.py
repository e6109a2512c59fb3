"""What a checkpoint report costs a training loop, next to the raw save it carries.

One two-worker Ray Train job runs, ``--reports`` times, on every rank:

- (raw) ``torch.save`` of the state (a model and Adam state, about the quickstart's
  0.12 MB) to a local file;
- (ckpt) the same ``torch.save`` into a fresh directory and ``ray.train.report(metrics,
  checkpoint=...)`` (rank 0 passes the checkpoint, as the quickstart does);
- (plain) ``ray.train.report(metrics)`` without a checkpoint;

then a quiet phase of ``--quiet`` seconds of compute without reports, during which this
script samples the CPU time of the job's Ray Train controller (psutil, every 0.2 s): the
cost of its polling. ``report`` blocks until the controller has taken the previous result
(``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, Ray's default 2 s,
ray/train/v2/_internal/execution/controller/controller.py ``_poll_workers``).

Each round runs two jobs side by side: (t) as trainfactory launches it (the poll interval
it sets, ``payload.REPORT_POLL_INTERVAL_S``) and (r) with the user's own setting
``env={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "2.0"}`` (Ray's default, kept as given). The
last line is the ratio (t) checkpoint report / raw save.

Usage: python benchmarks/report_latency.py [--rounds 3] [--reports 10] [--quiet 10]
       (short mode, as ``make test`` runs it: --rounds 1 --reports 3 --quiet 2 --only-tool)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import embedded_services, spread  # noqa: E402

RAY_DEFAULT = "2.0"


def report_loop(config):
    """Times raw saves, checkpoint reports and plain reports; prints them on rank 0."""
    import json
    import os
    import tempfile
    import time

    import ray.train
    import torch

    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(8, 64)).sum().backward()
    opt.step()  # Adam's state exists: the saved size is the quickstart's
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": 0}
    rank = ray.train.get_context().get_world_rank()
    out = {"raw": [], "ckpt": [], "plain": [], "bytes": 0}
    scratch = tempfile.mkdtemp()
    for i in range(config["reports"]):
        t0 = time.perf_counter()
        torch.save(state, os.path.join(scratch, "state.pt"))
        out["raw"].append(time.perf_counter() - t0)
        out["bytes"] = os.path.getsize(os.path.join(scratch, "state.pt"))
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                torch.save(state, os.path.join(d, "state.pt"))
                ckpt = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"step": 2 * i + 1}, checkpoint=ckpt)
        out["ckpt"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ray.train.report({"step": 2 * i + 2})
        out["plain"].append(time.perf_counter() - t0)
    out["quiet"] = [time.time()]
    x = torch.randn(64, 64)
    while time.time() - out["quiet"][0] < config["quiet"]:
        model(x).sum().backward()
    out["quiet"].append(time.time())
    if rank == 0:
        print("REPORT_RESULT " + json.dumps(out), flush=True)


class ControllerCpu:
    """Samples the CPU seconds of the newest ``ray::TrainController`` process started after
    ``since`` (this machine's local head), every ``every`` s, in a thread."""

    def __init__(self, since: float, every: float = 0.2):
        self.since, self.every = since, every
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _find(self):
        import psutil

        found = None
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            cmd = " ".join(proc.info["cmdline"] or [])
            created = proc.info["create_time"] or 0
            newest = found is None or created > found.info["create_time"]
            if "TrainController" in cmd and created >= self.since - 1 and newest:
                found = proc
        return found

    def _run(self) -> None:
        import psutil

        proc = None
        while not self._stop.wait(self.every):
            try:
                proc = proc or self._find()
                if proc is not None:
                    cpu = proc.cpu_times()
                    self.samples.append((time.time(), cpu.user + cpu.system))
            except psutil.Error:
                proc = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def share(self, start: float, end: float) -> float | None:
        """CPU seconds per second between the samples nearest inside ``[start, end]``."""
        inside = [s for s in self.samples if start <= s[0] <= end]
        if len(inside) < 2 or inside[-1][0] - inside[0][0] < 0.5:
            return None
        return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def run_job(args, interval: str | None) -> dict:
    """One job; ``interval`` None: as trainfactory launches it, else the user's setting."""
    import os

    from jupyter_trainfactory import launch
    from jupyter_trainfactory.payload import HEALTH_CHECK_ENV

    os.environ.pop(HEALTH_CHECK_ENV, None)  # this process's own setting would be the job's
    env = {HEALTH_CHECK_ENV: interval} if interval else None
    cpu = ControllerCpu(time.time())
    config = {"reports": args.reports, "quiet": args.quiet}
    job = launch(report_loop, workers=2, config=config, experiment="benchmarks", env=env)
    state = job.wait(timeout=900)
    cpu.stop()
    logs = job.logs()
    line = next((x for x in logs.splitlines() if "REPORT_RESULT " in x), None)
    if state != "SUCCEEDED" or line is None:
        raise SystemExit(f"job {job.id} ended {state}; log tail:\n{logs[-3000:]}")
    out = json.loads(line.split("REPORT_RESULT ", 1)[1])
    out["controller_cpu"] = cpu.share(*out["quiet"])
    out["job"] = job.id
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reports", type=int, default=10)
    parser.add_argument("--quiet", type=float, default=10.0, help="seconds without reports")
    parser.add_argument("--only-tool", action="store_true", help="skip the (r) jobs")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    import cloudpickle

    from jupyter_trainfactory.payload import REPORT_POLL_INTERVAL_S

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    modes = {"t": None} if args.only_tool else {"t": None, "r": RAY_DEFAULT}
    rounds: dict[str, list[dict]] = {m: [] for m in modes}
    started = time.time()
    with embedded_services():
        for _ in range(args.rounds):
            for mode, interval in modes.items():
                rounds[mode].append(run_job(args, interval))

    print(f"two workers, {args.rounds} round(s), {args.reports} reports per job")
    print(f"(ran {time.time() - started:.0f} s including the jobs' starts)")
    size = rounds["t"][0]["bytes"] / 1e6
    names = {
        "t": f"(t) trainfactory, {REPORT_POLL_INTERVAL_S} s",
        "r": f"(r) user's {RAY_DEFAULT} s",
    }
    summary: dict[str, dict[str, float]] = {}
    for mode in modes:
        per = {k: [statistics.median(r[k]) for r in rounds[mode]] for k in ("raw", "ckpt", "plain")}
        cpus = [r["controller_cpu"] for r in rounds[mode] if r["controller_cpu"] is not None]
        print(f"{names[mode]}: checkpoint of {size:.2f} MB")
        print(spread("  raw torch.save", [v * 1e3 for v in per["raw"]], "ms"))
        print(spread("  report with checkpoint", [v * 1e3 for v in per["ckpt"]], "ms"))
        print(spread("  report without checkpoint", [v * 1e3 for v in per["plain"]], "ms"))
        if cpus:
            print(spread("  controller CPU while polling", [c * 100 for c in cpus], "% of a core"))
        summary[mode] = {
            "raw_s": statistics.median(per["raw"]),
            "ckpt_s": statistics.median(per["ckpt"]),
            "plain_s": statistics.median(per["plain"]),
            "controller_cpu": statistics.median(cpus) if cpus else float("nan"),
        }
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=2))
    ratio = summary["t"]["ckpt_s"] / summary["t"]["raw_s"]
    ckpt_ms = summary["t"]["ckpt_s"] * 1e3
    print(
        f"(t) report with checkpoint / raw save = {ratio:.2f} ({ckpt_ms:.0f} ms;"
        f" goal <= 1.5 or under 300 ms: {'met' if ratio <= 1.5 or ckpt_ms < 300 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
