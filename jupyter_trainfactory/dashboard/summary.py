"""The static summary a finished job leaves in its cell: numbers and curves that need no kernel.

A widget is gone when a notebook is reopened or exported (its model lives in the kernel),
so when a job ends the dashboard writes this summary as plain HTML into a second output
of its cell (:class:`~.widget.JobDashboard` keeps it hidden while the live widget shows).
The curves are SVG pictures inlined as ``data:`` URIs, so the HTML is self-contained: it
shows in JupyterLab after a reload, on GitHub and in ``jupyter nbconvert --to html``.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from xml.sax.saxutils import escape

from .fmt import fmt_number

__all__ = ["empty_summary", "live_css", "summary_class", "summary_html", "svg_plot"]

_W, _H = 320, 170
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 46, 10, 22, 30


def _tick(value: float) -> str:
    return fmt_number(value) if math.isfinite(value) else "-"


def summary_class(uid: str) -> str:
    """The CSS class that marks the summary output of the live widget ``uid``."""
    return f"trainfactory-summary-{uid}"


def empty_summary(uid: str) -> dict[str, str]:
    """The mime bundle of widget ``uid``'s summary output before there is a summary."""
    return {"text/html": f'<div class="{summary_class(uid)}"></div>', "text/plain": ""}


def live_css(uid: str) -> str:
    """A marker and the style, to put inside live widget ``uid``, that hide its summary
    output while the widget shows (after a reload, in an export or once the widget is
    closed there is no widget, and the summary shows)."""
    mark = f"trainfactory-live-{uid}"
    return (
        f'<span class="{mark}"></span><style>.jp-OutputArea-child:has(.{mark})'
        f" ~ .jp-OutputArea-child:has(.{summary_class(uid)}){{display:none}}</style>"
    )


def svg_plot(points: Sequence[tuple[float, float]], title: str, x_label: str) -> str:
    """An SVG line chart (320 x 170 px) of ``(x, y)`` points: title, the x and y ranges at
    the axes' ends, the x axis label. Returns the SVG text ("" for no finite point)."""
    pts = [(float(x), float(y)) for x, y in points if math.isfinite(x) and math.isfinite(y)]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    sx = (_W - _PAD_L - _PAD_R) / ((x1 - x0) or 1)
    sy = (_H - _PAD_T - _PAD_B) / ((y1 - y0) or 1)

    def at(x: float, y: float) -> str:
        return f"{_PAD_L + (x - x0) * sx:.1f},{_H - _PAD_B - (y - y0) * sy:.1f}"

    line = " ".join(at(x, y) for x, y in pts)
    left, right, top, bottom = _PAD_L, _W - _PAD_R, _PAD_T, _H - _PAD_B
    text = 'font-family="sans-serif" font-size="10" fill="#57606a"'
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}"'
        f' viewBox="0 0 {_W} {_H}">'
        f'<rect x="0" y="0" width="{_W}" height="{_H}" fill="white"/>'
        f'<text x="{left}" y="14" font-family="sans-serif" font-size="12" fill="#24292f">'
        f"{escape(title)}</text>"
        f'<path d="M{left},{top} V{bottom} H{right}" stroke="#8c959f" fill="none"/>'
        f'<polyline points="{line}" fill="none" stroke="#1f77b4" stroke-width="1.5"/>'
        f'<text x="{left - 4}" y="{top + 8}" text-anchor="end" {text}>{_tick(y1)}</text>'
        f'<text x="{left - 4}" y="{bottom}" text-anchor="end" {text}>{_tick(y0)}</text>'
        f'<text x="{left}" y="{bottom + 12}" {text}>{_tick(x0)}</text>'
        f'<text x="{right}" y="{bottom + 12}" text-anchor="end" {text}>{_tick(x1)}</text>'
        f'<text x="{(left + right) / 2}" y="{bottom + 24}" text-anchor="middle" {text}>'
        f"{escape(x_label)}</text></svg>"
    )


def _img(svg: str, title: str) -> str:
    data = base64.b64encode(svg.encode()).decode()
    return (
        f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(title)}"'
        f' width="{_W}" height="{_H}" style="margin:2px">'
    )


def summary_html(
    css_class: str,
    job_id: str,
    header: str,
    curves: Sequence[tuple[str, str, list]],
    kind: str = "job",
    written: str = "when the job ended",
) -> str:
    """The summary block: a caption (``kind`` and ``job_id``, written ``written``), the
    dashboard's final ``header`` HTML, then one picture per ``(title, x_label, points)``
    curve (the user's metrics, throughput). ``css_class`` marks the block (the live
    dashboard hides its own summary by it)."""
    pictures = "".join(
        _img(svg, title)
        for title, x_label, points in curves
        if (svg := svg_plot(points, title, x_label))
    )
    return (
        f'<div class="trainfactory-summary {css_class}"'
        ' style="font-family:var(--jp-ui-font-family,sans-serif);font-size:13px">'
        f'<div style="color:#57606a;font-size:11px">{kind} {html.escape(job_id)}: summary written'
        f" {html.escape(written)} (the live view needs its kernel;"
        f" <code>%train attach {html.escape(job_id)}</code> shows it again)</div>"
        f"{header}<div>{pictures}</div></div>"
    )
