"""Reading job runs back from MLflow: finding and searching the job runs, the latest point
of every metric and a metric's history, and which latest values tell the current
submission's present (after a resume).

Tag names are ``tracking.TAG``; creating the job's run is ``tracking.create_job_run``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .tracking import TAG

__all__ = [
    "open_children",
    "sweep_children",
    "SUBMISSION_SERIES",
    "MetricPoint",
    "current_metrics",
    "find_job_run",
    "JobRuns",
    "is_current",
    "latest_points",
    "metric_history",
    "client_pages",
    "job_filter",
    "search_job_runs",
    "search_job_runs_sliced",
]


@dataclass(frozen=True)
class MetricPoint:
    """One metric value: ``key``, ``value``, ``step`` and ``timestamp`` (ms since the epoch)."""

    key: str
    value: float
    step: int
    timestamp: int


def latest_points(run) -> list[MetricPoint]:
    """The latest value of every metric of ``run``, with its step (one ``get_run``)."""
    return [
        MetricPoint(m.key, m.value, int(m.step), int(m.timestamp))
        for m in run.data.to_proto().metrics
    ]


#: Series of a submission's own doing: after a resume, their latest value counts only once
#: the resumed submission has written one (see :func:`is_current`).
SUBMISSION_SERIES = ("train/", "system/", "energy/")


def is_current(key: str, timestamp_ms: int, tags: dict[str, str]) -> bool:
    """Whether the latest point of ``key`` (written at ``timestamp_ms``, ms since the
    epoch) tells the job's present: True unless ``key`` is a throughput, step-time,
    MFU, system or energy series (``SUBMISSION_SERIES``) whose point is older than the
    current submission's start (tag ``trainfactory.started``, s since the epoch). So
    after a resume the dashboard and the panel show no number rather than the last one
    from before the stop, until the resumed workers report."""
    if not key.startswith(SUBMISSION_SERIES):
        return True
    try:
        started = float(tags.get(TAG.STARTED) or 0.0)
    except ValueError:
        return True
    return timestamp_ms / 1000 >= started


def current_metrics(run) -> dict[str, float]:
    """``run.data.metrics`` without the values :func:`is_current` rules out."""
    tags = run.data.tags
    return {
        m.key: m.value for m in run.data.to_proto().metrics if is_current(m.key, m.timestamp, tags)
    }


def metric_history(
    mlflow_client, run_id: str, key: str, max_points: int | None = None
) -> list[MetricPoint]:
    """Full history of one metric sorted by step, evenly downsampled to ``max_points``."""
    points = sorted(
        (
            MetricPoint(m.key, m.value, int(m.step), int(m.timestamp))
            for m in mlflow_client.get_metric_history(run_id, key)
        ),
        key=lambda p: (p.step, p.timestamp),
    )
    if max_points and len(points) > max_points:
        stride = len(points) / max_points
        points = [points[int(i * stride)] for i in range(max_points - 1)] + [points[-1]]
    return points


def sweep_children(mlflow_client, parent, max_results: int = 1000) -> list:
    """The child runs of sweep run ``parent`` (one per trial), in its experiment."""
    return mlflow_client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
        max_results=max_results,
    )


def trial_run(mlflow_client, parent, index: int):
    """The child run of trial ``index`` of sweep run ``parent``.

    Raises SpecError when ``parent`` is not a sweep's run or has no such trial (yet)."""
    from .spec_values import SpecError

    job_id = parent.data.tags.get(TAG.JOB_ID, "")
    if TAG.SWEEP not in parent.data.tags:
        raise SpecError(f"Job {job_id} is not a sweep; --trial names a sweep's trial.")
    for child in sweep_children(mlflow_client, parent):
        if child.data.tags.get(TAG.TRIAL_INDEX) == str(index):
            return child
    raise SpecError(f"Sweep {job_id} has no trial {index} (yet); its leaderboard lists them.")


def open_children(mlflow_client, parent) -> list[str]:
    """The ids of sweep run ``parent``'s child runs still RUNNING."""
    return [
        c.info.run_id for c in sweep_children(mlflow_client, parent) if c.info.status == "RUNNING"
    ]


def _all_experiment_ids(mlflow_client) -> list[str]:
    from mlflow.entities import ViewType

    return [
        e.experiment_id for e in mlflow_client.search_experiments(view_type=ViewType.ACTIVE_ONLY)
    ]


def find_job_run(mlflow_client, job_id: str):
    """The run of job ``job_id`` in any experiment, or None."""
    ids = _all_experiment_ids(mlflow_client)
    if not ids:
        return None
    runs = mlflow_client.search_runs(
        ids, filter_string=f"tags.`{TAG.JOB_ID}` = '{job_id}'", max_results=1
    )
    return runs[0] if runs else None


class JobRuns:
    """Job id -> the job's MLflow run, remembered once found.

    A job's run never changes, so after the first search (:func:`find_job_run`: every
    active experiment, then a tag search) each read is one ``get_run``. A remembered run
    that has been deleted since, or that the server no longer has, is searched again.
    Safe to share between threads (the panel's and the dashboard's pollers)."""

    def __init__(self, mlflow_client):
        self._client = mlflow_client
        self._run_ids: dict[str, str] = {}

    def remember(self, job_id: str, run_id: str) -> None:
        """Remember that ``run_id`` is job ``job_id``'s run (a submit knows it already)."""
        self._run_ids[job_id] = run_id

    def find(self, job_id: str):
        """The run of job ``job_id`` (``mlflow.entities.Run``), or None."""
        run_id = self._run_ids.get(job_id)
        if run_id is not None:
            run = self._remembered(job_id, run_id)
            if run is not None:
                return run
            self._run_ids.pop(job_id, None)
        run = find_job_run(self._client, job_id)
        if run is not None:
            self._run_ids[job_id] = run.info.run_id
        return run

    def _remembered(self, job_id: str, run_id: str):
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(run_id)
        except MlflowException:  # gone from the server (``mlflow gc``)
            return None
        active = run.info.lifecycle_stage == "active"
        return run if active and run.data.tags.get(TAG.JOB_ID) == job_id else None


def job_filter(
    owner: str | None = None, since: float | None = None, until: float | None = None
) -> str:
    """MLflow's filter for the runs of trainfactory jobs: only ``owner``'s when given, only
    those started at or after ``since`` and before ``until`` (s since the epoch) when given."""
    filt = f"tags.`{TAG.JOB_ID}` LIKE 'tf-%'"
    if owner:
        filt += f" AND tags.`{TAG.OWNER}` = '{owner.replace(chr(39), '')}'"
    if since is not None:
        filt += f" AND attributes.start_time >= {int(since * 1000)}"
    if until is not None:
        filt += f" AND attributes.start_time < {int(until * 1000)}"
    return filt


def client_pages(mlflow_client):
    """The page reader of ``mlflow_client``: ``read(experiment_ids, filter, max_results,
    order_by, page_token) -> (runs, next_token or None)`` through ``search_runs``."""

    def read(ids, filt, max_results, order_by, token):
        page = mlflow_client.search_runs(
            ids, filter_string=filt, max_results=max_results, order_by=order_by, page_token=token
        )
        return list(page), page.token

    return read


def _read_all(read, ids: list[str], filt: str, max_results: int) -> list:
    runs: list = []
    token = None
    while len(runs) < max_results:
        page, token = read(
            ids, filt, min(1000, max_results - len(runs)), ["attributes.start_time DESC"], token
        )
        runs.extend(page)
        if not token:
            break
    return runs


def search_job_runs(
    mlflow_client,
    owner: str | None = None,
    max_results: int = 200,
    experiment_ids: list[str] | None = None,
    since: float | None = None,
    until: float | None = None,
) -> list:
    """Runs of trainfactory jobs, newest first; only ``owner``'s when given, only in
    ``experiment_ids`` when given, only those started at or after ``since`` and before
    ``until`` (s since the epoch) when given. ``max_results`` above 1,000 pages through MLflow's results."""
    ids = experiment_ids or _all_experiment_ids(mlflow_client)
    if not ids:
        return []
    return _read_all(client_pages(mlflow_client), ids, job_filter(owner, since, until), max_results)


def _oldest_start(read, experiment_ids: list[str]) -> float | None:
    """The start (s since the epoch) of the oldest job run, or None when there is none."""
    runs, _ = read(experiment_ids, job_filter(), 1, ["attributes.start_time ASC"], None)
    return runs[0].info.start_time / 1000 if runs else None


def search_job_runs_sliced(
    mlflow_client,
    experiment_ids: list[str] | None,
    since: float | None,
    until: float,
    threads: int = 2,
    slices_per_thread: int = 4,
    pages=None,
) -> list:
    """Every job run (everyone's) started in ``[since, until)`` (s since the epoch;
    ``since`` None: from the oldest), newest first, read in pages of 1,000 (``pages``, a
    reader as :func:`client_pages` returns; the client's own by default) over
    ``threads * slices_per_thread`` equal time slices, ``threads`` at once: the tracking
    server's workers (``services`` starts two) then build pages side by side, which a
    serial read cannot, and each slice needs fewer of the server's offset pages. The
    slices meet exactly (``>= a`` and ``< b``), so no run is read twice or missed; more
    slices than threads even out a fleet whose runs bunch in time."""
    read = pages or client_pages(mlflow_client)
    ids = experiment_ids or _all_experiment_ids(mlflow_client)
    if not ids:
        return []
    if since is None:
        oldest = _oldest_start(read, ids)
        if oldest is None:
            return []
        since = min(oldest, until)
    count = max(1, threads * slices_per_thread)
    width = (until - since) / count
    edges = [since + i * width for i in range(count)] + [until]

    def one(i: int) -> list:
        return _read_all(read, ids, job_filter(None, edges[i], edges[i + 1]), 10**9)

    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="tf-runs") as pool:
        parts = list(pool.map(one, range(count)))
    return [run for part in reversed(parts) for run in part]
