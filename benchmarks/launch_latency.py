"""How long a launch takes to its first training step, next to a plain Ray Train ``fit()``.

The same small two-worker function (a DDP-prepared linear model, gloo on CPU) runs, in
alternated rounds, on the same cluster (the embedded Ray head), warmed first by one launch
that is not measured (``--warmup 0``: none), each measurement started once the machine's
CPUs are idle (:func:`settle`):

- (a) ``trainfactory.launch(fn, workers=2)`` from this process, to the first step of rank 0;
- (c) right after (a), a second launch of the same function with nothing changed;
- (b) ``TorchTrainer(fn, scaling_config=ScalingConfig(num_workers=2)).fit()`` in a new
  driver process connected to the same cluster (``RAY_ADDRESS`` and its token), from the
  process's start to the first step of rank 0;
- (w) the same ``fit()`` in a driver process kept warm: started (interpreter, ``import
  ray.train``, ``ray.init``) and, unless ``--warmup 0``, one fit run before the rounds;
  from its ``fit()`` call to the first step of rank 0. It measures what "a warm driver"
  could take off a launch: everything left is Ray Train's controller and worker group.

Rank 0 prints the wall-clock time (``time.time()``) at which the function was entered and
at which its first step ended; each figure is that time minus the moment this script
called ``launch`` (a, c) or started the driver process (b). Prints the medians, their
min-max spread, (a)'s and (b)'s last round's actors from Ray's state API
(``launch_timeline.py``: when each was asked for, got its process and was ready), the CPU
seconds every process on this machine used from the round's start to its first step (in
all, and by process for (a)'s and (b)'s last round: on a 2-CPU node the launch is bound by
CPU, so what each process costs is where the seconds go), each round's a/b, c/b and w/b,
w/b of the medians, and on the last line a/b and c/b of the medians (goals: a/b <= 1.0,
c/b <= 0.5).

The CPU table's rows: an actor class (its ``__init__`` and methods, in its own process),
``worker start`` (a Ray worker process before it takes its actor: the interpreter,
``import ray``, the actor class's imports), ``driver`` (the job's, or the plain
``fit()``'s), ``this benchmark`` (its ``launch``, ``wait`` and sampling), ``Ray system``
(raylet, GCS, dashboard, agents), ``MLflow server`` and ``(the rest)``, the classes past
the first nine. Ray Train V2's own actors appear under their names (``DatasetManager``,
``PreemptionWatcher``, Ray Data's ``_AutoscalingCoordinatorActor``).

Usage: python benchmarks/launch_latency.py [--rounds 3] [--steps 5] [--warmup 1]
(short mode: --rounds 1 --steps 2 --warmup 0)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import WarmDriver, embedded_services, plain_fit, settle, spread  # noqa: E402
from launch_timeline import (  # noqa: E402
    CpuByProcess,
    cpu_lines,
    creation_events,
    job_events,
    timeline_lines,
)

MARK = "FIRST_STEP "


def first_step_fn(config):
    """A few DDP steps; rank 0 prints when it was entered and when its first step ended."""
    import json
    import time

    entered = time.time()
    import ray.train
    import ray.train.torch
    import torch

    torch.set_num_threads(1)
    model = ray.train.torch.prepare_model(torch.nn.Linear(32, 32))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 32)
    for i in range(config["steps"]):
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i == 0 and ray.train.get_context().get_world_rank() == 0:
            print(MARK + json.dumps({"entered": entered, "first_step": time.time()}), flush=True)
    ray.train.report({"loss": loss.item()})


def _marks(text: str, t0: float) -> dict[str, float]:
    line = next((x for x in text.splitlines() if MARK in x), None)
    if line is None:
        raise SystemExit(f"no {MARK.strip()} line; output tail:\n{text[-3000:]}")
    times = json.loads(line.split(MARK, 1)[1])
    return {k: v - t0 for k, v in times.items()}


def via_trainfactory(steps: int) -> dict[str, float]:
    from jupyter_trainfactory import launch

    t0 = time.time()
    job = launch(first_step_fn, workers=2, config={"steps": steps}, experiment="benchmarks")
    submitted = time.time() - t0
    state = job.wait(timeout=900)
    logs = job.logs()
    if state != "SUCCEEDED":
        raise SystemExit(f"job {job.id} ended {state}; log tail:\n{logs[-3000:]}")
    marks = {"submitted": submitted, **_marks(logs, t0)}
    marks["timeline"] = _timeline(lambda: creation_events(job), t0, "launch() was called")
    return marks


def _timeline(events, t0: float, since: str) -> list[str]:
    """The timeline lines of ``events()`` (launch_timeline.py), or one line saying why
    there are none: a diagnostic, the ratio does not depend on it."""
    try:
        return timeline_lines(events(), t0, since)
    except Exception as exc:
        return [f"    (no timeline: {exc})"]


def via_plain_ray(services, steps: int, scratch: Path) -> dict[str, float]:
    t0, output = plain_fit(services, first_step_fn, {"steps": steps}, scratch)

    def events():  # the same actors as (a)'s, of the plain driver's Ray job
        from jupyter_trainfactory.rayjobs import RayClients

        ray_job_id = next(x for x in output.splitlines() if x.startswith("PLAIN_JOB_ID "))
        ray = RayClients(services.dashboard_url, services)
        return job_events(ray.address, ray.headers(ray.address), ray_job_id.split()[1])

    marks = _marks(output, t0)
    marks["timeline"] = _timeline(events, t0, "the driver process started")
    return marks


def via_warm_driver(driver: WarmDriver) -> dict[str, float]:
    t0, output = driver.fit(MARK)
    return _marks(output, t0)


def with_cpu(measure, *args) -> dict[str, float]:
    """``measure(*args)``'s marks, once the machine is idle (:func:`settle`; ``settled``:
    the seconds waited), with ``cpu`` (``{process class: CPU s}`` of every process on this
    machine from the round's start to its first step) added."""
    settled = settle()
    cpu = CpuByProcess().start()
    started = time.time()
    try:
        marks = measure(*args)
    finally:
        cpu.stop()
    marks["cpu"] = cpu.upto(started + marks["first_step"])
    marks["settled"] = settled
    return marks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured launches first")
    parser.add_argument("--json", help="also write the result here")
    args = parser.parse_args(argv)

    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    results: dict[str, list[dict[str, float]]] = {"a": [], "c": [], "b": [], "w": []}
    started = time.time()
    with (
        embedded_services() as services,
        tempfile.TemporaryDirectory() as scratch,
        WarmDriver(services, first_step_fn, {"steps": args.steps}, Path(scratch)) as warm,
    ):
        for _ in range(args.warmup):  # the first launch on fresh services is not measured
            via_trainfactory(args.steps)
            via_warm_driver(warm)
        for _ in range(args.rounds):
            results["a"].append(with_cpu(via_trainfactory, args.steps))
            results["c"].append(with_cpu(via_trainfactory, args.steps))
            results["b"].append(with_cpu(via_plain_ray, services, args.steps, Path(scratch)))
            results["w"].append(with_cpu(via_warm_driver, warm))

    print(f"two workers, {os.cpu_count()} CPUs, {args.rounds} round(s) of a c b w")
    print(f"(ran {time.time() - started:.0f} s)")
    names = {
        "a": "(a) trainfactory.launch",
        "c": "(c) the same launch again",
        "b": "(b) plain fit()",
        "w": "(w) fit() in a warm driver",
    }
    for key, label in names.items():
        print(spread(f"{label}: first step", [r["first_step"] for r in results[key]], "s"))
        print(spread("    function entered", [r["entered"] for r in results[key]], "s"))
        if key in ("a", "c"):
            print(spread("    launch() returned", [r["submitted"] for r in results[key]], "s"))
        cpu = [sum(r["cpu"].values()) for r in results[key]]
        print(spread("    CPU of all processes", cpu, "s", 1))
        print(
            spread("    waited for idle CPUs before", [r["settled"] for r in results[key]], "s", 1)
        )
    for key in ("a", "b"):
        print(f"({key})'s last round, from Ray's state API:")
        print("\n".join(results[key][-1].pop("timeline")))
        print(f"({key})'s last round, CPU s to the first step by process:")
        print("\n".join(cpu_lines(results[key][-1]["cpu"])))
    for rounds in results.values():
        for r in rounds:
            r.pop("timeline", None)
    med = {k: statistics.median(r["first_step"] for r in v) for k, v in results.items()}
    if args.json:
        Path(args.json).write_text(json.dumps({"rounds": results, "median": med}, indent=2))
    a_b, c_b = med["a"] / med["b"], med["c"] / med["b"]
    for key in ("a", "c", "w"):  # each round's pair ran back to back: the machine's drift cancels
        rounds = zip(results[key], results["b"], strict=True)
        pairs = [r["first_step"] / b["first_step"] for r, b in rounds]
        print(spread(f"{key}/b round by round", pairs, "", 2))
    print(f"w/b = {med['w'] / med['b']:.2f} (a warm driver, for comparison)")
    print(
        f"a/b = {a_b:.2f} (goal <= 1.0: {'met' if a_b <= 1.0 else 'NOT met'}),"
        f" c/b = {c_b:.2f} (goal <= 0.5: {'met' if c_b <= 0.5 else 'NOT met'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
