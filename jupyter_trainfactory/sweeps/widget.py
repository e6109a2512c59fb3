"""SweepBoard: the live leaderboard of a sweep (ipywidgets, and a bokeh plot through
jupyter_bokeh: BokehJS comes from the lab extension, as for the job dashboard).

One background poller reads the sweep from MLflow (:func:`.leaderboard.read_sweep`) every
``interval_s`` and owns every widget write: the header line, the table of trials (best
first, highlighted) and a plot of the metric per trial over steps, each trial a line that
only gets its new points. It stops once the sweep ended and the last read is shown.

Under the widget, the cell keeps a static summary (the leaderboard and the best trial's
curve, plain HTML, :mod:`..dashboard.summary`): hidden while the widget shows, written
when the sweep ends or when this view closes (``%train attach`` or ``resume`` shows a new
one), so a reloaded or exported notebook still shows the sweep.
"""

from __future__ import annotations

import threading
import uuid

import ipywidgets as widgets

from ..dashboard.plots import PlotGrid
from ..dashboard.summary import empty_summary, live_css, summary_class, summary_html
from .leaderboard import SweepView, leaderboard_html, read_sweep

__all__ = ["SweepBoard"]

_ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
_PLOT = "metric"


class SweepBoard(widgets.VBox):
    """Live view of the sweep whose parent run is ``run_id`` (``mlflow_client`` reads
    it; ``job_id`` names it in the summary); ``start=False`` leaves polling to
    :meth:`poll_once` (tests)."""

    def __init__(
        self,
        mlflow_client,
        run_id: str,
        interval_s: float = 2.0,
        start: bool = True,
        job_id: str = "",
    ):
        self._client = mlflow_client
        self.run_id = run_id
        self.job_id = job_id or run_id
        self.uid = uuid.uuid4().hex[:10]
        self._summary = None  # the DisplayHandle of the static summary's output
        self._summary_for: tuple | None = None
        self.interval_s = interval_s
        self.table = widgets.HTML()
        self.plots = PlotGrid(max_points=2000, min_width_px=420)
        self._steps: dict[int, int] = {}  # trial index -> last step plotted
        self._stop = threading.Event()
        self.view: SweepView | None = None
        super().__init__([self.table, self.plots.box])
        self.add_class("tf-sweep")
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    def __repr__(self) -> str:  # the text/plain of a saved notebook without its kernel
        return f"<live leaderboard of sweep {self.job_id}: shown by its kernel; a summary is kept below>"

    def start(self) -> None:
        """Start the poller (again, once it stopped: a resumed sweep shows here)."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def poll_once(self) -> SweepView:
        """Read the sweep and show it; returns what it read."""
        view = read_sweep(self._client, self.run_id)
        self.table.value = leaderboard_html(view) + live_css(self.uid)
        for row in sorted(view.rows, key=lambda r: r.index):
            last = self._steps.get(row.index, -1)
            new = [(s, v) for s, v in row.history if s > last]
            if new:
                self._steps[row.index] = new[-1][0]
                title = f"{view.metric} per trial"
                # beside the plot: with a few trials any corner of it covers some curve
                line = f"trial {row.index}"
                self.plots.line(
                    _PLOT, new, title, "step", view.metric, line=line, legend_at="outside"
                )
        self.view = view
        if view.state in _ENDED:
            self._publish("when the sweep ended")
        return view

    # -- the static summary -------------------------------------------------------
    def _ipython_display_(self) -> None:
        """Show the widget, then a second output for the static summary (empty and hidden
        while the widget shows)."""
        from IPython.display import display

        display(self._repr_mimebundle_(), raw=True)
        self._summary = display(empty_summary(self.uid), raw=True, display_id=True)
        self._summary_for = None
        if self.view is not None and self.view.state in _ENDED:
            self._publish("when the sweep ended")

    def summary(self, written: str) -> dict[str, str] | None:
        """The static summary's mime bundle (``text/html``, ``text/plain``) of the last
        read: the header and table, and the best trial's curve by step; None before a
        read. ``written``: when (its caption)."""
        view = self.view
        if view is None:
            return None
        best = view.best
        curves = [(f"{view.metric}, trial {best.index}", "step", best.history)] if best else []
        text = summary_html(
            summary_class(self.uid),
            self.job_id,
            leaderboard_html(view),
            curves,
            kind="sweep",
            written=written,
        )
        return {"text/html": text, "text/plain": f"sweep {self.job_id}: {view.state}"}

    def _publish(self, written: str) -> None:
        view = self.view
        key = (view.state, view.done, len(view.rows)) if view is not None else None
        if self._summary is None or key is None or key == self._summary_for:
            return
        self._summary_for = key
        self._summary.update(self.summary(written), raw=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                view = self.poll_once()
            except Exception as exc:  # the tracking server away: say it, keep polling
                self.table.value = f"<div class='tf-sweep-header'>sweep: cannot read ({exc})</div>"
            else:
                if view.state in _ENDED:
                    return
            self._stop.wait(self.interval_s)

    def close(self) -> None:
        """Stop polling and close the widget; the cell keeps the summary of the last read."""
        self._stop.set()
        self._publish("at its last read, when this view closed")
        self.plots.close()
        super().close()
