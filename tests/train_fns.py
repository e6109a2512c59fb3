"""Training functions used by the tests (shipped by value to the cluster).

``ray.train`` is imported at the top on purpose, as most training files do: importing
Ray before the embedded services exist must not break authentication.
"""

import time

import ray.train


def short_loop(config):
    """Reports ``config["steps"]`` times, with ``samples`` and a metric per report."""

    for i in range(config["steps"]):
        time.sleep(config.get("sleep", 0.05))
        ray.train.report({"loss": 1.0 / (i + 1), "samples": 8, "lr": config.get("lr", 0.1)})


def config_loop(config):
    """Rank 0 saves the config it got, pickled, to ``config["out"]``; reports once."""
    import pickle

    if ray.train.get_context().get_world_rank() == 0:
        with open(config["out"], "wb") as f:
            pickle.dump(config, f)
    ray.train.report({"loss": 1.0, "samples": 1})


def long_loop(config):
    """Reports forever (until stopped or killed)."""

    i = 0
    while True:
        time.sleep(0.2)
        i += 1
        ray.train.report({"loss": 1.0 / i, "samples": 4})


def failing_loop(config):
    """Fails on its second report."""

    ray.train.report({"loss": 1.0})
    print("failing_loop: first report done", flush=True)
    raise ValueError("bad batch at step 2")


def telemetry_loop(config):
    """A small DDP model trained with ``trainfactory.step``/``log``/``data_wait`` and checkpoints.

    Logs ``loss`` every step (and ``bad`` as NaN at step ``config["nan_step"]`` when given),
    reports ``val`` with a checkpoint every ``config["report_every"]`` steps.
    """
    import os
    import tempfile

    import torch

    import jupyter_trainfactory.train as trainfactory

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = ray.train.torch.prepare_model(torch.nn.Linear(32, 1))
    trainfactory.watch(model, layers=1, heads=2, head_dim=4, seq_len=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, seq = 16, 8
    for i in range(1, config["steps"] + 1):
        with trainfactory.data_wait():
            time.sleep(config.get("data_sleep", 0.002))
            x, y = torch.randn(batch, 32), torch.randn(batch, 1)
        with trainfactory.step(samples=batch, tokens=batch * seq):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            time.sleep(config.get("sleep", 0.01))
        metrics = {"loss": loss.item()}
        if i == config.get("nan_step"):
            metrics["bad"] = float("nan")
        trainfactory.log(metrics, step=i)
        if i % config.get("report_every", 10**9) == 0:
            with tempfile.TemporaryDirectory() as tmp:
                checkpoint = None
                if ray.train.get_context().get_world_rank() == 0:
                    torch.save(model.state_dict(), os.path.join(tmp, "model.pt"))
                    with open(os.path.join(tmp, "pad.bin"), "wb") as f:
                        f.write(os.urandom(config.get("ckpt_bytes", 1 << 20)))
                    checkpoint = ray.train.Checkpoint.from_directory(tmp)
                ray.train.report({"val": float(i), "step": i}, checkpoint=checkpoint)


def fault_loop(config):
    """Steps 1..``steps`` with a checkpoint every ``every`` steps, resuming from the newest
    checkpoint that verifies (``trainfactory.get_checkpoint``); rank 1 dies (``os._exit``) at
    ``fail_step`` on the first attempt only (a marker file says it already did), first
    truncating the newest checkpoint's file when ``config["corrupt"]``. Logs
    ``resumed_at`` (the step restored from) once per attempt."""
    import json
    import os
    import tempfile

    import jupyter_trainfactory.train as trainfactory

    rank = ray.train.get_context().get_world_rank()
    start = 0
    checkpoint = trainfactory.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["step"]
    trainfactory.log({"resumed_at": start}, step=start + 1)
    for i in range(start + 1, config["steps"] + 1):
        with trainfactory.step(samples=8):
            time.sleep(config.get("sleep", 0.05))
        trainfactory.log({"loss": 1.0 / i}, step=i)
        if rank == 1 and i == config["fail_step"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            if config.get("corrupt"):
                newest = ray.train.get_all_reported_checkpoints()[-1].checkpoint
                with open(os.path.join(newest.path, "state.json"), "r+") as f:
                    f.truncate(3)
            os._exit(1)
        if i % config["every"] == 0:
            with tempfile.TemporaryDirectory() as tmp:
                directory = None
                if rank == 0:
                    with open(os.path.join(tmp, "state.json"), "w") as f:
                        json.dump({"step": i, "pad": "x" * 100}, f)
                    directory = tmp
                trainfactory.save_checkpoint({"step": i}, directory)


def stoppable_loop(config):
    """Steps forever (0.05 s each), a checkpoint every ``every`` steps; with ``obey`` it
    checks ``trainfactory.should_stop()`` every step and then saves and returns."""
    import json
    import os
    import tempfile

    import jupyter_trainfactory.train as trainfactory

    rank = ray.train.get_context().get_world_rank()
    i = 0
    while True:
        i += 1
        with trainfactory.step(samples=4):
            time.sleep(0.05)
        trainfactory.log({"loss": 1.0 / i}, step=i)
        stop = config.get("obey") and trainfactory.should_stop()
        if stop or i % config["every"] == 0:
            with tempfile.TemporaryDirectory() as tmp:
                directory = None
                if rank == 0:
                    with open(os.path.join(tmp, "state.json"), "w") as f:
                        json.dump({"step": i}, f)
                    directory = tmp
                trainfactory.save_checkpoint({"step": i}, directory)
        if stop:
            return


def hanging_loop(config):
    """Steps (``config["steps"]``, default endless) with a checkpoint every ``every``
    steps, resumed from the newest good one; at ``hang_step`` rank 1 sleeps for good (a
    hung worker: its process lives, training makes no progress), on the first attempt
    only when a ``marker`` file path is given. With ``obey``, every step checks
    ``trainfactory.should_stop()`` and then saves and returns."""
    import os
    import tempfile

    import jupyter_trainfactory.train as trainfactory

    rank = ray.train.get_context().get_world_rank()
    checkpoint = trainfactory.get_checkpoint()
    start = 0
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "step")) as f:
            start = int(f.read())
    for i in range(start + 1, config.get("steps", 10**6) + 1):
        with trainfactory.step(samples=4):
            time.sleep(0.05)
        trainfactory.log({"loss": 1.0 / i}, step=i)
        marker = config.get("marker")
        if rank == 1 and i == config["hang_step"] and not (marker and os.path.exists(marker)):
            if marker:
                open(marker, "w").close()
            time.sleep(10**6)
        stop = config.get("obey") and trainfactory.should_stop()
        if stop or i % config["every"] == 0:
            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, "step"), "w") as f:
                    f.write(str(i))
                trainfactory.save_checkpoint({"step": i}, tmp if rank == 0 else None)
        if stop:
            return


class DigitsNet:
    """Built lazily (torch is imported inside): a 64-128-10 MLP for the digits data."""

    @staticmethod
    def build():
        from torch import nn

        return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def digits_loop(config):
    """Trains DigitsNet on scikit-learn's digits with DDP; a checkpoint (``state.pt``:
    the model's state dict) and ``val_accuracy`` every epoch."""
    import tempfile

    import ray.train.torch
    import torch
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)
    train = TensorDataset(torch.tensor(x_train, dtype=torch.float32), torch.tensor(y_train))
    x_val, y_val = torch.tensor(x_val, dtype=torch.float32), torch.tensor(y_val)
    loader = ray.train.torch.prepare_data_loader(DataLoader(train, batch_size=64, shuffle=True))
    model = ray.train.torch.prepare_model(DigitsNet.build())
    inner = model.module if hasattr(model, "module") else model
    optimizer = torch.optim.Adam(model.parameters(), lr=0.005)
    rank = ray.train.get_context().get_world_rank()
    for epoch in range(config["epochs"]):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
        with torch.no_grad():
            accuracy = (inner(x_val).argmax(dim=1) == y_val).float().mean().item()
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                torch.save(inner.state_dict(), f"{d}/state.pt")
                ckpt = ray.train.Checkpoint.from_directory(d)
            ray.train.report({"step": epoch + 1, "val_accuracy": accuracy}, checkpoint=ckpt)


def build_digits_model(checkpoint_dir):
    """``model_fn``: DigitsNet with the weights of a ``digits_loop`` checkpoint."""
    import torch

    model = DigitsNet.build()
    model.load_state_dict(torch.load(f"{checkpoint_dir}/state.pt"))
    return model.eval()


def uneven_ddp_loop(config):
    """A DDP model over gloo, rank 1 ``slow`` s slower per step than rank 0; checks
    ``trainfactory.should_stop()`` every ``check_every`` steps, then logs ``stopped_at``
    on every rank (``rank<r>/stopped_at``), saves and returns. ``loss`` (= the step) goes
    to ``trainfactory.log`` every step and to ``save_checkpoint`` with each checkpoint
    (every ``every`` steps and at the end, ``steps``); resumes from the newest one.
    ``check_every`` may be a list: submission n (counted in the checkpoint) uses item
    ``n % len``, so a chain of resumes alternates between them."""
    import json
    import os
    import tempfile

    import ray.train.torch
    import torch

    import jupyter_trainfactory.train as trainfactory

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    model = ray.train.torch.prepare_model(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start, starts = 0, 0
    checkpoint = trainfactory.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            state = json.load(f)
        start, starts = state["step"], state.get("starts", 0) + 1
    every_k = config.get("check_every", 1)
    every_k = every_k[starts % len(every_k)] if isinstance(every_k, list) else every_k
    for i in range(start + 1, config["steps"] + 1):
        with trainfactory.step(samples=8):
            time.sleep(config.get("sleep", 0.02) + (config.get("slow", 0.02) if rank else 0))
            loss = torch.nn.functional.mse_loss(model(torch.randn(8, 8)), torch.randn(8, 1))
            opt.zero_grad()
            loss.backward()  # the gradient allreduce: every rank or none
            opt.step()
        trainfactory.log({"loss": float(i)}, step=i)
        stop = i % every_k == 0 and trainfactory.should_stop()
        if stop:
            trainfactory.log({"stopped_at": i}, step=i, rank_zero_only=False)
        if stop or i % config["every"] == 0 or i == config["steps"]:
            with tempfile.TemporaryDirectory() as tmp:
                directory = None
                if rank == 0:
                    with open(os.path.join(tmp, "state.json"), "w") as f:
                        json.dump({"step": i, "starts": starts}, f)
                    directory = tmp
                trainfactory.save_checkpoint({"step": i, "loss": float(i)}, directory)
        if stop:
            return


def epoch_loop(config):
    """Plain Ray Train: one report per epoch without a ``step`` key (``{"epoch": e}``),
    a checkpoint every 5 epochs, resumed from ``ray.train.get_checkpoint()``; rank 1
    exits at ``fail_epoch`` on the first attempt (a ``marker`` file says it did)."""
    import json
    import os
    import tempfile

    rank = ray.train.get_context().get_world_rank()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.json")) as f:
            start = json.load(f)["epoch"]
    for epoch in range(start + 1, config["epochs"] + 1):
        time.sleep(0.1)
        if rank == 1 and epoch == config["fail_epoch"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os._exit(1)
        with tempfile.TemporaryDirectory() as tmp:
            ckpt = None
            if epoch % 5 == 0 and rank == 0:
                with open(os.path.join(tmp, "state.json"), "w") as f:
                    json.dump({"epoch": epoch}, f)
                ckpt = ray.train.Checkpoint.from_directory(tmp)
            ray.train.report({"epoch": float(epoch)}, checkpoint=ckpt)


def sweep_loop(config):
    """A sweep's trial: ``val_loss = 10 * lr + 1 / (step + 1)`` at each of ``steps``
    reports (so a larger ``lr`` is worse at every rung), each with a small checkpoint
    when ``config["checkpoint"]``; goes on after the step of the newest checkpoint."""
    import os
    import tempfile

    import jupyter_trainfactory.train as trainfactory

    start = 0
    checkpoint = trainfactory.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as d, open(os.path.join(d, "state.txt")) as f:
            start = int(f.read()) + 1
    for step in range(start, config.get("steps", 6)):
        time.sleep(config.get("sleep", 0.3))
        metrics = {"val_loss": 10 * config["lr"] + 1.0 / (step + 1), "step": step, "start": start}
        if not config.get("checkpoint"):
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "state.txt"), "w") as f:
                f.write(str(step))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def linear_model(checkpoint_dir):
    """``model_fn`` for ``sweep_loop``'s checkpoints (they hold a step, no weights)."""
    import torch

    return torch.nn.Linear(1, 1).eval()
