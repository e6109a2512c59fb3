"""The dashboard's state, updated from snapshots of the job's MLflow run (no widgets, no timing)."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from .. import tracking
from ..jobs import TERMINAL_STATES, JobInfo, job_info, job_state

__all__ = ["DEFAULT_ROLLOVER", "DashboardModel", "RunSource", "Snapshot"]

#: Points kept per plot; older points roll over (bokeh ``ColumnDataSource.stream``).
DEFAULT_ROLLOVER = 500


@dataclass
class Snapshot:
    """One poll: the job's state and the latest point of every metric of its run."""

    info: JobInfo
    points: list[tracking.MetricPoint]
    tags: dict[str, str] = field(default_factory=dict)


class RunSource:
    """Reads a job's run: ``snapshot()`` costs one ``get_run`` (plus Ray's status when a
    ``manager`` is given); ``history()`` reads full histories, once, on attach."""

    def __init__(self, tracking_uri: str, run_id: str, manager=None):
        self.tracking_uri = tracking_uri
        self.run_id = run_id
        self.manager = manager
        self.client = manager._mlflow if manager is not None else tracking.client(tracking_uri)

    def snapshot(self) -> Snapshot:
        run = self.client.get_run(self.run_id)
        if self.manager is not None:
            info = self.manager._info(run)
            if info.run_status != run.info.status:  # reconciled just now
                run = self.client.get_run(self.run_id)
        else:
            info = job_info(run, job_state(run.info.status, None, run.data.tags), self.tracking_uri)
        tags = {k: v for k, v in run.data.tags.items() if k.startswith("trainfactory.")}
        return Snapshot(info, tracking.latest_points(run), tags)

    def history(self, keys: list[str], max_points: int) -> dict[str, list[tracking.MetricPoint]]:
        return {k: tracking.metric_history(self.client, self.run_id, k, max_points) for k in keys}


@dataclass
class DashboardModel:
    """What the dashboard shows.

    ``series[key]`` holds at most ``rollover`` ``(step, value)`` points per user or
    ``train/*`` metric; ``nodes[node][metric]`` the latest ``system/<node>/<metric>``
    value (``metric`` is ``gpu0/utilization`` for a GPU); ``cluster[name]`` the latest
    ``system/cluster/<name>`` aggregate; ``tags`` the run's ``trainfactory.*`` tags.
    ``update`` returns, per series, the points that are new since the last call.
    """

    rollover: int = DEFAULT_ROLLOVER
    info: JobInfo | None = None
    series: dict[str, deque] = field(default_factory=dict)
    nodes: dict[str, dict[str, float]] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)
    cluster: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    polls: int = 0

    @property
    def finished(self) -> bool:
        return self.info is not None and self.info.state in TERMINAL_STATES

    def _series(self, key: str) -> deque:
        if key not in self.series:
            self.series[key] = deque(maxlen=self.rollover)
        return self.series[key]

    def load_history(self, history: dict[str, list[tracking.MetricPoint]]) -> None:
        """Seed the plots with (downsampled) history, e.g. on ``%train attach``."""
        for key, points in history.items():
            if key.startswith("system/"):
                continue
            series = self._series(key)
            for p in points:
                if not series or p.step > series[-1][0]:
                    series.append((p.step, p.value))

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
                else:
                    self.nodes.setdefault(node, {})[metric] = p.value
                continue
            self.latest[p.key] = p.value
            series = self._series(p.key)
            if not series or p.step > series[-1][0]:
                series.append((p.step, p.value))
                new.setdefault(p.key, []).append((p.step, p.value))
        return new

    def elapsed_s(self, now: float | None = None) -> float | None:
        if self.info is None or self.info.started is None:
            return None
        return (self.info.ended or now or time.time()) - self.info.started
