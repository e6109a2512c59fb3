"""Who holds a Ray cluster's resources: its placement groups and actors, job by job.

A job that waits for resources on a shared cluster says who holds them
(``held by job tf-0127dacc (2 CPU)``), so that its user knows whom to ask or what to stop.
What a job holds is read from Ray's state API (``ray.util.state``):

- a placement group holds the sum of its placed bundles (those with a ``node_id``),
  whether or not actors run in it: Ray reserves a bundle on its node when it places it. A
  group still ``PENDING`` (waiting for resources, as a waiting job's own worker group is)
  has no bundle placed and holds nothing;
- an alive actor outside any placement group holds its ``required_resources``; one inside
  a group uses the group's reservation, already counted.

Running tasks also hold CPUs; they are not listed here (listing them costs a scan of
every task the cluster has run). Only the resources a job waits for are counted:
``CPU``, ``GPU`` and the custom ones (an accelerator's), not ``memory``,
``object_store_memory`` or Ray's ``node:`` and ``bundle`` markers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Holding", "held_by", "holdings", "holdings_text", "read_holdings", "state_lister"]

#: Resource names that no job waits for (Ray's own bookkeeping).
_NOT_WAITED_FOR = ("memory", "object_store_memory")
_MARKERS = ("node:", "bundle_group", "accelerator_type:")
#: A submission of a trainfactory job: ``<job id>-<submission count>`` (submission.py).
_TF_SUBMISSION = re.compile(r"^(tf-[0-9a-f]{8})-\d+$")


@dataclass(frozen=True)
class Holding:
    """What one Ray job holds: ``job`` its name (a trainfactory job id, a Ray Jobs
    submission id, else ``Ray job <hex id>``), ``ray_job_id`` Ray's hex id, ``resources``
    the sum per resource name (``{"CPU": 2.0}``)."""

    job: str
    ray_job_id: str
    resources: dict[str, float] = field(default_factory=dict)

    def text(self) -> str:
        """``job tf-0127dacc (2 CPU, 1 GPU)``."""
        parts = ", ".join(f"{v:g} {k}" for k, v in sorted(self.resources.items()))
        return f"{self.job} ({parts})"


def _waited_for(resources: Mapping[str, float] | None) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in (resources or {}).items()
        if v and k not in _NOT_WAITED_FOR and not k.startswith(_MARKERS) and "_group_" not in k
    }


def _job_name(ray_job_id: str, submissions: Mapping[str, str]) -> str:
    submission = submissions.get(ray_job_id)
    if not submission:
        return f"Ray job {ray_job_id}"
    match = _TF_SUBMISSION.match(submission)
    return f"job {match.group(1)}" if match else f"job {submission}"


def holdings(
    placement_groups: Iterable[Any], actors: Iterable[Any], jobs: Iterable[Any]
) -> list[Holding]:
    """What each Ray job holds, most first.

    ``placement_groups``, ``actors`` and ``jobs`` are records of Ray's state API
    (``PlacementGroupState``, ``ActorState``, ``JobState``, with their ``detail`` fields):
    the groups' ``state``, ``creator_job_id`` and ``bundles`` (each bundle's
    ``unit_resources`` and ``node_id``, empty until placed); the actors' ``state``,
    ``job_id``, ``placement_group_id`` and ``required_resources``; the jobs' ``job_id`` and
    ``submission_id``. Jobs that hold none of the waited-for resources are left out.
    """
    held: dict[str, dict[str, float]] = {}

    def add(job_id: str, resources: dict[str, float]) -> None:
        total = held.setdefault(job_id, {})
        for name, value in resources.items():
            total[name] = total.get(name, 0.0) + value

    for group in placement_groups:
        if group.state == "REMOVED":
            continue
        for bundle in group.bundles or ():
            if bundle.get("node_id"):  # placed: "" while the group waits
                add(group.creator_job_id, _waited_for(bundle.get("unit_resources")))
    for actor in actors:
        if actor.state == "ALIVE" and not actor.placement_group_id:
            add(actor.job_id, _waited_for(actor.required_resources))
    submissions = {j.job_id: j.submission_id for j in jobs if j.job_id and j.submission_id}
    found = [
        Holding(_job_name(job_id, submissions), job_id, resources)
        for job_id, resources in held.items()
        if resources
    ]
    return sorted(found, key=lambda h: (-sum(h.resources.values()), h.job))


def held_by(found: Iterable[Holding], names: Iterable[str]) -> list[Holding]:
    """The holdings of ``found`` that hold any of the resources ``names``, only those
    resources kept (a job short of CPUs is not told who holds GPUs)."""
    wanted = set(names)
    kept = []
    for holding in found:
        resources = {k: v for k, v in holding.resources.items() if k in wanted}
        if resources:
            kept.append(Holding(holding.job, holding.ray_job_id, resources))
    return kept


def holdings_text(found: Iterable[Holding], limit: int = 3, amounts: bool = True) -> str:
    """``job tf-0127dacc (2 CPU), Ray job 05000000 (1 CPU)``: the first ``limit``, then
    ``and N more``; empty when nothing is held. ``amounts=False``: the names only
    (``job tf-0127dacc, Ray job 05000000``)."""
    found = list(found)
    text = ", ".join(h.text() if amounts else h.job for h in found[:limit])
    if len(found) > limit:
        text += f" and {len(found) - limit} more"
    return text


def read_holdings(list_fn: Any, timeout: float = 5.0) -> list[Holding]:
    """:func:`holdings` of a live cluster. ``list_fn(resource, filters)`` lists one kind
    of state record (``"placement_groups"``, ``"actors"``, ``"jobs"``) with ``detail``:
    ``ray.util.state`` in a connected process, a ``StateApiClient`` elsewhere (see
    :func:`state_lister`). Raises what the state API raises (the dashboard away, a
    timeout of ``timeout`` s)."""
    groups = list_fn("placement_groups", [("state", "!=", "REMOVED")], timeout)
    actors = list_fn("actors", [("state", "=", "ALIVE")], timeout)
    jobs = list_fn("jobs", None, timeout)
    return holdings(groups, actors, jobs)


def state_lister(address: str | None = None, headers: dict[str, str] | None = None):
    """A ``list_fn`` for :func:`read_holdings`: Ray's state API at the dashboard
    ``address`` with ``headers`` (the token's), or, when ``address`` is None, the
    ``ray.util.state`` functions of the cluster this process is connected to."""

    def list_fn(resource: str, filters, timeout: float):
        if address is None:
            from ray.util import state

            lister = getattr(state, f"list_{resource}")
            kwargs = {"filters": filters} if filters else {}
            return lister(detail=True, limit=10_000, timeout=int(max(1, timeout)), **kwargs)
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        client = StateApiClient(address=address, headers=headers or None)
        options = ListApiOptions(
            filters=filters or [], detail=True, limit=10_000, timeout=int(max(1, timeout))
        )
        return client.list(StateResource(resource), options=options, raise_on_missing_output=False)

    return list_fn
