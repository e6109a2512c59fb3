"""BokehJS from the installed bokeh package, for the page: ``<base_url>trainfactory/bokehjs/``.

jupyter_bokeh's widgets draw only once BokehJS is in the page, and bokeh's default
resources come from a CDN that clusters and air-gapped machines cannot reach. The side
panel's front-end plugin (``labextension/src/bokeh.ts``) loads these files at page load, in
JupyterLab 4 and Notebook 7, so the dashboard's plots draw offline. The files are the
Python package's own (``bokeh.util.paths.bokehjs_path() / "js"``), so BokehJS always matches
the kernel's bokeh version, as jupyter_bokeh requires.
"""

from __future__ import annotations

from pathlib import Path

from jupyter_server.base.handlers import APIHandler, JupyterHandler
from tornado import web

__all__ = ["BOKEHJS_FILES", "BokehJSHandler", "BokehJSInfoHandler", "bokehjs_dir", "bokehjs_info"]

#: What the page loads, in order (core first): bokeh's own INLINE set less mathjax.
BOKEHJS_FILES = ("bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js")


def bokehjs_dir() -> Path:
    """The folder of the installed bokeh package's compiled BokehJS files."""
    from bokeh.util.paths import bokehjs_path

    return Path(bokehjs_path()) / "js"


def bokehjs_info() -> dict[str, object]:
    """``{"version": bokeh's version, "files": [names of BOKEHJS_FILES present]}``."""
    import bokeh

    folder = bokehjs_dir()
    return {
        "version": bokeh.__version__,
        "files": [name for name in BOKEHJS_FILES if (folder / name).is_file()],
    }


class BokehJSInfoHandler(APIHandler):
    """``GET trainfactory/bokehjs/``: :func:`bokehjs_info` as JSON (what the page loads)."""

    @web.authenticated
    def get(self) -> None:
        self.finish(bokehjs_info())


class BokehJSHandler(JupyterHandler, web.StaticFileHandler):
    """``GET trainfactory/bokehjs/<file>``: one of :data:`BOKEHJS_FILES` from
    :func:`bokehjs_dir`, to authenticated users, cached for good (the URL has the version)."""

    def initialize(self) -> None:
        web.StaticFileHandler.initialize(self, path=str(bokehjs_dir()))

    @web.authenticated
    async def get(self, path: str, include_body: bool = True) -> None:
        if path not in BOKEHJS_FILES:
            raise web.HTTPError(404, f"{path!r} is not one of the BokehJS files served here.")
        await web.StaticFileHandler.get(self, path, include_body)

    def set_extra_headers(self, path: str) -> None:
        self.set_header("Cache-Control", "max-age=31536000, immutable")

    def compute_etag(self) -> str | None:
        return web.StaticFileHandler.compute_etag(self)
