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
    worker.stop_requested = True  # what the reader of the replies sets
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
