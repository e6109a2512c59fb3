"""A proof of concept's self-contained HTML report: the table, the bandwidth curves and
the goodput timeline with the recovery, BokehJS inlined (it opens with no network)."""

from __future__ import annotations

import html
from pathlib import Path

from ..dashboard.plots import PALETTE
from ..dashboard.timeline import timeline_html
from .checks import FAIL, PASS
from .report import PocReport, fmt_value

__all__ = ["bandwidth_figure", "report_html", "write_html"]

_COLOURS = {PASS: "#1a7f37", FAIL: "#cf222e"}


def bandwidth_figure(report: PocReport):
    """Bus bandwidth (GB/s) against buffer size (MiB), one line per collective and
    scope, both axes logarithmic; None when the collectives stage measured nothing."""
    if not report.curves:
        return None
    from bokeh.models import HoverTool, Legend, LegendItem
    from bokeh.plotting import figure

    fig = figure(
        title="collectives: bus bandwidth (nccl-tests definition)",
        x_axis_type="log",
        y_axis_type="log",
        x_axis_label="buffer size (MiB)",
        y_axis_label="busbw (GB/s)",
        width=900,
        height=320,
        tools="pan,wheel_zoom,reset,save",
    )
    items = []
    for i, ((name, scope), points) in enumerate(report.curves.items()):
        xs, ys = zip(*points, strict=True)
        colour = PALETTE[i % len(PALETTE)]
        label = (
            f"{name.replace('_', '-')} ({'within a node' if scope == 'intra' else 'across nodes'})"
        )
        line = fig.line(list(xs), list(ys), color=colour, line_width=2)
        dots = fig.scatter(list(xs), list(ys), color=colour, size=6)
        items.append(LegendItem(label=label, renderers=[line, dots]))
    fig.xaxis.ticker = sorted({mib for points in report.curves.values() for mib, _ in points})
    fig.add_tools(HoverTool(tooltips=[("MiB", "@x"), ("GB/s", "@y{0.000}")]))
    fig.add_layout(Legend(items=items), "right")  # beside the plot, never over a point
    return fig


def _table(report: PocReport) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("stage", "check", "value", "unit", "threshold", "result", "what it counts")
    )
    rows = []
    for c in report.checks:
        colour = _COLOURS.get(c.status, "#57606a")
        rows.append(
            "<tr>"
            f"<td>{html.escape(c.stage)}</td><td>{html.escape(c.label)}</td>"
            f'<td style="text-align:right">{fmt_value(c.value, c.unit)}</td>'
            f"<td>{'' if c.unit == 'x' else html.escape(c.unit)}</td>"
            f"<td>{html.escape(c.threshold)}</td>"
            f'<td style="color:{colour};font-weight:bold">{c.status}</td>'
            f'<td style="font-size:smaller">{html.escape(c.detail)}</td>'
            "</tr>"
        )
    return (
        '<table class="poc-checks" style="border-collapse:collapse" border="1" cellpadding="4">'
        f"<tr>{head}</tr>{''.join(rows)}</table>"
    )


def report_html(report: PocReport) -> str:
    """The report's HTML body (no page frame): heading, cluster, verdict, table and the
    recovery's goodput timeline."""
    cluster = "<br>".join(
        f"<b>{html.escape(k)}</b> {html.escape(v)}" for k, v in report.cluster.items() if v
    )
    colour = _COLOURS[PASS] if report.passed else _COLOURS[FAIL]
    timeline = timeline_html(report.timeline) if report.timeline else ""
    return (
        f"<h2>trainfactory proof of concept {html.escape(report.job_id)}</h2>"
        f"<p>MLflow run {html.escape(report.run_id)}<br>{cluster}</p>"
        f'<p class="poc-verdict" style="color:{colour};font-weight:bold">'
        f"{html.escape(report.verdict())}</p>"
        + _table(report)
        + ("<h3>recovery: where the job's time went</h3>" + timeline if timeline else "")
    )


def write_html(report: PocReport, path: str | Path) -> Path:
    """Write the self-contained page (BokehJS inlined) to ``path``; returns it."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import Div
    from bokeh.resources import INLINE

    parts = [Div(text=report_html(report), width=1100)]
    fig = bandwidth_figure(report)
    if fig is not None:
        parts.append(fig)
    page = file_html(column(*parts), INLINE, title=f"trainfactory poc {report.job_id}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page)
    return path
