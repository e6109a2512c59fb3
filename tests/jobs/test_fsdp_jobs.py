"""A real job of a model sharded with PyTorch's FSDP2 (``fully_shard``), on gloo and CPU
(issue 21, part 3): its all-gathers and reduce-scatters are timed per step, its
communication share recorded, and its parameter count is the unsharded model's."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from jupyter_trainfactory import launch
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the cluster cannot import tests/
pytestmark = pytest.mark.job

WIDTH, STEPS = 64, 12
N_PARAMS = 2 * (WIDTH * 4 * WIDTH) + 4 * WIDTH + WIDTH  # two Linear layers, with biases


def fsdp2_loop(config):
    """An MLP sharded layer by layer and at the root, as PyTorch's FSDP2 tutorial does;
    ``trainfactory.step`` times each step and ``ray.train.report`` ends the run."""
    import time

    import ray.train
    import torch
    from torch.distributed.fsdp import fully_shard

    import jupyter_trainfactory.train as trainfactory

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.ReLU(), torch.nn.Linear(4 * WIDTH, WIDTH)
    )
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(1, config["steps"] + 1):
        with trainfactory.step(samples=16, tokens=16):
            loss = model(torch.randn(16, WIDTH)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        trainfactory.log({"loss": loss.item()}, step=step)
        time.sleep(0.2)  # a few telemetry windows in all
    ray.train.report({"loss": loss.item(), "step": config["steps"]})


@pytest.mark.timeout(300)
def test_an_fsdp2_loop_has_its_collectives_timed(manager, mlflow_client):
    job = launch(fsdp2_loop, workers=2, config={"steps": STEPS}, experiment="tests")
    assert job.wait(timeout=240) == "SUCCEEDED", job.logs(tail=60)
    run = mlflow_client.get_run(job.run_id)
    metrics = run.data.metrics
    assert run.data.tags[TAG.N_PARAMS] == str(N_PARAMS)  # not one rank's half
    for key in ("train/all_gather_s", "train/reduce_scatter_s", "train/comm_s"):
        assert metrics[key] > 0, sorted(metrics)
    assert metrics["train/comm_s"] >= metrics["train/all_gather_s"]
    assert 0 < metrics["train/comm_fraction"] < 1
    loss = mlflow_client.get_metric_history(job.run_id, "loss")
    assert sorted(m.step for m in loss) == list(range(1, STEPS + 1))
