"""Links to a run that work from the browser: through this Jupyter server's proxy when there is one.

Pure (no Jupyter server import): the kernel uses it. The server extension exports its base
URL as :data:`BASE_URL_ENV` into its own environment at load, which every kernel it starts
inherits; its proxy (``<base_url>trainfactory/proxy/mlflow/``) forwards to the server's MLflow
(``MLFLOW_TRACKING_URI``, else the embedded server), so a run on that MLflow gets a link a
remote browser can open, and any other run keeps its direct URL.
"""

from __future__ import annotations

import os

__all__ = ["BASE_URL_ENV", "jupyter_base_url", "proxied_run_url"]

#: Set by the server extension in its process (so in its kernels): the server's base URL.
BASE_URL_ENV = "TRAINFACTORY_JUPYTER_BASE_URL"


def jupyter_base_url() -> str | None:
    """The base URL (``/`` or ``/user/alice/``) of the Jupyter server that started this
    kernel when it runs the trainfactory server extension, else None."""
    base = os.environ.get(BASE_URL_ENV)
    if not base:
        return None
    return base if base.endswith("/") else base + "/"


def _proxied_tracking_uri() -> str | None:
    """The MLflow the server's proxy forwards to, as the server resolves it."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    from .. import services as svc

    services = svc.load_services()
    return services.tracking_uri if services is not None else None


def proxied_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """``<base_url>trainfactory/proxy/mlflow/#/experiments/E/runs/R?workflowType=...`` when this kernel runs
    under a Jupyter server with the extension and the run is on the MLflow its proxy
    reaches; None otherwise (use the direct URL)."""
    base = jupyter_base_url()
    if base is None or not experiment_id or not run_id:
        return None
    target = _proxied_tracking_uri()
    if target is None or target.rstrip("/") != (tracking_uri or "").rstrip("/"):
        return None
    from ..tracking import UI_QUERY  # the MLflow UI's model-training view

    return f"{base}trainfactory/proxy/mlflow/#/experiments/{experiment_id}/runs/{run_id}?{UI_QUERY}"
