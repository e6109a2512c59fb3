"""Reading a fleet's job runs straight from the tracking server's REST search
(``POST /api/2.0/mlflow/runs/search``, MLflow's documented REST API), as light views.

Why: ``MlflowClient.search_runs`` turns each page's JSON into protobuf messages and then
into ``Run`` entities, in Python: 38 s of the kernel's CPU for 10,000 job runs of about
160 tags, params and metrics each (measured, ``benchmarks/reliability_report.py``),
which on a 2-core machine competes with the server's own work. Here a page is
``json.loads``-ed (C) and wrapped as it is: 3-4 s for the same runs. The request goes
through MLflow's own ``http_request_safe`` with the client's host credentials, so
authentication, TLS settings, retries and the server's error messages are MLflow's.

The views carry what ``history.history_from_run`` reads of a ``Run``: ``info``
(``run_id``, ``run_name``, ``experiment_id``, ``status``, ``start_time``, ``end_time``)
and ``data`` (``tags``, ``params``, ``metrics`` as dicts, ``_metric_objs`` with each
latest point's ``key``, ``value``, ``step`` and ``timestamp`` in ms).
"""

from __future__ import annotations

from types import SimpleNamespace

__all__ = ["page_reader", "run_view"]

_SEARCH = "/api/2.0/mlflow/runs/search"


def _value(m: dict) -> float:
    value = m.get("value")
    return float("nan") if value is None or value == "NaN" else float(value)


def run_view(run: dict) -> SimpleNamespace:
    """A light stand-in for ``mlflow.entities.Run`` from one run of the REST search's JSON."""
    info, data = run.get("info", {}), run.get("data", {})
    metrics = [
        SimpleNamespace(
            key=m["key"],
            value=_value(m),
            step=int(m.get("step", 0)),
            timestamp=int(m.get("timestamp", 0)),
        )
        for m in data.get("metrics", ())
    ]
    return SimpleNamespace(
        info=SimpleNamespace(
            run_id=info.get("run_id") or info.get("run_uuid"),
            run_name=info.get("run_name", ""),
            experiment_id=str(info.get("experiment_id")),
            status=info.get("status", ""),
            start_time=int(info.get("start_time") or 0),
            end_time=int(info["end_time"]) if info.get("end_time") else None,
        ),
        data=SimpleNamespace(
            tags={t["key"]: t.get("value", "") for t in data.get("tags", ())},
            params={p["key"]: p.get("value", "") for p in data.get("params", ())},
            metrics={m.key: m.value for m in metrics},
            _metric_objs=metrics,
        ),
    )


def _host_creds(mlflow_client):
    """The client's ``get_host_creds`` when it talks to a REST server, else None.

    ``MlflowClient`` keeps its store as ``_tracking_client.store`` and a ``RestStore``
    keeps the function as ``get_host_creds`` (MLflow 3.17, checked); anything else, or a
    later MLflow without them, means the client's own ``search_runs`` is used."""
    store = getattr(getattr(mlflow_client, "_tracking_client", None), "store", None)
    creds = getattr(store, "get_host_creds", None)
    return creds if callable(creds) else None


def page_reader(mlflow_client):
    """A page reader as ``runreads.client_pages`` returns, reading the REST search's JSON
    into :func:`run_view` s, for a client of an http(s) tracking server; None for any
    other store (a local SQLite file, a file store), whose client search is the path.
    The reader raises ``MlflowException`` (from MLflow) when the server refuses."""
    creds = _host_creds(mlflow_client)
    if creds is None:
        return None
    from mlflow.utils.rest_utils import http_request_safe

    def read(ids, filt, max_results, order_by, token):
        body = {
            "experiment_ids": list(ids),
            "filter": filt,
            "max_results": max_results,
            "order_by": list(order_by),
        }
        if token:
            body["page_token"] = token
        page = http_request_safe(creds(), _SEARCH, "POST", json=body).json()
        return [run_view(r) for r in page.get("runs", ())], page.get("next_page_token") or None

    return read
