"""Views of a :class:`~.report.ReliabilityReport`: the text a notebook and the command line
print, one summary line for the side panel, CSV rows per job, a plot over time and a
self-contained HTML file (BokehJS inlined: no CDN)."""

from __future__ import annotations

import csv
import datetime as dt
import html
from pathlib import Path
from typing import TYPE_CHECKING

from ..spec import SpecError
from ..tables import format_table
from ..telemetry.cost import money
from .history import SILENT_S
from .kinds import INFRASTRUCTURE, KINDS, USER_ERROR

if TYPE_CHECKING:
    from .report import GroupStats, ReliabilityReport

__all__ = ["CSV_FIELDS", "figure", "report_text", "summary_line", "write_csv", "write_html"]


def _day(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


def _period(r: ReliabilityReport) -> str:
    if r.since is None:
        return f"before {_day(r.until)}"
    return f"{_day(r.since)} to {_day(r.until)}"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 600 else f"{s / 60:.0f} min" if s < 36000 else f"{s / 3600:.1f} h"


def _mttr(g: GroupStats) -> str:
    if g.mttr_s is None:
        return "-" if not g.mttr_of else f"none recovered of {g.mttr_of}"
    p50, p95, top = g.mttr_s
    return f"p50 {p50:.1f} s, p95 {p95:.1f} s, max {top:.1f} s ({g.recovered} recovered of {g.mttr_of})"


def _kinds(kinds: dict[str, int], infra: bool) -> str:
    parts = [f"{k} {kinds[k]}" for k in KINDS if kinds.get(k) and (k in INFRASTRUCTURE) == infra]
    return ", ".join(parts) or "none"


def _money(amounts: dict[str, float]) -> str:
    return ", ".join(f"{money(v)} {c}" for c, v in sorted(amounts.items())) or "0"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def drill_line(g: GroupStats) -> str:
    """What the drills were and that no figure counts them, in one line."""
    kinds = ", ".join(f"{k} {g.drills[k]}" for k in KINDS if g.drills.get(k))
    return (
        f"drills:    {_plural(g.drill_count, 'injected failure')}"
        + (f" ({kinds})" if kinds else "")
        + " by %train chaos or the poc's kill: counted apart, not in the rate, MTBF or MTTR"
    )


def group_lines(g: GroupStats) -> list[str]:
    """The lines of one unit's figures, each saying what it counts."""
    unit = g.unit
    live = f", {g.live} still running (counted up to now)" if g.live else ""
    if g.silent:
        live += (
            f", {g.silent} open but silent for over {SILENT_S / 60:.0f} min (counted up to"
            " their last point)"
        )
    lines = [
        f"exposure:  {g.exposure_days:.4g} {unit}-days ({g.exposure_h:.4g} {unit}-hours held)"
        f" over {g.jobs} job{'s' if g.jobs != 1 else ''}{live}",
        f"failures:  {g.infrastructure} infrastructure ({_kinds(g.kinds, True)});"
        f" apart: {_plural(g.user_errors, 'user error')} in training code,"
        f" {_plural(g.stops, 'planned stop')}",
        drill_line(g),
        f"rate:      {g.rate.text()}",
        "MTBF:      "
        + (f"{g.mtbf_h:.4g} {unit}-hours per infrastructure failure" if g.mtbf_h else
           f"no infrastructure failure in {g.exposure_h:.4g} {unit}-hours"),
        f"MTTR:      {_mttr(g)}",
    ]  # fmt: skip
    if g.ettr is None:
        lines.append("ETTR:      no wall time recorded")
    else:
        badput = ", ".join(
            f"{k} {_seconds(v)}"
            for k, v in sorted(g.badput_s.items(), key=lambda kv: -kv[1])
            if v > 0.05
        )
        lines.append(
            f"ETTR:      {100 * g.ettr:.1f} % of {_seconds(g.wall_s)} wall time"
            f" (goodput {_seconds(g.goodput_s)}; badput: {badput or 'none'})"
        )
    drills = f", drills {_money(g.drill_cost)}" if g.drill_count else ""
    lines.append(
        f"wasted:    {_money(g.wasted_cost)} on badput, of which failures"
        f" {_money(g.failure_cost)}{drills}"
    )
    return lines


def _group_rows(groups: list[GroupStats], by: str) -> list[dict[str, str]]:
    return [
        {
            by: g.key,
            "jobs": str(g.jobs),
            "exposure": f"{g.exposure_days:.4g} {g.unit}-d",
            "infra": str(g.infrastructure),
            "user": str(g.user_errors),
            "stops": str(g.stops),
            "drills": str(g.drill_count),
            "rate %/day": "-" if g.rate.per_day is None else f"{100 * g.rate.per_day:.3g}",
            "MTTR p50": "-" if g.mttr_s is None else f"{g.mttr_s[0]:.1f} s",
            "ETTR": "-" if g.ettr is None else f"{100 * g.ettr:.1f} %",
        }
        for g in groups
    ]


def _node_rows(r: ReliabilityReport) -> list[dict[str, str]]:
    return [
        {
            "node": n.node,
            "exposure": f"{n.exposure_h / 24:.4g} {n.unit}-d",
            "infra": str(n.infrastructure),
            "user": str(n.kinds.get(USER_ERROR, 0)),
            "p-value": "-" if n.p_value is None else f"{n.p_value:.3g}",
            "lemon": "LEMON" if n.lemon else "",
        }
        for n in r.nodes
    ]


def report_text(r: ReliabilityReport) -> str:
    """What ``%train reliability`` and ``jupyter trainfactory reliability`` print."""
    scope = f"experiment {r.experiment}" if r.experiment else "all experiments"
    head = f"reliability of jobs started {_period(r)}, {scope}: {len(r.jobs)} job{'s' if len(r.jobs) != 1 else ''}"
    if not r.jobs:
        return head + "\n(no jobs in the period)"
    parts = [head]
    for g in r.fleet:
        parts += ["", f"[{g.unit}]", *group_lines(g)]
    if r.groups:
        parts += ["", f"by {r.by}:", format_table(_group_rows(r.groups, r.by or ""))]
    if r.nodes and (r.by == "node" or len(r.nodes) > 1 or r.lemons):
        parts += ["", "by node:", format_table(_node_rows(r))]
    if r.lemons:
        names = ", ".join(n.node for n in r.lemons)
        parts.append(
            f"lemon node{'s' if len(r.lemons) > 1 else ''}: {names} (their share of the"
            " infrastructure failures is far above their share of the exposure: binomial"
            " test, p < 0.05 / nodes)"
        )
    return "\n".join(parts)


def summary_line(r: ReliabilityReport) -> str:
    """One line for the side panel: ETTR, infrastructure failures and MTTR per unit, and
    user errors and drills (not infrastructure failures) when there were any."""
    if not r.jobs:
        return "no jobs in the period"
    parts = []
    for g in r.fleet:
        text = f"{g.unit}: ETTR {'-' if g.ettr is None else f'{100 * g.ettr:.0f} %'}"
        text += f", {g.infrastructure} infra failure{'s' if g.infrastructure != 1 else ''}"
        if g.mttr_s:
            text += f", MTTR {g.mttr_s[0]:.0f} s"
        if g.user_errors:
            text += f", {_plural(g.user_errors, 'user error')}"
        if g.drill_count:
            text += f", {_plural(g.drill_count, 'drill')} (not counted)"
        parts.append(text)
    lemons = f"; lemon: {', '.join(n.node for n in r.lemons)}" if r.lemons else ""
    jobs = f"{len(r.jobs)} job{'s' if len(r.jobs) != 1 else ''}"
    return f"{jobs} · " + " · ".join(parts) + lemons


#: Columns of the CSV rows, one per job.
CSV_FIELDS = (
    "job", "run_id", "name", "owner", "project", "experiment", "cluster", "accelerator",
    "unit", "state", "started", "ended", "exposure_hours", "exposure_days",
    *[f"failures_{k}" for k in KINDS], "infrastructure_failures", "drills", "planned_stops",
    "mttr_p50_s", "wall_s", "goodput_s", "ettr", "wasted_cost", "failure_cost", "drill_cost",
    "currency",
)  # fmt: skip


def write_csv(r: ReliabilityReport, path: str | Path) -> Path:
    """One row per job (:data:`CSV_FIELDS`; times ISO 8601 local with their offset;
    ``failures_<kind>`` real failures, ``drills`` injected ones, ``planned_stops`` over the
    job's submissions). Raises SpecError when the file cannot be written."""
    from .stats import percentiles

    def iso(t: float | None) -> str:
        return (
            ""
            if t is None
            else dt.datetime.fromtimestamp(t).astimezone().isoformat(timespec="seconds")
        )

    path = Path(path).expanduser()
    try:
        with path.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
            w.writeheader()
            for j in r.jobs:
                mttrs = [x.mttr_s for x in j.failures if x.infrastructure and x.mttr_s is not None]
                p50 = percentiles(mttrs, (50,))
                w.writerow(
                    {
                        "job": j.job, "run_id": j.run_id, "name": j.name, "owner": j.owner,
                        "project": j.project, "experiment": j.experiment, "cluster": j.cluster,
                        "accelerator": j.accelerator, "unit": j.unit, "state": j.state,
                        "started": iso(j.started), "ended": iso(j.ended),
                        "exposure_hours": f"{j.exposure_h:.6g}",
                        "exposure_days": f"{j.exposure_h / 24:.6g}",
                        **{f"failures_{k}": j.kinds.get(k, 0) for k in KINDS},
                        "infrastructure_failures": j.infrastructure_failures,
                        "drills": sum(j.drills.values()), "planned_stops": j.stops,
                        "mttr_p50_s": "" if p50 is None else f"{p50[0]:.3f}",
                        "wall_s": f"{j.wall_s:.3f}", "goodput_s": f"{j.goodput_s:.3f}",
                        "ettr": "" if not j.wall_s else f"{j.goodput_s / j.wall_s:.4f}",
                        "wasted_cost": f"{j.wasted_cost:.6g}",
                        "failure_cost": f"{j.failure_cost:.6g}",
                        "drill_cost": f"{j.drill_cost:.6g}", "currency": j.currency,
                    }
                )  # fmt: skip
    except OSError as exc:
        raise SpecError(f"Cannot write the CSV file {str(path)!r}: {exc.strerror}.") from None
    return path


def figure(r: ReliabilityReport):
    """A bokeh plot over the period: infrastructure failures and user errors per day (or
    week) as bars, ETTR of the jobs started in it as a line (right axis, %)."""
    from bokeh.models import ColumnDataSource, HoverTool, LinearAxis, Range1d
    from bokeh.plotting import figure as bokeh_figure

    width = r.bucket_s * 1000
    data = {
        "t": [(start + r.bucket_s / 2) * 1000 for start, *_ in r.buckets],
        "infra": [b[1] for b in r.buckets],
        "user": [b[2] for b in r.buckets],
        "ettr": [float("nan") if b[3] is None else 100 * b[3] for b in r.buckets],
    }
    source = ColumnDataSource(data)
    per = "day" if r.bucket_s <= 86400 else "week"
    p = bokeh_figure(
        height=260, width=720, x_axis_type="datetime", title=f"failures per {per} and ETTR",
        tools="xpan,xwheel_zoom,reset,save", name="trainfactory-reliability",
    )  # fmt: skip
    top = max([b[1] + b[2] for b in r.buckets] + [1])
    p.y_range = Range1d(0, top * 1.25)
    p.yaxis.axis_label = f"failures per {per}"
    p.vbar_stack(
        ["infra", "user"], x="t", width=0.8 * width, source=source,
        color=["#d62728", "#ff9896"], legend_label=["infrastructure", "user error"],
    )  # fmt: skip
    p.extra_y_ranges = {"ettr": Range1d(0, 105)}
    p.add_layout(LinearAxis(y_range_name="ettr", axis_label="ETTR %"), "right")
    p.line("t", "ettr", source=source, y_range_name="ettr", color="#2ca02c", line_width=2,
           legend_label="ETTR")  # fmt: skip
    p.scatter("t", "ettr", source=source, y_range_name="ettr", color="#2ca02c", size=6)
    p.add_tools(
        HoverTool(tooltips=[("infra", "@infra"), ("user", "@user"), ("ETTR %", "@ettr{0.0}")])
    )
    p.legend.location = "top_left"
    p.legend.click_policy = "hide"
    return p


def write_html(r: ReliabilityReport, path: str | Path) -> Path:
    """A self-contained HTML report (the text, the plot; BokehJS inlined, no CDN).
    Raises SpecError when the file cannot be written."""
    from bokeh.embed import file_html
    from bokeh.layouts import column
    from bokeh.models import Div
    from bokeh.resources import INLINE

    text = Div(text=f"<pre>{html.escape(report_text(r))}</pre>", width=900)
    page = file_html(column(text, figure(r)), INLINE, title="trainfactory reliability report")
    path = Path(path).expanduser()
    try:
        path.write_text(page)
    except OSError as exc:
        raise SpecError(f"Cannot write the HTML file {str(path)!r}: {exc.strerror}.") from None
    return path
