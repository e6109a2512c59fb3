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


#: Runs per search request (MLflow's own page size for ``search_runs``).
PAGE_SIZE = 1000


def _rest_store(mlflow_client):
    """The client's ``RestStore`` (an HTTP tracking server), or None for any other store."""
    from mlflow.store.tracking.rest_store import RestStore

    store = getattr(getattr(mlflow_client, "_tracking_client", None), "store", None)
    return store if type(store) is RestStore else None


def run_from_json(d: dict):
    """The ``mlflow.entities.Run`` of one run of a ``runs/search`` JSON answer, equal to
    what ``MlflowClient.search_runs`` makes of it (``Run.from_proto`` of the parsed
    protobuf): proto2 defaults for absent fields, ``"NaN"`` and ``"Infinity"`` values as
    floats, ``inputs`` and ``outputs`` through their protos."""
    from mlflow.entities import Metric, Run, RunData, RunInfo, RunInputs, RunOutputs
    from mlflow.protos.service_pb2 import RunInputs as ProtoInputs
    from mlflow.protos.service_pb2 import RunOutputs as ProtoOutputs
    from mlflow.utils.proto_json_utils import parse_dict

    i, data = d.get("info", {}), d.get("data", {})
    info = RunInfo(
        run_id=i.get("run_id", ""),
        run_name=i.get("run_name", ""),
        experiment_id=i.get("experiment_id", ""),
        user_id=i.get("user_id", ""),
        status=i.get("status", "RUNNING"),
        start_time=int(i.get("start_time", 0)),
        end_time=int(i.get("end_time", 0)) or None,
        lifecycle_stage=i.get("lifecycle_stage", ""),
        artifact_uri=i.get("artifact_uri", ""),
    )
    metrics = [
        Metric(
            m.get("key", ""),
            float(m.get("value", 0.0)),
            int(m.get("timestamp", 0)),
            int(m.get("step", 0)),
            model_id=m.get("model_id") or None,
            dataset_name=m.get("dataset_name") or None,
            dataset_digest=m.get("dataset_digest") or None,
            run_id=m.get("run_id") or None,
        )
        for m in data.get("metrics", ())
    ]
    run_data = RunData(metrics)
    run_data._params = {p.get("key", ""): p.get("value", "") for p in data.get("params", ())}
    run_data._tags = {t.get("key", ""): t.get("value", "") for t in data.get("tags", ())}
    parsed_inputs, parsed_outputs = ProtoInputs(), ProtoOutputs()
    parse_dict(d.get("inputs") or {}, parsed_inputs)
    parse_dict(d.get("outputs") or {}, parsed_outputs)
    inputs = RunInputs.from_proto(parsed_inputs)
    return Run(info, run_data, inputs, RunOutputs.from_proto(parsed_outputs))


def _search_json_pages(store, ids: list[str], filt: str, order: list[str], max_results: int):
    """``search_job_runs`` through ``store``'s ``runs/search`` endpoint, page after page
    (:data:`PAGE_SIZE`), each answer read with ``json.loads``; raises ``MlflowException``
    as ``MlflowClient.search_runs`` does."""
    import json
    from concurrent.futures import ThreadPoolExecutor

    from mlflow.protos.service_pb2 import SearchRuns
    from mlflow.utils.rest_utils import http_request, verify_rest_response

    endpoint, method = store._METHOD_TO_INFO[SearchRuns]

    def fetch(token: str | None, size: int) -> dict:
        body = {"experiment_ids": [str(x) for x in ids], "filter": filt,
                "run_view_type": "ACTIVE_ONLY", "max_results": size, "order_by": order}  # fmt: skip
        if token:
            body["page_token"] = token
        response = http_request(store.get_host_creds(), endpoint, method, json=body)
        return json.loads(verify_rest_response(response, endpoint).text)

    runs: list = []
    with ThreadPoolExecutor(1, thread_name_prefix="search-runs") as pool:
        page = pool.submit(fetch, None, min(PAGE_SIZE, max_results))
        while page is not None:
            answer = page.result()
            token, page = answer.get("next_page_token") or None, None
            found = answer.get("runs", [])[: max_results - len(runs)]
            if token and len(runs) + len(found) < max_results:
                page = pool.submit(
                    fetch, token, min(PAGE_SIZE, max_results - len(runs) - len(found))
                )
            runs.extend(run_from_json(r) for r in found)
    return runs


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
    ``until`` (s since the epoch) when given. ``max_results`` above 1,000 pages through
    MLflow's results. On an HTTP tracking server the pages are read as JSON and made
    into the same ``mlflow.entities.Run``\\ s directly, without MLflow's protobuf
    parse (:func:`run_from_json`), the next page fetched while this one is converted."""
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
    order = ["attributes.start_time DESC"]
    store = _rest_store(mlflow_client)
    if store is not None:
        return _search_json_pages(store, ids, filt, order, max_results)
    runs: list = []
    token = None
    while len(runs) < max_results:
        page = mlflow_client.search_runs(
            ids,
            filter_string=filt,
            max_results=min(PAGE_SIZE, max_results - len(runs)),
            order_by=order,
            page_token=token,
        )
        runs.extend(page)
        token = page.token
        if not token:
            break
    return runs
