"""Authenticated reverse proxy to the MLflow UI and the Ray dashboard: ``trainfactory/proxy/<name>/``.

A browser that is not on the server's machine (JupyterHub, a remote lab) reaches both UIs
through the Jupyter server it is logged in to. The Ray cluster's token is added here, so
the user never handles it; the browser's Jupyter cookies and credentials are not passed on.
"""

from __future__ import annotations

from urllib.parse import urlparse

from jupyter_server.base.handlers import JupyterHandler
from tornado import httpclient, web

#: Request and response headers that belong to one hop, or to Jupyter, not to the service.
_DROP_REQUEST = {
    "host",
    "cookie",
    "authorization",
    "x-xsrftoken",
    "connection",
    "keep-alive",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "accept-encoding",
}
_DROP_RESPONSE = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "content-encoding",
    "set-cookie",
    "server",
    "date",
}


class ServiceProxyHandler(JupyterHandler):
    """Forwards ``<base_url>trainfactory/proxy/<mlflow|ray>/<path>`` to that service."""

    SUPPORTED_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

    def check_xsrf_cookie(self) -> None:
        """The proxied UIs cannot send Jupyter's XSRF token, so a write must come from this
        server's own origin instead (Origin or Referer), which a cross-site form cannot fake.
        Token-authenticated requests pass, as everywhere in Jupyter."""
        if not hasattr(self, "_jupyter_current_user"):
            return  # called before authentication; JupyterHandler.prepare calls it again
        if self.token_authenticated or self.settings.get("disable_check_xsrf", False):
            return
        source = self.request.headers.get("Origin") or self.request.headers.get("Referer") or ""
        if urlparse(source).netloc != self.request.host:
            raise web.HTTPError(403, "Cross-origin write refused by the trainfactory proxy.")

    async def _forward(self, name: str, path: str | None) -> None:
        from .manager import ServiceUnavailable

        if not path:  # relative links of both UIs need the trailing slash
            self.redirect(
                self.request.path + "/" + (f"?{self.request.query}" if self.request.query else "")
            )
            return
        try:
            base, headers = self.settings["trainfactory_manager"].service_target(name)
        except ServiceUnavailable as exc:
            raise web.HTTPError(503, str(exc)) from None
        url = base + path + (f"?{self.request.query}" if self.request.query else "")
        for key, value in self.request.headers.get_all():
            if key.lower() not in _DROP_REQUEST and key.lower() not in (h.lower() for h in headers):
                headers[key] = value
        body = (
            self.request.body if self.request.method in ("POST", "PUT", "PATCH", "DELETE") else None
        )
        request = httpclient.HTTPRequest(
            url,
            method=self.request.method,
            headers=headers,
            body=body,
            allow_nonstandard_methods=True,
            follow_redirects=False,
            request_timeout=60,
        )
        try:
            reply = await httpclient.AsyncHTTPClient().fetch(request, raise_error=False)
        except OSError as exc:
            raise web.HTTPError(
                503, f"The {name} service does not answer at {base}: {exc}"
            ) from None
        if reply.code == 599:
            raise web.HTTPError(503, f"The {name} service does not answer at {base}: {reply.error}")
        self.set_status(reply.code, reply.reason)
        self.clear_header("Content-Type")
        for key, value in reply.headers.get_all():
            if key.lower() in _DROP_RESPONSE:
                continue
            if key.lower() == "location" and value.startswith(
                "/"
            ):  # keep redirects inside the proxy
                value = self.request.path[: len(self.request.path) - len(path)] + value
            self.add_header(key, value)
        if reply.body and self.request.method != "HEAD":
            self.write(reply.body)
        await self.finish()

    @web.authenticated
    async def get(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    async def head(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    async def post(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    async def put(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    async def patch(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    async def delete(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)

    @web.authenticated
    async def options(self, name: str, path: str | None = None) -> None:
        await self._forward(name, path)
