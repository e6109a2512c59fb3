"""Reading job runs back from MLflow: finding and searching the job runs, the latest point
of every metric and a metric's history, and which latest values tell the current
submission's present (after a resume).

Tag names are ``tracking.TAG``; creating the job's run is ``tracking.create_job_run``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .tracking import TAG

__all__ = [
    "SUBMISSION_SERIES",
    "MetricPoint",
    "current_metrics",
    "find_job_run",
    "is_current",
    "latest_points",
    "metric_history",
    "search_job_runs",
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
    filt = f"tags.`{TAG.JOB_ID}` LIKE 'tf-%'"
    if owner:
        filt += f" AND tags.`{TAG.OWNER}` = '{owner.replace(chr(39), '')}'"
    if since is not None:
        filt += f" AND attributes.start_time >= {int(since * 1000)}"
    if until is not None:
        filt += f" AND attributes.start_time < {int(until * 1000)}"
    runs: list = []
    token = None
    while len(runs) < max_results:
        page = mlflow_client.search_runs(
            ids,
            filter_string=filt,
            max_results=min(1000, max_results - len(runs)),
            order_by=["attributes.start_time DESC"],
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    return runs
