"""JobDashboard: the live widget (ipywidgets + bokeh through jupyter_bokeh).

One background poller owns every widget write. Each poll reads only the latest
value of each metric (one ``get_run``); the full history is read once, downsampled,
when the dashboard is created for a job that already has points.
"""

from __future__ import annotations

import functools
import html
import threading

import ipywidgets as widgets

from .model import DEFAULT_ROLLOVER, DashboardModel, RunSource, Snapshot

__all__ = ["JobDashboard"]

_STATE_COLOURS = {
    "PENDING": "#8a6d00",
    "RUNNING": "#1a7f37",
    "RESTARTING": "#bc4c00",
    "SUCCEEDED": "#0969da",
    "FAILED": "#cf222e",
    "STOPPED": "#57606a",
}
_NOT_PLOTTED = {"train/samples", "checkpoint/step"}


def _fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt_number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


@functools.cache
def _plot_class():
    """A ``jupyter_bokeh.BokehModel`` whose ``close()`` may be called twice.

    jupyter_bokeh 4.1's ``close()`` raises KeyError the second time, and ipywidgets
    calls ``close()`` again from ``__del__`` after the dashboard closed it.
    """
    from jupyter_bokeh import BokehModel

    class Plot(BokehModel):
        def close(self) -> None:
            if not getattr(self, "_trainfactory_closed", False):
                self._trainfactory_closed = True
                super().close()

    return Plot


class JobDashboard(widgets.VBox):
    """Live view of one job: state, elapsed time, step, samples/s, a plot per metric,
    utilization per node, last checkpoint and the link to the MLflow run.

    Parameters
    ----------
    job : Job, optional
        The job to show (its manager also supplies Ray's state).
    source : RunSource, optional
        Where to read from instead of ``job`` (tests, or a run without a job).
    interval_s : float
        Seconds between polls.
    rollover : int
        Points kept per plot.
    start : bool
        Start the background poller now (``poll_once`` drives it by hand otherwise).
    """

    def __init__(
        self,
        job=None,
        source: RunSource | None = None,
        interval_s: float = 2.0,
        rollover: int = DEFAULT_ROLLOVER,
        start: bool = True,
        history: bool = True,
    ):
        if source is None:
            source = RunSource(job.tracking_uri, job.run_id, manager=job.manager)
        self.source = source
        self.model = DashboardModel(rollover=rollover)
        self.interval_s = interval_s
        self._header = widgets.HTML()
        self._nodes = widgets.HTML()
        self._footer = widgets.HTML()
        self._plots = widgets.GridBox(
            layout=widgets.Layout(grid_template_columns="repeat(auto-fill, minmax(320px, 1fr))")
        )
        self._figures: dict[str, tuple[object, object]] = {}  # key -> (BokehModel, CDS)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        super().__init__([self._header, self._plots, self._nodes, self._footer])
        if history:
            self._load_history()
        if start:
            self.start()

    # -- polling ----------------------------------------------------------------
    def _load_history(self) -> None:
        snap = self.source.snapshot()
        keys = [p.key for p in snap.points if not p.key.startswith("system/")]
        if keys:
            self.model.load_history(self.source.history(keys, self.model.rollover))
            for key in self.model.series:
                self._plot(key, list(self.model.series[key]))
        self._apply(snap)

    def poll_once(self) -> bool:
        """Read one snapshot and render it. Returns False once the job has ended."""
        self._apply(self.source.snapshot())
        return not self.model.finished

    def _apply(self, snap: Snapshot) -> None:
        new = self.model.update(snap)
        with self.hold_sync():
            for key, points in new.items():
                self._plot(key, points)
            self._render_text()

    def start(self) -> None:
        """Start the background poller (idempotent). It stops by itself when the job ends."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="trainfactory-dashboard", daemon=True
            )
            self._thread.start()

    @property
    def polling(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        delay = self.interval_s
        while not self._stop.wait(delay):
            try:
                if not self.poll_once():
                    return
                delay = self.interval_s
                self._footer.value = ""
            except Exception as exc:  # tracking server briefly away: say so, back off
                delay = min(delay * 2, 30.0)
                self._footer.value = (
                    f"<small>Cannot read the run ({html.escape(str(exc)[:200])});"
                    f" retrying in {delay:.0f} s.</small>"
                )

    def stop(self) -> None:
        """Stop polling (the job itself keeps running)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def close(self) -> None:
        self.stop()
        for bokeh_model, _ in self._figures.values():
            bokeh_model.close()
        self._figures.clear()
        for child in (self._header, self._nodes, self._footer, self._plots):
            child.close()
        super().close()

    # -- rendering --------------------------------------------------------------
    def _plot(self, key: str, points: list[tuple[int, float]]) -> None:
        if key in _NOT_PLOTTED or not points:
            return
        if key not in self._figures:
            from bokeh.models import ColumnDataSource
            from bokeh.plotting import figure

            cds = ColumnDataSource({"step": [], "value": []})
            fig = figure(
                title=key,
                height=200,
                sizing_mode="stretch_width",
                x_axis_label="step",
                tools="pan,wheel_zoom,box_zoom,reset,hover",
                tooltips=[("step", "@step"), (key, "@value")],
            )
            fig.line("step", "value", source=cds, line_width=2)
            fig.scatter("step", "value", source=cds, size=4)
            fig.toolbar.logo = None
            view = _plot_class()(fig)
            self._figures[key] = (view, cds)
            self._plots.children = (*self._plots.children, view)
        _, cds = self._figures[key]
        cds.stream(
            {"step": [p[0] for p in points], "value": [p[1] for p in points]},
            rollover=self.model.rollover,
        )

    def _render_text(self) -> None:
        info = self.model.info
        if info is None:
            return
        colour = _STATE_COLOURS.get(info.state, "#57606a")
        ckpt = "-"
        if info.checkpoint_step is not None:
            ckpt = f"step {info.checkpoint_step}"
            if self.model.latest.get("checkpoint/step") is not None and info.checkpoint_path:
                ckpt += f" · <code>{html.escape(info.checkpoint_path)}</code>"
        link = (
            f'<a href="{html.escape(info.run_url)}" target="_blank">MLflow run</a>'
            if info.run_url
            else html.escape(info.run_id)
        )
        detail = info.error or (info.reason if info.state in ("PENDING", "RESTARTING") else "")
        cells = [
            f'<b style="color:white;background:{colour};padding:2px 8px;border-radius:4px">'
            f"{info.state}</b>",
            f"<b>{html.escape(info.job_id)}</b> {html.escape(info.name)}",
            f"elapsed {_fmt_duration(self.model.elapsed_s())}",
            f"step {'-' if info.step is None else info.step}",
            f"{_fmt_number(self.model.latest.get('train/samples_per_s'), 'samples/s')}",
            f"checkpoint {ckpt}",
            link,
        ]
        text = " &nbsp;|&nbsp; ".join(cells)
        if detail:
            text += f'<div style="color:{colour}"><code>{html.escape(detail)}</code></div>'
        self._header.value = f'<div style="font-family:var(--jp-ui-font-family)">{text}</div>'
        self._nodes.value = self._nodes_html()

    def _nodes_html(self) -> str:
        if not self.model.nodes:
            return ""
        rows = []
        for node, values in sorted(self.model.nodes.items()):
            gpus = sorted(k for k in values if k.startswith("gpu") and k.endswith("/utilization"))
            util = (
                " ".join(f"{k.split('/')[0]} {values[k]:.0f} %" for k in gpus)
                if gpus
                else f"CPU {values.get('cpu_utilization', float('nan')):.0f} %"
            )
            mem = values.get("memory_used_mb")
            rows.append(
                f"<tr><td>{html.escape(node)}</td><td>{util}</td>"
                f"<td>{'-' if mem is None else f'{mem / 1024:.1f} GiB'}</td></tr>"
            )
        return (
            "<table><tr><th>node</th><th>utilization</th><th>host memory used</th></tr>"
            + "".join(rows)
            + "</table>"
        )

    def wait(self, timeout: float | None = None) -> None:
        """Block until the poller stops (the job ended), for scripts and tests."""
        if self._thread is not None:
            self._thread.join(timeout)
