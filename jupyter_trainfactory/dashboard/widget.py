"""JobDashboard: the live widget (ipywidgets + bokeh through jupyter_bokeh).

One background poller owns every widget write. Each poll reads only the latest value of
each metric (one ``get_run``); the full history is read once, downsampled, when the
dashboard is created for a job that already has points. Under the header line of numbers
come the user's metrics, then throughput and devices, then (collapsed) goodput and cost:
:mod:`.layout` decides what goes where. When the job ends the poller slows down but keeps
following it (a resume from anywhere shows here), and the cell gets a static summary
(:mod:`.summary`) that outlives the kernel.
"""

from __future__ import annotations

import html
import threading
import uuid

import ipywidgets as widgets

from ..server.links import proxied_run_url
from . import layout
from .header import header_html, nodes_html
from .model import DEFAULT_MAX_POINTS, DashboardModel, RunSource, Snapshot, history_keys
from .plots import PlotGrid
from .summary import empty_summary, live_css, summary_class, summary_html
from .timeline import timeline_html

__all__ = ["JobDashboard", "timeline_html"]

_SYSTEM_ORDER = {"throughput": 0, "utilization": 1, "memory": 2, layout.STEP_SPLIT[0]: 3}
_TIME_AXIS, _STEP_AXIS, _RUNNING_AXIS = "elapsed (s)", "step", "running time (s)"


def _is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the tracking server did not answer (not a bug of ours)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return isinstance(exc, OSError) or bool(names & {"MlflowException", "RequestException"})


class JobDashboard(widgets.VBox):
    """Live view of one job: the header line of numbers (state, step, throughput, MFU,
    checkpoint, goodput, cost), a plot per user metric, throughput, utilization and memory
    per device, the step time split, the node table and the link to the MLflow run.

    Parameters
    ----------
    job : Job, optional
        The job to show (its manager also supplies Ray's state).
    source : RunSource, optional
        Where to read from instead of ``job`` (tests, or a run without a job).
    interval_s : float
        Seconds between polls while the job runs.
    follow_interval_s : float
        Seconds between polls once it ended (a resume shows within this time).
    max_points : int
        Points kept per plot line: past twice as many, every other one is dropped, so a
        plot spans the whole run (each poll adds the latest point of each metric; when the
        job ends the plots are re-read from the run's whole history).
    start : bool
        Start the background poller now (``poll_once`` drives it by hand otherwise).
    history : bool
        Read the run's history on creation (``%train attach`` of a running or ended job).
    """

    def __init__(
        self,
        job=None,
        source: RunSource | None = None,
        interval_s: float = 2.0,
        max_points: int = DEFAULT_MAX_POINTS,
        start: bool = True,
        history: bool = True,
        follow_interval_s: float = 10.0,
    ):
        if source is None:
            source = RunSource(job.tracking_uri, job.run_id, manager=job.manager)
        self.source = source
        self.model = DashboardModel(max_points=max_points)
        self.interval_s = interval_s
        self.follow_interval_s = follow_interval_s
        self.uid = uuid.uuid4().hex[:10]
        self._header = widgets.HTML()
        self._nodes = widgets.HTML()
        self._footer = widgets.HTML()
        self._user = PlotGrid(max_points)
        self._system = PlotGrid(max_points, rank=lambda plot_id: _SYSTEM_ORDER.get(plot_id, 9))
        self._cost = PlotGrid(max_points)
        self._cost_box = widgets.Accordion(
            children=[self._cost.box], titles=(layout.SECTION_TITLES["cost"],)
        )
        self._cost_box.selected_index = None
        self._cost_box.layout.display = "none"  # until there is a goodput or cost series
        self._split_after: int | None = None
        self._step_plots: dict[str, tuple[PlotGrid, str]] = {}  # key -> its plot
        self._complete = False  # the plots hold the ended run's whole history
        self._t0: float | None = None
        self._lock = threading.RLock()
        self._ended = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._summary = None  # the DisplayHandle of the static summary's output
        self._summary_for: tuple | None = None
        super().__init__(
            [
                self._header,
                self._user.box,
                self._system.box,
                self._cost_box,
                self._nodes,
                self._footer,
            ]
        )
        if history:
            self._load_history()
        if start:
            self.start()

    def __repr__(self) -> str:  # the text/plain of a saved notebook without its kernel
        job = self.model.info.job_id if self.model.info else self.source.run_id
        return f"<live dashboard of job {job}: shown by its kernel; a summary is kept below>"

    # -- display ----------------------------------------------------------------
    def _ipython_display_(self) -> None:
        """Show the widget, then a second output for the static summary (empty and hidden
        while the job runs; filled when it ends)."""
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        self._summary = display(self._summary_bundle(None), raw=True, display_id=True)
        self._summary_for = None
        if self.model.finished:
            self._publish_summary()

    def _summary_bundle(self, summary: str | None) -> dict[str, str]:
        if summary is None:
            return empty_summary(self.uid)
        job = self.model.info.job_id if self.model.info else ""
        return {"text/html": summary, "text/plain": f"job {job}: {self.model.info.state}"}

    def summary(self, written: str | None = None) -> dict[str, str] | None:
        """The static summary's mime bundle (``text/html``, ``text/plain``) once the job has
        ended: the final header and a picture per user metric and of the throughput, by
        step; None while it runs. With ``written`` (when, for its caption) that of the
        last read whatever the state (a view closed while the job runs); None before one."""
        info = self.model.info
        if info is None or (written is None and not self.model.finished):
            return None
        series = self.model.series
        curves = [(k, _STEP_AXIS, list(v)) for k, v in series.items() if layout.is_user_metric(k)]
        rate = layout.throughput_key(series)
        if rate:
            curves.append((rate, _STEP_AXIS, list(series[rate])))
        header = header_html(self.model, self._run_link())
        html_text = summary_html(
            summary_class(self.uid),
            info.job_id,
            header,
            curves,
            written=written or "when the job ended",
        )
        return self._summary_bundle(html_text)

    def _publish_summary(self) -> None:
        info = self.model.info
        key = (info.state, info.step, info.resumes) if info is not None else None
        if self._summary is None or key == self._summary_for:
            return
        self._summary_for = key
        self._summary.update(self.summary(), raw=True)

    def _retract_summary(self) -> None:
        if self._summary is not None and self._summary_for is not None:
            self._summary_for = None
            self._summary.update(self._summary_bundle(None), raw=True)

    # -- polling ----------------------------------------------------------------
    def _load_history(self) -> None:
        snap = self.source.snapshot()
        keys = history_keys(snap)
        with self._lock:
            self.model.info = snap.info
            self._complete = self.model.finished  # read after the end: nothing to re-read
            if keys:
                self.model.load_history(self.source.history(keys, 2 * self.model.max_points))
                self._render_plots(
                    {
                        **{k: list(v) for k, v in self.model.series.items()},
                        **{k: list(v) for k, v in self.model.timeseries.items()},
                    }
                )
            self._apply(snap)

    def _reread_history(self, keys: list[str] | None = None) -> None:
        """The step plots of ``keys`` (default: all) get every point of the run so far
        (downsampled), not only the latest point each poll saw: all of them once the job
        ended, and each once when it first draws while the job runs (the steps a fast loop
        made before that poll, the start of its curve)."""
        keys = [k for k in (self.model.series if keys is None else keys) if k in self._step_plots]
        if not keys:
            return
        history = self.source.history(keys, 2 * self.model.max_points)
        self.model.replace_history(history)
        for key in keys:
            grid, plot_id = self._step_plots[key]
            grid.replace(plot_id, self.model.series[key])

    def poll_once(self) -> bool:
        """Read one snapshot and render it. Returns False while the job is ended."""
        snap = self.source.snapshot()
        with self._lock:
            self._apply(snap)
        return not self.model.finished

    def _apply(self, snap: Snapshot) -> None:
        new = self.model.update(snap)
        with self.hold_sync():
            drawn = set(self._step_plots)
            self._render_plots(new)
            first = [k for k in self._step_plots if k not in drawn]  # plots drawn just now
            if first and not self.model.finished:  # an ended run is re-read below
                self._reread_history(first)
            self._render_text()
        if self.model.finished:
            if not self._complete:
                self._complete = True
                self._reread_history()
                for grid in (self._user, self._system, self._cost):
                    grid.refresh()
            self._ended.set()
            self._publish_summary()
        else:
            self._ended.clear()
            self._complete = False
            self._retract_summary()

    def start(self) -> None:
        """Start the background poller (idempotent). It polls every ``interval_s`` while the
        job runs and every ``follow_interval_s`` once it ended, until :meth:`stop`."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._run, name="trainfactory-dashboard", daemon=True
            )
            self._thread.start()

    @property
    def polling(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def ended(self) -> bool:
        """Whether the job is in a terminal state as last seen (a resume clears it)."""
        return self._ended.is_set()

    def _run(self) -> None:
        delay = self.interval_s
        while not self._stop.wait(delay):
            try:
                running = self.poll_once()
                delay = self.interval_s if running else self.follow_interval_s
                if self._footer.value:
                    self._footer.value = ""
            except Exception as exc:  # tracking server briefly away: say so, back off
                delay = min(delay * 2, 30.0)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                what = (
                    "tracking server unreachable"
                    if _is_outage(exc)
                    else f"the dashboard could not update ({type(exc).__name__})"
                )
                self._footer.value = (
                    f'<div style="color:#cf222e"><b>{what}</b>'
                    f" ({html.escape(first[:200])}); the job goes on and its recorder queues"
                    f" the points; retrying in {delay:.0f} s.</div>"
                )

    def stop(self) -> None:
        """Stop polling (the job itself keeps running)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the dashboard has seen the job end (scripts and tests); returns
        whether it has."""
        return self._ended.wait(timeout)

    def close(self) -> None:
        """Stop polling and close the widget. The cell keeps a summary: the final one of an
        ended job, else that of the last read (an ``attach`` or ``resume`` elsewhere
        replaced this view while the job runs: the cell was left blank, issue 48)."""
        self.stop()
        if self._summary is not None and not self.model.finished:
            bundle = self.summary("at its last read, when this view closed")
            if bundle is not None:
                self._summary.update(bundle, raw=True)
        for grid in (self._user, self._system, self._cost):
            grid.close()
        for child in (self._header, self._nodes, self._footer, self._cost_box):
            child.close()
        super().close()

    def plot_ids(self) -> dict[str, list[str]]:
        """The plots shown, per section in display order: ``user`` (metric keys),
        ``system`` (``throughput``, ``utilization``, ``memory``, ``step_split``) and
        ``cost`` (metric keys, in the collapsed section)."""
        return {"user": self._user.ids, "system": self._system.ids, "cost": self._cost.ids}

    def source_of(self, plot_id: str, line: str = "") -> object:
        """The bokeh ``ColumnDataSource`` of one line of a plot (columns ``x`` and ``y``;
        KeyError when there is no such plot or line)."""
        for grid in (self._user, self._system, self._cost):
            if plot_id in grid:
                return grid.sources[plot_id][line]
        raise KeyError(plot_id)

    # -- rendering --------------------------------------------------------------
    def _elapsed(self, at: float) -> float:
        if self._t0 is None:
            started = self.model.info.started if self.model.info else None
            self._t0 = started if started is not None else at
        return round(at - self._t0, 1)

    def _render_plots(self, new: dict[str, list[tuple[float, float]]]) -> None:
        """Route each series' new points to its section's plot (see :mod:`.layout`)."""
        rate = layout.throughput_key(self.model.series)
        for key, points in new.items():
            if key in self.model.timeseries:
                device = layout.device_series(key, self.model.has_gpus)
                if device is not None:
                    plot_id, label, scale = device
                    title, unit = layout.device_plot(plot_id, self.model.has_gpus)
                    xy = [(self._elapsed(t), v * scale) for t, v in points]
                    self._system.line(
                        plot_id, xy, title, _TIME_AXIS, unit, line=label, legend_at="outside"
                    )
            elif layout.is_user_metric(key):
                self._user.line(key, points, key, _STEP_AXIS)
                self._step_plots[key] = (self._user, key)
            elif key == rate:
                unit = rate.removeprefix("train/").replace("_per_s", "/s")
                self._system.line("throughput", points, f"throughput ({unit})", _STEP_AXIS)
                self._step_plots[key] = (self._system, "throughput")
            elif (title := layout.cost_plot(key)) is not None:
                self._cost.line(key, points, title, _RUNNING_AXIS)
                self._cost_box.layout.display = None
        rows = self.model.step_split(after=self._split_after)
        if rows:
            plot_id, title = layout.STEP_SPLIT
            in_ms = [(step, *(1000 * s for s in parts)) for step, *parts in rows]
            self._system.stacked(
                plot_id, in_ms, ("compute", "data wait", "communication"), title, _STEP_AXIS
            )
            self._split_after = rows[-1][0]

    def _run_link(self) -> str | None:
        info = self.model.info
        if info is None:
            return None
        uri = getattr(self.source, "tracking_uri", "")
        return proxied_run_url(uri, info.experiment_id, info.run_id)

    def _render_text(self) -> None:
        text = header_html(self.model, self._run_link())
        if not text:
            return
        self._header.value = (
            f'<div style="font-family:var(--jp-ui-font-family)">{text}{live_css(self.uid)}</div>'
        )
        self._nodes.value = nodes_html(self.model)
