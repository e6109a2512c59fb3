"""MLflow: tag names, run creation and reading runs back (key hygiene: ``telemetry.keys``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = [
    "MetricPoint",
    "TAG",
    "client",
    "create_job_run",
    "experiment_id",
    "find_job_run",
    "latest_points",
    "log_data_inputs",
    "metric_history",
    "run_url",
    "search_job_runs",
]


class TAG:
    """Run tags this tool writes (all under the ``trainfactory.`` prefix)."""

    JOB_ID = "trainfactory.job_id"
    SUBMISSION = "trainfactory.ray_submission_id"
    DASHBOARD = "trainfactory.ray_dashboard"
    LOCAL_HEAD = "trainfactory.local_head"
    OWNER = "trainfactory.owner"
    SOURCE = "trainfactory.source"
    FUNCTION = "trainfactory.function"
    FUNCTION_SHA = "trainfactory.code.function_sha256"  # written by lineage.CodeVersion
    STATE = "trainfactory.state"
    REASON = "trainfactory.reason"
    ERROR = "trainfactory.error"
    STOP = "trainfactory.stop_requested"
    STOP_GRACE = "trainfactory.stop_grace_s"
    STOP_TIME = "trainfactory.stop_time"
    STEP = "trainfactory.step"
    CKPT_PATH = "trainfactory.checkpoint.path"
    CKPT_STEP = "trainfactory.checkpoint.step"
    CKPT_TIME = "trainfactory.checkpoint.time"
    STARTED = "trainfactory.started"
    WORKERS = "trainfactory.workers"
    FAILURES = "trainfactory.faults.records"  # JSON: this submission's FailureRecords
    FAILURE = "trainfactory.failure"  # JSON: the last failure's rank, node, type, traceback
    RANK = "trainfactory.rank."  # + rank -> JSON: pid, node_id, node_ip of its worker
    STALL = "trainfactory.stall"  # "" or what stalled since when
    STALL_SUGGESTED = "trainfactory.stall.suggested_s"
    STALL_TIMEOUT = "trainfactory.stall.timeout_s"  # the job's timeout, or "off"
    CHAOS = "trainfactory.chaos"  # JSON request: id and rank or node
    CHAOS_DONE = "trainfactory.chaos.done"  # JSON: id, killed ranks, error
    RESUMES = "trainfactory.resumes"  # number of resume submissions
    RESUME_SPEC = "trainfactory.resume.spec"  # JSON: the latest resume's changed options
    ENV = "trainfactory.env."  # + python, ray, torch, cuda, nvidia_driver: as the workers see
    PROJECT = "trainfactory.project"  # chargeback group given at launch
    TARGET_STEPS = "trainfactory.target_steps"  # the step the user expects the job to reach
    DATA = "trainfactory.data."  # + input name -> JSON: digest, digest_of, source
    REDACTED = "trainfactory.redacted"  # JSON list: config/env paths whose values were masked
    # JSON {"price_gb_month", "history": [[time, bytes kept], ...]}: storage after the job
    STORAGE = "trainfactory.storage"
    REGISTERED = "trainfactory.registered"  # on a checkpoint's LoggedModel: "NAME/VERSION"
    DELETED = "trainfactory.checkpoint.deleted"  # on a checkpoint's LoggedModel: when
    # JSON {"strategy", "min_nodes", "nodes": {node label: [ranks]}, "ranks": {rank: label}}:
    # where the current attempt's workers were placed
    PLACEMENT = "trainfactory.placement"
    PLACEMENT_WARNING = "trainfactory.placement.warning"  # a pack request that ended spread


@dataclass(frozen=True)
class MetricPoint:
    """One metric value: ``key``, ``value``, ``step`` and ``timestamp`` (ms since the epoch)."""

    key: str
    value: float
    step: int
    timestamp: int


def client(tracking_uri: str):
    """An ``MlflowClient`` for ``tracking_uri`` (imported lazily: workers need no MLflow)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def experiment_id(mlflow_client, name: str) -> str:
    """Id of experiment ``name``, created when missing."""
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return mlflow_client.create_experiment(name)
    except Exception:  # created concurrently by another process
        exp = mlflow_client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def create_job_run(
    mlflow_client, experiment: str, run_name: str, tags: dict[str, str], params: dict[str, str]
):
    """Create the job's run with its tags and params (logged once, here). Returns the Run."""
    from mlflow.entities import Param, RunTag

    exp_id = experiment_id(mlflow_client, experiment)
    run = mlflow_client.create_run(exp_id, run_name=run_name, tags=tags)
    items = [Param(k, v) for k, v in params.items()]
    for i in range(0, len(items), 100):
        mlflow_client.log_batch(run.info.run_id, params=items[i : i + 100])
    mlflow_client.log_batch(run.info.run_id, tags=[RunTag(TAG.STARTED, str(time.time()))])
    return mlflow_client.get_run(run.info.run_id)


def log_data_inputs(mlflow_client, run_id: str, inputs: list) -> None:
    """Record ``lineage.DataInput`` items as the run's datasets (``log_inputs``, context
    ``training``): name, digest, source and profile, as the MLflow UI shows them."""
    import json

    from mlflow.entities import Dataset, DatasetInput, InputTag

    datasets = [
        DatasetInput(
            Dataset(
                name=d.name,
                digest=d.digest[:36],  # MLflow keeps digests of at most 36 characters
                source_type=d.source_type,
                source=json.dumps({"uri": d.source, "digest": d.digest, "digest_of": d.digest_of}),
                profile=json.dumps({**d.profile, "size_bytes": d.size_bytes}, default=str),
            ),
            tags=[InputTag("mlflow.data.context", "training")],
        )
        for d in inputs
    ]
    mlflow_client.log_inputs(run_id, datasets=datasets)


def latest_points(run) -> list[MetricPoint]:
    """The latest value of every metric of ``run``, with its step (one ``get_run``)."""
    return [
        MetricPoint(m.key, m.value, int(m.step), int(m.timestamp))
        for m in run.data.to_proto().metrics
    ]


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
) -> list:
    """Runs of trainfactory jobs, newest first; only ``owner``'s when given, only in
    ``experiment_ids`` when given, only those started at or after ``since`` (s since the
    epoch) when given. ``max_results`` above 1,000 pages through MLflow's results."""
    ids = experiment_ids or _all_experiment_ids(mlflow_client)
    if not ids:
        return []
    filt = f"tags.`{TAG.JOB_ID}` LIKE 'tf-%'"
    if owner:
        filt += f" AND tags.`{TAG.OWNER}` = '{owner.replace(chr(39), '')}'"
    if since is not None:
        filt += f" AND attributes.start_time >= {int(since * 1000)}"
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


def run_url(tracking_uri: str, run) -> str:
    """Link to the run in the MLflow UI ("" for non-HTTP tracking URIs)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return ""
    base = tracking_uri.rstrip("/")
    return f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
