"""The goodput timeline: a stacked bar of where a job's wall time went (inline HTML, pure)."""

from __future__ import annotations

import html
import math

from ..telemetry.goodput import CATEGORY_CODES
from .fmt import fmt_duration, fmt_number, pct

__all__ = ["CATEGORY_COLOURS", "timeline_html"]

#: Goodput timeline colours: goodput green, each badput category a distinct muted colour.
CATEGORY_COLOURS = {
    "goodput": "#2da44e",
    "startup": "#8c959f",
    "data_loading": "#d4a72c",
    "checkpoint_save": "#6e9fc9",
    "checkpoint_restore": "#9a87c9",
    "wasted_progress": "#e0976b",
    "infrastructure_recovery": "#a86b6b",
    "preemption": "#c98fb0",
    "user_error": "#bf8700",
    "drill": "#57606a",
    "stop_wait": "#cf8a4e",
    "other": "#c9ced3",
}
_FAILURE_COLOUR = "#cf222e"


def _parse_timeline(timeline) -> tuple[float, list[tuple], list[tuple]] | None:
    """``(wall_s, [(start, end, code)], [(time, kind)])`` of a ``Goodput.timeline()`` dict,
    or None when it is not one (a finite positive ``wall_s`` and at least one segment)."""
    try:
        wall = float(timeline["wall_s"])
        segments = [(float(a), float(b), str(code)) for a, b, code in timeline["segments"]]
        failures = [(float(t), str(kind)) for t, kind in timeline.get("failures", [])]
    except (TypeError, ValueError, KeyError, AttributeError):
        return None
    if not (math.isfinite(wall) and wall > 0 and segments):
        return None
    return wall, segments, failures


def _share(seconds: float, wall: float) -> str:
    """``seconds`` as a percentage of ``wall`` for a CSS length, clipped to 0-100."""
    return f"{min(100.0, max(0.0, 100 * seconds / wall)):.2f}%"


def _swatch(colour: str) -> str:
    return (
        f'<span style="display:inline-block;width:9px;height:9px;background:{colour};'
        'margin-right:3px"></span>'
    )


def timeline_html(timeline: dict) -> str:
    """A stacked bar of where a job's wall time went, failures marked, and its legend.

    Parameters
    ----------
    timeline : dict
        ``Goodput.timeline()`` (the ``trainfactory.goodput.timeline`` run tag, parsed):
        segments ``[start, end, code]`` and failures ``[time, kind]`` in s since ``t0``.

    Returns
    -------
    str
        Inline HTML: one bar whose segments are placed and sized in percent of ``wall_s``,
        coloured by category, each titled ``"category: N s (from M:SS to M:SS)"``; a red
        mark titled ``"failure at M:SS (kind)"`` per failure; under it, each category's
        seconds and share of the wall time as drawn (merged segments make these
        approximate; the exact totals are the ``badput/*`` metrics). "" when ``timeline``
        is not such a dict.
    """
    parsed = _parse_timeline(timeline)
    if parsed is None:
        return ""
    wall, segments, failures = parsed
    names = {code: name for name, code in CATEGORY_CODES.items()}
    parts = []
    totals: dict[str, float] = {}
    for start, end, code in segments:
        name = names.get(code, code)
        totals[name] = totals.get(name, 0.0) + end - start
        title = (
            f"{name.replace('_', ' ')}: {fmt_number(end - start, 's')}"
            f" (from {fmt_duration(start)} to {fmt_duration(end)})"
        )
        parts.append(
            f'<div title="{html.escape(title)}" style="position:absolute;top:0;bottom:0;'
            f"left:{_share(start, wall)};width:{_share(end - start, wall)};"
            f'background:{CATEGORY_COLOURS.get(name, "#57606a")}"></div>'
        )
    for at, kind in failures:
        title = f"failure at {fmt_duration(at)} ({kind})"
        parts.append(
            f'<div title="{html.escape(title)}" style="position:absolute;top:-3px;bottom:-3px;'
            f'left:{_share(at, wall)};width:2px;margin-left:-1px;background:{_FAILURE_COLOUR}">'
            "</div>"
        )
    order = [*CATEGORY_CODES, *sorted(set(totals) - set(CATEGORY_CODES))]
    legend = [
        f"{_swatch(CATEGORY_COLOURS.get(name, '#57606a'))}{html.escape(name.replace('_', ' '))}"
        f" {fmt_number(totals[name], 's')} ({pct(totals[name] / wall)})"
        for name in order
        if name in totals
    ]
    if failures:
        legend.append(f"{_swatch(_FAILURE_COLOUR)}failures {len(failures)}")
    return (
        '<div style="margin:6px 0">'
        '<div style="position:relative;height:14px;background:#eaeef2;border-radius:2px">'
        + "".join(parts)
        + '</div><div style="font-size:smaller;margin-top:4px">'
        + f"<b>goodput timeline</b> {fmt_duration(wall)} &nbsp; "
        + " &nbsp; ".join(legend)
        + "</div></div>"
    )
