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

from jupyter_server.base.handlers import JupyterHandler
from tornado import web

__all__ = ["BOKEHJS_FILES", "BokehJSHandler", "bokehjs_dir", "bokehjs_info"]

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


class BokehJSHandler(JupyterHandler, web.StaticFileHandler):
    """Serves the files of :func:`bokehjs_dir` to authenticated users, cached by version.

    ``GET trainfactory/bokehjs/`` (no file) answers :func:`bokehjs_info` as JSON.
    """

    def initialize(self) -> None:
        web.StaticFileHandler.initialize(self, path=str(bokehjs_dir()))

    @web.authenticated
    async def get(self, path: str = "", include_body: bool = True) -> None:
        if not path:
            self.set_header("Content-Type", "application/json")
            self.finish(bokehjs_info())
            return
        if path not in BOKEHJS_FILES:
            raise web.HTTPError(404, f"{path!r} is not one of the BokehJS files served here.")
        await web.StaticFileHandler.get(self, path, include_body)

    def set_extra_headers(self, path: str) -> None:
        # the URL carries bokeh's version (?v=), so the file can be cached for good
        self.set_header("Cache-Control", "max-age=31536000, immutable")

    def compute_etag(self) -> str | None:
        return web.StaticFileHandler.compute_etag(self)
