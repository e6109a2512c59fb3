"""A sweep's leaderboard: one row per trial, best first, read from its MLflow runs.

:func:`sweep_view` is pure (the parent run, its children and each child's history of the
metric in, a :class:`SweepView` out); :func:`read_sweep` reads them from MLflow, and
:func:`leaderboard_text` / :func:`leaderboard_html` show a view.
"""

from __future__ import annotations

import html
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

from ..jobstate import latest_step
from ..runreads import sweep_children
from ..tracking import TAG

__all__ = [
    "SweepView",
    "TrialRow",
    "leaderboard_html",
    "leaderboard_text",
    "panel_trials",
    "param_text",
    "planned_trials",
    "read_sweep",
    "sweep_settings",
    "sweep_view",
]

_ACTIVE = ("PENDING", "RUNNING", "RESTARTING")


@dataclass
class TrialRow:
    """One trial: its index in the search, child run, sampled params (config key ->
    text), state (the job states; an early stop is ``STOPPED`` with reason
    ``early-stop``), its furthest step (``jobstate.latest_step``: steps done, as the
    panel and the dashboard count them), the metric's latest and best values, cost (USD)."""

    index: int
    run_id: str
    params: dict[str, str]
    state: str
    reason: str = ""
    step: int | None = None
    latest: float | None = None
    best: float | None = None
    cost: float | None = None
    history: list[tuple[int, float]] = field(default_factory=list)  # (step, value)


@dataclass
class SweepView:
    """The sweep as the leaderboard shows it: ``rows`` sorted by each trial's best value
    (``mode``: lowest first for ``min``), trials without a value last; the header's
    counts, the best so far, the total cost and an ETA (s, None until a trial ended);
    ``error``: why the sweep failed (its run's ``trainfactory.error``), else ""."""

    state: str
    metric: str
    mode: str
    trials: int
    rows: list[TrialRow]
    cost: float = 0.0
    elapsed_s: float = 0.0
    error: str = ""

    def count(self, *states: str) -> int:
        return sum(r.state in states for r in self.rows)

    @property
    def done(self) -> int:
        """Trials that ended for good: finished, failed or stopped early by the scheduler
        (a trial the sweep's stop rests at a checkpoint goes on at a resume)."""
        return len(self.rows) - self.running - self.count("PENDING") - self.stopped

    @property
    def running(self) -> int:
        return self.count("RUNNING", "RESTARTING")

    @property
    def pending(self) -> int:
        """Trials not started: not sampled yet, or with a run that waits for workers."""
        return max(self.trials - len(self.rows), 0) + self.count("PENDING")

    @property
    def stopped(self) -> int:
        """Trials the sweep's stop (or budget) rested at a checkpoint."""
        return sum(r.state == "STOPPED" and r.reason != "early-stop" for r in self.rows)

    @property
    def stopped_early(self) -> int:
        return sum(r.reason == "early-stop" for r in self.rows)

    @property
    def best(self) -> TrialRow | None:
        return self.rows[0] if self.rows and self.rows[0].best is not None else None

    @property
    def eta_s(self) -> float | None:
        """Elapsed time per ended trial times the trials left (concurrency included, as
        the elapsed time already ran trials side by side); None until one ended, and
        once the sweep is not running."""
        if self.state not in _ACTIVE or not self.done:
            return None
        return self.elapsed_s / self.done * (self.trials - self.done)


def _value(x: Any) -> float | None:
    try:
        value = float(x)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def param_text(raw: str) -> str:
    """A trial's parameter as MLflow keeps it (text), for a table: a float written with more
    than 4 significant digits is shown with 4 (``"0.006940721493676259"`` -> ``"0.006941"``);
    integers, short floats and other text are left as they are. The exact value stays in
    the child run's params (``config.<name>``)."""
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return raw
    if not math.isfinite(value) or raw.lstrip("+-").isdigit():
        return raw
    short = f"{value:.4g}"
    return short if len(short) < len(raw) else raw


def sweep_view(
    parent, children: list, histories: dict[str, list], now: float | None = None
) -> SweepView:
    """The view of a sweep from its parent run, its child runs (``mlflow.entities.Run``)
    and ``histories`` (child run id -> the metric's ``Metric`` history)."""
    tags = parent.data.tags
    settings = sweep_settings(parent)
    metric, mode = settings.get("metric", ""), settings.get("mode", "min")
    keys = list(settings.get("space_text", {}))
    rows = []
    for child in children:
        ctags, params = child.data.tags, child.data.params
        points = sorted((int(m.step), float(m.value)) for m in histories.get(child.info.run_id, []))
        values = [v for _, v in points if math.isfinite(v)]
        best = (min(values) if mode == "min" else max(values)) if values else None
        rows.append(
            TrialRow(
                index=int(ctags.get(TAG.TRIAL_INDEX, "0")),
                run_id=child.info.run_id,
                params={k: param_text(params.get(f"config.{k}", "")) for k in keys},
                state=ctags.get(TAG.STATE, "PENDING"),
                reason=ctags.get(TAG.REASON, ""),
                step=max(  # the trial's furthest step, as the panel counts it
                    [
                        s
                        for s in (latest_step(child), points[-1][0] if points else None)
                        if s is not None
                    ],
                    default=None,
                ),
                latest=points[-1][1] if points else None,
                best=best,
                cost=_value(child.data.metrics.get("cost/usd")),
                history=points,
            )
        )
    sign = 1 if mode == "min" else -1
    rows.sort(key=lambda r: (r.best is None, sign * (r.best or 0.0), r.index))
    start = _value(tags.get(TAG.STARTED)) or parent.info.start_time / 1000
    end = parent.info.end_time / 1000 if parent.info.end_time else (now or time.time())
    return SweepView(
        state=tags.get(TAG.STATE, "PENDING"),
        metric=metric,
        mode=mode,
        trials=planned_trials(parent) or len(rows),
        rows=rows,
        cost=sum(r.cost or 0.0 for r in rows),
        elapsed_s=max(end - start, 0.0),
        error=tags.get(TAG.ERROR, "") if tags.get(TAG.STATE) == "FAILED" else "",
    )


def sweep_settings(parent) -> dict[str, Any]:
    """The sweep's settings (metric, mode, trials, grid size, search space as text) from
    its parent run's ``trainfactory.sweep`` tag; ``{}`` when there is none."""
    return json.loads(parent.data.tags.get(TAG.SWEEP, "{}") or "{}")


def planned_trials(parent) -> int:
    """The trials the sweep of parent run ``parent`` runs in all: ``--trials`` samples of
    each grid combination (0 when the run has no sweep settings)."""
    settings = sweep_settings(parent)
    return int(settings.get("trials", 0)) * int(settings.get("grid_size", 1))


def panel_trials(parent, children: list) -> list[dict[str, Any]]:
    """The side panel's rows of a sweep's trials (from the runs alone, no history read):
    ``index``, ``params`` (``"lr=0.01 hidden=64"``), ``state``, ``reason``, ``metric``
    and its latest ``value`` (None before a report), ``step`` (the trial's furthest
    training step, None before one), ``cost_usd``, ``run_id``; best
    first by that value (the sweep's mode), trials without one last, then by index."""
    settings = sweep_settings(parent)
    metric, mode = settings.get("metric", ""), settings.get("mode", "min")
    keys = list(settings.get("space_text", {}))
    rows = []
    for child in children:
        tags, params = child.data.tags, child.data.params
        rows.append(
            {
                "index": int(tags.get(TAG.TRIAL_INDEX, "0")),
                "params": " ".join(
                    f"{k}={param_text(params.get(f'config.{k}', ''))}" for k in keys
                ),
                "state": tags.get(TAG.STATE, "PENDING"),
                "reason": tags.get(TAG.REASON, ""),
                "metric": metric,
                "value": _value(child.data.metrics.get(metric)),
                "step": latest_step(child),
                "cost_usd": _value(child.data.metrics.get("cost/usd")),
                "run_id": child.info.run_id,
            }
        )
    sign = 1 if mode == "min" else -1
    rows.sort(key=lambda r: (r["value"] is None, sign * (r["value"] or 0.0), r["index"]))
    return rows


def read_sweep(mlflow_client, run_id: str) -> SweepView:
    """The sweep of parent run ``run_id``, read from MLflow (one search for the children,
    one metric history per child)."""
    parent = mlflow_client.get_run(run_id)
    children = sweep_children(mlflow_client, parent)
    metric = sweep_settings(parent).get("metric", "")
    histories = {
        c.info.run_id: mlflow_client.get_metric_history(c.info.run_id, metric) if metric else []
        for c in children
    }
    return sweep_view(parent, children, histories)


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.4g}"


def _usd(x: float | None) -> str:
    """A trial's cost in dollars, to 1/100 of a cent (``"<0.0001"`` below it, never 8e-05)."""
    if x is None:
        return ""
    return "<0.0001" if 0 < x < 0.00005 else f"{x:.4f}"


def _state(row: TrialRow) -> str:
    return "early-stop" if row.reason == "early-stop" else row.state.lower()


def _header(view: SweepView) -> str:
    best = view.best
    best_text = (
        f"best {view.metric} {_num(best.best)} (trial {best.index})" if best else "no result yet"
    )
    eta = view.eta_s
    eta_text = f", ETA {eta / 60:.1f} min" if eta else ""
    stopped = f", {view.stopped} stopped" if view.stopped else ""
    failed = view.count("FAILED")
    failed_text = f", {failed} failed" if failed else ""
    text = (
        f"sweep {view.state.lower()}: {view.done}/{view.trials} trials done"
        f" ({view.stopped_early} stopped early{failed_text}), {view.running} running,"
        f" {view.pending} pending{stopped}; {best_text}; cost ${view.cost:.4f}{eta_text}"
    )
    return f"{text}. {view.error}" if view.error else text


def leaderboard_text(mlflow_client, run_id: str) -> str:
    """The leaderboard of parent run ``run_id`` as plain text (the CLI's ``--wait``)."""
    view = read_sweep(mlflow_client, run_id)
    keys = list(view.rows[0].params) if view.rows else []
    head = ["trial", *keys, "state", "step", f"{view.metric} latest", "best", "cost"]
    lines = [_header(view), "  ".join(head)]
    for r in view.rows:
        cells = [str(r.index), *r.params.values(), _state(r), str(r.step or ""), _num(r.latest)]
        lines.append("  ".join([*cells, _num(r.best), _usd(r.cost)]))
    return "\n".join(lines)


def leaderboard_html(view: SweepView) -> str:
    """The header line and the table of trials, the best row highlighted."""
    keys = list(view.rows[0].params) if view.rows else []
    esc = html.escape
    head = [
        "trial",
        *keys,
        "state",
        "step",
        f"{view.metric} latest",
        f"{view.metric} best",
        "cost ($)",
    ]
    cells = "".join(f"<th style='padding:2px 8px;text-align:left'>{esc(h)}</th>" for h in head)
    body = []
    for i, r in enumerate(view.rows):
        style = "background:#e6f4ea;font-weight:bold" if i == 0 and view.best else ""
        values = [
            r.index,
            *r.params.values(),
            _state(r),
            r.step or "",
            _num(r.latest),
            _num(r.best),
        ]
        values.append(_usd(r.cost))
        tds = "".join(f"<td style='padding:2px 8px'>{esc(str(v))}</td>" for v in values)
        body.append(f"<tr class='tf-trial' style='{style}'>{tds}</tr>")
    return (
        f"<div class='tf-sweep-header'>{esc(_header(view))}</div>"
        f"<table class='tf-leaderboard' style='border-collapse:collapse'><tr>{cells}</tr>"
        f"{''.join(body)}</table>"
    )
