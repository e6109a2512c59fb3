"""JobDashboard: the live widget (ipywidgets + bokeh through jupyter_bokeh).

One background poller owns every widget write. Each poll reads only the latest
value of each metric (one ``get_run``); the full history is read once, downsampled,
when the dashboard is created for a job that already has points.
"""

from __future__ import annotations

import functools
import html
import json
import math
import threading
from typing import Any

import ipywidgets as widgets

from ..telemetry.cost import BUDGET_WARN_FRACTION, money
from ..telemetry.goodput import CATEGORY_CODES, TIMELINE_TAG
from ..tracking import TAG
from .model import DEFAULT_ROLLOVER, DashboardModel, RunSource, Snapshot

__all__ = ["JobDashboard", "timeline_html"]

_STATE_COLOURS = {
    "PENDING": "#8a6d00",
    "RUNNING": "#1a7f37",
    "RESTARTING": "#bc4c00",
    "SUCCEEDED": "#0969da",
    "FAILED": "#cf222e",
    "STOPPED": "#57606a",
}
#: ``train/*`` series worth a plot; the others are shown as numbers in the header.
_PLOTTED_TRAIN = {
    "goodput/ettr",
    "train/samples_per_s",
    "train/tokens_per_s",
    "train/mfu",
    "train/step_time_s",
}
#: Above this many GPUs the node table shows the cluster min / mean / max, not every GPU.
MAX_GPU_ROWS = 16
#: Goodput timeline colours: goodput green, each badput category a distinct muted colour.
_CATEGORY_COLOURS = {
    "goodput": "#2da44e",
    "startup": "#8c959f",
    "data_loading": "#d4a72c",
    "checkpoint_save": "#6e9fc9",
    "checkpoint_restore": "#9a87c9",
    "wasted_progress": "#e0976b",
    "infrastructure_recovery": "#a86b6b",
    "preemption": "#c98fb0",
    "other": "#c9ced3",
}
_FAILURE_COLOUR = "#cf222e"


def _plotted(key: str) -> bool:
    if key.startswith(("train/", "checkpoint/", "energy/", "goodput/", "badput/", "faults/")):
        return key in _PLOTTED_TRAIN
    return True


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.1f} ms"


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
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                self._footer.value = (
                    '<div style="color:#cf222e"><b>tracking server unreachable</b>'
                    f" ({html.escape(first[:200])}); the job goes on and its recorder queues"
                    f" the points; retrying in {delay:.0f} s.</div>"
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
        if not _plotted(key) or not points:
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
            f"checkpoint {ckpt}",
            link,
        ]
        text = " &nbsp;|&nbsp; ".join(cells)
        perf = self._performance_cells()
        if perf:
            text += "<div>" + " &nbsp;|&nbsp; ".join(perf) + "</div>"
        text += self._timeline_html()
        for warning in self._warnings():
            text += f'<div style="color:#bc4c00">&#9888; {warning}</div>'
        if detail:
            text += f'<div style="color:{colour}"><code>{html.escape(detail)}</code></div>'
        text += _failure_html(info)
        self._header.value = f'<div style="font-family:var(--jp-ui-font-family)">{text}</div>'
        self._nodes.value = self._nodes_html()

    def _performance_cells(self) -> list[str]:
        """Throughput, MFU, step time and its split, checkpoint I/O, energy (what is known)."""
        v = self.model.latest.get
        cells = []
        rates = []
        if v("train/samples_per_s") is not None:
            rates.append(_fmt_number(v("train/samples_per_s"), "samples/s"))
        if v("train/tokens_per_s") is not None:
            rates.append(_fmt_number(v("train/tokens_per_s"), "tokens/s"))
            if v("train/tokens_per_s_per_gpu") is not None:
                rates.append(_fmt_number(v("train/tokens_per_s_per_gpu"), "tokens/s per GPU"))
            elif v("train/tokens_per_s_per_worker") is not None:
                per_worker = _fmt_number(v("train/tokens_per_s_per_worker"), "tokens/s per worker")
                rates.append(per_worker)
        if rates:
            cells.append("<b>throughput</b> " + " · ".join(rates))
        if v("train/mfu") is not None:
            cells.append(f"<b>MFU</b> {_pct(v('train/mfu'))}")
        elif v("train/tokens_per_s") is not None:
            note = self.model.tags.get("trainfactory.mfu_note") or "MFU unavailable"
            cells.append(f'<b>MFU</b> <span title="{html.escape(note)}">unavailable</span>')
        if v("train/step_time_p50_s") is not None:
            text = (
                f"<b>step</b> p50 {_fmt_ms(v('train/step_time_p50_s'))}"
                f" · p95 {_fmt_ms(v('train/step_time_p95_s'))}"
            )
            if v("train/step_time_s") is not None:
                text += f" · mean of the last second {_fmt_ms(v('train/step_time_s'))}"
            cells.append(text)
        split = []
        if v("train/data_wait_fraction") is not None:
            split.append(f"data wait {_pct(v('train/data_wait_fraction'))}")
        if v("train/comm_fraction") is not None:
            per_step = f"{_fmt_ms(v('train/comm_s'))}/step, " if v("train/comm_s") else ""
            split.append(
                f"allreduce {_pct(v('train/comm_fraction'))} ({per_step}may overlap compute)"
            )
        if split:
            cells.append("<b>wall time</b> " + " · ".join(split))
        if v("checkpoint/save_s") is not None:
            save = f"<b>checkpoint save</b> {v('checkpoint/save_s'):.3g} s"
            if v("checkpoint/mb_per_s") is not None:
                save += f" · {_fmt_number(v('checkpoint/mb_per_s'), 'MB/s')}"
                save += f" · {_fmt_number(v('checkpoint/bytes') / 1e6, 'MB')}"
            cells.append(save)
        if v("goodput/ettr") is not None:
            badput = sorted(
                (
                    (k.removeprefix("badput/").removesuffix("_s").replace("_", " "), x)
                    for k, x in self.model.latest.items()
                    if k.startswith("badput/") and x >= 0.5
                ),
                key=lambda kv: -kv[1],
            )[:3]
            text = f"<b>goodput</b> ETTR {_pct(v('goodput/ettr'))}"
            if badput:
                text += " (badput: " + ", ".join(f"{k} {x:.0f} s" for k, x in badput) + ")"
            cells.append(text)
        if v("faults/count"):
            text = f"<b>failures</b> {v('faults/count'):.0f}"
            if v("faults/mttr_s") is not None:
                text += f" (MTTR {v('faults/mttr_s'):.1f} s)"
            if v("faults/restarts"):
                text += (
                    f" · {v('faults/restarts'):.0f} restart(s), last from step"
                    f" {v('faults/restore_step'):.0f}"
                )
            cells.append(text)
        if v("energy/gpu_kwh") is not None:
            cells.append(f"<b>GPU energy</b> {v('energy/gpu_kwh'):.3g} kWh")
        if v("cost/usd") is not None:
            cells.append(self._cost_cell())
        return cells

    def _cost_cell(self) -> str:
        """Cost so far, burn rate and the wasted part, in the catalog's currency."""
        v, tags = self.model.latest.get, self.model.tags
        cur = html.escape(tags.get("trainfactory.cost.currency", "USD"))
        catalog = html.escape(tags.get("trainfactory.cost.catalog", ""))
        text = (
            f'<b title="price catalog: {catalog}">cost</b> {money(v("cost/usd"))} {cur}'
            f" · {money(v('cost/rate_per_h') or 0)} {cur}/h"
        )
        if v("cost/wasted_usd"):
            text += f" · wasted {money(v('cost/wasted_usd'))} {cur}"
        if tags.get("trainfactory.cost.budget"):
            text += f" of a {html.escape(tags['trainfactory.cost.budget'])} {cur} budget"
        target = tags.get("trainfactory.target_steps")
        if target and v("cost/projected_usd") is not None:
            text += f" · {money(v('cost/projected_usd'))} {cur} by step {html.escape(target)}"
        if "example" in catalog:
            text += " (example prices)"
        return text

    def _timeline_html(self) -> str:
        """The goodput timeline of the run's ``TIMELINE_TAG`` ("" when absent or not valid)."""
        tag = self.model.tags.get(TIMELINE_TAG)
        if not tag:
            return ""
        try:
            bar = timeline_html(json.loads(tag))
        except (ValueError, RecursionError):
            return ""
        resumes = self.model.tags.get(TAG.RESUMES)
        if bar and resumes:  # the ETTR above counts every submission; the bar the latest
            bar += (
                f'<div style="font-size:11px;color:#57606a">timeline of the latest submission'
                f" (resume {html.escape(resumes)}); the goodput figures above count all</div>"
            )
        return bar

    def _warnings(self) -> list[str]:
        tags = self.model.tags
        out = []
        count = tags.get("trainfactory.nonfinite.count")
        if count:
            out.append(
                f"{html.escape(count)} non-finite value(s) (NaN or inf), first"
                f" <code>{html.escape(tags.get('trainfactory.nonfinite.first_key', '?'))}</code>"
                f" at step {html.escape(tags.get('trainfactory.nonfinite.first_step', '?'))};"
                " not written to MLflow"
            )
        info = self.model.info
        if info is not None and info.stall and not self.model.finished:
            out.append(f"<b>stalled</b>: {html.escape(info.stall)}")
        elif (
            info is not None
            and info.stall_suggested_s
            and not self.model.finished
            and tags.get(TAG.STALL_TIMEOUT) == "off"
        ):
            out.append(
                "no stall detection; from the step times seen,"
                f" <code>--stall-timeout {info.stall_suggested_s:.0f}</code> would suit this job"
            )
        share = self.model.latest.get("cost/budget_fraction")
        if share is not None and share >= BUDGET_WARN_FRACTION and not self.model.finished:
            out.append(f"<b>budget</b>: {100 * share:.0f} % spent; the job stops before passing it")
        outage = tags.get("trainfactory.tracking.last_outage")
        if outage and self.model.info is not None and not self.model.finished:
            out.append(html.escape(outage))
        return out

    def _gpu_totals(self) -> dict[tuple[str, str], float]:
        """``(node, label) -> memory total (MB)`` from the samplers' device lists (tags)."""
        totals = {}
        for key, value in self.model.tags.items():
            if key.startswith("trainfactory.gpus."):
                node = key.removeprefix("trainfactory.gpus.")
                try:
                    for device in json.loads(value):
                        if device.get("memory_total_mb"):
                            totals[(node, device["label"])] = device["memory_total_mb"]
                except (ValueError, TypeError, KeyError):
                    continue
        return totals

    def _placement(self) -> dict[str, Any]:
        """The job's placement tag (strategy, nodes -> ranks), {} before every rank is placed."""
        try:
            placement = json.loads(self.model.tags.get(TAG.PLACEMENT) or "{}")
        except ValueError:
            return {}
        return placement if isinstance(placement, dict) else {}

    def _nodes_html(self) -> str:
        nodes = self.model.nodes
        placement = self._placement()
        by_node = placement.get("nodes") or {}
        caption = ""
        if by_node:
            n = len(by_node)
            caption = (
                f"<caption style='text-align:left'>placement {html.escape(placement.get('strategy', ''))}:"
                f" {sum(len(r) for r in by_node.values())} workers on {n} node{'s' if n != 1 else ''}"
            )
            warning = self.model.tags.get(TAG.PLACEMENT_WARNING)
            if warning:
                caption += f" &mdash; <b>warning</b>: {html.escape(warning)}"
            caption += "</caption>"
        if not nodes:
            return ""
        gpus = {
            (node, key.split("/")[0])
            for node, values in nodes.items()
            for key in values
            if key.startswith("gpu") and "/" in key
        }
        rows = []
        for node, values in sorted(nodes.items()):
            mem = values.get("memory_used_mb")
            ranks = ", ".join(map(str, by_node.get(node, []))) or "-"
            rows.append(
                f"<tr><td>{html.escape(node)}</td><td>{ranks}</td><td>CPU</td>"
                f"<td>{values.get('cpu_utilization', float('nan')):.0f} %</td>"
                f"<td>{'-' if mem is None else f'{mem / 1024:.1f} GiB'}</td><td></td><td></td></tr>"
            )
        if len(gpus) <= MAX_GPU_ROWS:
            totals = self._gpu_totals()
            for node, label in sorted(gpus):
                g = {
                    k.split("/", 1)[1]: x
                    for k, x in nodes[node].items()
                    if k.startswith(label + "/")
                }
                rows.append(
                    f"<tr><td>{html.escape(node)}</td><td></td><td>{html.escape(label)}</td>"
                    f"<td>{_num(g.get('utilization'), '%')}</td>"
                    f"<td>{_mem(g.get('memory_used_mb'), totals.get((node, label)))}</td>"
                    f"<td>{_num(g.get('power_w'), 'W')}</td>"
                    f"<td>{_num(g.get('temperature_c'), '&deg;C')}</td></tr>"
                )
        else:
            c = self.model.cluster
            for metric, unit in (("utilization", "%"), ("power_w", "W"), ("memory_used_mb", "MB")):
                stats = [c.get(f"gpu_{metric}_{s}") for s in ("min", "mean", "max")]
                rows.append(
                    f"<tr><td>cluster ({len(gpus)} GPUs)</td><td></td><td>{metric} min / mean / max</td>"
                    f"<td colspan=4>{' / '.join(_num(x, unit) for x in stats)}</td></tr>"
                )
        return (
            f"<table>{caption}<tr><th>node</th><th>ranks</th><th>device</th><th>utilization</th>"
            "<th>memory used</th><th>power</th><th>temperature</th></tr>"
            + "".join(rows)
            + "</table>"
        )

    def wait(self, timeout: float | None = None) -> None:
        """Block until the poller stops (the job ended), for scripts and tests."""
        if self._thread is not None:
            self._thread.join(timeout)


def _failure_html(info) -> str:
    """The last worker failure's root cause: rank, node, error and traceback tail."""
    lines = info.failure_lines()
    if not lines:
        return ""
    tail = "\n".join(line.removeprefix("  ") for line in lines[1:])
    body = f"<pre style='font-size:11px;margin:2px 0'>{html.escape(tail)}</pre>" if tail else ""
    return (
        "<details style='color:#cf222e'><summary><b>last failure</b>: "
        f"{html.escape(lines[0])}</summary>{body}</details>"
    )


def _num(value: float | None, unit: str) -> str:
    return "n/a" if value is None else f"{value:,.0f} {unit}"


def _mem(used: float | None, total: float | None) -> str:
    if used is None:
        return "n/a"
    text = f"{used / 1024:.1f}"
    return text + (f" / {total / 1024:.0f} GiB" if total else " GiB")


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
            f"{name.replace('_', ' ')}: {_fmt_number(end - start, 's')}"
            f" (from {_fmt_duration(start)} to {_fmt_duration(end)})"
        )
        parts.append(
            f'<div title="{html.escape(title)}" style="position:absolute;top:0;bottom:0;'
            f"left:{_share(start, wall)};width:{_share(end - start, wall)};"
            f'background:{_CATEGORY_COLOURS.get(name, "#57606a")}"></div>'
        )
    for at, kind in failures:
        title = f"failure at {_fmt_duration(at)} ({kind})"
        parts.append(
            f'<div title="{html.escape(title)}" style="position:absolute;top:-3px;bottom:-3px;'
            f'left:{_share(at, wall)};width:2px;margin-left:-1px;background:{_FAILURE_COLOUR}">'
            "</div>"
        )
    order = [*CATEGORY_CODES, *sorted(set(totals) - set(CATEGORY_CODES))]
    legend = [
        f"{_swatch(_CATEGORY_COLOURS.get(name, '#57606a'))}{html.escape(name.replace('_', ' '))}"
        f" {_fmt_number(totals[name], 's')} ({_pct(totals[name] / wall)})"
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
        + f"<b>goodput timeline</b> {_fmt_duration(wall)} &nbsp; "
        + " &nbsp; ".join(legend)
        + "</div></div>"
    )
