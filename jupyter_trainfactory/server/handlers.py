"""Thin tornado handlers under ``<base_url>/trainfactory/``: JSON in and out, errors as HTTP codes.

Every verb requires Jupyter authentication (POST also the XSRF check). An unknown job is a
404, a request the job's state refuses a 409, Ray or MLflow out of reach a 503: always with
a message, never a traceback.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..chargeback import parse_since
from ..errors import JobNotFound, Unreachable
from ..services import ServiceError
from ..spec import SpecError
from .bokehjs import BokehJSHandler, BokehJSInfoHandler
from .manager import ServiceUnavailable, TrainingJobsManager
from .proxy import ServiceProxyHandler

log = logging.getLogger(__name__)

#: A job id in a URL (``jobstate.JOB_ID_PATTERN`` without anchors): anything else is a 404.
JOB_ID = r"tf-[0-9a-f]{8}"


async def _answer(handler: APIHandler, call: Callable[[], Awaitable[Any]]) -> None:
    """Write ``await call()`` as JSON, or the matching HTTP error with a one-line message."""
    try:
        model = await call()
    except JobNotFound as exc:
        raise web.HTTPError(404, str(exc)) from None
    except SpecError as exc:  # refused by the job's state, or a service out of reach
        code = 503 if isinstance(exc, Unreachable) else 409
        raise web.HTTPError(code, str(exc)) from None
    except (ServiceUnavailable, ServiceError) as exc:
        raise web.HTTPError(503, str(exc)) from None
    except Exception as exc:  # the clients' own errors when Ray or MLflow is away
        log.warning("trainfactory panel: %s failed", handler.request.path, exc_info=True)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise web.HTTPError(503, f"Ray or MLflow did not answer: {first}") from None
    handler.finish(json.dumps(model))


class TrainfactoryHandler(APIHandler):
    """Base: the manager from the tornado settings."""

    @property
    def manager(self) -> TrainingJobsManager:
        return self.settings["trainfactory_manager"]

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """``{"message": ...}`` without a traceback, whatever the server's debug setting."""
        self.set_header("Content-Type", "application/json")
        exc = kwargs.get("exc_info", (None, None, None))[1]
        message = getattr(exc, "log_message", None) or self._reason
        self.finish(json.dumps({"message": message, "reason": self._reason}))

    def _body(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            body = json.loads(self.request.body)
        except ValueError:
            raise web.HTTPError(400, "The request body is not JSON.") from None
        if not isinstance(body, dict):
            raise web.HTTPError(400, "The request body must be a JSON object.")
        return body


class JobsHandler(TrainfactoryHandler):
    """``GET jobs[?all=1]``: jobs newest first, the current user's or everyone's."""

    @web.authenticated
    async def get(self) -> None:
        all_users = self.get_argument("all", "0").lower() in ("1", "true", "yes")
        await _answer(self, lambda: self.manager.list_jobs(all_users=all_users))


class JobHandler(TrainfactoryHandler):
    """``GET jobs/<id>``."""

    @web.authenticated
    async def get(self, job_id: str) -> None:
        await _answer(self, lambda: self.manager.get_job(job_id))


class StopHandler(TrainfactoryHandler):
    """``POST jobs/<id>/stop`` with optional ``{"now": true}``."""

    @web.authenticated
    async def post(self, job_id: str) -> None:
        now = bool(self._body().get("now", False))
        await _answer(self, lambda: self.manager.stop_job(job_id, now=now))


class ResumeHandler(TrainfactoryHandler):
    """``POST jobs/<id>/resume``."""

    @web.authenticated
    async def post(self, job_id: str) -> None:
        await _answer(self, lambda: self.manager.resume_job(job_id))


class ServicesHandler(TrainfactoryHandler):
    """``GET services``: state and links of the Ray head and MLflow server."""

    @web.authenticated
    async def get(self) -> None:
        await _answer(self, self.manager.services)


class StartServicesHandler(TrainfactoryHandler):
    """``POST services/start``: start (or reuse) the embedded services."""

    @web.authenticated
    async def post(self) -> None:
        await _answer(self, self.manager.start_services)


class ReliabilityHandler(TrainfactoryHandler):
    """``GET reliability[?since=30d]``: the fleet's reliability summary of the period
    (``since`` as ``chargeback.parse_since`` reads it; empty: every job); 400 for a
    ``since`` it cannot read or one not in the past."""

    @web.authenticated
    async def get(self) -> None:
        text = self.get_argument("since", "30d").strip()
        try:
            since = parse_since(text, option="since")
        except SpecError as exc:
            raise web.HTTPError(400, str(exc)) from None
        if since is not None and since >= time.time():
            raise web.HTTPError(400, f"since must be in the past, got {text!r}.")
        await _answer(self, lambda: self.manager.reliability(text, since))


class NotAJobHandler(TrainfactoryHandler):
    """Any other ``jobs/...`` path: a 404 that says what a job id looks like."""

    @web.authenticated
    async def get(self, rest: str) -> None:
        raise web.HTTPError(
            404, f"{rest.split('/')[0]!r} is not a job id (they look like tf-1a2b3c4d)."
        )

    @web.authenticated
    async def post(self, rest: str) -> None:
        await self.get(rest)


ROUTES: list[tuple[str, type]] = [
    (r"jobs/?", JobsHandler),
    (rf"jobs/({JOB_ID})/?", JobHandler),
    (rf"jobs/({JOB_ID})/stop/?", StopHandler),
    (rf"jobs/({JOB_ID})/resume/?", ResumeHandler),
    (r"jobs/(.+)", NotAJobHandler),
    (r"services/?", ServicesHandler),
    (r"services/start/?", StartServicesHandler),
    (r"reliability/?", ReliabilityHandler),
    (r"proxy/(mlflow|ray)(/.*)?", ServiceProxyHandler),
    (r"bokehjs/?", BokehJSInfoHandler),
    (r"bokehjs/(.+)", BokehJSHandler),
]


def add_handlers(web_app: web.Application, base_url: str) -> None:
    """Register :data:`ROUTES` under ``<base_url>trainfactory/``."""
    prefix = url_path_join(base_url, "trainfactory")
    web_app.add_handlers(".*$", [(url_path_join(prefix, p), h) for p, h in ROUTES])
