"""RunRecorder against a real MLflow store (SQLite file, no server, no Ray)."""

import json
import threading
import time
import zlib

import pytest
from mlflow import MlflowClient

from jupyter_trainfactory.tracking import TAG
from ray_backend.recorder import RunRecorder


@pytest.fixture
def store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp)
    return uri, client, run.info.run_id


def test_steps_first_write_wins_and_samples_per_s(store):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)  # flush by hand
    rec.set_state("RUNNING")
    t0 = 1_000.0
    assert rec.report([{"loss": 1.0, "samples": 10}, {"loss": 9.0, "samples": 30}], None, t0) == 1
    assert rec.report([{"loss": 0.5, "samples": 10}, {"samples": 30}], "/ckpt/1", t0 + 2) == 2
    # a restored worker reports step 2 again: first write wins
    assert rec.report([{"loss": 7.0, "step": 2}], None, t0 + 3) is None
    assert rec.report([{"loss": 0.25, "step": 5, "name": "text is skipped"}], None, t0 + 4) == 5
    rec.flush()
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss == [(1, 1.0), (2, 0.5), (5, 0.25)]
    sps = {m.step: m.value for m in client.get_metric_history(run_id, "train/samples_per_s")}
    assert sps[2] == pytest.approx(40 / 2.0)  # rank 0 + rank 1 samples over 2 s
    tags = client.get_run(run_id).data.tags
    assert tags[TAG.CKPT_PATH] == "/ckpt/1" and tags[TAG.CKPT_STEP] == "2"
    assert tags[TAG.STEP] == "5"
    assert "name" not in client.get_run(run_id).data.metrics


def test_each_checkpoint_becomes_a_logged_model_with_its_step_and_metrics(store):
    uri, client, run_id = store
    client.set_tag(run_id, TAG.JOB_ID, "tf-0000abcd")
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.report([{"loss": 0.9, "acc": 0.5}], "/ckpt/a", 1_000.0)
    rec.report([{"loss": 0.7}], None, 1_001.0)
    rec.report([{"loss": 0.4, "acc": 0.8, "note": "x"}], "/ckpt/b", 1_002.0)
    rec.flush()
    exp = client.get_run(run_id).info.experiment_id
    models = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")
    by_step = {int(m.tags[TAG.CKPT_STEP]): m for m in models}
    assert sorted(by_step) == [1, 3]
    m = by_step[3]
    assert m.model_type == "checkpoint" and m.status.name == "READY"
    assert m.tags[TAG.CKPT_PATH] == "/ckpt/b" and m.tags[TAG.JOB_ID] == "tf-0000abcd"
    assert {x.key: x.value for x in m.metrics} == {"loss": 0.4, "acc": 0.8}
    assert all(x.step == 3 for x in m.metrics)
    # the run page of the MLflow UI lists the models of the run's outputs
    outputs = client.get_run(run_id).outputs.model_outputs
    assert sorted((o.step, o.model_id) for o in outputs) == [
        (step, by_step[step].model_id) for step in (1, 3)
    ]
    rec.flush()  # logged once
    assert len(client.search_logged_models([exp])) == 2
    assert len(client.get_run(run_id).outputs.model_outputs) == 2


def test_a_checkpoint_backlog_never_holds_back_the_run_and_its_models_come_in_rounds(store):
    # a job checkpointing every report, faster than the server takes models: each flush
    # writes the run's points and tags first and gives the models a bounded time
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    calls = {"log_outputs": 0, "create_logged_model": 0}
    for name in calls:
        real = getattr(rec.delivery.client, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            calls[_name] += 1
            return _real(*args, **kwargs)

        setattr(rec.delivery.client, name, counted)
    n = 60  # more than one round of models
    for i in range(1, n + 1):
        rec.report([{"loss": 1.0 / i, "step": i}], f"/ckpt/{i}", 1_000.0 + i)
    rec.flush(models_budget_s=0.0)  # the budget is spent: one model this time
    tags = client.get_run(run_id).data.tags
    assert tags[TAG.STEP] == str(n) and tags[TAG.CKPT_STEP] == str(n)
    assert len(client.get_metric_history(run_id, "loss")) == n
    assert calls["create_logged_model"] == 1 and rec.delivery.models.pending() == n - 1
    rec.flush()  # no budget (the job's last flush): every model
    assert rec.delivery.models.pending() == 0
    exp = client.get_run(run_id).info.experiment_id
    models = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")
    assert sorted(int(m.tags[TAG.CKPT_STEP]) for m in models) == list(range(1, n + 1))
    assert all(m.status.name == "READY" for m in models)
    m = next(m for m in models if m.tags[TAG.CKPT_STEP] == "7")
    assert [(x.key, x.value, x.step) for x in m.metrics] == [("loss", pytest.approx(1 / 7), 7)]
    assert len(client.get_run(run_id).outputs.model_outputs) == n
    # one model per round at first, then rounds of up to 50: not one request per model
    assert calls["create_logged_model"] == n and calls["log_outputs"] == 3


def test_finish_closes_run_with_error(store):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.report([{"acc": 0.5}], None)
    rec.finish("FAILED", "FAILED", error="ValueError: bad batch")
    run = client.get_run(run_id)
    assert run.info.status == "FAILED"
    assert run.data.tags[TAG.ERROR] == "ValueError: bad batch"
    assert run.data.metrics["acc"] == 0.5


def test_a_pending_jobs_reason_is_kept_current_until_it_runs(store):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state(
        "PENDING",
        "waiting for resources: ...; held by job tf-0127dacc (2 CPU)",
        "0 of 2 CPU free; held by job tf-0127dacc",
    )
    rec.flush()
    assert (
        client.get_run(run_id).data.tags[TAG.WAITING] == "0 of 2 CPU free; held by job tf-0127dacc"
    )
    assert rec.pending_reason("starting the workers: 2 workers x (1 CPU)", "starting the workers")
    rec.flush()
    tags = client.get_run(run_id).data.tags
    assert tags[TAG.REASON] == "starting the workers: 2 workers x (1 CPU)"
    assert tags[TAG.WAITING] == "starting the workers"
    rec.set_state("RUNNING")  # rank 0 started: a late look changes nothing
    assert not rec.pending_reason("waiting for resources: ...; free now 0 of 2 CPU", "0 of 2")
    rec.flush()
    tags = client.get_run(run_id).data.tags
    assert tags[TAG.STATE] == "RUNNING" and tags[TAG.REASON] == "" and tags[TAG.WAITING] == ""


class FlakyClient:
    """Stands in for MlflowClient: records log_batch calls, fails while ``down``.

    ``fail_after`` lets the next N requests succeed and then fails (a server that goes
    away in the middle of a flush).
    """

    def __init__(self):
        self.metrics = []
        self.tags = {}
        self.requests = []
        self.down = False
        self.fail_after = None
        self.status = None

    def log_batch(self, run_id, metrics=(), tags=()):
        if self.fail_after is not None:
            if self.fail_after == 0:
                raise ConnectionError("connection refused")
            self.fail_after -= 1
        if self.down:
            raise ConnectionError("connection refused")
        assert len(metrics) + len(tags) <= 1000  # MLflow's per-request limit
        self.requests.append(len(metrics))
        self.metrics.extend(metrics)
        self.tags.update({t.key: t.value for t in tags})

    def delete_tag(self, run_id, key):
        if self.down:
            raise ConnectionError("connection refused")
        self.tags.pop(key, None)

    def set_terminated(self, run_id, status):
        if self.down:
            raise ConnectionError("connection refused")
        self.status = status


def _recorder(**kwargs):
    rec = RunRecorder("http://unused", "run", flush_interval_s=3600, **kwargs)
    rec.delivery.client = FlakyClient()
    return rec, rec.delivery.client


def _log(rec, rank, n, start=1, key="loss"):
    points = [[key, float(s), s, 1000.0 + s] for s in range(start, start + n)]
    rec.worker_batch(rank, {"points": points})


def test_points_wait_while_the_server_is_away_and_arrive_exactly_once(capsys):
    rec, fake = _recorder()
    _log(rec, 0, 2500)
    fake.fail_after = 1  # the first request goes through, then the server goes away
    with pytest.raises(ConnectionError):
        rec.flush()
    rec.delivery.went_offline(ConnectionError("connection refused"))
    assert len(fake.metrics) == 900 and rec.stats()["queued"] == 1600
    fake.fail_after, fake.down = None, True
    _log(rec, 0, 500, start=2501)  # training goes on meanwhile
    with pytest.raises(ConnectionError):
        rec.flush()
    assert rec.stats()["queued"] == 2100
    fake.down = False
    rec.flush()
    steps = [m.step for m in fake.metrics if m.key == "loss"]
    assert sorted(steps) == list(range(1, 3001))  # every point once: no loss, no duplicate
    assert max(fake.requests) == 900
    out = capsys.readouterr().out
    assert "tracking server unreachable (connection refused)" in out
    assert "tracking server back after" in out and "2100 points were queued" in out
    assert rec.stats()["offline_s"] > 0 and rec.stats()["dropped"] == 0
    rec.flush()  # the outage tags
    assert fake.tags["trainfactory.tracking.dropped_points"] == "0"


def test_the_bound_drops_oldest_system_points_never_user_points():
    rec, fake = _recorder(max_queued=100)
    fake.down = True
    for i in range(60):
        rec.node_metrics({"system/n1/cpu_utilization": float(i)}, i, 1000.0 + i * 1.0)
    _log(rec, 0, 80)
    assert rec.stats() == {
        "queued": 100,
        "queued_user": 80,
        "dropped": 40,  # 140 points for a bound of 100: the 40 oldest system samples go
        "offline_s": 0.0,
        "nonfinite": 0,
    }
    _log(rec, 0, 50, start=81)  # beyond the bound with no system point left: user points stay
    assert rec.stats()["queued_user"] == 130 and rec.stats()["dropped"] == 60
    fake.down = False
    rec.flush()
    cpu = sorted(m.step for m in fake.metrics if m.key == "system/n1/cpu_utilization")
    assert cpu == []  # all 60 system samples were the oldest
    assert sorted(m.step for m in fake.metrics if m.key == "loss") == list(range(1, 131))


def test_nonfinite_values_are_counted_and_flagged_never_written():
    rec, fake = _recorder()
    rec.worker_batch(
        0,
        {
            "points": [
                ["loss", 1.0, 1, 1.0],
                ["loss", float("nan"), 2, 2.0],
                ["gn", float("inf"), 3, 3.0],
            ]
        },
    )
    rec.report([{"acc": float("-inf"), "step": 4}], None, 4.0)
    rec.flush()
    assert [(m.key, m.step) for m in fake.metrics if m.key in ("loss", "gn", "acc")] == [
        ("loss", 1)
    ]
    assert fake.tags["trainfactory.nonfinite.first_step"] == "2"
    assert fake.tags["trainfactory.nonfinite.first_key"] == "loss"
    assert fake.tags["trainfactory.nonfinite.count"] == "3"
    assert rec.stats()["nonfinite"] == 3
    counts = [m.value for m in fake.metrics if m.key == "train/nonfinite_count"]
    assert counts == [1.0, 2.0, 3.0]


def test_keys_are_mapped_and_renames_recorded():
    rec, fake = _recorder()
    rec.worker_batch(0, {"points": [["loss", 1.0, 1, 1.0], ["loss/val", 2.0, 1, 1.0]]})
    rec.worker_batch(0, {"points": [["acc@1", 0.5, 1, 1.0]]})
    rec.derive(10.0)
    rec.flush()
    assert {m.key for m in fake.metrics} == {"loss", "loss_/val", "acc_1"}
    assert json.loads(fake.tags["trainfactory.renamed_keys"]) == {
        "loss/val": "loss_/val",
        "acc@1": "acc_1",
    }


def test_per_gpu_series_are_thinned_for_large_jobs_but_the_cluster_view_is_not():
    # 5 nodes x 8 GPUs x 5 metrics + 5 nodes x 2 host values = 210 per-device values for a
    # budget of 105 points/s: each node's series is written every ceil(210 / 105) = 2nd
    # sample, the nodes staggered by crc32(node) % 2; the cluster aggregates every tick.
    rec, fake = _recorder(device_points_per_s=105)
    names = ("utilization", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz")
    for t in range(10):
        for node in range(5):
            values = {
                f"system/n{node}/gpu{g}/{name}": float(10 * g + t)
                for g in range(8)
                for name in names
            }
            values[f"system/n{node}/cpu_utilization"] = 50.0
            rec.node_metrics(values, t, 1000.0 + t)
        rec.derive(1000.0 + t)
    rec.flush()
    for node in range(5):
        written = [m.step for m in fake.metrics if m.key == f"system/n{node}/gpu3/utilization"]
        offset = zlib.crc32(f"n{node}".encode())
        assert written == [t for t in range(10) if (t + offset) % 2 == 0]
    util_max = [m.value for m in fake.metrics if m.key == "system/cluster/gpu_utilization_max"]
    assert util_max == [70.0 + t for t in range(10)]  # gpu7 = 10 * 7 + t, every tick
    util_mean = [m.value for m in fake.metrics if m.key == "system/cluster/gpu_utilization_mean"]
    assert util_mean[0] == pytest.approx(35.0)  # mean of 0, 10, ..., 70


def test_energy_from_sampled_power():
    rec, fake = _recorder()
    for t in range(4):  # 2 GPUs at 300 W and 100 W for 3 s: 1200 J
        rec.node_metrics(
            {"system/n0/gpu0/power_w": 300.0, "system/n0/gpu1/power_w": 100.0}, t, 1000.0 + t
        )
    rec.derive(1003.0)
    rec.flush()
    kwh = [m.value for m in fake.metrics if m.key == "energy/gpu_kwh"]
    assert kwh == [pytest.approx(1200 / 3.6e6)]


def test_worker_counters_give_throughput_and_mfu():
    rec, fake = _recorder(gpus_per_worker=1.0, peak_tflops=100.0)
    rec.worker_batch(0, {"model": {"n_params": 1000}, "device": {"device_name": "NVIDIA H100"}})
    for rank in (0, 1):
        rec.worker_batch(rank, {"counters": {"time": 10.0, "steps": 10, "tokens": 1000.0}})
        rec.worker_batch(rank, {"counters": {"time": 12.0, "steps": 30, "tokens": 5000.0}})
    rec.derive(12.0)
    rec.flush()
    last = {m.key: m.value for m in fake.metrics}
    assert last["train/tokens_per_s"] == pytest.approx(2 * 4000 / 2.0)
    assert last["train/tokens_per_s_per_gpu"] == pytest.approx(2000.0)
    # --peak-tflops wins over the table: 2000 tokens/s * 6 * 1000 FLOPs / 100e12
    assert last["train/mfu"] == pytest.approx(2000.0 * 6000 / 100e12)
    assert fake.tags["trainfactory.flops_per_token"] == "6000"
    assert fake.tags["trainfactory.peak_flops"] == "1e+14"
    assert fake.tags["trainfactory.mfu_note"] == ""


def test_checkpoint_saves_give_bandwidth():
    rec, fake = _recorder()
    rec.worker_batch(0, {"checkpoints": [{"save_s": 0.5, "bytes": 200_000_000, "time": 5.0}]})
    rec.worker_batch(1, {"checkpoints": [{"save_s": 9.0, "bytes": 1, "time": 5.0}]})  # not rank 0's
    rec.flush()
    values = {m.key: (m.step, m.value) for m in fake.metrics}
    assert values == {
        "checkpoint/save_s": (1, 0.5),
        "checkpoint/bytes": (1, 200_000_000.0),
        "checkpoint/mb_per_s": (1, 400.0),
    }


def test_finish_waits_for_the_server_and_then_closes_the_run():
    rec, fake = _recorder()
    _log(rec, 0, 10)
    fake.down = True

    def back():
        time.sleep(1.5)
        fake.down = False

    threading.Thread(target=back).start()
    stats = rec.finish("FINISHED", "SUCCEEDED", timeout_s=30)
    assert fake.status == "FINISHED" and stats["queued"] == 0
    assert sorted(m.step for m in fake.metrics if m.key == "loss") == list(range(1, 11))


def test_report_samples_give_throughput_until_workers_count_their_own():
    rec, fake = _recorder()
    rec.set_state("RUNNING")
    # a worker that only started (device info, zero counters) does not switch the source
    rec.worker_batch(0, {"counters": {"time": 1.0, "steps": 0}, "device": {}})
    rec.report([{"samples": 8}, {"samples": 8}], None, 1000.0)
    rec.report([{"samples": 8}, {"samples": 8}], None, 1002.0)
    rec.flush()
    assert [m.value for m in fake.metrics if m.key == "train/samples"] == [16.0, 32.0]
    assert [m.value for m in fake.metrics if m.key == "train/samples_per_s"][-1] == 8.0


def _counters(steps, t):
    return {"time": t, "steps": steps, "step_time_s": 0.05 * steps, "data_wait_s": 0.0}


def test_a_stall_is_flagged_suggested_and_stops_the_job(store, capsys):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600, stall_timeout_s=10, on_stall="stop")
    rec.set_state("RUNNING")
    t0 = time.time()
    for i in range(1, 4):  # progress every 2 s: the longest gap is 2 s
        rec.progressed(t0 + 2 * i)
    assert rec.check_stall(t0 + 6 + 9.9) is None  # 9.9 s without progress: not yet
    decision = rec.check_stall(t0 + 6 + 10.1)
    assert decision.kind == "stop"
    assert rec.check_stall(t0 + 6 + 20) is None  # once per stall
    rec.carry_out([decision])
    assert rec.stop_status()["reason"] == "stall" and rec.stop_status()["due"]
    rec.flush()
    tags = client.get_run(run_id).data.tags
    assert tags[TAG.STALL].startswith("no step or report for 10 s since")
    assert tags[TAG.STALL_SUGGESTED] == "60"  # 10 x 2 s is below the 60 s floor
    rec.progressed(t0 + 40)  # progress again clears the flag
    rec.flush()
    assert client.get_run(run_id).data.tags[TAG.STALL] == ""
    assert "stalled: no step or report" in capsys.readouterr().out


def test_without_a_timeout_a_stall_is_never_flagged(store):
    uri, _, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    rec.progressed(time.time())
    assert rec.check_stall(time.time() + 10**6) is None


def test_a_failure_keeps_its_root_cause_with_the_rank_node(store):
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    rec.worker_batch(1, {"worker": {"pid": 4242, "node_id": "ab" * 28, "node_ip": "10.0.0.7"}})
    assert rec.ranks_on_node("10.0.0.7") == [1] and rec.ranks_on_node("ab" * 4) == [1]
    assert rec.ranks_on_node("10.0.0.8") == []
    detail = {"type": "ValueError", "message": "ValueError: bad", "traceback": "  File x\nbad"}
    rec.worker_failure(1, "ValueError: bad", detail=detail)
    rec.flush()
    tags = client.get_run(run_id).data.tags
    failure = json.loads(tags[TAG.FAILURE])
    assert failure["rank"] == 1 and failure["node"] == "10.0.0.7" and failure["pid"] == 4242
    assert failure["type"] == "ValueError" and failure["traceback"].endswith("bad")
    assert json.loads(tags[f"{TAG.RANK}1"])["pid"] == 4242
    assert rec.ranks_on_node("10.0.0.7") == []  # its process is gone with the failure


def test_a_peer_that_died_is_the_root_cause_of_the_survivors_collective_error(store):
    """Rank 1 SIGKILLed under DDP: rank 0's allreduce fails first (gloo: "Connection
    reset by peer"), then Ray sees rank 1's process gone: the failure is rank 1's, a
    worker crash, not rank 0's error in user code."""
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    rec.worker_batch(0, {"worker": {"pid": 10, "node_id": "n0", "node_ip": "10.0.0.1"}})
    rec.worker_batch(1, {"worker": {"pid": 11, "node_id": "n1", "node_ip": "10.0.0.2"}})
    reset = "RuntimeError: [gloo/transport/tcp/pair.cc:537] Connection reset by peer"
    symptom = {"type": "RuntimeError", "message": reset, "traceback": "  File hook\nreset"}
    rec.worker_failure(0, reset, detail=symptom)
    died = {"type": "ActorDiedError", "message": "ActorDiedError: the actor died", "traceback": ""}
    rec.worker_failure(1, died["message"], detail=died)
    rec.worker_failure(0, "ValueError: later", detail={"type": "ValueError"})  # no death
    rec.finish("FINISHED", "SUCCEEDED")
    tags = client.get_run(run_id).data.tags
    failure = json.loads(tags[TAG.FAILURE])
    assert failure["rank"] == 1 and failure["type"] == "ActorDiedError", failure
    assert failure["pid"] == 11 and failure["node"] == "10.0.0.2" and failure["traceback"] == ""
    records = json.loads(tags[TAG.FAILURES])
    assert [(r["kind"], r["rank"]) for r in records] == [("worker_crash", 1)]


def test_chaos_for_a_rank_that_is_not_running_answers_with_the_running_ones(store):
    uri, _, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.worker_batch(0, {"worker": {"pid": 1, "node_id": "n", "node_ip": "10.0.0.7"}})
    assert rec.chaos({"id": "x", "rank": 5})["error"] == (
        "rank 5 is not running (running ranks: 0)"
    )
    assert (
        "no worker of this job runs on node" in rec.chaos({"id": "y", "node": "10.9.9.9"})["error"]
    )


def test_a_resume_continues_steps_counts_and_goodput_of_the_run(store):
    uri, client, run_id = store
    first = RunRecorder(uri, run_id, flush_interval_s=3600)
    first.set_state("RUNNING")
    t0 = time.time()
    first.worker_batch(0, {"counters": _counters(5, t0 + 1), "points": [("loss", 1.0, 5, t0 + 1)]})
    first.report([{"step": 5}], "/ckpt/5", t0 + 1)
    first.worker_failure(1, "boom")
    first.finish("KILLED", "STOPPED", reason="user")
    records = json.loads(client.get_run(run_id).data.tags[TAG.FAILURES])
    # no exception type: an error of the training code, not of the cluster
    assert [r["kind"] for r in records] == ["user_error"] and "steps_lost" in records[0]
    before = client.get_run(run_id).data.metrics
    second = RunRecorder(uri, run_id, flush_interval_s=3600, resume=1)
    second.set_state("RUNNING")
    # the restored workers log steps 4..6 again: only 6 is new
    points = [("loss", 9.0, s, time.time()) for s in (4, 5, 6)]
    second.worker_batch(0, {"counters": _counters(3, time.time()), "points": points})
    assert second.report([{"step": 5}], None) is None  # the report count continues too
    second.worker_batch(1, {"worker": {"pid": 7, "node_id": "cd" * 28, "node_ip": "10.0.0.9"}})
    died = {"type": "ActorDiedError", "message": "ActorDiedError: the actor died", "traceback": ""}
    second.worker_failure(1, died["message"], detail=died)
    second.derive(time.time() + 1)
    second.finish("FINISHED", "SUCCEEDED")
    run = client.get_run(run_id)
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss == [(5, 1.0), (6, 9.0)]
    m = run.data.metrics
    assert m["faults/count"] == 2  # not reset by the resume
    # the failure log goes on over the resume: both failures, each with its kind and node
    records = json.loads(run.data.tags[TAG.FAILURES])
    assert [(r["kind"], r["node"]) for r in records] == [
        ("user_error", ""),
        ("worker_crash", "10-0-0-9"),
    ]
    counts = json.loads(run.data.tags[TAG.FAULT_COUNTS])
    assert counts == {
        "kinds": {"user_error": 1, "worker_crash": 1},
        "nodes": {"10-0-0-9": {"worker_crash": 1}},
    }
    assert m["goodput/wall_s"] > before["goodput/wall_s"]
    assert m["goodput/goodput_s"] >= before["goodput/goodput_s"]
    assert run.data.tags[TAG.RESUMES] == "1"
    wall = [p for p in client.get_metric_history(run_id, "goodput/wall_s")]
    assert max(wall, key=lambda p: p.step).value == m["goodput/wall_s"]  # latest = newest


def test_a_report_that_overtakes_the_workers_batch_loses_no_step(store):
    # after a resume from step 5 the checkpoint report of step 10 reaches the recorder
    # before the worker's batch of steps 6..9: all of them are written, each once
    uri, client, run_id = store
    first = RunRecorder(uri, run_id, flush_interval_s=3600)
    first.set_state("RUNNING")
    t = time.time()
    first.worker_batch(0, {"points": [("loss", float(s), s, t) for s in (1, 2)]})
    first.report([{"loss": 3.0, "step": 3}], None, t)  # a fresh job's report overtakes too
    first.worker_batch(0, {"points": [("loss", float(s), s, t) for s in range(1, 6)]})
    first.finish("KILLED", "STOPPED", reason="user")
    second = RunRecorder(uri, run_id, flush_interval_s=3600, resume=1)
    second.set_state("RUNNING")
    second.report([{"loss": 10.0, "step": 10}], "/ckpt/10", time.time())
    points = [("loss", float(s), s, time.time()) for s in range(4, 11)]  # 4, 5: written before
    second.worker_batch(0, {"points": points})
    second.finish("FINISHED", "SUCCEEDED")
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss == [(s, float(s)) for s in range(1, 11)]


def test_a_checkpoints_steps_are_written_before_the_reply_and_refused_once_closed(store):
    # stop --now: the run closes while the workers still step; what they send after is
    # not in the run, and the worker must hear it (it then reports no checkpoint)
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    t = time.time()
    assert rec.worker_batch(0, {"points": [("loss", 1.0, 1, t)]}) == {"stop": False}
    assert client.get_metric_history(run_id, "loss") == []  # queued: flushed every hour
    # before a checkpoint the worker asks for a write: its reply comes once it is in MLflow
    reply = rec.worker_batch(0, {"points": [("loss", 0.5, 2, t)], "write": True})
    assert reply == {"stop": False, "written": True}
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2]
    rec.finish("KILLED", "STOPPED", reason="user-now")
    assert rec.worker_batch(0, {"points": [("loss", 2.0, 3, t)], "write": True}) == {
        "stop": False,
        "closed": True,
    }
    assert rec.delivery.empty()
    assert [m.step for m in client.get_metric_history(run_id, "loss")] == [1, 2]


def test_cost_is_metered_live_and_a_budget_asks_for_a_stop(store):
    from jupyter_trainfactory.telemetry.cost import EXAMPLE_CATALOG
    from ray_backend.costs import CostMeter

    uri, client, run_id = store
    meter = CostMeter(EXAMPLE_CATALOG, workers=2, gpus_per_worker=1, cpus_per_worker=4, budget=1)
    rec = RunRecorder(uri, run_id, flush_interval_s=3600, cost=meter)
    rec.set_state("RUNNING")
    rec.worker_batch(0, {"device": {"device_name": "NVIDIA H200"}})
    t = time.time()
    rec.derive(t + 3600)  # an hour of 2 H200 at the example price, $4.00/h each
    rec.flush()
    run = client.get_run(run_id)
    m, tags = run.data.metrics, run.data.tags
    assert m["cost/usd"] == pytest.approx(8.0, rel=1e-3)
    assert m["cost/accelerator_hours"] == pytest.approx(2.0, rel=1e-3)
    assert m["cost/rate_per_h"] == 8.0 and m["cost/budget_fraction"] > 1
    assert tags["trainfactory.cost.currency"] == "USD"
    assert tags["trainfactory.cost.catalog"].endswith("(example prices, not a quote)")
    assert rec.stop_status()["reason"] == "budget"


def test_cost_is_projected_to_the_target_step(store):
    from jupyter_trainfactory.telemetry.cost import EXAMPLE_CATALOG
    from ray_backend.costs import CostMeter

    uri, client, run_id = store
    meter = CostMeter(EXAMPLE_CATALOG, workers=2, gpus_per_worker=1, cpus_per_worker=4)
    rec = RunRecorder(uri, run_id, flush_interval_s=3600, cost=meter, target_steps=100)
    rec.set_state("RUNNING")
    rec.worker_batch(0, {"device": {"device_name": "NVIDIA H200"}})
    t = time.time()
    rec.report([{"step": 10}], None, t)
    rec.derive(t)  # the first step seen: the rate is measured from here
    rec.report([{"step": 20}], None, t + 360)
    rec.derive(t + 360)  # 10 steps in 360 s; 80 steps to go: 2880 s at $8.00/h = $6.40
    rec.flush()
    m = client.get_run(run_id).data.metrics
    assert m["cost/projected_usd"] == pytest.approx(m["cost/usd"] + 6.40, rel=1e-6)


def test_plain_ray_train_reports_are_the_steps_of_goodput(store):
    # a loop with ray.train.report only (no trainfactory.step): each report is a step
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    t0 = rec.attempts.current()["start"] = time.time() - 100  # the workers started 100 s ago
    rec.attempts.submitted = t0 - 1
    for i in range(1, 6):
        rec.report([{"loss": 1.0 / i, "step": i}], f"/ckpt/{i}" if i == 3 else None, t0 + 2 * i)
    # the worker's own record of that checkpoint (timed around the report)
    rec.worker_batch(0, {"checkpoints": [{"save_s": 0.5, "bytes": 10, "time": t0 + 6, "step": 3}]})
    acc = rec.goodput(t0 + 10)
    assert acc.badput_s["startup"] == pytest.approx(1.0 + 2.0)  # pending, then to report 1
    assert acc.goodput_s == pytest.approx(8.0 - 0.5)  # reports 2-5, 2 s each, less the save
    rec.worker_failure(1, "boom")
    rec.set_state("RUNNING")  # the restart
    start = rec.attempts.current()["start"]
    rec.report([{"loss": 0.1, "step": 4}], None, start + 1)
    rec.report([{"loss": 0.1, "step": 6}], None, start + 2)
    (failure,) = rec.goodput(start + 3).failures
    assert failure.step_reached == 5 and failure.restored_step == 3
    assert failure.mttr_s == pytest.approx(start + 2 - failure.time)


def test_the_stall_watch_decides_a_restart_of_the_laggard_and_never_acts():
    from ray_backend.decisions import Decision
    from ray_backend.stall import StallWatch

    watch = StallWatch(timeout_s=10, on_stall="restart")
    watch.started(100.0)
    watch.progressed(102.0)
    assert watch.check(111.0, running=True, laggard=3, laggard_step=7) == ({}, None)
    tags, decision = watch.check(113.0, running=True, laggard=3, laggard_step=7)
    assert decision == Decision("restart", reason="stall", rank=3)
    assert tags[TAG.STALL].endswith("least progress: rank 3 (step 7)")
    assert watch.cause() == tags[TAG.STALL]  # the failure that follows is the stall's
    assert watch.check(200.0, running=True, laggard=3) == ({}, None)  # once per stall


def test_control_tags_become_decisions_once():
    from ray_backend.control import ChaosControl, StopControl, decisions_from_tags
    from ray_backend.decisions import Decision

    chaos, stop = ChaosControl(), StopControl()
    chaos.seen_before(json.dumps({"id": "old", "rank": 0}))
    tags = {TAG.CHAOS: json.dumps({"id": "old", "rank": 1})}
    assert decisions_from_tags(tags, chaos, stop) == []  # an earlier submission's request
    tags = {
        TAG.CHAOS: json.dumps({"id": "c1", "rank": 1}),
        TAG.STOP: "user",
        TAG.STOP_GRACE: "60",
        TAG.STOP_TIME: "1000",
    }
    assert decisions_from_tags(tags, chaos, stop) == [
        Decision("chaos", request={"id": "c1", "rank": 1}),
        Decision("stop", reason="user", grace_s=60.0, at=1000.0),
    ]
    stop.ask("user", 60.0, 1000.0)  # carried out by the recorder
    assert decisions_from_tags(tags, chaos, stop) == []


def test_a_plain_loops_stop_is_agreed_at_its_reported_step(store, capsys):
    # a plain Ray Train loop counts no steps through trainfactory: its reports give the step
    uri, _, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    for step in range(1, 99):
        rec.report([{"loss": 1.0, "step": step}, {"loss": 1.0, "step": step}], None, 1_000.0 + step)
    rec.request_stop("user")
    for rank in (0, 1):
        reply = rec.worker_batch(rank, {"checks": 98, "stop": {"checks": 98, "world_size": 2}})
    assert reply == {"stop": True, "at": 99}
    assert "every rank stops at its next stop point (about step 99)" in capsys.readouterr().out


def test_a_loop_that_counts_no_steps_gets_its_worker_numbers_at_each_report():
    """Plain Ray Train code (no trainfactory.step/log): the workers' counters (data wait,
    collectives, ingest) are derived at each report's step, not once at step 0."""
    from ray_backend.derived import DerivedNumbers

    derived = DerivedNumbers(workers=1)
    key = lambda name: name  # noqa: E731
    derived.counters(0, {"time": 100.0, "steps": 0}, now=100.0)
    derived.tick(100.0, key, report_step=-1)  # the baseline window
    rows_at = {}
    for report_step, t in ((1, 102.0), (2, 104.0), (3, 106.0)):
        counters = {"time": t, "steps": 0, "data_wait_s": 0.1 * report_step}
        derived.counters(0, {**counters, "ingest_rows": 64.0 * report_step}, now=t)
        points = derived.tick(t, key, report_step=report_step).points
        rows_at.update({step: v for k, v, step, _ in points if k == "train/ingest_rows"})
        # a second tick at the same report writes no second point for the step
        assert not [
            p for p in derived.tick(t + 0.5, key, report_step).points if p[2] == report_step
        ]
    assert rows_at == {1: 64.0, 2: 128.0, 3: 192.0}


def test_startup_ends_at_the_first_training_work_not_at_the_first_report(store):
    # issue 48, finding 6: one report per epoch (the quickstart); the workers' first
    # forward begins the first epoch, 60 s before its report: that minute is training
    uri, client, run_id = store
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    t0 = rec.attempts.current()["start"] = time.time() - 200
    rec.attempts.submitted = t0 - 5
    rec.worker_batch(1, {"started": {"time": t0 + 4.0}})
    rec.worker_batch(0, {"started": {"time": t0 + 3.0}})  # the earliest rank counts
    rec.worker_batch(0, {"started": {"time": t0 - 50.0}})  # before the attempt: ignored
    rec.report([{"epoch": 0}], None, t0 + 63)
    rec.report([{"epoch": 1}], None, t0 + 123)
    acc = rec.goodput(t0 + 123)
    assert acc.badput_s["startup"] == pytest.approx(5.0 + 3.0)  # pending, then setup
    assert acc.goodput_s == pytest.approx(120.0)  # both epochs


def test_a_restored_checkpoints_report_adds_no_second_point_to_a_step_written_before(store):
    # stop --now, then a resume that restores step 2 and runs 3..5 again: the checkpoint
    # report at step 5 (save_checkpoint's loss) falls on the earlier submission's point.
    # Its LoggedModel's copy of that point, at the report's time, was a second loss at 5
    uri, client, run_id = store
    first = RunRecorder(uri, run_id, flush_interval_s=3600)
    first.set_state("RUNNING")
    t = time.time()
    first.worker_batch(0, {"points": [("loss", float(s), s, t + s) for s in range(1, 6)]})
    first.finish("KILLED", "STOPPED", reason="user-now")
    second = RunRecorder(uri, run_id, flush_interval_s=3600, resume=1)
    second.set_state("RUNNING")
    second.worker_batch(0, {"points": [("loss", 9.0, s, t + 60 + s) for s in (3, 4, 5)]})
    second.report([{"loss": 9.0, "step": 5}], "/ckpt/5", t + 70)
    second.report([{"loss": 0.6, "step": 6}], "/ckpt/6", t + 71)
    second.finish("FINISHED", "SUCCEEDED")
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss == [(s, float(s)) for s in range(1, 6)] + [(6, 0.6)]  # each step once
    exp = client.get_run(run_id).info.experiment_id
    models = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")
    by_step = {int(m.tags[TAG.CKPT_STEP]): m for m in models}
    assert not by_step[5].metrics  # the run's point at 5 is not its own
    assert [(x.key, x.value) for x in by_step[6].metrics] == [("loss", 0.6)]


def test_train_totals_wait_for_every_ranks_counters_of_a_step():
    # rank 0's last counters arrive, a derive tick, then rank 1's: the point at step 30
    # held the job's samples less rank 1's last 20 (telemetry_jobs: 3792 of 3840)
    rec, fake = _recorder()
    for rank in (0, 1):
        rec.worker_batch(rank, {"counters": {"time": 10.0, "steps": 10, "samples": 40.0}})
    rec.derive(10.5)
    rec.worker_batch(0, {"counters": {"time": 12.0, "steps": 30, "samples": 120.0}})
    rec.derive(12.5)  # rank 1 is still at 10: its totals are not in yet
    rec.worker_batch(1, {"counters": {"time": 12.1, "steps": 30, "samples": 120.0}})
    rec.derive(13.0)
    rec.flush()
    samples = {m.step: m.value for m in fake.metrics if m.key == "train/samples"}
    assert samples[30] == 240.0 and max(samples) == 30
