"""The reliability report over many jobs: exposure, failures by kind, failure rate with
its interval, MTBF, MTTR, ETTR and badput, wasted cost, per group and per node.

Definitions (the README's "Reliability" section says the same):

- **exposure**: unit-hours held by the jobs (:class:`.history.JobHistory`), in
  accelerator-days (GPU-, NPU-, HPU-days) or vCPU-days for CPU jobs; units are never
  added across kinds: each unit is its own row;
- **failure rate**: infrastructure failures (:data:`.kinds.INFRASTRUCTURE`) per
  unit-day, as a percentage (``100 * failures / unit-days``, what "0.16 % per GPU per
  day" quotes) and per 1,000 unit-days, with Garwood's exact 95 % Poisson interval; with
  less than :data:`MIN_RATE_DAYS` of exposure no rate is given, only the interval;
- **MTBF**: unit-hours per infrastructure failure (per accelerator: a job on N of them
  sees a failure N times as often);
- **MTTR**: from a failure to the first step past the step it had reached
  (``telemetry.goodput.FailureRecord.mttr_s``), p50 / p95 / max over the recorded
  infrastructure failures that recovered;
- **ETTR**: goodput over wall time, summed over the jobs (``telemetry.goodput``);
- **drills**: failures injected on purpose (``%train chaos``, the poc's kill;
  :func:`.kinds.injected`), counted apart by the kind they simulate: never in the
  failure rate, MTBF or MTTR;
- **planned stops**: ``%train stop`` (graceful or ``--now``), the panel's Stop, a budget
  stop, over every submission of a job (:func:`.records.planned_stops`).

A job counts in the period it started in, with all its failures; one still running is
counted up to ``now`` (up to its last point when its recorder has been silent for
``history.SILENT_S``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..spec import SpecError
from .history import JobHistory, history_from_run
from .kinds import INFRASTRUCTURE, USER_ERROR
from .stats import LEMON_ALPHA, lemon_p_value, percentiles, poisson_interval

__all__ = [
    "GROUPS",
    "MIN_RATE_DAYS",
    "GroupStats",
    "NodeStats",
    "Rate",
    "ReliabilityReport",
    "compute",
    "read_histories",
    "reliability_report",
]

#: What ``--by`` groups by.
GROUPS = ("cluster", "node", "owner", "project", "accelerator")
#: Exposure (unit-days) below which no failure rate is given: one failure more or less
#: would move it by more than 100 % per day.
MIN_RATE_DAYS = 1.0


@dataclass(frozen=True)
class Rate:
    """``failures`` over ``exposure_days`` unit-days: ``per_day`` (None with too little
    exposure), the 95 % interval ``low``-``high`` per unit-day."""

    failures: int
    exposure_days: float
    unit: str
    per_day: float | None
    low: float | None
    high: float | None

    @classmethod
    def of(cls, failures: int, exposure_days: float, unit: str) -> Rate:
        if exposure_days <= 0:
            return cls(failures, exposure_days, unit, None, None, None)
        lo, hi = poisson_interval(failures)
        per_day = failures / exposure_days if exposure_days >= MIN_RATE_DAYS else None
        return cls(failures, exposure_days, unit, per_day, lo / exposure_days, hi / exposure_days)

    def text(self) -> str:
        """``0.120 % per GPU-day (1.20 per 1,000 GPU-days; 95 % CI 0.08-0.17 %)``, or what
        is missing for one."""
        unit = f"{self.unit}-day"
        if self.low is None:
            return "no exposure: no rate"
        ci = f"95 % CI {100 * self.low:.3g}-{100 * self.high:.3g} % per {unit}"
        if self.per_day is None:
            return (
                f"too little exposure for a rate ({self.exposure_days:.3g} {unit}s, a rate"
                f" needs {MIN_RATE_DAYS:g}); {ci}"
            )
        return (
            f"{100 * self.per_day:.3g} % per {unit} ({1000 * self.per_day:.3g} per 1,000"
            f" {unit}s; {ci})"
        )


@dataclass
class GroupStats:
    """The figures of a set of jobs that share ``unit`` (and ``key``, the group's value).

    ``exposure_h`` unit-hours; ``kinds`` real failures per kind; ``drills`` injected
    failures per the kind they simulate (in no figure below); ``stops`` planned stops;
    ``mttr_s`` ``(p50, p95, max)`` or None, over ``recovered`` of ``mttr_of`` recorded
    infrastructure failures; ``mtbf_h`` unit-hours per infrastructure failure (None for
    none); ``ettr`` goodput / wall (None without wall time); ``wasted_cost``,
    ``failure_cost`` and ``drill_cost`` per currency."""

    key: str
    unit: str
    jobs: int = 0
    live: int = 0
    silent: int = 0
    exposure_h: float = 0.0
    kinds: dict[str, int] = field(default_factory=dict)
    drills: dict[str, int] = field(default_factory=dict)
    stops: int = 0
    wall_s: float = 0.0
    goodput_s: float = 0.0
    badput_s: dict[str, float] = field(default_factory=dict)
    wasted_cost: dict[str, float] = field(default_factory=dict)
    failure_cost: dict[str, float] = field(default_factory=dict)
    drill_cost: dict[str, float] = field(default_factory=dict)
    mttr_s: tuple[float, float, float] | None = None
    recovered: int = 0
    mttr_of: int = 0

    @property
    def infrastructure(self) -> int:
        return sum(n for k, n in self.kinds.items() if k in INFRASTRUCTURE)

    @property
    def user_errors(self) -> int:
        return self.kinds.get(USER_ERROR, 0)

    @property
    def drill_count(self) -> int:
        return sum(self.drills.values())

    @property
    def exposure_days(self) -> float:
        return self.exposure_h / 24

    @property
    def rate(self) -> Rate:
        return Rate.of(self.infrastructure, self.exposure_days, self.unit)

    @property
    def mtbf_h(self) -> float | None:
        return self.exposure_h / self.infrastructure if self.infrastructure else None

    @property
    def ettr(self) -> float | None:
        return self.goodput_s / self.wall_s if self.wall_s > 0 else None


@dataclass(frozen=True)
class NodeStats:
    """One node (its label): ``exposure_h`` unit-hours (its share of each job's ranks),
    ``kinds`` its failures, ``p_value`` of the lemon-node test (None: not tested),
    ``lemon`` when it fails far more often than its share."""

    node: str
    unit: str
    exposure_h: float
    kinds: dict[str, int]
    p_value: float | None
    lemon: bool

    @property
    def infrastructure(self) -> int:
        return sum(n for k, n in self.kinds.items() if k in INFRASTRUCTURE)


@dataclass
class ReliabilityReport:
    """The report of ``jobs`` started in ``[since, until)`` at ``now`` (s since the
    epoch): ``fleet`` one :class:`GroupStats` per unit, ``groups`` per ``by`` value and
    unit, ``nodes`` per node, ``buckets`` per day or week (``bucket_s``): its start,
    infrastructure failures, user errors and ETTR (None: no job started in it)."""

    since: float | None
    until: float
    now: float
    by: str | None
    experiment: str | None
    jobs: list[JobHistory]
    fleet: list[GroupStats]
    groups: list[GroupStats]
    nodes: list[NodeStats]
    bucket_s: float
    buckets: list[tuple[float, int, int, float | None]]

    @property
    def lemons(self) -> list[NodeStats]:
        return [n for n in self.nodes if n.lemon]

    def __repr__(self) -> str:
        from .views import summary_line

        return f"<ReliabilityReport {summary_line(self)}>"

    def text(self) -> str:
        """The report as ``%train reliability`` prints it."""
        from .views import report_text

        return report_text(self)

    def to_csv(self, path) -> Path:
        """One row per job; see ``views.write_csv``."""
        from .views import write_csv

        return write_csv(self, path)

    def to_html(self, path) -> Path:
        """A self-contained HTML report; see ``views.write_html``."""
        from .views import write_html

        return write_html(self, path)

    def figure(self):
        """The bokeh plot of failures and ETTR over the period (``views.figure``)."""
        from .views import figure

        return figure(self)

    def summary(self) -> dict:
        """JSON-safe summary for the side panel: the period, jobs, per unit the exposure,
        infrastructure failures, user errors, drills, planned stops, the rate's text,
        MTTR p50 and ETTR, and one line of text."""
        from .views import summary_line

        return {
            "since": self.since,
            "until": self.until,
            "jobs": len(self.jobs),
            "units": [
                {
                    "unit": g.unit,
                    "exposure_days": g.exposure_days,
                    "infrastructure_failures": g.infrastructure,
                    "user_errors": g.user_errors,
                    "drills": g.drill_count,
                    "stops": g.stops,
                    "rate": g.rate.text(),
                    "mttr_p50_s": g.mttr_s[0] if g.mttr_s else None,
                    "ettr": g.ettr,
                }
                for g in self.fleet
            ],
            "lemons": [n.node for n in self.lemons],
            "text": summary_line(self),
        }


def _add(stats: GroupStats, job: JobHistory, mttrs: list[float]) -> None:
    stats.jobs += 1
    stats.live += job.live
    stats.silent += job.silent
    stats.exposure_h += job.exposure_h
    for kind, n in job.kinds.items():
        stats.kinds[kind] = stats.kinds.get(kind, 0) + n
    for kind, n in job.drills.items():
        stats.drills[kind] = stats.drills.get(kind, 0) + n
    stats.stops += job.stops
    stats.wall_s += job.wall_s
    stats.goodput_s += job.goodput_s
    for cat, s in job.badput_s.items():
        stats.badput_s[cat] = stats.badput_s.get(cat, 0.0) + s
    cur = job.currency
    stats.wasted_cost[cur] = stats.wasted_cost.get(cur, 0.0) + job.wasted_cost
    stats.failure_cost[cur] = stats.failure_cost.get(cur, 0.0) + job.failure_cost
    stats.drill_cost[cur] = stats.drill_cost.get(cur, 0.0) + job.drill_cost
    infra = [f for f in job.failures if f.infrastructure]  # drills are not
    stats.mttr_of += len(infra)
    mttrs += [f.mttr_s for f in infra if f.mttr_s is not None]


def group_stats(jobs: Iterable[JobHistory], key_of) -> list[GroupStats]:
    """One :class:`GroupStats` per ``(key_of(job), job.unit)``, by exposure, largest first."""
    groups: dict[tuple[str, str], tuple[GroupStats, list[float]]] = {}
    for job in jobs:
        key = (key_of(job) or "(none)", job.unit)
        stats, mttrs = groups.setdefault(key, (GroupStats(key[0], key[1]), []))
        _add(stats, job, mttrs)
    out = []
    for stats, mttrs in groups.values():
        stats.recovered = len(mttrs)
        if mttrs:
            p50, p95 = percentiles(mttrs, (50, 95))
            stats.mttr_s = (p50, p95, max(mttrs))
        out.append(stats)
    return sorted(out, key=lambda g: (-g.exposure_h, g.key, g.unit))


def node_stats(jobs: Sequence[JobHistory]) -> list[NodeStats]:
    """Per node and unit: exposure, failures, and the lemon-node test over the nodes of
    that unit (nodes with exposure, at least 2 of them; a lemon has at least 2
    infrastructure failures and a p-value under ``LEMON_ALPHA / nodes``)."""
    exposure: dict[tuple[str, str], float] = {}
    kinds: dict[tuple[str, str], dict[str, int]] = {}
    for job in jobs:
        for node, hours in job.nodes.items():
            exposure[(node, job.unit)] = exposure.get((node, job.unit), 0.0) + hours
        for node, per in job.node_kinds.items():
            mine = kinds.setdefault((node, job.unit), {})
            for kind, n in per.items():
                mine[kind] = mine.get(kind, 0) + n
    keys = sorted(set(exposure) | set(kinds))
    out = []
    for unit in sorted({u for _, u in keys}):
        mine = [k for k in keys if k[1] == unit]
        tested = [k for k in mine if exposure.get(k, 0.0) > 0]
        total_e = sum(exposure.get(k, 0.0) for k in tested)
        infra = {
            k: sum(n for c, n in kinds.get(k, {}).items() if c in INFRASTRUCTURE) for k in mine
        }
        total_k = sum(infra[k] for k in tested)
        for k in mine:
            p = None
            if len(tested) >= 2 and k in tested and total_k:
                p = lemon_p_value(infra[k], total_k, exposure[k] / total_e)
            lemon = p is not None and infra[k] >= 2 and p < LEMON_ALPHA / len(tested)
            out.append(NodeStats(k[0], unit, exposure.get(k, 0.0), kinds.get(k, {}), p, lemon))
    return sorted(out, key=lambda n: (-n.infrastructure, n.node))


def _buckets(jobs: Sequence[JobHistory], since: float, until: float, size: float):
    n = max(1, int((until - since + size - 1e-9) // size))
    infra, user = [0] * n, [0] * n
    wall, good = [0.0] * n, [0.0] * n
    for job in jobs:
        i = int((job.started - since) // size)
        if 0 <= i < n:
            wall[i] += job.wall_s
            good[i] += job.goodput_s
        for f in job.failures:
            j = int((f.time - since) // size)
            if 0 <= j < n:
                if f.infrastructure:
                    infra[j] += 1
                elif f.kind == USER_ERROR:
                    user[j] += 1
    return [
        (since + i * size, infra[i], user[i], good[i] / wall[i] if wall[i] > 0 else None)
        for i in range(n)
    ]


def compute(
    jobs: Sequence[JobHistory],
    since: float | None,
    until: float,
    now: float,
    by: str | None = None,
    experiment: str | None = None,
) -> ReliabilityReport:
    """The report of ``jobs`` (already chosen for the period). Raises SpecError for an
    unknown ``by``."""
    if by is not None and by not in GROUPS:
        raise SpecError(f"--by takes {', '.join(GROUPS)}, got {by!r}.")
    groups = []
    if by and by != "node":
        groups = group_stats(jobs, lambda j: getattr(j, by))
    start = since if since is not None else min((j.started for j in jobs), default=until)
    size = 86400.0 if until - start <= 31 * 86400 else 7 * 86400.0
    return ReliabilityReport(
        since=since,
        until=until,
        now=now,
        by=by,
        experiment=experiment,
        jobs=list(jobs),
        fleet=group_stats(jobs, lambda j: "fleet"),
        groups=groups,
        nodes=node_stats(jobs),
        bucket_s=size,
        buckets=_buckets(jobs, start, until, size),
    )


def read_histories(
    manager, since: float | None, until: float, experiment: str | None, now: float
) -> list[JobHistory]:
    """Every job run (everyone's) started in ``[since, until)`` at the manager's tracking
    server, through MLflow's search in pages of 1,000 (tags, params and latest metrics
    only), its time slices read in parallel (``runreads.search_job_runs_sliced``),
    straight from the REST search's JSON on an http(s) server (``rest_runs``).
    Raises SpecError when ``experiment`` does not exist."""
    from .. import runreads
    from . import rest_runs

    client = manager.mlflow_client
    ids = manager.experiment_ids(experiment)
    pages = rest_runs.page_reader(client)
    runs = runreads.search_job_runs_sliced(client, ids, since, until, pages=pages)
    names: dict[str, str] = {}
    out = []
    for run in runs:
        exp_id = run.info.experiment_id
        if exp_id not in names:
            names[exp_id] = client.get_experiment(exp_id).name
        out.append(history_from_run(run, names[exp_id], now))
    return out


def reliability_report(
    manager,
    since: float | None = None,
    until: float | None = None,
    experiment: str | None = None,
    by: str | None = None,
    now: float | None = None,
) -> ReliabilityReport:
    """Read and compute the report (see the module's definitions); ``until`` and ``now``
    default to now. Raises SpecError for an unknown ``by``, an empty period or a missing
    experiment."""
    now = time.time() if now is None else now
    until = now if until is None else until
    if since is not None and since >= until:
        raise SpecError("--since must come before --until.")
    if by is not None and by not in GROUPS:
        raise SpecError(f"--by takes {', '.join(GROUPS)}, got {by!r}.")
    jobs = read_histories(manager, since, until, experiment, now)
    return compute(jobs, since, until, now, by, experiment)
