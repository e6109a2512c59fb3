"""The dashboard's header line of numbers and its node table, as HTML (pure: a model in, text out)."""

from __future__ import annotations

import html
import json
from typing import Any

from ..telemetry.cost import BUDGET_WARN_FRACTION, money
from ..telemetry.goodput import TIMELINE_TAG
from ..tracking import TAG
from .fmt import fmt_duration, fmt_ms, fmt_number, pct
from .model import DashboardModel
from .timeline import timeline_html

__all__ = ["MAX_GPU_ROWS", "STATE_COLOURS", "header_html", "nodes_html", "performance_cells"]

#: A state's badge colour: the side panel's (``labextension/style/index.css``), JupyterLab's
#: theme variables, with the light theme's values where the page has no such variable.
STATE_COLOURS = {
    "PENDING": "var(--jp-warn-color1, #f57c00)",
    "RUNNING": "var(--jp-brand-color1, #1976d2)",
    "RESTARTING": "var(--jp-warn-color1, #f57c00)",
    "SUCCEEDED": "var(--jp-success-color1, #388e3c)",
    "FAILED": "var(--jp-error-color1, #d32f2f)",
    "STOPPED": "var(--jp-ui-font-color2, #616161)",
}
#: What the ETTR and the cost outside goodput count (telemetry.goodput), as tooltips: a
#: short job's ETTR is low from its start-up alone, which is not a fault.
_ETTR_TIP = (
    "ETTR (effective training time ratio): the share of the job's wall time, from its"
    " submission, spent in training steps whose progress was kept. Start-up (scheduling,"
    " workers, setup), checkpoint saves, data waits, restarts and lost progress are"
    " badput: a short job's ETTR is low from its start-up alone."
)
_WASTED_TIP = (
    "the cost of the wall time outside goodput: start-up, checkpoint saves, data waits,"
    " restarts and progress lost to failures (the badput in the goodput line)"
)
_MUTED = "var(--jp-ui-font-color2, #616161)"
#: Above this many GPUs the node table shows the cluster min / mean / max, not every GPU.
MAX_GPU_ROWS = 16


def header_html(model: DashboardModel, run_link: str | None = None) -> str:
    """The header: state, job, elapsed time, step, checkpoint, the MLflow link, then the
    performance line, the goodput timeline, warnings, the error and the last failure.
    ``run_link`` overrides the run's direct URL (the Jupyter server's proxy). "" before the
    first snapshot."""
    info = model.info
    if info is None:
        return ""
    colour = STATE_COLOURS.get(info.state, STATE_COLOURS["STOPPED"])
    ckpt = "-"
    if info.checkpoint_step is not None:
        ckpt = f"step {info.checkpoint_step}"
        if model.latest.get("checkpoint/step") is not None and info.checkpoint_path:
            ckpt += f" · <code>{html.escape(info.checkpoint_path)}</code>"
    url = run_link or info.run_url
    link = (
        f'<a href="{html.escape(url)}" target="_blank">MLflow run</a>'
        if url
        else html.escape(info.run_id)
    )
    detail = info.error or (info.reason if info.state in ("PENDING", "RESTARTING") else "")
    cells = [
        f'<b style="color:white;background:{colour};padding:2px 8px;border-radius:4px">'
        f"{info.state}</b>",
        f"<b>{html.escape(info.job_id)}</b> {html.escape(info.name)}",
        f"elapsed {fmt_duration(model.elapsed_s())}",
        f"step {'-' if info.step is None else info.step}",
        f"checkpoint {ckpt}",
        link,
    ]
    text = _cells(cells)
    perf = performance_cells(model)
    if perf:
        text += "<div>" + _cells(perf) + "</div>"
    text += timeline_block(model)
    for warning in warnings(model):
        text += f'<div style="color:#bc4c00">&#9888; {warning}</div>'
    for tip in tips(model):
        text += f'<div style="color:{_MUTED}">tip: {tip}</div>'
    if detail:
        text += f'<div style="color:{colour}"><code>{html.escape(detail)}</code></div>'
    return text + _failure_html(info)


def _cells(cells: list[str]) -> str:
    """One line of cells: a narrow output wraps between cells, never inside one (a
    figure stays beside its name)."""
    return " &nbsp;|&nbsp; ".join(f'<span style="white-space:nowrap">{c}</span>' for c in cells)


def performance_cells(model: DashboardModel) -> list[str]:
    """Throughput, MFU, step time and its split, checkpoint I/O, energy (what is known)."""
    v = model.latest.get
    cells = []
    rates = []
    if v("train/samples_per_s") is not None:
        rates.append(fmt_number(v("train/samples_per_s"), "samples/s"))
    if v("train/tokens_per_s") is not None:
        rates.append(fmt_number(v("train/tokens_per_s"), "tokens/s"))
        if v("train/tokens_per_s_per_gpu") is not None:
            rates.append(fmt_number(v("train/tokens_per_s_per_gpu"), "tokens/s per GPU"))
        elif v("train/tokens_per_s_per_worker") is not None:
            per_worker = fmt_number(v("train/tokens_per_s_per_worker"), "tokens/s per worker")
            rates.append(per_worker)
    if rates:
        cells.append("<b>throughput</b> " + " · ".join(rates))
    if v("train/mfu") is not None:
        cells.append(f"<b>MFU</b> {pct(v('train/mfu'))}")
    elif v("train/tokens_per_s") is not None:
        note = model.tags.get(TAG.MFU_NOTE) or "MFU unavailable"
        cells.append(f'<b>MFU</b> <span title="{html.escape(note)}">unavailable</span>')
    if v("train/step_time_p50_s") is not None:
        text = (
            f"<b>step</b> p50 {fmt_ms(v('train/step_time_p50_s'))}"
            f" · p95 {fmt_ms(v('train/step_time_p95_s'))}"
        )
        if v("train/step_time_s") is not None:
            text += f" · mean of the last second {fmt_ms(v('train/step_time_s'))}"
        cells.append(text)
    split = []
    if v("train/data_wait_fraction") is not None:
        wait = f"data wait {pct(v('train/data_wait_fraction'))}"
        if v("train/ingest_rows_per_s") is not None:  # a Ray Data shard's rows
            wait += f" (ingest {fmt_number(v('train/ingest_rows_per_s'), 'rows/s')})"
        split.append(wait)
    if v("train/comm_fraction") is not None:
        split.append(_comm_cell(v))
    if split:
        cells.append("<b>wall time</b> " + " · ".join(split))
    if v("checkpoint/save_s") is not None:
        save = f"<b>checkpoint save</b> {v('checkpoint/save_s'):.3g} s"
        if v("checkpoint/mb_per_s") is not None:
            save += f" · {fmt_number(v('checkpoint/mb_per_s'), 'MB/s')}"
            save += f" · {fmt_number(v('checkpoint/bytes') / 1e6, 'MB')}"
        cells.append(save)
    if v("goodput/ettr") is not None:
        badput = sorted(
            (
                (k.removeprefix("badput/").removesuffix("_s").replace("_", " "), x)
                for k, x in model.latest.items()
                if k.startswith("badput/") and x >= 0.5
            ),
            key=lambda kv: -kv[1],
        )[:3]
        text = f'<b title="{_ETTR_TIP}">goodput</b> ETTR {pct(v("goodput/ettr"))}'
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
        cells.append(cost_cell(model))
    return cells


def cost_cell(model: DashboardModel) -> str:
    """Cost so far, burn rate and the wasted part, in the catalog's currency."""
    v, tags = model.latest.get, model.tags
    cur = html.escape(tags.get(TAG.COST_CURRENCY, "USD"))
    catalog = html.escape(tags.get(TAG.COST_CATALOG, ""))
    text = (
        f'<b title="price catalog: {catalog}">cost</b> {money(v("cost/usd"))} {cur}'
        f" · {money(v('cost/rate_per_h') or 0)} {cur}/h"
    )
    if v("cost/wasted_usd"):
        text += (
            f' · <span title="{_WASTED_TIP}">outside goodput</span>'
            f" {money(v('cost/wasted_usd'))} {cur}"
        )
    if tags.get(TAG.COST_BUDGET):
        text += f" of a {html.escape(tags['trainfactory.cost.budget'])} {cur} budget"
    target = tags.get(TAG.TARGET_STEPS)
    if target and v("cost/projected_usd") is not None:
        text += f" · {money(v('cost/projected_usd'))} {cur} by step {html.escape(target)}"
    if "example" in catalog:
        text += " (example prices)"
    return text


def timeline_block(model: DashboardModel) -> str:
    """The goodput timeline of the run's ``TIMELINE_TAG`` ("" when absent or not valid)."""
    tag = model.tags.get(TIMELINE_TAG)
    if not tag:
        return ""
    try:
        bar = timeline_html(json.loads(tag))
    except (ValueError, RecursionError):
        return ""
    resumes = model.tags.get(TAG.RESUMES)
    if bar and resumes:  # the ETTR above counts every submission; the bar the latest
        bar += (
            f'<div style="font-size:11px;color:#57606a">timeline of the latest submission'
            f" (resume {html.escape(resumes)}); the goodput figures above count all</div>"
        )
    return bar


def warnings(model: DashboardModel) -> list[str]:
    tags = model.tags
    out = []
    count = tags.get(TAG.NONFINITE_COUNT)
    if count:
        out.append(
            f"{html.escape(count)} non-finite value(s) (NaN or inf), first"
            f" <code>{html.escape(tags.get('trainfactory.nonfinite.first_key', '?'))}</code>"
            f" at step {html.escape(tags.get('trainfactory.nonfinite.first_step', '?'))};"
            " not written to MLflow"
        )
    waiting = tags.get(TAG.STOP_WAITING)
    if waiting and not model.finished:  # a graceful stop that cannot complete (a rank behind)
        out.append(f"<b>stop</b>: {html.escape(waiting)}")
    info = model.info
    if info is not None and info.stall and not model.finished:
        out.append(f"<b>stalled</b>: {html.escape(info.stall)}")
    share = model.latest.get("cost/budget_fraction")
    if share is not None and share >= BUDGET_WARN_FRACTION and not model.finished:
        out.append(f"<b>budget</b>: {100 * share:.0f} % spent; the job stops before passing it")
    outage = tags.get(TAG.LAST_OUTAGE)
    if outage and model.info is not None and not model.finished:
        out.append(html.escape(outage))
    return out


def tips(model: DashboardModel) -> list[str]:
    """Advice for a running job, shown muted under the warnings (nothing is wrong): the
    stall timeout that would suit a job launched without one, from its step times."""
    info = model.info
    if (
        info is None
        or model.finished
        or info.stall
        or not info.stall_suggested_s
        or model.tags.get(TAG.STALL_TIMEOUT) != "off"
    ):
        return []
    return [
        "no stall detection; from the step times seen,"
        f" <code>--stall-timeout {info.stall_suggested_s:.0f}</code> would suit this job"
    ]


def _gpu_totals(model: DashboardModel) -> dict[tuple[str, str], float]:
    """``(node, label) -> memory total (MB)`` from the samplers' device lists (tags)."""
    totals = {}
    for key, value in model.tags.items():
        if key.startswith(TAG.GPUS):
            node = key.removeprefix(TAG.GPUS)
            try:
                for device in json.loads(value):
                    if device.get("memory_total_mb"):
                        totals[(node, device["label"])] = device["memory_total_mb"]
            except (ValueError, TypeError, KeyError):
                continue
    return totals


def _placement(model: DashboardModel) -> dict[str, Any]:
    """The job's placement tag (strategy, nodes -> ranks), {} before every rank is placed."""
    try:
        placement = json.loads(model.tags.get(TAG.PLACEMENT) or "{}")
    except ValueError:
        return {}
    return placement if isinstance(placement, dict) else {}


def nodes_html(model: DashboardModel) -> str:
    nodes = model.nodes
    placement = _placement(model)
    by_node = placement.get("nodes") or {}
    caption = ""
    if by_node:
        n = len(by_node)
        caption = (
            f"<caption style='text-align:left'>placement {html.escape(placement.get('strategy', ''))}:"
            f" {sum(len(r) for r in by_node.values())} workers on {n} node{'s' if n != 1 else ''}"
        )
        warning = model.tags.get(TAG.PLACEMENT_WARNING)
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
        totals = _gpu_totals(model)
        for node, label in sorted(gpus):
            g = {k.split("/", 1)[1]: x for k, x in nodes[node].items() if k.startswith(label + "/")}
            rows.append(
                f"<tr><td>{html.escape(node)}</td><td></td><td>{html.escape(label)}</td>"
                f"<td>{_num(g.get('utilization'), '%')}</td>"
                f"<td>{_mem(g.get('memory_used_mb'), totals.get((node, label)))}</td>"
                f"<td>{_num(g.get('power_w'), 'W')}</td>"
                f"<td>{_num(g.get('temperature_c'), '&deg;C')}</td></tr>"
            )
    else:
        c = model.cluster
        for metric, unit in (("utilization", "%"), ("power_w", "W"), ("memory_used_mb", "MB")):
            stats = [c.get(f"gpu_{metric}_{s}") for s in ("min", "mean", "max")]
            rows.append(
                f"<tr><td>cluster ({len(gpus)} GPUs)</td><td></td><td>{metric} min / mean / max</td>"
                f"<td colspan=4>{' / '.join(_num(x, unit) for x in stats)}</td></tr>"
            )
    return (
        f"<table>{caption}<tr><th>node</th><th>ranks</th><th>device</th><th>utilization</th>"
        "<th>memory used</th><th>power</th><th>temperature</th></tr>" + "".join(rows) + "</table>"
    )


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


def _comm_cell(v) -> str:
    """The communication share: DDP's allreduce, or FSDP2's all-gather and reduce-scatter
    (each per step) when the job issued those."""
    kinds = [
        f"{name} {fmt_ms(v(key))}/step"
        for name, key in (
            ("all-gather", "train/all_gather_s"),
            ("reduce-scatter", "train/reduce_scatter_s"),
        )
        if v(key)
    ]
    if kinds:
        return f"communication {pct(v('train/comm_fraction'))} ({', '.join(kinds)}; may overlap compute)"
    per_step = f"{fmt_ms(v('train/comm_s'))}/step, " if v("train/comm_s") else ""
    return f"allreduce {pct(v('train/comm_fraction'))} ({per_step}may overlap compute)"
