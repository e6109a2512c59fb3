"""jupyter_trainfactory: launch, watch and record Ray Train jobs from JupyterLab.

The public API (``launch``, ``attach``, ``list_jobs``) and the IPython extension
(``%load_ext jupyter_trainfactory``). Imports are lazy so that worker code can import
``jupyter_trainfactory.train`` without Jupyter, ipywidgets or bokeh.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = [
    "attach",
    "health",
    "launch",
    "list_jobs",
    "load_ipython_extension",
    "poc",
    "reliability",
    "sweep",
]


def __getattr__(name: str) -> Any:
    if name in (
        "launch",
        "attach",
        "list_jobs",
        "get_manager",
        "reliability",
        "health",
        "poc",
        "sweep",
    ):
        from . import api

        return getattr(api, name)
    if name in ("Job", "JobInfo", "JobManager"):
        from . import jobs

        return getattr(jobs, name)
    if name in ("JobSpec", "SpecError"):
        from . import spec

        return getattr(spec, name)
    raise AttributeError(f"module 'jupyter_trainfactory' has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext jupyter_trainfactory``: registers the ``%train`` magic."""
    from .magics import TrainMagics

    ipython.register_magics(TrainMagics(shell=ipython))


def unload_ipython_extension(ipython) -> None:
    """Nothing to undo beyond IPython's own bookkeeping."""
