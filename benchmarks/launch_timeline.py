"""Where a launch's seconds go: the job's Ray actors and when each was asked for, got its
process and finished ``__init__``, from Ray's state API (``/api/v0/tasks``, the events of
each actor's creation task), relative to the moment ``launch`` was called; and the CPU
seconds of every process on the machine meanwhile, by what the process is
(:class:`CpuByProcess`, from psutil).

Used by ``launch_latency.py`` after its last (a) round; run alone it launches one job:
``python benchmarks/launch_timeline.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

#: The actors of one job, in the order a launch starts them (Ray Train V2's own included).
ACTORS = (
    "RunRecorder",
    "TrainController",
    "PlacementGroupCleaner",
    "SynchronizationActor",
    "RayTrainWorker",
    "NodeSampler",
)


def creation_events(job, page: int = 1000) -> dict[str, list[dict[str, float]]]:
    """``{actor class: [{"asked", "process", "ready"}, ...]}`` for ``job`` (a launched
    :class:`~jupyter_trainfactory.job.Job`), s since the epoch (:func:`job_events`)."""
    import requests

    from jupyter_trainfactory.tracking import TAG

    manager = job.manager
    address = manager.ray.address
    headers = manager.ray.headers(address)
    submission = manager.find_run(job.id).data.tags[TAG.SUBMISSION]
    jobs = requests.get(f"{address}/api/jobs/", headers=headers, timeout=30).json()
    ray_job_id = next(j["job_id"] for j in jobs if j.get("submission_id") == submission)
    return job_events(address, headers, ray_job_id, page)


def job_events(
    address: str, headers: dict[str, str], ray_job_id: str, page: int = 1000
) -> dict[str, list[dict[str, float]]]:
    """``{actor class: [{"asked", "process", "ready"}, ...]}`` for the Ray job
    ``ray_job_id`` (hex) of the cluster whose dashboard is ``address``, s since the
    epoch; from the events of each actor's ``__init__`` task: ``PENDING_NODE_ASSIGNMENT``
    (asked for), ``RUNNING`` (its worker process is up), ``FINISHED`` (``__init__``
    returned)."""
    import requests

    query = {
        "detail": 1,
        "limit": page,
        "filter_keys": "job_id",
        "filter_predicates": "=",
        "filter_values": ray_job_id,
    }
    reply = requests.get(f"{address}/api/v0/tasks", params=query, headers=headers, timeout=60)
    out: dict[str, list[dict[str, float]]] = {}
    for task in reply.json()["data"]["result"]["result"]:
        name = task.get("name", "")
        if not name.endswith(".__init__"):
            continue
        cls = name.split(":")[-1].split(".")[0]
        events = {e["state"]: e["created_ms"] / 1000 for e in task.get("events", [])}
        out.setdefault(cls, []).append(
            {
                "asked": events.get("PENDING_NODE_ASSIGNMENT", 0.0),
                "process": events.get("RUNNING", 0.0),
                "ready": events.get("FINISHED", 0.0),
            }
        )
    return out


def timeline_lines(
    events: dict[str, list[dict[str, float]]], t0: float, since: str = "launch() was called"
) -> list[str]:
    """One line per actor class (the latest of several, e.g. the workers), times in s
    after ``t0`` (the moment ``since`` names); a class the job did not start is left out.
    Ray's job supervisor is not among them: it belongs to the dashboard's Ray job."""
    lines = [f"    actor                  asked  process  ready  (s after {since})"]
    for cls in ACTORS:
        if cls not in events:
            continue
        last = {k: max(e[k] for e in events[cls]) for k in ("asked", "process", "ready")}
        n = len(events[cls])
        label = f"{cls} x{n}" if n > 1 else cls
        lines.append(
            f"    {label:22s} {last['asked'] - t0:5.1f}  {last['process'] - t0:7.1f}"
            f"  {last['ready'] - t0:5.1f}"
        )
    return lines


#: Process titles and command lines, the class each one's CPU time is counted under.
_SYSTEM = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "agent")


def process_class(cmdline: list[str], bench_pid: int, pid: int) -> str:
    """What a process is, from its command line (Ray sets an actor's to ``ray::Class...``):
    an actor class (``RunRecorder``), ``worker start`` (a Ray worker process before its
    actor's class is loaded: the interpreter, ``import ray``, the class's imports),
    ``driver`` (the job's driver, or the plain ``fit()``'s), ``this benchmark`` (its
    ``launch``, ``wait`` and sampling),
    ``MLflow server``, ``Ray system`` (raylet, GCS, dashboard, agents) or ``other``."""
    text = " ".join(cmdline)
    if pid == bench_pid:
        return "this benchmark"
    if text.startswith("ray::"):
        title = (text[5:].split() or [""])[0]
        if title.startswith("IDLE"):
            return "worker start"
        return title.split(":")[-1].split(".")[0] or "other"
    if "default_worker.py" in text or "setup_worker.py" in text:
        return "worker start"
    if "ray_backend.driver" in text or "PLAIN_JOB_ID" in text:
        return "driver"
    if "mlflow" in text:
        return "MLflow server"
    if any(name in text for name in _SYSTEM):
        return "Ray system"
    return "other"


class CpuByProcess:
    """CPU seconds (user + system) of every process on this machine, by
    :func:`process_class`, from :meth:`start` on; sampled every ``interval_s`` by a
    thread (a process that ends between two samples loses at most its last interval).

    :meth:`upto` gives the totals at the last sample taken before a moment (the first
    step), so a round's CPU is counted to the same mark as its latency."""

    def __init__(self, interval_s: float = 0.5):
        import threading

        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._samples: list[tuple[float, dict[str, float]]] = []

    def start(self) -> CpuByProcess:
        import os

        import psutil

        self._psutil, self._me = psutil, os.getpid()
        self._seen: dict[tuple[int, float], float] = {}
        self._totals: dict[str, float] = {}
        self._parents: dict[tuple[int, float], bool] = {}
        self._sample(count=False)  # what ran before counts from here
        self._thread.start()
        return self

    def _sample(self, count: bool = True) -> None:
        for proc in self._psutil.process_iter():
            try:
                key = (proc.pid, proc.create_time())
                times = proc.cpu_times()
                cpu = times.user + times.system
                name = process_class(proc.cmdline(), self._me, proc.pid)
                if name == "other" and self._mlflow_child(key, proc):
                    name = "MLflow server"  # its uvicorn workers (multiprocessing spawn)
            except (self._psutil.Error, OSError):
                continue
            before = self._seen.get(key, 0.0)
            self._seen[key] = cpu
            if count and cpu > before:
                self._totals[name] = self._totals.get(name, 0.0) + cpu - before
        self._samples.append((time.time(), dict(self._totals)))

    def _mlflow_child(self, key: tuple[int, float], proc) -> bool:
        """Whether ``proc``'s parent is the MLflow server (read once per process)."""
        if key not in self._parents:
            parent = proc.parent()
            self._parents[key] = parent is not None and "mlflow" in " ".join(parent.cmdline())
        return self._parents[key]

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def upto(self, moment: float) -> dict[str, float]:
        """``{class: CPU s}`` at the last sample before ``moment`` (epoch s)."""
        totals: dict[str, float] = {}
        for when, values in self._samples:
            if when > moment:
                break
            totals = values
        return totals


def cpu_lines(totals: dict[str, float], top: int = 9) -> list[str]:
    """The ``top`` classes by CPU s, then the rest and the total, one line each."""
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    lines = [f"    {name:28s} {cpu:5.1f}" for name, cpu in ranked[:top]]
    rest = sum(cpu for _, cpu in ranked[top:])
    lines.append(f"    {'(the rest)':28s} {rest:5.1f}")
    lines.append(f"    {'total':28s} {sum(totals.values()):5.1f}")
    return lines


def main() -> int:
    import cloudpickle
    import launch_latency
    from common import embedded_services

    from jupyter_trainfactory import launch

    cloudpickle.register_pickle_by_value(launch_latency)
    with embedded_services():
        t0 = time.time()
        job = launch(launch_latency.first_step_fn, workers=2, config={"steps": 2})
        print(f"launch() returned after {time.time() - t0:.1f} s; job {job.wait(timeout=600)}")
        print("\n".join(timeline_lines(creation_events(job), t0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
