"""The reliability report's arithmetic on a hand-built history written to a real MLflow
store (SQLite): exposure per unit, kinds, rates and their intervals, MTBF, MTTR
percentiles, ETTR, the lemon-node flag, a resumed job, a job in progress (no services)."""

import csv
import json
import math
from types import SimpleNamespace

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from jupyter_trainfactory import runreads
from jupyter_trainfactory.fleet.history import history_from_run
from jupyter_trainfactory.fleet.kinds import classify
from jupyter_trainfactory.fleet.report import MIN_RATE_DAYS, Rate, reliability_report
from jupyter_trainfactory.fleet.rest_runs import page_reader, run_view
from jupyter_trainfactory.fleet.stats import poisson_interval
from jupyter_trainfactory.fleet.views import report_text, summary_line, write_csv, write_html
from jupyter_trainfactory.spec import SpecError
from jupyter_trainfactory.tracking import TAG

DAY = 86400.0
T0 = 1_780_000_000.0  # the period starts here
NOW = T0 + 10 * DAY


def _failure(t, kind, node, mttr):
    return {"time": t, "kind": kind, "node": node, "mttr_s": mttr, "steps_lost": 3, "rank": 0}


def _write(client, exp, job, *, start, end, status, gpus=4, cpus=1, workers=2, accel="gpu",
           hours=0.0, hours_at=None, wall=0.0, good=0.0, failures=(), nodes=None,
           cluster="http://c1:8265", owner="ana", project="p", state=None):  # fmt: skip
    run = client.create_run(exp, start_time=int(start * 1000), run_name=job)
    counts = {"kinds": {}, "nodes": {}}
    for f in failures:
        counts["kinds"][f["kind"]] = counts["kinds"].get(f["kind"], 0) + 1
        per = counts["nodes"].setdefault(f["node"], {})
        per[f["kind"]] = per.get(f["kind"], 0) + 1
    placement = {"nodes": {n: list(r) for n, r in (nodes or {}).items()}}
    tags = {
        TAG.JOB_ID: f"tf-{job}",
        TAG.OWNER: owner,
        TAG.PROJECT: project,
        TAG.DASHBOARD: cluster,
        TAG.STATE: state or {"FINISHED": "SUCCEEDED", "KILLED": "STOPPED"}.get(status, "RUNNING"),
        TAG.FAILURES: json.dumps(list(failures)),
        TAG.FAULT_COUNTS: json.dumps(counts),
        TAG.PLACEMENT: json.dumps(placement),
    }
    params = {"accelerator": accel, "workers": str(workers), "cpus_per_worker": str(cpus),
              "gpus_per_worker": str(gpus if accel != "cpu" else 0)}  # fmt: skip
    key = "cost/vcpu_hours" if accel == "cpu" else "cost/accelerator_hours"
    ts = int((hours_at or end or NOW) * 1000)
    metrics = {key: hours, "goodput/wall_s": wall, "goodput/goodput_s": good,
               "badput/startup_s": wall - good, "cost/wasted_usd": 1.5,
               "cost/infrastructure_recovery_usd": 0.5}  # fmt: skip
    client.log_batch(
        run.info.run_id,
        metrics=[Metric(k, v, ts, 0) for k, v in metrics.items()],
        params=[Param(k, v) for k, v in params.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    if status != "RUNNING":
        client.set_terminated(run.info.run_id, status, end_time=int(end * 1000))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Jobs a-h started in the period, one before it (gpus: per worker, 2 workers).

    GPU jobs (8 GPUs each): a on c1, nodes n1 n2, 960 GPU-h, 2 worker crashes on n1 and
    a preemption on n2; b on c2, n3 n4, 240 GPU-h, a user error on n3; c on c2, n5 n6,
    240 GPU-h, 5 node losses on n5 (the lemon); d resumed: its run spans 3 days but it
    held its GPUs 1 day (192 GPU-h, what its cost meter counted); e still running, 24
    GPU-h written 9 min before now (1.2 more since); s's run is open but silent for 2 h
    (5 GPU-h, not counted on); f stopped by its user, 48 GPU-h.
    CPU job g: 2 vCPUs, 0.5 vCPU-h, a worker crash. z started before the period."""
    path = tmp_path_factory.mktemp("rel")
    client = MlflowClient(f"sqlite:///{path}/mlflow.db")
    exp = client.create_experiment("fleet", artifact_location=str(path / "a"))
    t = T0 + DAY
    _write(client, exp, "a", start=T0 + 0.5 * DAY, end=T0 + 5.5 * DAY, status="FINISHED",
           hours=960, wall=5 * DAY, good=4 * DAY, nodes={"n1": [0], "n2": [1]},
           failures=[_failure(t, "worker_crash", "n1", 30.0),
                     _failure(t + DAY, "worker_crash", "n1", 50.0),
                     _failure(t + 2 * DAY, "preemption", "n2", 70.0)])  # fmt: skip
    _write(client, exp, "b", start=T0 + 2 * DAY, end=T0 + 3.5 * DAY, status="FAILED",
           hours=240, wall=1.5 * DAY, good=DAY, nodes={"n3": [0], "n4": [1]},
           cluster="http://c2:8265", owner="bo", project="q", state="FAILED",
           failures=[_failure(T0 + 3 * DAY, "user_error", "n3", None)])  # fmt: skip
    _write(client, exp, "c", start=T0 + 6 * DAY, end=T0 + 8 * DAY, status="FINISHED",
           hours=240, wall=2 * DAY, good=DAY, nodes={"n5": [0], "n6": [1]},
           cluster="http://c2:8265", owner="bo", project="q",
           failures=[_failure(T0 + 7 * DAY + i, "node_loss", "n5", m)
                     for i, m in enumerate((10.0, 20.0, 40.0, 80.0, None))])  # fmt: skip
    _write(client, exp, "d", start=T0 + DAY, end=T0 + 4 * DAY, status="FINISHED",
           hours=192, wall=DAY, good=0.5 * DAY, nodes={"n1": [0, 1]})  # fmt: skip
    _write(client, exp, "e", start=T0 + 9 * DAY, end=None, status="RUNNING", hours=24,
           hours_at=NOW - 540, wall=0.4 * DAY, good=0.2 * DAY, nodes={"n2": [0, 1]})  # fmt: skip
    _write(client, exp, "s", start=T0 + 9 * DAY, end=None, status="RUNNING", hours=5,
           hours_at=NOW - 7200, wall=0.1 * DAY, good=0.1 * DAY)  # fmt: skip
    _write(client, exp, "f", start=T0 + 8 * DAY, end=T0 + 8.25 * DAY, status="KILLED",
           hours=48, wall=0.25 * DAY, good=0.2 * DAY, nodes={"n6": [0, 1]})  # fmt: skip
    _write(client, exp, "g", start=T0 + 3 * DAY, end=T0 + 3.01 * DAY, status="FINISHED",
           accel="cpu", cpus=1, hours=0.5, wall=900, good=600, nodes={"h1": [0, 1]},
           failures=[_failure(T0 + 3 * DAY + 60, "worker_crash", "h1", 12.0)])  # fmt: skip
    _write(client, exp, "z", start=T0 - DAY, end=T0 - 0.5 * DAY, status="FINISHED",
           hours=1000, wall=DAY, good=DAY, failures=[_failure(T0 - DAY, "worker_crash", "n9", 1.0)])  # fmt: skip
    return SimpleNamespace(mlflow_client=client, experiment_ids=lambda name: None)


def _report(fleet, **kw):
    return reliability_report(fleet, since=T0, until=NOW, now=NOW, **kw)


def test_exposure_counts_held_time_per_unit_and_a_running_job_up_to_now(fleet):
    r = _report(fleet)
    gpu, cpu = {g.unit: g for g in r.fleet}["GPU"], {g.unit: g for g in r.fleet}["vCPU"]
    assert len(r.jobs) == 8  # z started before the period
    # d's stopped time is not exposure (192, not 3 days x 8); e: 24 + 8 GPUs x 9 min;
    # s: its last point (its driver may be gone)
    assert gpu.exposure_h == pytest.approx(960 + 240 + 240 + 192 + (24 + 1.2) + 5 + 48)
    assert gpu.jobs == 7 and gpu.live == 1 and gpu.silent == 1
    assert "1 open but silent for over 10 min" in report_text(r)
    assert cpu.exposure_h == pytest.approx(0.5) and cpu.jobs == 1


def test_kinds_rate_interval_mtbf_and_mttr(fleet):
    gpu = {g.unit: g for g in _report(fleet).fleet}["GPU"]
    assert gpu.kinds == {"worker_crash": 2, "preemption": 1, "user_error": 1, "node_loss": 5}
    assert gpu.infrastructure == 8 and gpu.user_errors == 1 and gpu.stops == 1
    days = (960 + 240 + 240 + 192 + 25.2 + 5 + 48) / 24  # 71.26 GPU-days
    assert gpu.rate.per_day == pytest.approx(8 / days)
    # Garwood's exact 95 % interval for 8 events: 3.4538 to 15.7632 (published tables)
    assert gpu.rate.low * days == pytest.approx(3.4538, abs=1e-4)
    assert gpu.rate.high * days == pytest.approx(15.7632, abs=1e-4)
    assert gpu.mtbf_h == pytest.approx(days * 24 / 8)
    # MTTRs of recovered infrastructure failures: 30 50 70 10 20 40 80 (user error none)
    xs = sorted([30, 50, 70, 10, 20, 40, 80])
    p95 = xs[5] + 0.7 * (xs[6] - xs[5])  # type 7: rank 0.95 * 6 = 5.7
    assert gpu.mttr_s == pytest.approx((40.0, p95, 80.0))
    assert (gpu.recovered, gpu.mttr_of) == (7, 8)
    good, wall = 4 + 1 + 1 + 0.5 + 0.2 + 0.1 + 0.2, 5 + 1.5 + 2 + 1 + 0.4 + 0.1 + 0.25
    assert gpu.ettr == pytest.approx(good / wall)
    assert gpu.badput_s["startup"] == pytest.approx(gpu.wall_s - gpu.goodput_s)
    assert gpu.wasted_cost == {"USD": pytest.approx(7 * 1.5)}
    assert gpu.failure_cost == {"USD": pytest.approx(7 * 0.5)}


def test_too_little_exposure_gives_no_rate_but_its_interval(fleet):
    cpu = {g.unit: g for g in _report(fleet).fleet}["vCPU"]
    assert cpu.infrastructure == 1 and cpu.rate.per_day is None
    text = cpu.rate.text()
    assert text.startswith("too little exposure for a rate (0.0208 vCPU-days") and "95 % CI" in text
    zero = Rate.of(0, 100.0, "GPU")
    assert zero.per_day == 0.0 and zero.high == pytest.approx(3.6889 / 100, abs=1e-6)
    assert "95 % CI 0-3.69 % per GPU-day" in zero.text()  # 0 % never without its bound
    assert Rate.of(0, 0.0, "GPU").text() == "no exposure: no rate"
    assert MIN_RATE_DAYS == 1.0


def test_the_lemon_node_is_named_with_its_test(fleet):
    r = _report(fleet)
    nodes = {(n.node, n.unit): n for n in r.nodes}
    n5 = nodes[("n5", "GPU")]
    # 8 infrastructure failures over 6 GPU nodes; n5 holds 120 of 1,664 GPU-h
    share = 120 / (480 + 480 + 120 + 120 + 120 + 120 + 192 + 25.2 + 48)
    tail = sum(math.comb(8, k) * share**k * (1 - share) ** (8 - k) for k in range(5, 9))
    assert n5.p_value == pytest.approx(tail) and n5.lemon
    assert [n.node for n in r.lemons] == ["n5"]
    assert not nodes[("n1", "GPU")].lemon  # 2 failures on a 672 GPU-h share: ordinary
    assert nodes[("n1", "GPU")].exposure_h == pytest.approx(480 + 192)
    assert nodes[("h1", "vCPU")].p_value is None  # a unit with one node is not tested
    assert "lemon node: n5" in report_text(r) and "lemon: n5" in summary_line(r)


def test_groups_by_cluster_and_owner(fleet):
    by = {(g.key, g.unit): g for g in _report(fleet, by="cluster").groups}
    assert by[("http://c1:8265", "GPU")].infrastructure == 3
    assert by[("http://c2:8265", "GPU")].infrastructure == 5
    assert by[("http://c2:8265", "GPU")].user_errors == 1
    owners = {(g.key, g.unit): g.jobs for g in _report(fleet, by="owner").groups}
    assert owners == {("ana", "GPU"): 5, ("bo", "GPU"): 2, ("ana", "vCPU"): 1}
    with pytest.raises(SpecError, match="--by takes cluster, node, owner"):
        _report(fleet, by="team")


def test_buckets_views_and_files(fleet, tmp_path):
    r = _report(fleet)
    assert r.bucket_s == DAY and len(r.buckets) == 10
    by_day = {int((b[0] - T0) // DAY): b for b in r.buckets}
    assert by_day[1][1:3] == (1, 0) and by_day[7][1] == 5
    assert by_day[3][1:3] == (2, 1)  # a preemption, the CPU job's crash; b's user error
    assert by_day[4][3] is None and by_day[0][3] == pytest.approx(0.8)  # none started on day 4
    text = report_text(r)
    assert "[GPU]" in text and "[vCPU]" in text and "planned stop" in text
    rows = list(csv.DictReader(write_csv(r, tmp_path / "r.csv").open()))
    assert len(rows) == 8 and {x["job"] for x in rows} >= {"tf-a", "tf-g"}
    a = next(x for x in rows if x["job"] == "tf-a")
    assert a["failures_worker_crash"] == "2" and a["infrastructure_failures"] == "3"
    page = write_html(r, tmp_path / "r.html").read_text()
    assert "cdn.bokeh.org" not in page and "Bokeh" in page and "lemon node" in page


def test_sliced_search_reads_every_run_once_newest_first(fleet):
    client = fleet.mlflow_client
    ids = [client.get_experiment_by_name("fleet").experiment_id]
    # ten one-day slices: d, b and g start exactly on a slice's edge
    runs = runreads.search_job_runs_sliced(client, ids, T0, NOW, threads=2, slices_per_thread=5)
    names = [r.info.run_name for r in runs]
    assert sorted(names) == sorted("abcdefgs") and len(names) == 8
    starts = [r.info.start_time for r in runs]
    assert starts == sorted(starts, reverse=True)
    everything = runreads.search_job_runs_sliced(client, ids, None, NOW)
    assert sorted(r.info.run_name for r in everything) == sorted("abcdefgsz")
    assert runreads.search_job_runs_sliced(client, ids, NOW, NOW + DAY) == []


def test_a_run_read_from_the_rest_json_gives_the_same_history(fleet):
    """The REST path (``rest_runs``) reads the JSON the server writes for a search
    (``message_to_json`` of the run's proto, what MLflow's handler returns)."""
    from mlflow.utils.proto_json_utils import message_to_json

    client = fleet.mlflow_client
    runs = runreads.search_job_runs(client, max_results=100)
    assert len(runs) == 9
    for run in runs:
        view = run_view(json.loads(message_to_json(run.to_proto())))
        assert history_from_run(view, "fleet", NOW) == history_from_run(run, "fleet", NOW)
    assert page_reader(client) is None  # a SQLite store: the client's own search
    assert page_reader(MlflowClient("http://127.0.0.1:1")) is not None


def test_classify_failure_kinds():
    assert classify({"kind": "preemption", "type": "ActorDiedError"}) == "preemption"
    assert classify({"type": "ActorDiedError", "by": "chaos"}) == "worker_crash"
    assert classify({"type": "ActorDiedError", "by": "chaos-node"}) == "node_loss"
    assert classify({"type": "ValueError", "by": "stall"}) == "stall"
    assert classify({"type": "WorkerHealthCheckTimeoutError"}) == "stall"
    msg = "ActorDiedError: The actor died because its node has died."
    assert classify({"type": "ActorDiedError", "message": msg}) == "node_loss"
    assert classify({"type": "ActorDiedError", "message": "killed"}) == "worker_crash"
    assert classify({"type": "ValueError", "message": "bad"}) == "user_error"


def test_poisson_interval_edges():
    assert poisson_interval(0) == (0.0, pytest.approx(3.6889, abs=1e-4))
    assert poisson_interval(1) == (pytest.approx(0.0253, abs=1e-4), pytest.approx(5.5716, abs=1e-4))
    with pytest.raises(ValueError):
        poisson_interval(-1)


def test_the_api_function_is_not_shadowed_by_the_package():
    import jupyter_trainfactory
    import jupyter_trainfactory.fleet.report  # noqa: F401  (ray_backend imports it too)
    from jupyter_trainfactory import api

    assert jupyter_trainfactory.reliability is api.reliability
