"""One job's reliability history, read from its MLflow run (tags, params and the latest
value of each metric; no metric history): its exposure, failures, goodput and cost."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..jobstate import job_state
from ..telemetry.goodput import FAILURE_CATEGORIES
from ..tracking import TAG
from .kinds import DRILL, INFRASTRUCTURE
from .records import planned_stops, read_counts, read_records, record_kind

__all__ = ["Failure", "JobHistory", "UNITS", "history_from_run"]

#: The exposure unit of each ``--accelerator``: accelerator-days are GPU-days, NPU-days or
#: HPU-days; a CPU job's exposure is its vCPUs (Ray ``CPU`` units) held, in vCPU-days.
UNITS = {"gpu": "GPU", "npu": "NPU", "hpu": "HPU", "cpu": "vCPU"}


@dataclass(frozen=True)
class Failure:
    """One recorded failure: ``time`` (s since the epoch), ``kind`` (:mod:`.kinds`; for
    a drill, the kind it simulates), ``node`` label ("" when unknown), ``mttr_s`` (None:
    not recovered), ``steps_lost``, ``drill`` (injected on purpose)."""

    time: float
    kind: str
    node: str = ""
    mttr_s: float | None = None
    steps_lost: int | None = None
    drill: bool = False

    @property
    def infrastructure(self) -> bool:
        """A real infrastructure failure (a drill is none)."""
        return self.kind in INFRASTRUCTURE and not self.drill


@dataclass
class JobHistory:
    """What one job contributes to a reliability report.

    ``exposure_h``: ``unit``-hours the job held (accelerators, or vCPUs for CPU jobs),
    from its cost meter, summed over its submissions (the time a stopped job waits for
    its resume holds nothing and is not counted), up to ``now`` for a running job;
    ``kinds``: real failures per kind over the whole job (exact), ``drills``: failures
    injected on purpose per the kind they simulate (:mod:`.kinds`), ``failures``: the
    latest recorded ones (drills marked) with their times, nodes and MTTRs; ``nodes``:
    node label -> its share of the exposure (by the job's last placement, ranks per
    node); ``wall_s``, ``goodput_s``, ``badput_s``: the goodput account; ``wasted_cost``:
    cost of all badput, ``failure_cost``: the part failures caused
    (``telemetry.goodput.FAILURE_CATEGORIES``), ``drill_cost``: the part drills caused,
    in ``currency``; ``stops``: planned stops (``%train stop``, the panel's Stop, a
    budget) over its submissions, ``stopped``: one ended it; ``live``: still in progress
    and counted up to now; ``silent``: its run is open but its recorder has written
    nothing for :data:`SILENT_S` (counted up to its last point).
    """

    job: str
    run_id: str
    name: str
    owner: str
    project: str
    experiment: str
    cluster: str
    accelerator: str
    unit: str
    state: str
    started: float
    ended: float | None
    exposure_h: float
    wall_s: float
    goodput_s: float
    badput_s: dict[str, float] = field(default_factory=dict)
    kinds: dict[str, int] = field(default_factory=dict)
    drills: dict[str, int] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    node_kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    nodes: dict[str, float] = field(default_factory=dict)
    wasted_cost: float = 0.0
    failure_cost: float = 0.0
    drill_cost: float = 0.0
    currency: str = "USD"
    stops: int = 0
    stopped: bool = False
    live: bool = False
    silent: bool = False

    @property
    def infrastructure_failures(self) -> int:
        return sum(n for k, n in self.kinds.items() if k in INFRASTRUCTURE)


def _float(value: Any, default: float = 0.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _units_held(params: Mapping[str, str], unit: str) -> float:
    workers = _float(params.get("workers"), 1.0)
    per = params.get("cpus_per_worker" if unit == "vCPU" else "gpus_per_worker")
    return workers * _float(per, 1.0)


def _points(run, keys: tuple[str, ...]) -> dict:
    """The latest point (``.value``, ``.timestamp`` in ms) of each of ``keys`` the run has:
    from the run's own ``Metric`` list when it keeps one, without ``RunData.to_proto``
    of every metric, param and tag."""
    objs = getattr(run.data, "_metric_objs", None)
    if objs is None:
        objs = run.data.to_proto().metrics
    return {m.key: m for m in objs if m.key in keys}


#: A running job whose recorder wrote nothing for this long (s) is not counted up to now
#: but up to its last point: its driver may be gone without closing its run (the
#: recorder writes its cost every second).
SILENT_S = 600.0


def _exposure_h(run, unit: str, live: bool, now: float) -> tuple[float, bool]:
    """``(unit-hours held, counted up to now)``: ``cost/accelerator_hours``
    (``cost/vcpu_hours`` for CPU jobs), plus, for a live job whose last point is at most
    :data:`SILENT_S` old, the units held since; a run without them (no cost meter)
    counts its wall time times the units it holds."""
    key = "cost/vcpu_hours" if unit == "vCPU" else "cost/accelerator_hours"
    points = _points(run, (key, "goodput/wall_s"))
    held = _units_held(run.data.params, unit)
    if key in points:
        hours, since = points[key].value, points[key].timestamp / 1000
    elif "goodput/wall_s" in points:
        point = points["goodput/wall_s"]
        hours, since = point.value * held / 3600, point.timestamp / 1000
    else:
        hours, since = 0.0, run.info.start_time / 1000
    if live and now - since <= SILENT_S:
        return hours + held * max(0.0, now - since) / 3600, True
    return hours, False


def _nodes(tags: Mapping[str, str], exposure_h: float) -> dict[str, float]:
    try:
        placed = json.loads(tags.get(TAG.PLACEMENT) or "{}").get("nodes") or {}
    except (ValueError, AttributeError):
        return {}
    ranks = sum(len(r) for r in placed.values())
    return {node: exposure_h * len(r) / ranks for node, r in placed.items()} if ranks else {}


def history_from_run(run, experiment: str, now: float) -> JobHistory:
    """The :class:`JobHistory` of a job's run (an ``mlflow.entities.Run`` from a search:
    its tags, params and latest metrics), at ``now`` (s since the epoch)."""
    tags, metrics, params = run.data.tags, run.data.metrics, run.data.params
    state = str(job_state(run.info.status, None, tags))
    live = run.info.status == "RUNNING"
    accelerator = params.get("accelerator") or (
        "gpu" if _float(params.get("gpus_per_worker")) else "cpu"
    )
    unit = UNITS.get(accelerator, accelerator.upper())
    exposure, live = _exposure_h(run, unit, live, now)
    silent = run.info.status == "RUNNING" and not live
    counts = read_counts(tags)
    failures = [
        Failure(
            time=_float(r.get("time")),
            kind=record_kind(r),
            node=str(r.get("node") or ""),
            mttr_s=None if r.get("mttr_s") is None else _float(r["mttr_s"]),
            steps_lost=r.get("steps_lost"),
            drill=bool(r.get("drill")),
        )
        for r in read_records(tags)
    ]
    wall = _float(metrics.get("goodput/wall_s"))
    return JobHistory(
        job=tags.get(TAG.JOB_ID, ""),
        run_id=run.info.run_id,
        name=run.info.run_name or "",
        owner=tags.get(TAG.OWNER, ""),
        project=tags.get(TAG.PROJECT, ""),
        experiment=experiment,
        cluster=tags.get(TAG.DASHBOARD, ""),
        accelerator=tags.get(TAG.DEVICE_NAME) or accelerator,
        unit=unit,
        state=state,
        started=run.info.start_time / 1000,
        ended=run.info.end_time / 1000 if run.info.end_time else None,
        exposure_h=exposure,
        wall_s=wall,
        goodput_s=_float(metrics.get("goodput/goodput_s")),
        badput_s={
            k[len("badput/") : -len("_s")]: v for k, v in metrics.items() if k.startswith("badput/")
        },
        kinds={k: int(n) for k, n in counts["kinds"].items()},
        drills={k: int(n) for k, n in counts["drills"].items()},
        failures=failures,
        node_kinds={n: {k: int(c) for k, c in per.items()} for n, per in counts["nodes"].items()},
        nodes=_nodes(tags, exposure),
        wasted_cost=_float(metrics.get("cost/wasted_usd")),
        failure_cost=sum(_float(metrics.get(f"cost/{c}_usd")) for c in FAILURE_CATEGORIES),
        drill_cost=_float(metrics.get(f"cost/{DRILL}_usd")),
        currency=tags.get(TAG.COST_CURRENCY, "USD"),
        stops=planned_stops(run.info.status, tags),
        stopped=state == "STOPPED",
        live=live,
        silent=silent,
    )
