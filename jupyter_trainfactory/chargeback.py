"""Cost reports over jobs: one row per job from its MLflow run, totals per owner,
experiment or project, CSV export (``%train costs``, ``jupyter trainfactory costs``)."""

from __future__ import annotations

import csv
import datetime as dt
import json
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from .spec import SpecError
from .tables import format_table
from .telemetry.cost import money, storage_cost
from .telemetry.goodput import FAILURE_CATEGORIES  # lost progress, recovery, user errors
from .tracking import TAG

__all__ = [
    "FAILURE_CATEGORIES",
    "GROUPS",
    "SORT_KEYS",
    "CostRow",
    "cost_rows",
    "parse_since",
    "totals",
    "write_csv",
]

#: What ``--by`` groups by.
GROUPS = ("owner", "experiment", "project")
#: Columns ``--sort`` takes: largest first (newest first for ``started``), except ``ettr``,
#: lowest first (the jobs that wasted most of their time on top).
SORT_KEYS = (
    "cost",
    "wasted",
    "failures",
    "accelerator_hours",
    "ettr",
    "tokens_per_cost",
    "started",
)


@dataclass
class CostRow:
    """One job's cost, in its price catalog's ``currency``.

    ``cost`` is what the job's resources cost while held (``cost/usd``) plus keeping its
    checkpoints since it ended (``storage_after``); ``wasted`` is the part spent on any
    badput (``cost/wasted_usd``: startup, checkpoint saves and restores, data waits and
    failures), ``failures`` the part of it that failures cost (lost progress, recovery,
    preemptions and the training code's own errors, ``cost/user_error_usd``; not drills,
    which were asked for); ``ettr`` the share of wall time that was productive;
    ``tokens`` the tokens trained on (``train/tokens``, 0 when unknown) and
    ``tokens_per_cost`` tokens per unit of currency (None when either is 0)."""

    job: str
    name: str
    owner: str
    experiment: str
    project: str
    state: str
    started: float
    accelerator_hours: float
    cost: float
    wasted: float
    failures: float
    storage_after: float
    ettr: float | None
    tokens: float
    tokens_per_cost: float | None
    currency: str
    example_prices: bool


def parse_since(text: str | None, option: str = "--since") -> float | None:
    """``--since`` (or ``option``, e.g. ``--until``): an ISO date or date-time (local
    time), or ``Nd`` / ``Nh`` ago, as s since the epoch; None for no text.

    Raises SpecError (one sentence) for anything else."""
    if not text:
        return None
    text = text.strip()
    if text[:-1].isdigit() and text[-1:] in ("d", "h"):
        return time.time() - int(text[:-1]) * (86400 if text[-1] == "d" else 3600)
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise SpecError(
            f"{option} takes a date (2026-11-01), a date-time or 7d / 12h, got {text!r}."
        ) from None


def _row(run, experiment: str, state: str, now: float) -> CostRow:
    tags, metrics = run.data.tags, run.data.metrics
    storage = json.loads(tags.get(TAG.STORAGE) or "{}")
    after = storage_cost(storage.get("history", []), storage.get("price_gb_month", 0.0), now)
    cost = metrics.get("cost/usd", 0.0) + after
    tokens = metrics.get("train/tokens", 0.0)
    return CostRow(
        job=tags.get(TAG.JOB_ID, ""),
        name=run.info.run_name or "",
        owner=tags.get(TAG.OWNER, ""),
        experiment=experiment,
        project=tags.get(TAG.PROJECT, ""),
        state=state,
        started=run.info.start_time / 1000.0,
        accelerator_hours=metrics.get("cost/accelerator_hours", 0.0),
        cost=cost,
        wasted=metrics.get("cost/wasted_usd", 0.0),
        failures=sum(metrics.get(f"cost/{c}_usd", 0.0) for c in FAILURE_CATEGORIES),
        storage_after=after,
        ettr=metrics.get("goodput/ettr"),
        tokens=tokens,
        tokens_per_cost=tokens / cost if tokens and cost else None,
        currency=tags.get(TAG.COST_CURRENCY, "USD"),
        example_prices="example" in tags.get(TAG.COST_CATALOG, ""),
    )


def cost_rows(
    manager,
    experiment: str | None = None,
    since: float | None = None,
    owner: str | None = None,
    limit: int = 10_000,
) -> list[CostRow]:
    """One row per job (everyone's unless ``owner``), newest first, from the runs at the
    manager's tracking server; only ``experiment``'s and those started at or after
    ``since`` (s since the epoch) when given.

    Raises SpecError when the experiment does not exist."""
    from . import runreads

    client = manager.mlflow_client
    names: dict[str, str] = {}
    ids = manager.experiment_ids(experiment)
    runs = runreads.search_job_runs(client, owner, limit, experiment_ids=ids, since=since)
    now = time.time()
    rows = []
    for run in runs:
        exp_id = run.info.experiment_id
        if exp_id not in names:
            names[exp_id] = client.get_experiment(exp_id).name
        state = manager.run_info(run, reconcile=False).state
        rows.append(_row(run, names[exp_id], state, now))
    return rows


def sort_rows(rows: list[CostRow], key: str = "cost") -> list[CostRow]:
    """Rows by ``key`` (one of :data:`SORT_KEYS`; see there for the order); unknown last."""
    if key not in SORT_KEYS:
        raise SpecError(f"--sort takes {', '.join(SORT_KEYS)}, got {key!r}.")
    if key == "ettr":  # lowest first, unknown last
        return sorted(rows, key=lambda r: (r.ettr is None, r.ettr or 0.0))
    return sorted(rows, key=lambda r: (getattr(r, key) is not None, getattr(r, key) or 0.0))[::-1]


def totals(rows: list[CostRow], by: str) -> list[dict[str, Any]]:
    """Per value of ``by`` (owner, experiment or project; "" for none given): jobs,
    accelerator-hours, cost, wasted cost, tokens and the currency, largest cost first.
    Rows in different currencies are never added up: each currency is its own group.

    Raises SpecError for an unknown ``by``."""
    if by not in GROUPS:
        raise SpecError(f"--by takes {', '.join(GROUPS)}, got {by!r}.")
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        key = (getattr(r, by) or "(none)", r.currency)
        g = groups.setdefault(
            key,
            {by: key[0], "jobs": 0, "accelerator_hours": 0.0, "cost": 0.0, "wasted": 0.0,
             "tokens": 0.0, "currency": r.currency},
        )  # fmt: skip
        g["jobs"] += 1
        g["accelerator_hours"] += r.accelerator_hours
        g["cost"] += r.cost
        g["wasted"] += r.wasted
        g["tokens"] += r.tokens
    return sorted(groups.values(), key=lambda g: -g["cost"])


def write_csv(rows: list[CostRow], path: str | Path) -> Path:
    """Write the rows (every :class:`CostRow` field, ``started`` as ISO 8601 local time with
    its UTC offset) to ``path``. Raises SpecError when the file cannot be written."""
    path = Path(path).expanduser()
    try:
        with path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=[x.name for x in fields(CostRow)])
            writer.writeheader()
            for r in rows:
                data = asdict(r)
                started = dt.datetime.fromtimestamp(r.started).astimezone()
                data["started"] = started.isoformat(timespec="seconds")
                writer.writerow(data)
    except OSError as exc:
        raise SpecError(f"Cannot write the CSV file {str(path)!r}: {exc.strerror}.") from None
    return path


def table_rows(rows: list[CostRow]) -> list[dict[str, str]]:
    """Printable cells of the rows (:func:`~.telemetry.cost.money`, ETTR in %)."""

    def amount(value: float, currency: str) -> str:
        return f"{money(value)} {currency}"

    return [
        {
            "job": r.job,
            "owner": r.owner,
            "experiment": r.experiment,
            "project": r.project or "-",
            "state": r.state,
            "accel_h": f"{r.accelerator_hours:.3f}",
            "cost": amount(r.cost, r.currency) + ("*" if r.example_prices else ""),
            "wasted": amount(r.wasted, r.currency),
            "failures": amount(r.failures, r.currency),
            "ettr": "-" if r.ettr is None else f"{100 * r.ettr:.0f} %",
            "tokens_per_cost": "-" if r.tokens_per_cost is None else f"{r.tokens_per_cost:,.0f}",
        }
        for r in rows
    ]


def report_text(rows: list[CostRow], by: str | None = None) -> str:
    """The ``costs`` report: the jobs table, then the totals per ``by`` when given, and a
    note when any price came from the shipped example catalog."""
    if not rows:
        return "(no jobs)"
    parts = [format_table(table_rows(rows))]
    if by:
        groups = [
            {
                by: g[by],
                "jobs": str(g["jobs"]),
                "accel_h": f"{g['accelerator_hours']:.3f}",
                "cost": f"{money(g['cost'])} {g['currency']}",
                "wasted": f"{money(g['wasted'])} {g['currency']}",
            }
            for g in totals(rows, by)
        ]
        parts += ["", f"totals by {by}:", format_table(groups)]
    if any(r.example_prices for r in rows):
        from .services import state_dir

        parts += [
            "",
            "* example prices, not a quote: a job keeps the prices it was launched with; for"
            f" new jobs put your own in {state_dir() / 'prices.toml'} or give --price-catalog.",
        ]
    return "\n".join(parts)
