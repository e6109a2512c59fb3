"""Real jobs of loops written for Ray Train's integrations, launched unchanged (issue 21,
part 4): PyTorch Lightning with ``RayDDPStrategy``, ``RayLightningEnvironment`` and
``RayTrainReportCallback``, and a Hugging Face ``Trainer`` with
``ray.train.huggingface.transformers.RayTrainReportCallback`` and ``prepare_trainer`` (a
GPT-2 built from a small config: no hub download). Each is recorded with its steps, its
loss curve, throughput and a LoggedModel per checkpoint."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

from jupyter_trainfactory import launch
from jupyter_trainfactory.tracking import TAG

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the cluster cannot import tests/
pytestmark = pytest.mark.job


def lightning_loop(config):
    """A linear regression LightningModule, ``config["epochs"]`` epochs of 4 steps per rank
    (256 rows, batch 32, Lightning's distributed sampler); the callback reports and
    checkpoints once per epoch with ``step`` = the global step."""
    import lightning.pytorch as pl
    import ray.train.lightning as rtl
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    class Regression(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 1)

        def training_step(self, batch, _):
            x, y = batch
            loss = nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    torch.manual_seed(0)
    x = torch.randn(256, 8)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=32)
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        accelerator="cpu",
        devices="auto",
        strategy=rtl.RayDDPStrategy(),
        plugins=[rtl.RayLightningEnvironment()],
        callbacks=[rtl.RayTrainReportCallback()],
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    rtl.prepare_trainer(trainer).fit(Regression(), train_dataloaders=loader)


def transformers_loop(config):
    """A one-layer GPT-2 from a config (no download) on random tokens, ``config["steps"]``
    steps, logging every 2 and saving every ``config["save_steps"]``: the callback
    reports each save with its checkpoint and the logged metrics (``step`` included)."""
    import tempfile

    import ray.train.huggingface.transformers as rth
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    torch.manual_seed(0)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
    )

    class Tokens(torch.utils.data.Dataset):
        def __init__(self):
            self.ids = torch.randint(0, 64, (64, 16))

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.ids[i]}

    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(),
        max_steps=config["steps"],
        per_device_train_batch_size=4,
        logging_steps=2,
        save_strategy="steps",
        save_steps=config["save_steps"],
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    trainer.add_callback(rth.RayTrainReportCallback())
    rth.prepare_trainer(trainer).train()


def _checkpoint_steps(client, run):
    models = client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    return sorted(int(m.tags[TAG.CKPT_STEP]) for m in models)


def _assert_measured(client, run, steps, params=None):
    """The trainfactory callback timed every step: throughput and the model's size."""
    metrics = run.data.metrics
    assert metrics["train/samples_per_s"] > 0, sorted(metrics)
    samples = client.get_metric_history(run.info.run_id, "train/samples")
    assert max(m.step for m in samples) == steps
    if params is not None:
        assert run.data.tags[TAG.N_PARAMS] == str(params)


@pytest.mark.timeout(300)
def test_a_lightning_loop_is_recorded_with_its_steps_and_checkpoints(manager, mlflow_client):
    job = launch(lightning_loop, workers=2, config={"epochs": 3}, experiment="tests")
    state = job.wait(timeout=240)
    assert state == "SUCCEEDED", job.logs(tail=60)
    run = mlflow_client.get_run(job.run_id)
    loss = mlflow_client.get_metric_history(job.run_id, "train_loss")
    assert sorted(m.step for m in loss) == [4, 8, 12]  # Lightning's global step per epoch
    assert _checkpoint_steps(mlflow_client, run) == [4, 8, 12]
    assert run.data.tags[TAG.CKPT_STEP] == "12"
    _assert_measured(mlflow_client, run, steps=12, params=9)  # Linear(8, 1)


@pytest.mark.timeout(300)
def test_a_hugging_face_trainer_is_recorded_with_its_steps_and_checkpoints(manager, mlflow_client):
    job = launch(
        transformers_loop, workers=2, config={"steps": 8, "save_steps": 4}, experiment="tests"
    )
    state = job.wait(timeout=240)
    assert state == "SUCCEEDED", job.logs(tail=60)
    run = mlflow_client.get_run(job.run_id)
    loss = mlflow_client.get_metric_history(job.run_id, "loss")
    assert sorted(m.step for m in loss) == [4, 8]  # the logged loss, at each save
    assert _checkpoint_steps(mlflow_client, run) == [4, 8]
    assert run.data.tags[TAG.CKPT_STEP] == "8"
    _assert_measured(mlflow_client, run, steps=8)
