"""The reliability report's arithmetic on a hand-built history written to a real MLflow
store (SQLite): exposure per unit, kinds, rates and their intervals, MTBF, MTTR
percentiles, ETTR, the lemon-node flag, a resumed job, a job in progress (no services)."""

import csv
import json
import math
import time
from types import SimpleNamespace

import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from jupyter_trainfactory import runreads
from jupyter_trainfactory.fleet.history import history_from_run
from jupyter_trainfactory.fleet.kinds import classify
from jupyter_trainfactory.fleet.report import MIN_RATE_DAYS, Rate, compute, reliability_report
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


# -- drills and planned stops, end to end through the recorder (issue 48, finding 7) -----


def _recorder_run(tmp_path):
    from ray_backend.recorder import RunRecorder

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(exp).info.run_id
    client.log_batch(run_id, params=[Param("accelerator", "cpu"), Param("workers", "2")])
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    rec.worker_batch(0, {"worker": {"pid": 10, "node_id": "n0", "node_ip": "10.0.0.1"}})
    rec.worker_batch(1, {"worker": {"pid": 11, "node_id": "n1", "node_ip": "10.0.0.2"}})
    return rec, client, run_id


_DIED = {"type": "ActorDiedError", "message": "ActorDiedError: the actor died", "traceback": ""}


def _fleet_of(client, run_id):
    job = history_from_run(client.get_run(run_id), "t", time.time())
    return job, compute([job], None, time.time() + 1, time.time())


def test_a_chaos_kill_is_a_drill_never_an_infrastructure_failure(tmp_path):
    """``%train chaos`` kills rank 1: its recorder marks the pid it killed. The failure
    keeps the kind it simulates, is recorded as a drill and counted apart: no failure
    rate, MTBF or MTTR of real failures counts it, and the report says so."""
    rec, client, run_id = _recorder_run(tmp_path)
    rec.chaos_control.killed("c1", [11])  # what RunRecorder.chaos records after its kill
    rec.worker_failure(1, _DIED["message"], detail=_DIED)
    rec.set_state("RUNNING")  # the restart
    rec.finish("FINISHED", "SUCCEEDED")
    tags = client.get_run(run_id).data.tags
    (record,) = json.loads(tags[TAG.FAILURES])
    assert (record["kind"], record["rank"], record["drill"]) == ("worker_crash", 1, True)
    counts = json.loads(tags[TAG.FAULT_COUNTS])
    assert counts == {"kinds": {}, "nodes": {}, "drills": {"worker_crash": 1}}
    job, report = _fleet_of(client, run_id)
    assert job.kinds == {} and job.drills == {"worker_crash": 1}
    assert job.infrastructure_failures == 0 and job.failures[0].drill
    (cpu,) = report.fleet
    assert cpu.infrastructure == 0 and cpu.drill_count == 1 and cpu.rate.failures == 0
    assert cpu.mtbf_h is None and cpu.mttr_of == 0 and cpu.mttr_s is None
    text = report.text()
    assert "failures:  0 infrastructure (none)" in text
    assert "drills:    1 injected failure (worker_crash 1)" in text
    assert "not in the rate, MTBF or MTTR" in text
    assert "1 drill (not counted)" in report.summary()["text"]
    assert report.summary()["units"][0]["drills"] == 1
    assert report.buckets[0][1] == 0  # not a failure on the plot either
    from jupyter_trainfactory.commands import format_status
    from jupyter_trainfactory.jobstate import job_info

    status = format_status(job_info(client.get_run(run_id), "SUCCEEDED", "sqlite://"))
    assert "worker_crash (a drill: injected) at step" in status


def test_the_pocs_own_kill_is_a_drill_even_when_a_peer_fails_first(tmp_path):
    """The poc's dying rank tells the recorder first (``poc_loop._announce_drill``: an
    ``error`` report with ``by``); under DDP its peer's broken collective is often
    recorded before Ray sees the death, and the death then becomes the root cause: the
    drill mark goes with it."""
    from ray_backend import poc_loop, session

    told = []

    class Worker:
        def set_info(self, kind, info):
            told.append((kind, info))

        def drain(self, timeout):
            told.append(("drained", timeout))

    session._current = Worker()
    try:
        poc_loop._announce_drill(poc_loop.BY_CHAOS_WORKER, 25)
    finally:
        session._current = None
    (kind, said), drained = told
    assert kind == "error" and said["by"] == "chaos" and "step 25" in said["cause"]
    assert drained[0] == "drained"  # it waits until the recorder has the word
    rec, client, run_id = _recorder_run(tmp_path)
    rec.worker_batch(1, {"error": said})  # sent before the SIGKILL
    reset = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Connection reset by peer"
    rec.worker_failure(0, reset, detail={"type": "RuntimeError", "message": reset})
    rec.worker_failure(1, _DIED["message"], detail=_DIED)
    rec.finish("FINISHED", "SUCCEEDED")
    tags = client.get_run(run_id).data.tags
    failure = json.loads(tags[TAG.FAILURE])
    assert failure["rank"] == 1 and failure["by"] == "chaos" and "poc" in failure["cause"]
    (record,) = json.loads(tags[TAG.FAILURES])
    assert (record["kind"], record["rank"], record.get("drill")) == ("worker_crash", 1, True)
    job, report = _fleet_of(client, run_id)
    assert job.kinds == {} and report.fleet[0].infrastructure == 0
    # the goodput account books its time as the drill's, not infrastructure recovery's
    assert [f.kind for f in rec.goodput(time.time()).failures] == ["drill"]


def test_a_real_crash_stays_an_infrastructure_failure_beside_a_drill():
    from jupyter_trainfactory.fleet.kinds import attempt_kind, injected
    from jupyter_trainfactory.fleet.records import failure_tags, read_counts
    from jupyter_trainfactory.telemetry.goodput import FailureRecord

    records = [
        FailureRecord(1.0, "failure", 5, 4, 1, 3.0),
        FailureRecord(9.0, "drill", 8, 4, 4, 2.0),
    ]
    causes = [
        dict(_DIED, node="10.0.0.2", rank=1),
        dict(_DIED, node="10.0.0.2", rank=1, by="chaos-node"),
    ]
    tags = failure_tags(records, causes, counts_before={"kinds": {"user_error": 1}})
    counts = read_counts(tags)
    assert counts["kinds"] == {"user_error": 1, "worker_crash": 1}
    assert counts["nodes"] == {"10-0-0-2": {"worker_crash": 1}}  # no lemon test counts a drill
    assert counts["drills"] == {"node_loss": 1}
    assert [r.get("drill", False) for r in json.loads(tags[TAG.FAILURES])] == [False, True]
    assert not injected(causes[0]) and injected(causes[1]) and not injected({"by": "stall"})
    assert attempt_kind(causes[0]) == "failure" and attempt_kind(causes[1]) == "drill"
    assert attempt_kind({"type": "KeyError"}) == "user_error"
    assert attempt_kind({"type": "ActorDiedError", "kind": "preemption"}) == "preemption"


def test_planned_stops_are_counted_over_a_jobs_resumes(tmp_path):
    """A stop from the panel, then Resume: the reopened run ends FINISHED, so the stop
    was only in its KILLED status, which the resume overwrote. The resume now keeps it
    (``trainfactory.stops``) and the report counts every planned stop of a job."""
    from jupyter_trainfactory import submission
    from jupyter_trainfactory.fleet.records import planned_stops

    _, reopen = submission.reopen_tags("tf-x", 1, {}, 0.0, planned_stops("KILLED", {}))
    assert reopen[TAG.STOPS] == "1"
    _, again = submission.reopen_tags("tf-x", 2, {}, 0.0, planned_stops("KILLED", reopen))
    assert again[TAG.STOPS] == "2"
    assert planned_stops("FAILED", again) == 2 and planned_stops("RUNNING", {}) == 0
    client = MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "a"))
    resumed = client.create_run(exp).info.run_id  # stopped twice, resumed, finished
    client.log_batch(resumed, tags=[RunTag(TAG.STOPS, again[TAG.STOPS])])
    client.set_terminated(resumed, "FINISHED")
    stopped = client.create_run(exp).info.run_id  # stopped now
    client.set_terminated(stopped, "KILLED")
    runs = [client.get_run(r) for r in (resumed, stopped)]
    jobs = [history_from_run(r, "t", NOW) for r in runs]
    assert [j.stops for j in jobs] == [2, 1] and [j.stopped for j in jobs] == [False, True]
    report = compute(jobs, None, NOW, NOW)
    assert report.fleet[0].stops == 3 and "3 planned stops" in report.text()
    rows = list(csv.DictReader(write_csv(report, tmp_path / "s.csv").open()))
    assert sorted(x["planned_stops"] for x in rows) == ["1", "2"]


def test_a_resume_keeps_the_stop_its_reopen_overwrites(tmp_path, monkeypatch):
    """``JobManager.resume`` of a job stopped from the panel (its run KILLED): the reopened
    run still counts that planned stop (no cluster: the submission is a stub)."""
    from jupyter_trainfactory import jobs
    from jupyter_trainfactory.spec import JobSpec

    manager = jobs.JobManager("http://127.0.0.1:1", f"sqlite:///{tmp_path}/mlflow.db")
    client = manager.mlflow_client
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "a"))
    run_id = client.create_run(exp).info.run_id
    client.log_batch(
        run_id,
        tags=[RunTag(k, v) for k, v in {TAG.JOB_ID: "tf-5700beef", TAG.CKPT_STEP: "5",
              TAG.DASHBOARD: "http://127.0.0.1:1", TAG.STATE: "STOPPED", TAG.STOP: "user",
              TAG.STOP_TIME: "1000.0", TAG.STOP_GRACE: "300"}.items()],
    )  # fmt: skip
    client.set_terminated(run_id, "KILLED")
    payload = tmp_path / "payload"
    payload.mkdir()
    (payload / "job.json").write_text(
        json.dumps({"job_id": "tf-5700beef", "spec": JobSpec("f").to_dict()})
    )
    monkeypatch.setattr(jobs, "fetch_payload", lambda *a: payload)
    monkeypatch.setattr(manager, "check", lambda spec: SimpleNamespace(min_nodes=1))
    monkeypatch.setattr(manager, "_submit", lambda *a: None)
    manager.resume("tf-5700beef")
    run = client.get_run(run_id)
    assert run.info.status == "RUNNING" and run.data.tags[TAG.STOPS] == "1"
    assert history_from_run(run, "t", time.time()).stops == 1
    # issue 48, finding 9: the running run's tags say what holds now: no stale stop
    # request, and no empty tags (error, stall, chaos) written in their place
    gone = (TAG.STOP, TAG.STOP_TIME, TAG.STOP_GRACE, TAG.ERROR, TAG.STALL, TAG.CHAOS, TAG.WAITING)
    assert not set(gone) & set(run.data.tags)
    assert "" not in run.data.tags.values()
