"""The dashboard's bokeh plots: a grid of figures, each built with its data and then streamed.

A jupyter_bokeh view builds its BokehJS document from the widget's ``render_bundle``,
which is fixed when the ``BokehModel`` is made; later changes reach a view only as patches
to a view that already exists. So every figure is made with the points it has (history
on attach), never empty and filled after, or the browser would show an empty frame; and a
line added to a figure renews its bundle (the view redraws), or a view made later (a cell
JupyterLab re-renders, a reload) would show the figure without it.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import ipywidgets as widgets

from .model import thin

__all__ = ["PALETTE", "PlotGrid"]

#: Line colours (Bokeh's Category10), cycled per line of a multi-line plot.
PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
_STACK_COLOURS = ("#2da44e", "#d4a72c", "#6e9fc9")


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


def _style(legend) -> None:
    """Small labels; a click on an entry hides its line."""
    legend.label_text_font_size = "10px"
    legend.click_policy = "hide"
    legend.background_fill_alpha = 0.6


def _figure(title: str, x_label: str, y_label: str | None, tooltips):
    from bokeh.plotting import figure

    fig = figure(
        title=title,
        height=210,
        sizing_mode="stretch_width",
        x_axis_label=x_label,
        y_axis_label=y_label,
        tools="pan,wheel_zoom,box_zoom,reset,hover",
        tooltips=tooltips,
    )
    fig.toolbar.logo = None
    fig.title.text_font_size = "12px"
    return fig


class PlotGrid:
    """One section's plots, ordered by ``rank(plot_id)``, then by when they got points.

    ``box`` is the ipywidgets ``GridBox`` to show. ``sources[plot_id][line]`` is the
    ``ColumnDataSource`` of each line (columns ``x``, ``y``; a stacked plot has one
    source, line ``""``, with a column per part).
    """

    def __init__(self, max_points: int, min_width_px: int = 320, rank=None):
        self.max_points = max_points
        self._rank = rank or (lambda plot_id: 0)
        self.box = widgets.GridBox(
            layout=widgets.Layout(
                grid_template_columns=f"repeat(auto-fill, minmax({min_width_px}px, 1fr))"
            )
        )
        self.views: dict[str, object] = {}
        self.figures: dict[str, object] = {}
        self.sources: dict[str, dict[str, object]] = {}
        self._lines: dict[str, list[tuple[str, object]]] = {}  # plot id: (name, renderer)

    def __contains__(self, plot_id: str) -> bool:
        return plot_id in self.views

    @property
    def ids(self) -> list[str]:
        """The plot ids in the order they show."""
        by_view = {id(v): p for p, v in self.views.items()}
        return [by_view[id(v)] for v in self.box.children]

    def _add(self, plot_id: str, fig) -> None:
        view = _plot_class()(fig)
        self.views[plot_id] = view
        self.figures[plot_id] = fig
        order = sorted(self.views, key=lambda p: self._rank(p))  # stable: first come first
        self.box.children = tuple(self.views[p] for p in order)

    def line(
        self,
        plot_id: str,
        points: Sequence[tuple[float, float]],
        title: str,
        x_label: str,
        y_label: str | None = None,
        line: str = "",
        legend_at: str = "top_left",
    ) -> None:
        """Append ``(x, y)`` points to ``line`` of plot ``plot_id`` (made on first points).

        A plot with a ``line`` name gets a legend entry per line (one per device), at
        ``legend_at`` (a bokeh ``LegendLocation``: the corner the lines leave free, or
        ``"outside"``: right of the plot area, from its second line on: one line's name is
        in the plot's title and hover, and a legend beside it would take the plot's width)."""
        if not points:
            return
        from bokeh.models import ColumnDataSource

        xs, ys = [p[0] for p in points], [p[1] for p in points]
        lines = self.sources.get(plot_id)
        if lines is not None and line in lines:
            self._stream(lines[line], {"x": xs, "y": ys})
            return
        cds = ColumnDataSource({"x": xs, "y": ys}, name=line or title)
        fresh = plot_id not in self.views
        fig = (
            _figure(title, x_label, y_label, [(x_label, "@x{0,0.[0]}"), (line or title, "@y")])
            if fresh
            else self.figures[plot_id]
        )
        colour = PALETTE[len(self.sources.get(plot_id, {})) % len(PALETTE)]
        inside = line and legend_at != "outside"
        extra = {"legend_label": line} if inside else {}
        renderer = fig.line("x", "y", source=cds, line_width=2, color=colour, **extra)
        if not line:
            fig.scatter("x", "y", source=cds, size=4, color=colour)
        elif inside:
            fig.legend.location = legend_at
            _style(fig.legend)
        else:
            self._lines.setdefault(plot_id, []).append((line, renderer))
            self._legend_beside(fig, self._lines[plot_id])
        self.sources.setdefault(plot_id, {})[line] = cds
        if fresh:
            self._add(plot_id, fig)
        else:  # a new line is a new model: a view made from the old bundle would lack it
            self.views[plot_id].update_from_model(fig)

    @staticmethod
    def _legend_beside(fig, lines: list[tuple[str, object]]) -> None:
        """The legend right of the plot area, where it covers no line, once there are two
        ``(name, renderer)`` lines; a later line is appended to it."""
        from bokeh.models import Legend, LegendItem

        if len(lines) < 2:
            return
        items = [LegendItem(label=name, renderers=[r]) for name, r in lines[-2:]]
        if len(lines) == 2:
            legend = Legend(items=items)
            fig.add_layout(legend, "right")
            _style(legend)
        else:  # a new list, so that the browser's copy follows
            fig.legend[0].items = [*fig.legend[0].items, items[-1]]

    def stacked(
        self,
        plot_id: str,
        rows: Sequence[Sequence[float]],
        parts: Sequence[str],
        title: str,
        x_label: str,
        y_label: str = "ms",
    ) -> None:
        """Append rows ``(x, part_0, part_1, ...)`` to a stacked-area plot of ``parts``."""
        if not rows:
            return
        data = {"x": [r[0] for r in rows]}
        for i, name in enumerate(parts):
            data[name] = [r[i + 1] for r in rows]
        if plot_id in self.views:
            self._stream(self.sources[plot_id][""], data)
            return
        from bokeh.models import ColumnDataSource

        cds = ColumnDataSource(data)
        fig = _figure(
            title,
            x_label,
            y_label,
            [(x_label, "@x")] + [(n, "@{" + n + "}{0.[000]}") for n in parts],
        )
        fig.height += 20  # the legend's row under the axis: the plot area keeps its height
        fig.varea_stack(
            list(parts),
            x="x",
            source=cds,
            color=list(_STACK_COLOURS[: len(parts)]),
            legend_label=list(parts),
        )
        legend = fig.legend[0]  # under the plot area, where it covers no part, and compact
        fig.center.remove(legend)  # enough not to widen a plot of the grid's narrowest cell
        fig.add_layout(legend, "below")
        legend.orientation = "horizontal"
        legend.label_text_font_size = "9px"
        legend.glyph_width = legend.glyph_height = 10
        legend.spacing, legend.padding, legend.margin = 6, 2, 0
        legend.border_line_alpha = 0
        self.sources[plot_id] = {"": cds}
        self._add(plot_id, fig)

    def _stream(self, cds, data: dict[str, list]) -> None:
        """Append ``data``'s columns; a source past ``2 * max_points`` rows keeps every
        other row (:func:`~.model.thin`), sent once as a whole: the plot spans the run."""
        if len(cds.data["x"]) + len(data["x"]) <= 2 * self.max_points:
            cds.stream(data)
            return
        rows = list(zip(*(list(cds.data[k]) + list(v) for k, v in data.items()), strict=True))
        kept = thin(rows, self.max_points)
        cds.data = {k: [r[i] for r in kept] for i, k in enumerate(data)}

    def replace(self, plot_id: str, points: Sequence[tuple[float, float]], line: str = "") -> None:
        """Replace a line's points (the run's whole history, re-read when it ended)."""
        if plot_id in self.sources and line in self.sources[plot_id]:
            self.sources[plot_id][line].data = {
                "x": [p[0] for p in points],
                "y": [p[1] for p in points],
            }

    def refresh(self) -> None:
        """Rebuild each widget's render bundle from its figure as it is now, so that a view
        made later (a browser tab reloaded while the kernel lives) draws every point."""
        for plot_id, view in self.views.items():
            fig = self.figures[plot_id]
            # the browser syncs the ranges it computed back (start and end), and a bundle
            # with them would freeze the view there: fresh ranges follow the data again
            from bokeh.models import DataRange1d

            fig.x_range, fig.y_range = DataRange1d(), DataRange1d()
            view.update_from_model(fig)

    def close(self) -> None:
        for view in self.views.values():
            view.close()
        self.views.clear()
        self.figures.clear()
        self.sources.clear()
        self._lines.clear()
        self.box.close()
