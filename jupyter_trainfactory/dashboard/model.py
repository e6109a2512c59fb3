"""The dashboard's state, updated from snapshots of the job's MLflow run (no widgets, no timing)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import runreads, tracking
from ..jobstate import TERMINAL_STATES, JobInfo, job_info, job_state

__all__ = [
    "DEFAULT_MAX_POINTS",
    "DashboardModel",
    "RunSource",
    "Snapshot",
    "history_keys",
    "thin",
]

#: Points kept per plot line: a line that reaches twice as many keeps every other one
#: (:func:`thin`), so a plot always spans the whole run, at a resolution that halves.
DEFAULT_MAX_POINTS = 500
#: ``system/`` series whose history is read on attach (utilization and memory, per device).
HISTORY_SYSTEM_SUFFIXES = ("/utilization", "/cpu_utilization", "/memory_used_mb")
#: At most this many ``system/`` histories are read on attach (a big cluster's devices).
MAX_SYSTEM_HISTORIES = 32


@dataclass
class Snapshot:
    """One poll: the job's state and the latest point of every metric of its run."""

    info: JobInfo
    points: list[runreads.MetricPoint]
    tags: dict[str, str] = field(default_factory=dict)


class RunSource:
    """Reads a job's run: ``snapshot()`` costs one ``get_run`` (plus Ray's status when a
    ``manager`` is given); ``history()`` reads full histories, once, on attach."""

    def __init__(self, tracking_uri: str, run_id: str, manager=None):
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.manager = manager
        self.client = (
            manager.mlflow_client if manager is not None else tracking.client(tracking_uri)
        )

    def snapshot(self) -> Snapshot:
        run = self.client.get_run(self.run_id)
        if self.manager is not None:
            info = self.manager.run_info(run)
            if info.run_status != run.info.status:  # reconciled just now
                run = self.client.get_run(self.run_id)
        else:
            info = job_info(run, job_state(run.info.status, None, run.data.tags), self.tracking_uri)
        tags = {k: v for k, v in run.data.tags.items() if k.startswith("trainfactory.")}
        return Snapshot(info, runreads.latest_points(run), tags)

    def history(self, keys: list[str], max_points: int) -> dict[str, list[runreads.MetricPoint]]:
        return {k: runreads.metric_history(self.client, self.run_id, k, max_points) for k in keys}


def thin(points: list, max_points: int) -> list:
    """``points`` when they are at most ``2 * max_points``, else every other one (the first
    and the last kept): about ``max_points`` points spread over the same span."""
    if len(points) <= 2 * max_points:
        return points
    kept = points[::2]
    return kept if (len(points) - 1) % 2 == 0 else [*kept, points[-1]]


def history_keys(snap: Snapshot) -> list[str]:
    """The keys whose history :meth:`RunSource.history` reads on attach: every non-``system/``
    metric, and the first :data:`MAX_SYSTEM_HISTORIES` utilization and memory series."""
    keys = [p.key for p in snap.points if not p.key.startswith("system/")]
    system = sorted(
        p.key
        for p in snap.points
        if p.key.startswith("system/")
        and not p.key.startswith("system/cluster/")
        and p.key.endswith(HISTORY_SYSTEM_SUFFIXES)
    )
    return keys + system[:MAX_SYSTEM_HISTORIES]


@dataclass
class DashboardModel:
    """What the dashboard shows.

    ``series[key]`` holds the ``(step, value)`` points of a user or ``train/*`` metric;
    ``timeseries[key]`` the ``(time, value)`` points
    per ``system/<node>/...`` metric (time in s since the epoch, from MLflow's timestamps);
    ``nodes[node][metric]`` the latest ``system/<node>/<metric>`` value (``metric`` is
    ``gpu0/utilization`` for a GPU); ``cluster[name]`` the latest ``system/cluster/<name>``
    aggregate; ``tags`` the run's ``trainfactory.*`` tags. Each series spans the whole run
    with at most ``2 * max_points`` points (:func:`thin`). ``update`` returns, per series
    (``series`` and ``timeseries`` keys alike), the points that are new since the last call.
    """

    max_points: int = DEFAULT_MAX_POINTS
    info: JobInfo | None = None
    series: dict[str, list] = field(default_factory=dict)
    timeseries: dict[str, list] = field(default_factory=dict)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)
    cluster: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    polls: int = 0

    @property
    def finished(self) -> bool:
        return self.info is not None and self.info.state in TERMINAL_STATES

    def _series(self, key: str) -> list:
        return self.series.setdefault(key, [])

    def _timeseries(self, key: str) -> list:
        return self.timeseries.setdefault(key, [])

    @property
    def has_gpus(self) -> bool:
        """Whether any node reports a GPU (``system/<node>/gpu<i>/...`` metrics)."""
        return any(k.startswith("gpu") for values in self.nodes.values() for k in values) or any(
            "/gpu" in key for key in self.timeseries
        )

    def _append(self, table: dict[str, list], key: str, x: float, value: float) -> bool:
        """Append ``(x, value)`` to ``table[key]`` when ``x`` is past its last point; thin."""
        points = table.setdefault(key, [])
        if points and x <= points[-1][0]:
            return False
        points.append((x, value))
        if len(points) > 2 * self.max_points:
            table[key] = thin(points, self.max_points)
        return True

    def load_history(self, history: dict[str, list[runreads.MetricPoint]]) -> None:
        """Seed the plots with (downsampled) history, e.g. on ``%train attach``."""
        for key, points in history.items():
            if key.startswith("system/"):
                for p in sorted(points, key=lambda p: p.timestamp):
                    self._append(self.timeseries, key, p.timestamp / 1000, p.value)
                continue
            for p in points:
                self._append(self.series, key, p.step, p.value)

    def replace_history(self, history: dict[str, list[runreads.MetricPoint]]) -> None:
        """Replace the step series of ``history``'s keys by it (the whole run, re-read)."""
        for key, points in history.items():
            self.series[key] = []
            for p in points:
                self._append(self.series, key, p.step, p.value)

    def update(self, snap: Snapshot) -> dict[str, list[tuple[int, float]]]:
        """Apply one snapshot; return the new points per series."""
        self.polls += 1
        self.info = snap.info
        self.tags = snap.tags
        new: dict[str, list[tuple[int, float]]] = {}
        for p in snap.points:
            if p.key.startswith("system/"):
                _, _, rest = p.key.partition("/")
                node, _, metric = rest.partition("/")
                if node == "cluster":
                    self.cluster[metric] = p.value
                    continue
                self.nodes.setdefault(node, {})[metric] = p.value
                at = p.timestamp / 1000
                if self._append(self.timeseries, p.key, at, p.value):
                    new.setdefault(p.key, []).append((at, p.value))
                continue
            if runreads.is_current(p.key, p.timestamp, snap.tags):
                self.latest[p.key] = p.value
            else:  # a resume's workers have not written it yet
                self.latest.pop(p.key, None)
            if self._append(self.series, p.key, p.step, p.value):
                new.setdefault(p.key, []).append((p.step, p.value))
        return new

    def step_split(self, after: int | None = None) -> list[tuple[int, float, float, float]]:
        """``(step, compute_s, data_wait_s, comm_s)`` per ``train/step_time_s`` point
        after step ``after``: the step time times ``train/data_wait_fraction`` and
        ``train/comm_fraction`` at that step (or the last one before it); compute is the
        rest, never below 0 (communication may overlap compute: DDP's bucketed allreduce,
        FSDP2's prefetched all-gathers)."""
        times = self.series.get("train/step_time_s") or ()
        fractions = {
            name: dict(self.series.get(key) or ())
            for name, key in (("data", "train/data_wait_fraction"), ("comm", "train/comm_fraction"))
        }
        last = {"data": 0.0, "comm": 0.0}
        rows = []
        for step, seconds in times:
            for name, by_step in fractions.items():
                if step in by_step:
                    last[name] = by_step[step]
            if after is not None and step <= after:
                continue
            data, comm = seconds * last["data"], seconds * last["comm"]
            rows.append((step, max(0.0, seconds - data - comm), data, comm))
        return rows

    def elapsed_s(self, now: float | None = None) -> float | None:
        if self.info is None or self.info.started is None:
            return None
        return (self.info.ended or now or time.time()) - self.info.started
