"""Cost reports: rows, totals per group, sorting, --since, CSV (pure, no services)."""

import csv
import time
from types import SimpleNamespace

import pytest

from jupyter_trainfactory.chargeback import (
    CostRow,
    _row,
    parse_since,
    report_text,
    sort_rows,
    totals,
    write_csv,
)
from jupyter_trainfactory.spec import SpecError
from jupyter_trainfactory.telemetry.cost import HOURS_PER_MONTH, storage_cost


def row(job, owner, cost, project="", currency="USD", ettr=0.9, tokens=0.0, hours=1.0):
    return CostRow(
        job=job, name=job, owner=owner, experiment="e", project=project, state="SUCCEEDED",
        started=1_000.0, accelerator_hours=hours, cost=cost, wasted=cost / 10,
        failures=cost / 20, storage_after=0.0, ettr=ettr, tokens=tokens,
        tokens_per_cost=tokens / cost if tokens and cost else None, currency=currency,
        example_prices=False,
    )  # fmt: skip


def test_totals_per_owner_add_up_and_keep_currencies_apart():
    rows = [
        row("a", "ana", 1.25, hours=2.0),
        row("b", "ana", 0.75, hours=1.0),
        row("c", "bo", 5.0),
        row("d", "bo", 3.0, currency="EUR"),
    ]
    groups = {(g["owner"], g["currency"]): g for g in totals(rows, "owner")}
    assert groups[("ana", "USD")]["cost"] == pytest.approx(2.0)
    assert groups[("ana", "USD")]["jobs"] == 2
    assert groups[("ana", "USD")]["accelerator_hours"] == pytest.approx(3.0)
    assert groups[("bo", "USD")]["cost"] == 5.0 and groups[("bo", "EUR")]["cost"] == 3.0
    assert [g["cost"] for g in totals(rows, "owner")] == [5.0, 3.0, 2.0]  # largest first
    by_project = totals([row("a", "ana", 1.0), row("b", "bo", 2.0, project="nlp")], "project")
    assert {g["project"] for g in by_project} == {"(none)", "nlp"}
    with pytest.raises(SpecError, match="--by takes owner, experiment, project"):
        totals(rows, "team")


def test_sort_puts_unknown_values_last():
    rows = [row("a", "x", 1.0, ettr=None), row("b", "x", 3.0, ettr=0.5), row("c", "x", 2.0)]
    assert [r.job for r in sort_rows(rows, "cost")] == ["b", "c", "a"]
    assert [r.job for r in sort_rows(rows, "ettr")] == ["b", "c", "a"]  # lowest ETTR first
    with pytest.raises(SpecError, match="--sort takes"):
        sort_rows(rows, "price")


def test_parse_since():
    assert parse_since(None) is None
    assert parse_since("7d") == pytest.approx(time.time() - 7 * 86400, abs=5)
    assert parse_since("12h") == pytest.approx(time.time() - 12 * 3600, abs=5)
    assert parse_since("2026-11-01") == time.mktime((2026, 11, 1, 0, 0, 0, 0, 0, -1))
    with pytest.raises(SpecError, match="--since takes a date"):
        parse_since("last week")


def test_row_adds_storage_kept_after_the_job():
    month = HOURS_PER_MONTH * 3600
    run = SimpleNamespace(
        info=SimpleNamespace(run_name="r", start_time=5_000),
        data=SimpleNamespace(
            tags={
                "trainfactory.job_id": "tf-00000001",
                "trainfactory.owner": "ana",
                "trainfactory.storage": '{"price_gb_month": 0.02, "history": [[0, 5e9]]}',
                "trainfactory.cost.catalog": "example-2026 (example prices, not a quote)",
            },
            metrics={
                "cost/usd": 1.0,
                "cost/wasted_usd": 0.25,
                "cost/wasted_progress_usd": 0.1,
                "cost/infrastructure_recovery_usd": 0.05,
                "cost/startup_usd": 0.1,
                "train/tokens": 3e6,
            },
        ),
    )
    r = _row(run, "e", "SUCCEEDED", now=month)  # 5 GB for one month at 0.02 per GB-month
    assert r.storage_after == pytest.approx(0.1)
    assert r.cost == pytest.approx(1.1) and r.wasted == 0.25
    assert r.failures == pytest.approx(0.15)  # lost progress + recovery, not the startup
    assert r.tokens_per_cost == pytest.approx(3e6 / 1.1)
    assert r.example_prices and r.started == 5.0


def test_storage_cost_follows_gc():
    hour = 3600.0
    # 10 GB for 10 h, then 2 GB (after gc) for 5 h, at 0.73 per GB-month (0.001 per GB-hour)
    history = [[0.0, 10e9], [10 * hour, 2e9]]
    assert storage_cost(history, 0.73, 15 * hour) == pytest.approx(10 * 10 * 0.001 + 2 * 5 * 0.001)
    assert storage_cost(history, 0.73, 5 * hour) == pytest.approx(10 * 5 * 0.001)
    assert storage_cost([], 0.73, hour) == 0.0


def test_csv_and_report(tmp_path):
    rows = [row("a", "ana", 1.5, tokens=3e6), row("b", "bo", 0.5, project="nlp")]
    path = write_csv(rows, tmp_path / "c.csv")
    read = list(csv.DictReader(path.open()))
    assert [r["job"] for r in read] == ["a", "b"] and float(read[0]["cost"]) == 1.5
    text = report_text(rows, "owner")
    assert "totals by owner:" in text and "1.50 USD" in text and "2,000,000" in text
    assert report_text([], "owner") == "(no jobs)"
    with pytest.raises(SpecError, match="Cannot write the CSV file '/no/such/dir/c.csv'"):
        write_csv(rows, "/no/such/dir/c.csv")
