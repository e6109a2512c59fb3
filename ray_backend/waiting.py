"""What a job's driver says while its workers wait, and what it frees when it exits.

A ``PENDING`` job's reason: the workers' shape, whether the cluster's free resources
cover them, and who holds what is short (:mod:`jupyter_trainfactory.holders`), kept
current while it waits. At its exit the driver releases the placement groups its job
left (:func:`release_groups`).
"""

from __future__ import annotations

import time

__all__ = [
    "PENDING_REFRESH_S",
    "PendingReason",
    "current_wait",
    "release_groups",
    "resources_text",
    "worker_resources",
    "workers_reason",
    "workers_wait",
]


def worker_resources(spec) -> dict[str, float]:
    """One worker's Ray resources, zeros kept (``{"CPU": 1.0, "GPU": 0.0}``)."""
    from jupyter_trainfactory.accelerators import resources_per_worker

    return resources_per_worker(
        spec.cpus_per_worker, spec.gpus_per_worker, spec.accelerator, spec.resources
    )


def resources_text(spec) -> str:
    """``2 workers x (1 CPU, 1 GPU), placement pack, labels ray.io/market-type=spot``."""
    from jupyter_trainfactory.spec import selector_text

    parts = ", ".join(f"{v:g} {k}" for k, v in worker_resources(spec).items())
    n = spec.workers
    text = f"{n} worker{'s' if n != 1 else ''} x ({parts}), placement {spec.placement}"
    labels = selector_text(spec.label_selector)
    return text + (f", labels {labels}" if labels else "")


def workers_wait(spec, free: dict[str, float], held: list | None = None) -> tuple[str, str]:
    """What a job whose driver runs waits for before its workers start, as ``(reason,
    line)``: the reason in full (the run's ``trainfactory.reason``) and in a few words for
    the side panel (``trainfactory.waiting``).

    ``starting the workers: ...`` when the cluster's free resources (``free``,
    ``ray.available_resources()`` plus what the job itself already holds) cover all
    workers, else ``waiting for resources: ...; free now ...`` naming what is short (summed
    over nodes: a worker that fits no single node still waits), and ``; held by ...`` the
    other jobs that hold it (``held``, :class:`~jupyter_trainfactory.holders.Holding`
    records). Its line: ``starting the workers``, or ``0 of 2 CPU free; held by job
    tf-0127dacc`` (who, not how much: the amounts are in the reason)."""
    from jupyter_trainfactory.holders import held_by, holdings_text

    need = {k: v * spec.workers for k, v in worker_resources(spec).items() if v > 0}
    short = {k: v for k, v in need.items() if free.get(k, 0.0) + 1e-9 < v}
    resources = resources_text(spec)
    if not short:
        return f"starting the workers: {resources}", "starting the workers"
    have = [f"{free.get(k, 0.0):g} of {v:g} {k}" for k, v in short.items()]
    holders = held_by(held or [], short)
    reason = f"waiting for resources: {resources}; free now {', '.join(have)}"
    line = ", ".join(f"{x} free" for x in have)
    if holders:
        reason += f"; held by {holdings_text(holders)}"
        line += f"; held by {holdings_text(holders, amounts=False)}"
    return reason, line


def workers_reason(spec, free: dict[str, float], held: list | None = None) -> str:
    """The full reason of :func:`workers_wait`."""
    return workers_wait(spec, free, held)[0]


def current_wait(ray, spec) -> tuple[str, str]:
    """:func:`workers_wait` of the cluster now. Ray's state API (who holds what) is
    asked only when the free resources fall short; what this job holds already (its
    workers' placement group, being created) counts as free to it. The state API away:
    the reason without its holders."""
    from jupyter_trainfactory.holders import read_holdings, state_lister

    free = dict(ray.available_resources())
    wait = workers_wait(spec, free)
    if wait[0].startswith("starting"):
        return wait
    try:
        found = read_holdings(state_lister(), timeout=5.0)
    except Exception:  # noqa: BLE001 - the dashboard busy or away: say what is known
        return wait
    own = ray.get_runtime_context().get_job_id()
    for holding in found:
        if holding.ray_job_id == own:
            for name, value in holding.resources.items():
                free[name] = free.get(name, 0.0) + value
    return workers_wait(spec, free, [h for h in found if h.ray_job_id != own])


#: Seconds between two looks at what a PENDING job waits for (the state API's cost:
#: three list calls to the dashboard, only while resources are short).
PENDING_REFRESH_S = 5.0


class PendingReason:
    """Keeps a ``PENDING`` job's reason current (free resources and their holders change
    while it waits), every :data:`PENDING_REFRESH_S` s until the job leaves ``PENDING``."""

    def __init__(self, ray, recorder, spec):
        self.ray, self.recorder, self.spec = ray, recorder, spec
        self.next_at = time.monotonic() + PENDING_REFRESH_S
        self.pending = True

    def __call__(self) -> None:
        if not self.pending or time.monotonic() < self.next_at:
            return
        try:
            reason, line = current_wait(self.ray, self.spec)
            pending = self.recorder.pending_reason.remote(reason, line)
            self.pending = self.ray.get(pending, timeout=10)
        except Exception as exc:  # noqa: BLE001 - what it waits for must never end the job
            print(f"trainfactory: reading what the job waits for: {exc}", flush=True)
        self.next_at = time.monotonic() + PENDING_REFRESH_S


def release_groups() -> list[str]:
    """Remove the placement groups this Ray job created that Ray still holds; returns
    their ids (none when Ray is not initialized).

    Ray removes a placement group once its creator job *and* its creator actor are dead;
    a Train worker group's creator is the Train controller, which a stop or a sweep's end
    kills, sometimes in the middle of a worker group's restart (Ray's own cleaner, Ray
    Train's ``PlacementGroupCleaner``, knows only a started group: ray-project/ray#58515).
    CI once found 1 of 2 CPUs held after the sweep tests, every later job short. The
    driver removes what is left before it exits, so no reservation outlives its job."""
    import ray

    if not ray.is_initialized():
        return []
    from ray.util.placement_group import PlacementGroup, remove_placement_group
    from ray.util.state import list_placement_groups

    own = ray.get_runtime_context().get_job_id()
    try:
        left = list_placement_groups(
            filters=[("creator_job_id", "=", own), ("state", "!=", "REMOVED")], timeout=5
        )
        for group in left:
            remove_placement_group(
                PlacementGroup(ray.PlacementGroupID.from_hex(group.placement_group_id))
            )
    except Exception as exc:  # noqa: BLE001 - the dashboard away: Ray's own cleanup remains
        print(f"trainfactory: releasing the job's placement groups: {exc}", flush=True)
        return []
    ids = [g.placement_group_id for g in left]
    if ids:
        print(
            f"trainfactory: released {len(ids)} placement group(s) left: {', '.join(ids)}",
            flush=True,
        )
    return ids
