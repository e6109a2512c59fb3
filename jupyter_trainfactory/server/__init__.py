"""Jupyter server extension: authenticated REST for the side panel under ``<base_url>/trainfactory/``."""

from __future__ import annotations

from typing import Any

__all__ = ["_jupyter_server_extension_points", "_load_jupyter_server_extension"]


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": "jupyter_trainfactory.server"}]


def _load_jupyter_server_extension(server_app: Any) -> None:
    """Put one :class:`TrainingJobsManager` in the tornado settings and add the routes."""
    import os

    from ..cluster import resolve_address
    from .handlers import add_handlers
    from .links import BASE_URL_ENV
    from .manager import TrainingJobsManager

    web_app = server_app.web_app
    base_url = web_app.settings["base_url"]
    # the same target as every other door: RAY_ADDRESS (a dashboard URL) and
    # MLFLOW_TRACKING_URI when the server's environment has them, else the embedded services
    manager = TrainingJobsManager(
        base_url=base_url,
        address=resolve_address(None),
        tracking_uri=os.environ.get("MLFLOW_TRACKING_URI") or None,
    )
    manager.warm_up()
    web_app.settings["trainfactory_manager"] = manager
    add_handlers(web_app, base_url)
    # kernels this server starts inherit its environment: the dashboard links through the
    # proxy below (dashboard/links.py) and knows the page loads BokehJS (server/bokehjs.py)
    os.environ[BASE_URL_ENV] = base_url
    server_app.log.info("jupyter_trainfactory: side panel REST at %strainfactory/", base_url)
