"""What the benchmarks share: the embedded services for the length of a run, and one
line per measured figure (median, min-max spread, n)."""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@contextlib.contextmanager
def embedded_services() -> Iterator[object]:
    """The embedded Ray head and MLflow server (``services.Services``), started if needed;
    on exit, stops only those this context started (a running cluster is left as it was)."""
    from jupyter_trainfactory import services as svc

    before = svc.load_services()
    running = {n for n, p in (before.processes.items() if before else []) if p.alive()}
    services = svc.ensure_services()
    try:
        yield services
    finally:
        mine = tuple(n for n in ("ray", "mlflow") if n not in running)
        if mine:
            svc.stop_services(mine)


#: A measurement starts once the machine's CPUs were at most this busy (percent, over
#: 1 s), as a user's job on an idle cluster would: the job before it may still end its
#: processes and close its run for some seconds after ``wait()`` returns.
IDLE_PERCENT = 15.0


def settle(limit_s: float = 60.0) -> float:
    """Wait until the CPUs were at most :data:`IDLE_PERCENT` busy over 1 s (``limit_s`` at
    most); returns the seconds waited."""
    import psutil

    started = time.monotonic()
    while psutil.cpu_percent(interval=1.0) > IDLE_PERCENT:
        if time.monotonic() - started > limit_s:
            break
    return time.monotonic() - started


def spread(label: str, values: list[float], unit: str, digits: int = 2) -> str:
    """``label  median X unit  (min, max, n)`` for a list of measurements."""
    med = statistics.median(values)
    return (
        f"{label:38s} median {med:.{digits}f} {unit}"
        f"  (min {min(values):.{digits}f}, max {max(values):.{digits}f}, n={len(values)})"
    )


PLAIN_DRIVER = """
import json, sys, cloudpickle, ray
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
fn = cloudpickle.loads(open(sys.argv[1], "rb").read())
config, storage, max_failures = json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
ray.init(log_to_driver=True)
print("PLAIN_JOB_ID", ray.get_runtime_context().get_job_id(), flush=True)
TorchTrainer(fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
             run_config=RunConfig(storage_path=storage,
                                  failure_config=FailureConfig(max_failures=max_failures))).fit()
"""


def _driver_env(services, env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with the cluster's address and token (``services``), Ray
    Train's own health-check interval, and ``env`` on top."""
    from jupyter_trainfactory.payload import HEALTH_CHECK_ENV

    full_env = {**os.environ, **services.client_env(), "RAY_ADDRESS": services.ray_address}
    full_env.pop(HEALTH_CHECK_ENV, None)  # Ray's default unless given
    full_env.update(env or {})
    return full_env


def _fn_file(fn: Callable, scratch: Path) -> str:
    import cloudpickle

    fn_file = scratch / "fn.pkl"
    fn_file.write_bytes(cloudpickle.dumps(fn))
    return str(fn_file)


def plain_fit(
    services, fn: Callable, config: dict, scratch: Path, max_failures: int = 0, env=None
) -> tuple[float, str]:
    """Run ``TorchTrainer(fn).fit()`` with two workers in a new driver process connected to
    the embedded cluster (``services``); returns (the process's start time, ``time.time()``,
    and its output). ``env``: variables for the driver and, through Ray, its workers.
    Raises SystemExit with the output's tail when the driver fails."""
    import json

    argv = [_fn_file(fn, scratch), json.dumps(config), str(scratch / "storage"), str(max_failures)]
    t0 = time.time()
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_DRIVER, *argv],
        env=_driver_env(services, env),
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        raise SystemExit(f"plain fit() failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return t0, done.stdout + done.stderr


WARM_DRIVER = """
import json, sys, time, cloudpickle, ray
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
fn = cloudpickle.loads(open(sys.argv[1], "rb").read())
config, storage = json.loads(sys.argv[2]), sys.argv[3]
ray.init(log_to_driver=True)
for _ in sys.stdin:
    print("FIT_CALLED", time.time(), flush=True)
    TorchTrainer(fn, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(storage_path=storage)).fit()
    print("FIT_DONE", flush=True)
"""


class WarmDriver:
    """One driver process connected to the embedded cluster (``services``) that runs
    ``TorchTrainer(fn).fit()`` with two workers each time :meth:`fit` asks: the driver's
    interpreter, ``import ray.train``/``torch`` and ``ray.init`` are paid once, before the
    first fit, as a driver kept warm between jobs would pay them. Use as a context manager
    (the process ends on exit)."""

    def __init__(self, services, fn: Callable, config: dict, scratch: Path):
        import json

        argv = [_fn_file(fn, scratch), json.dumps(config), str(scratch / "warm-storage")]
        self._process = subprocess.Popen(
            [sys.executable, "-c", WARM_DRIVER, *argv],
            env=_driver_env(services),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def __enter__(self) -> WarmDriver:
        return self

    def __exit__(self, *exc) -> None:
        self._process.stdin.close()
        try:
            self._process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def fit(self, mark: str) -> tuple[float, str]:
        """Run one ``fit()``; returns (``time.time()`` when the driver called it, its
        output up to the line holding ``mark``, which a worker prints, and the fit's end).
        Raises SystemExit with the output's tail when the driver exits first."""
        self._process.stdin.write("fit\n")
        self._process.stdin.flush()
        lines: list[str] = []
        called = None
        done = False
        while not (done and any(mark in x for x in lines)):
            line = self._process.stdout.readline()
            if not line:
                raise SystemExit("the warm driver exited:\n" + "".join(lines)[-3000:])
            lines.append(line)
            if line.startswith("FIT_CALLED "):
                called = float(line.split()[1])
            done = done or line.startswith("FIT_DONE")
        return called, "".join(lines)
