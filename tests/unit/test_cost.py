"""Cost metering (telemetry.cost): exact arithmetic on hand-built timelines."""

import pytest

from jupyter_trainfactory.telemetry.cost import (
    EXAMPLE_CATALOG,
    AcceleratorPrice,
    Allocation,
    PriceCatalog,
    StorageSample,
    meter,
    projected_cost,
)
from jupyter_trainfactory.telemetry.goodput import Attempt, CheckpointSave, Step, account

#: $3.60 per GPU-hour: $0.001 per GPU-second, so 8 GPUs cost $0.008 a second.
CATALOG = PriceCatalog(
    version="test-1",
    accelerators={"H100": AcceleratorPrice(3.60, 1.80), "H100 SXM": AcceleratorPrice(3.60)},
    fallback="H100",
    cpu_vcpu_hour=0.036,
    memory_gib_hour=0.0036,
    storage_gb_month=0.73,
    egress_gb=0.10,
)


def _steps(first_step, first_end, n, duration=1.0, wait=0.1):
    return [Step(first_end + k * duration, first_step + k, duration, wait) for k in range(n)]


def _one_failure():
    """tests/unit/test_goodput.py's timeline: workers from 10, failure at 37.5, restart at 45."""
    steps = _steps(1, 21, 10) + _steps(11, 33, 5) + _steps(11, 56, 10)
    attempts = [Attempt(10.0, failed_at=37.5), Attempt(45.0)]
    return account(0.0, 70.0, attempts, steps, [CheckpointSave(30.0, 32.0, 10)])


def test_two_nodes_of_four_gpus_with_a_failure_cost_to_the_cent():
    acc = _one_failure()
    # 2 nodes x 4 GPUs held from the workers' start (10 s) to the end (70 s)
    nodes = [Allocation(10.0, None, 4, "NVIDIA H100 80GB HBM3") for _ in range(2)]
    cost = meter(acc.segments, nodes, CATALOG, until=70.0)
    assert cost.compute == pytest.approx(0.48)  # 8 GPUs x 60 s x $0.001
    assert cost.accelerator_hours == pytest.approx(8 * 60 / 3600)
    expected = {  # seconds held in each category x $0.008
        "startup": 10 * 0.008,  # 10-20: held, no step yet (0-10 pending: not held)
        "checkpoint_save": 2 * 0.008,
        "data_loading": 2 * 0.008,
        "wasted_progress": 5.5 * 0.008,  # the failure's lost work
        "infrastructure_recovery": 7.5 * 0.008,
        "checkpoint_restore": 10 * 0.008,
        "other": 5 * 0.008,
        "goodput": 18 * 0.008,
    }
    assert {k: round(v, 2) for k, v in cost.by_category.items() if v} == {
        k: round(v, 2) for k, v in expected.items()
    }
    assert cost.by_category == pytest.approx(expected)
    assert round(cost.productive, 2) == 0.14 and round(cost.wasted, 3) == 0.336
    assert cost.rate_per_h == pytest.approx(8 * 3.60)
    assert cost.warnings == []
    failure_cost = sum(
        cost.by_category[k]
        for k in ("wasted_progress", "infrastructure_recovery", "checkpoint_restore")
    )
    assert round(failure_cost, 2) == 0.18  # "this failure cost $0.18"


def test_spot_capacity_cpu_workers_storage_and_egress():
    acc = _one_failure()
    spot = meter(acc.segments, [Allocation(10.0, 70.0, 2, "H100", spot=True)], CATALOG, 70.0)
    assert spot.compute == pytest.approx(2 * 60 * 1.80 / 3600)
    cpus = meter(acc.segments, [Allocation(10.0, 70.0, 0, "", 4, 16)], CATALOG, 70.0)
    assert cpus.compute == pytest.approx((4 * 0.036 + 16 * 0.0036) * 60 / 3600)
    assert cpus.accelerator_hours == 0
    # 1,000 GB kept from 0 to 35, 2,000 GB from 35 to 70 at $0.73 per GB-month (730 h)
    stored = [StorageSample(0.0, 1e12), StorageSample(35.0, 2e12)]
    cost = meter(acc.segments, [], CATALOG, 70.0, storage=stored, egress_bytes=5e9)
    assert cost.storage == pytest.approx((1000 * 35 + 2000 * 35) * 0.001 / 3600)
    assert cost.egress == pytest.approx(0.50)
    assert cost.total == pytest.approx(cost.storage + 0.50) and cost.compute == 0


def test_an_unknown_accelerator_is_charged_as_the_fallback_with_a_warning():
    acc = _one_failure()
    cost = meter(acc.segments, [Allocation(10.0, 70.0, 1, "Mystery X9")], CATALOG, 70.0)
    assert cost.compute == pytest.approx(60 * 0.001)  # never zero
    assert cost.warnings == [
        "no price for accelerator 'Mystery X9' in catalog test-1; charged as H100"
    ]
    assert CATALOG.accelerator_price("NVIDIA H100 SXM5")[0] == 3.60  # longest match


def test_the_metrics_and_a_projection():
    acc = _one_failure()
    cost = meter(acc.segments, [Allocation(10.0, None, 8, "H100")], CATALOG, until=70.0)
    m = cost.metrics()
    assert m["cost/usd"] == pytest.approx(0.48) and m["cost/wasted_usd"] == pytest.approx(0.336)
    assert m["cost/goodput_usd"] == pytest.approx(0.144) and m["cost/storage_usd"] == 0
    # 1,000 more steps at 2 steps/s: 500 s at $28.80/h
    assert projected_cost(0.48, 28.80, 20, 1020, 2.0) == pytest.approx(0.48 + 4.0)
    assert projected_cost(0.48, 28.80, 20, 1020, 0.0) is None


def test_catalogs_from_toml_and_bad_ones(tmp_path):
    path = tmp_path / "prices.toml"
    path.write_text(
        'version = "acme-2026-11"\ncurrency = "EUR"\nfallback = "H100"\n'
        "storage_gb_month = 0.02\n[accelerators]\n"
        '"H100" = { on_demand = 2.9, spot = 1.1 }\n"L4" = 0.6\n'
    )
    catalog = PriceCatalog.load(path)
    assert catalog.currency == "EUR" and catalog.accelerator_price("NVIDIA L4") == (0.6, "")
    assert catalog.accelerator_price("H100", spot=True)[0] == 1.1
    assert EXAMPLE_CATALOG.example and not catalog.example
    bad = {
        'version = "v"\n[accelerators]\n"H100" = -1\nfallback = "H100"': "must be a number",
        'currency = "USD"': "needs a version",
        'version = "v"\nfallback = "A100"\n[accelerators]\n"H100" = 1': "fallback 'A100'",
        'version = "v"\ncurrency = "dollars"': "ISO 4217",
        'version = "v"\nprice = 3': "unknown catalog field 'price'",
        "version = ": "not valid TOML",
    }
    for text, message in bad.items():
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            PriceCatalog.load(path)


def test_the_job_meter_holds_from_the_first_start_keeps_the_newest_checkpoints():
    from ray_backend.costs import CostMeter

    job = CostMeter(CATALOG, workers=2, gpus_per_worker=4, cpus_per_worker=8, keep_checkpoints=2)
    acc = _one_failure()
    job.device("NVIDIA H100 80GB HBM3")
    job.started(10.0)
    job.started(45.0)  # a restart does not release the cluster's GPUs
    for when, size in ((20.0, 1e12), (30.0, 1e12), (40.0, 2e12)):
        job.checkpoint(when, size)
    cost = job.cost(acc.segments, 70.0)
    assert cost.compute == pytest.approx(0.48)
    # kept bytes: 1 TB from 20, 2 TB from 30, 3 TB (the newest two) from 40 to 70
    assert cost.storage == pytest.approx((1000 * 10 + 2000 * 10 + 3000 * 30) * 0.001 / 3600)
    job.released(70.0)
    assert job.cost(acc.segments, 100.0).compute == pytest.approx(0.48)  # nothing after
    job.add_before({"cost/usd": 1.0, "cost/rate_per_h": 99.0})
    m = job.metrics(cost)
    assert m["cost/usd"] == pytest.approx(1.0 + cost.total) and m["cost/rate_per_h"] == 28.8


def test_a_budget_stops_before_the_checkpoint_that_would_pass_it():
    from ray_backend.costs import CostMeter

    job = CostMeter(CATALOG, 1, 1, 1, budget=1.0)
    job.started(0.0)
    job.checkpoint(100.0, None)
    job.checkpoint(200.0, None)  # one checkpoint every 100 s
    # at 250 s with $0.50 spent at $3.60/h: the checkpoint after the next (400 s) and the
    # stop (10 s) cost 0.5 + 160 s x $0.001 = $0.66: fine; from $0.90 it is $1.06: stop
    assert not job.over_budget(0.50, 3.60, 250.0)
    assert not job.over_budget(0.84, 3.60, 250.0)
    assert job.over_budget(0.85, 3.60, 250.0)
    assert not job.over_budget(0.95, 3.60, 251.0)  # asked once
    assert not CostMeter(CATALOG, 1, 1, 1).over_budget(10**6, 3.60, 0.0)  # no budget


def test_status_says_what_a_job_cost():
    from jupyter_trainfactory.jobstate import cost_text as _cost_text

    tags = {
        "trainfactory.cost.currency": "EUR",
        "trainfactory.cost.budget": "15",
        "trainfactory.cost.catalog": "example-2026-11 (example prices, not a quote)",
    }
    metrics = {"cost/usd": 1234.5, "cost/wasted_usd": 12.25}
    assert _cost_text(metrics, tags) == "1,234.50 EUR (12.25 wasted; budget 15; example prices)"
    assert _cost_text({}, tags) == ""


def test_money_shows_cents_or_two_significant_digits():
    from jupyter_trainfactory.telemetry.cost import money

    assert money(1234.5) == "1,234.50"
    assert money(0.0) == "0.00"
    assert money(0.05) == "0.05"
    assert money(0.000712) == "0.00071"
    assert money(8.1e-05) == "0.000081"  # a 30 s CPU job: never "8.1e-05"
    assert money(3e-9) == "<0.000001"


def test_a_user_errors_cost_is_the_users_never_infrastructure_recovery(tmp_path, monkeypatch):
    """A trial's loop raises its own KeyError and Ray Train restarts it: the lost time
    and its cost are booked as the user's (``badput/user_error_s``,
    ``cost/user_error_usd``), not as ``infrastructure_recovery`` (issue 48, finding 8).
    A real MLflow store (SQLite); the recorder's clock is stepped by hand."""
    import json
    import time

    from mlflow import MlflowClient

    from jupyter_trainfactory.chargeback import FAILURE_CATEGORIES
    from jupyter_trainfactory.telemetry.cost import EXAMPLE_CATALOG
    from jupyter_trainfactory.tracking import TAG
    from ray_backend import recorder as recorder_module
    from ray_backend.costs import CostMeter

    real = time

    class Clock:
        t = real.time()

        def time(self):
            return self.t

        def __getattr__(self, name):
            return getattr(real, name)

    clock = Clock()
    monkeypatch.setattr(recorder_module, "time", clock)
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "a"))
    run_id = client.create_run(exp).info.run_id
    meter = CostMeter(EXAMPLE_CATALOG, workers=1, gpus_per_worker=1, cpus_per_worker=4)
    rec = recorder_module.RunRecorder(uri, run_id, flush_interval_s=3600, cost=meter)
    t0 = clock.t = real.time() + 1  # after the recorder's submission time
    rec.set_state("RUNNING")
    rec.worker_batch(0, {"device": {"device_name": "NVIDIA H200"}})
    clock.t = t0 + 90  # the loop's last sign of life; it raises
    rec.worker_batch(0, {"worker": {"pid": 7, "node_id": "n", "node_ip": "10.0.0.7"}})
    error = {"type": "KeyError", "message": "KeyError: 'lr'", "traceback": "  File f\nKeyError"}
    rec.worker_failure(0, error["message"], detail=error)
    clock.t = t0 + 130  # Ray Train's restart
    rec.set_state("RUNNING")
    rec.derive(t0 + 140)
    rec.flush()
    run = client.get_run(run_id)
    m = run.data.metrics
    (record,) = json.loads(run.data.tags[TAG.FAILURES])
    assert record["kind"] == "user_error"
    assert m["badput/user_error_s"] == pytest.approx(40.0, abs=0.5)  # 90-130
    assert m["badput/infrastructure_recovery_s"] == 0.0
    # one H200 at the example's $4.00 an hour: 40 s of it are the user's
    assert m["cost/user_error_usd"] == pytest.approx(4.0 * 40 / 3600, rel=0.02)
    assert "cost/infrastructure_recovery_usd" not in m
    assert "user_error" in FAILURE_CATEGORIES  # a failure's cost, named for whose it is
