"""The worker API without Ray: buffering, ranks, step/data-wait timing and the DDP comm hook."""

import os
import time

import pytest

from ray_backend import session


@pytest.fixture
def telemetry():
    """A WorkerTelemetry installed as the current one, shipping into a list."""
    sent = []
    worker = session.WorkerTelemetry(lambda rank, batch: sent.append((rank, batch)), rank=0)
    session._current = worker
    yield worker, sent
    session._current = None


def test_log_buffers_points_and_counts(telemetry):
    worker, sent = telemetry
    session.log({"loss": 0.5, "acc": True}, step=3, samples=8, tokens=64)
    session.log({"loss": 0.25}, samples=8, tokens=64)  # default step: steps so far (2 calls)
    batch = worker.batch()
    assert [p[:3] for p in batch["points"]] == [
        ["loss", 0.5, 3],
        ["acc", 1.0, 3],
        ["loss", 0.25, 2],
    ]
    assert batch["counters"]["samples"] == 16 and batch["counters"]["tokens"] == 128
    assert batch["counters"]["steps"] == 2  # no step() blocks: log calls count as steps
    assert worker.batch() is None  # nothing new since
    session.log({"loss": 0.125}, step=4)
    worker.flush()
    worker.flush()  # nothing new, and the last send was < 2 s ago: nothing goes out
    assert [[p[:3] for p in batch["points"]] for _, batch in sent] == [[["loss", 0.125, 4]]]


def test_an_idle_worker_still_hears_about_a_stop(telemetry):
    worker, sent = telemetry
    worker._last_sent = time.time() - 3  # nothing logged for 3 s
    worker.flush()
    assert sent == [(0, {})]  # an empty batch, so that the recorder's reply comes back
    assert session.should_stop() is False
    worker.hear({"stop": True, "at": 2})  # the recorder's reply: stop at stop point 2
    assert session.should_stop() is True


def test_other_ranks_count_but_log_only_when_asked(telemetry):
    worker, _ = telemetry
    worker.rank = 1
    session.log({"loss": 1.0}, step=1, tokens=10)
    session.log({"loss": 2.0}, step=2, tokens=10, rank_zero_only=False)
    batch = worker.batch()
    assert [p[:3] for p in batch["points"]] == [["rank1/loss", 2.0, 2]]
    assert batch["counters"]["tokens"] == 20


def test_non_numbers_are_skipped_with_one_warning(telemetry, capsys):
    worker, _ = telemetry
    session.log({"name": "abc", "loss": 1.0}, step=1)
    session.log({"name": "abc"}, step=2)
    assert [p[0] for p in worker.batch()["points"]] == ["loss"]
    assert capsys.readouterr().out.count("'name' is not a number") == 1


def test_step_and_data_wait_are_timed(telemetry):
    worker, _ = telemetry
    for _ in range(3):
        with session.data_wait():
            time.sleep(0.01)
        with session.step(samples=4, tokens=40):
            time.sleep(0.02)
    for _ in session.data_wait(iter(range(2))):
        pass
    counters = worker.batch()["counters"]
    assert counters["steps"] == 3 and counters["samples"] == 12 and counters["tokens"] == 120
    assert len(counters["step_times"]) == 3 and min(counters["step_times"]) >= 0.02
    assert counters["step_time_s"] >= 0.06 and counters["data_wait_s"] >= 0.03


def test_checkpoints_and_model_info(telemetry):
    worker, _ = telemetry
    worker.add_checkpoint(0.5, 1000)

    class NotAModule:
        pass

    session.watch(NotAModule(), layers=2, heads=4, head_dim=8, seq_len=16)
    batch = worker.batch()
    assert batch["checkpoints"][0]["save_s"] == 0.5 and batch["checkpoints"][0]["bytes"] == 1000
    assert batch["model"] == {"layers": 2, "heads": 4, "head_dim": 8, "seq_len": 16}


def test_outside_a_job_every_call_does_nothing():
    assert session.current() is None
    session.log({"loss": 1.0})
    with session.step(samples=1):
        pass
    model = object()
    assert session.watch(model) is model


@pytest.fixture
def process_group():
    import torch.distributed as dist

    from jupyter_trainfactory.services import _free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_watch_counts_parameters_and_times_allreduces(telemetry, process_group):
    import torch

    worker, _ = telemetry
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(100, 10))
    session.watch(model)
    session.watch(model)  # twice: still one hook
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(4, 100)).sum().backward()
        opt.step()
    batch = worker.batch()
    assert batch["model"]["n_params"] == 100 * 10 + 10
    assert batch["counters"]["comm_s"] > 0


def test_a_users_own_comm_hook_still_works_and_is_timed(telemetry, process_group):
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    worker, _ = telemetry
    model = session.watch(torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(10, 1)))
    calls = []

    def my_hook(state, bucket):
        calls.append(1)
        return allreduce_hook(state, bucket)

    model.register_comm_hook(None, my_hook)  # DDP allows one hook: ours must not be in the way
    model(torch.randn(2, 10)).sum().backward()
    assert calls and worker.batch()["counters"]["comm_s"] > 0


def test_the_worker_api_imports_without_jupyter_mlflow_ray_or_torch():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('IPython', 'ipywidgets', 'ipykernel', 'bokeh', 'jupyter_bokeh',"
        " 'jupyterlab', 'mlflow', 'ray', 'torch', 'pynvml'):\n"
        "    sys.modules[name] = None\n"
        "import jupyter_trainfactory.train as trainfactory\n"
        "import jupyter_trainfactory.telemetry.flops, jupyter_trainfactory.telemetry.stats\n"
        "trainfactory.log({'loss': 1.0})\n"
        "print(sorted(trainfactory.__all__))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "['data_wait', 'get_checkpoint', 'log', 'save_checkpoint', 'should_stop', 'step', 'watch']"
    )


class _NoServer:
    def get_run(self, run_id):
        raise ConnectionError("no tracking server in this test")


def _ddp_ranks(rec, sleeps, stop_after_s, check_every=1):
    """Two ranks in lock-step (a barrier as the allreduce of each step, another as the
    report barrier), telemetry shipped to ``rec`` every 50 ms; a stop is requested after
    ``stop_after_s``. Returns ``{rank: step where should_stop() was True}``."""
    import random
    import threading

    workers = {r: session.WorkerTelemetry(None, rank=r, world_size=len(sleeps)) for r in range(2)}
    for w in workers.values():
        w._send = lambda rank, batch: workers[rank].hear(rec.worker_batch(rank, batch))
    allreduce, report = threading.Barrier(2, timeout=10), threading.Barrier(2, timeout=10)
    stopped, done = {}, threading.Event()

    def rank_loop(r):
        worker, i = workers[r], 0
        while True:
            i += 1
            time.sleep(sleeps[r] * random.uniform(0.5, 1.5))
            allreduce.wait()  # DDP's gradient allreduce: every rank or none
            worker.log({"loss": 1.0 / i}, step=i)
            if i % check_every == 0 and worker.check(wait_s=10):
                stopped[r] = i
                report.wait()  # save_checkpoint: ray.train.report is a barrier
                return

    def ship():
        while not done.wait(0.05):
            for w in workers.values():
                w.flush()

    threads = [threading.Thread(target=rank_loop, args=(r,)) for r in workers]
    shipper = threading.Thread(target=ship)
    for t in (*threads, shipper):
        t.start()
    time.sleep(stop_after_s)
    rec.request_stop("user")
    for t in threads:
        t.join(timeout=20)
    done.set()
    shipper.join()
    for w in workers.values():  # the last stop points reach the recorder
        w.flush()
    return stopped


@pytest.mark.timeout(120)
@pytest.mark.parametrize("check_every", [1, 5])
def test_every_rank_stops_at_the_same_step_whatever_their_speeds(check_every):
    import random

    from ray_backend.recorder import RunRecorder

    for _ in range(10):  # a stop at a random moment, 10 times
        rec = RunRecorder("http://unused", "run", flush_interval_s=3600)
        rec.delivery.client = _NoServer()
        rec.set_state("RUNNING")
        stopped = _ddp_ranks(rec, [0.002, 0.006], random.uniform(0.05, 0.4), check_every)
        assert set(stopped) == {0, 1}, "a rank deadlocked (a barrier timed out)"
        assert stopped[0] == stopped[1] and stopped[0] % check_every == 0
        assert rec.stop_status()["at"] == stopped[0] // check_every


def test_a_rank_that_does_not_reach_the_stop_point_is_named():
    from ray_backend.recorder import RunRecorder

    rec = RunRecorder("http://unused", "run", flush_interval_s=3600)
    rec.delivery.client = _NoServer()
    rec.set_state("RUNNING")
    for t in (1.0, 2.0):  # two steps (plain reports) before the stop
        rec.report([{"loss": 1.0}, {}], None, rec.attempts.attempts[0]["start"] + t)
    rec.request_stop("user")
    for rank, checks in ((0, 12), (1, 11)):  # rank 1 is one stop point behind
        points = [["loss", 1.0, checks, time.time()]]
        reply = rec.worker_batch(
            rank, {"points": points, "checks": checks, "stop": {"checks": checks, "world_size": 2}}
        )
    assert reply == {"stop": True, "at": 13}
    rec.worker_batch(0, {"checks": 13})  # rank 0 reached it; rank 1 hangs at step 11
    now = rec.attempts.attempts[0]["start"] + 5  # after the two steps
    rec.check_stop_wait(now)  # starts the clock
    rec.check_stop_wait(now + 10)
    assert "waiting" not in rec.stop_status()
    rec.check_stop_wait(now + 31)  # at least 30 s
    assert rec.stop_status()["waiting"] == "stopping: waiting for rank 1 at step 11"
    assert rec.delivery.tags["trainfactory.reason"] == "stopping: waiting for rank 1 at step 11"
    badput = rec.goodput(now + 40).badput_s  # booked to its own category, not "other"
    assert badput["stop_wait"] == pytest.approx(40, abs=1)
    assert badput["other"] == pytest.approx(3, abs=0.5)  # last step to the wait


def test_a_key_from_log_and_save_checkpoint_is_written_once_per_step(tmp_path):
    from mlflow import MlflowClient

    from ray_backend.recorder import RunRecorder

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(exp).info.run_id
    rec = RunRecorder(uri, run_id, flush_interval_s=3600)
    rec.set_state("RUNNING")
    # trainfactory.log's point at step 10 arrives first, then save_checkpoint's report
    rec.worker_batch(0, {"points": [["loss", 0.5, 10, 1_000.0]]})
    rec.report([{"loss": 0.5, "step": 10}, {"step": 10}], "/ckpt/10", 1_000.2)
    # the report first, then the logged point (dropped: first write wins)
    rec.report([{"loss": 0.25, "step": 20}, {"step": 20}], "/ckpt/20", 1_001.0)
    rec.worker_batch(0, {"points": [["loss", 0.25, 20, 1_001.1]]})
    # a late batch with the steps before a checkpoint: written, none lost, none twice
    late = [["loss", 0.25, s, 1_000.5 + s / 100] for s in range(15, 21)]
    rec.worker_batch(0, {"points": late})
    # step 10 again: not written twice; step 2, never written, arrives last: written
    rec.worker_batch(0, {"points": [["loss", 0.5, 10, 1_002.0], ["loss", 0.1, 2, 1_002.0]]})
    rec.flush()
    loss = sorted((m.step, m.value) for m in client.get_metric_history(run_id, "loss"))
    assert loss == [(2, 0.1), (10, 0.5), *[(s, 0.25) for s in range(15, 21)]]
    models = client.search_logged_models([exp], filter_string=f"source_run_id = '{run_id}'")
    assert sorted((x.step, x.value) for m in models for x in m.metrics) == [(10, 0.5), (20, 0.25)]


@pytest.mark.timeout(120)
def test_fsdp2_collectives_are_timed_and_the_unsharded_model_counted():
    """Two gloo ranks (tests/fsdp2_ranks.py, fresh processes: a fork would inherit this
    process's gloo and OpenMP threads) train an FSDP2 model 2 steps under the timing."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from jupyter_trainfactory.services import _free_port

    script = Path(__file__).parents[1] / "fsdp2_ranks.py"
    port = str(_free_port())
    ranks = [
        subprocess.Popen([sys.executable, str(script), str(r), port], stdout=subprocess.PIPE)
        for r in (0, 1)
    ]
    outs = [p.communicate(timeout=100)[0] for p in ranks]
    assert [p.returncode for p in ranks] == [0, 0]
    for out in outs:
        got = json.loads(out.decode().strip().splitlines()[-1])
        assert got["n_params"] == 16 * 32 + 32 + 32 * 4 + 4  # the unsharded model, each rank
        counters = got["counters"]
        assert counters["all_gather_s"] > 0 and counters["reduce_scatter_s"] > 0
        assert counters["comm_s"] == pytest.approx(
            counters["all_gather_s"] + counters["reduce_scatter_s"]
        )
        assert got["undone"]


@pytest.mark.parametrize(("answer", "holds"), [(True, False), (None, False), (False, True)])
def test_a_checkpoint_waits_for_the_recorder_and_is_held_when_the_record_closed(
    monkeypatch, capsys, answer, holds
):
    # a checkpoint Ray keeps is what a resume restores: the steps before it must be in the
    # run. A closed record (stop --now) or a dead recorder: the worker never reports it
    class Worker:
        waited = None

        def confirm(self, timeout):
            self.waited = timeout
            return answer

    class Ended(Exception):
        pass

    def sleep(seconds):
        raise Ended  # the job's end, as the driver's exit brings it

    monkeypatch.setattr(session.time, "sleep", sleep)
    worker = Worker()
    if holds:
        with pytest.raises(Ended):
            session._hold_unless_recorded(worker)
        assert "this checkpoint is not reported" in capsys.readouterr().out
    else:
        session._hold_unless_recorded(worker)
        said = capsys.readouterr().out
        assert ("not confirmed in MLflow" in said) == (answer is None)
    assert worker.waited == session.CONFIRM_WAIT_S


def test_the_first_forward_batch_or_step_says_when_training_started(telemetry):
    import torch

    worker, sent = telemetry
    model = session.watch(torch.nn.Linear(2, 1))
    t0 = time.time()
    model(torch.zeros(1, 2))
    model(torch.zeros(1, 2))  # once: the hook removed itself
    worker.add_step(0.1, 4, None)  # later work changes nothing
    worker.flush()
    (rank, batch), *_ = sent
    assert t0 <= batch["started"]["time"] <= time.time()
    assert not model._forward_pre_hooks
    worker.add_data_wait(0.2)
    worker.flush()
    assert all("started" not in b for _, b in sent[1:])
