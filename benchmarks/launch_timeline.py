"""Where a launch's seconds go: the job's Ray actors and when each was asked for, got its
process and finished ``__init__``, from Ray's state API (``/api/v0/tasks``, the events of
each actor's creation task), relative to the moment ``launch`` was called.

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
    :class:`~jupyter_trainfactory.job.Job`), s since the epoch; from the events of each
    actor's ``__init__`` task: ``PENDING_NODE_ASSIGNMENT`` (asked for), ``RUNNING`` (its
    worker process is up), ``FINISHED`` (``__init__`` returned)."""
    import requests

    from jupyter_trainfactory.tracking import TAG

    manager = job.manager
    address = manager.ray.address
    headers = manager.ray.headers(address)
    submission = manager.find_run(job.id).data.tags[TAG.SUBMISSION]
    jobs = requests.get(f"{address}/api/jobs/", headers=headers, timeout=30).json()
    ray_job_id = next(j["job_id"] for j in jobs if j.get("submission_id") == submission)
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


def timeline_lines(events: dict[str, list[dict[str, float]]], t0: float) -> list[str]:
    """One line per actor class (the latest of several, e.g. the workers), times in s
    after ``t0``; a class the job did not start is left out."""
    lines = ["    actor                  asked  process  ready  (s after launch() was called)"]
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
