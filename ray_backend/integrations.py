"""Lightning and Hugging Face loops measured as they are written.

A loop written for Ray Train's integrations ends in ``ray.train.lightning.prepare_trainer``
or ``ray.train.huggingface.transformers.prepare_trainer``; in a trainfactory job both are
wrapped to add one callback to the trainer they prepare. The callback times each training
step and counts its samples (``WorkerTelemetry.add_step``: throughput, MFU, the step time
split) and watches the model (``session.watch``: the parameter count, and for Lightning's
DDP-wrapped module the allreduce timing). Nothing else of the loop changes: its
``RayTrainReportCallback`` reports and checkpoints as under plain Ray Train.

Neither package is imported to do this (Lightning takes seconds to import): the wrap is
made when the user's loop imports the Ray module (:func:`.import_hooks.when_imported`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ray_backend.import_hooks import when_imported

__all__ = ["batch_samples", "install"]

LIGHTNING = "ray.train.lightning"
TRANSFORMERS = "ray.train.huggingface.transformers"


def batch_samples(batch: Any) -> int | None:
    """The samples in a batch: the first dimension of its first tensor (a tensor, or one
    in a tuple, list or dict, as DataLoaders give them); None when there is none."""
    if hasattr(batch, "shape") and len(batch.shape) > 0:
        return int(batch.shape[0])
    items = batch.values() if isinstance(batch, dict) else batch
    if isinstance(items, (tuple, list)) or isinstance(batch, dict):
        for item in items:
            found = batch_samples(item)
            if found is not None:
                return found
    return None


def _lightning_callback(worker: Any, watch: Callable[[Any], Any]) -> Any:
    try:
        import lightning.pytorch as pl
    except ImportError:  # the older package name, as Ray Train accepts it
        import pytorch_lightning as pl

    class TrainfactorySteps(pl.Callback):
        """Times each training batch and watches the (DDP-wrapped) module."""

        def on_train_start(self, trainer, pl_module):
            watch(getattr(trainer.strategy, "model", None) or pl_module)

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            self._started = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            worker.add_step(time.perf_counter() - self._started, batch_samples(batch), None)

    return TrainfactorySteps()


def _transformers_callback(worker: Any, watch: Callable[[Any], Any]) -> Any:
    from transformers import TrainerCallback

    class TrainfactorySteps(TrainerCallback):
        """Times each optimizer step; its samples are the per-device batch size times the
        gradient accumulation steps (``TrainingArguments``)."""

        def on_train_begin(self, args, state, control, model=None, **kwargs):
            if model is not None:
                watch(model)

        def on_step_begin(self, args, state, control, **kwargs):
            self._started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            samples = args.per_device_train_batch_size * args.gradient_accumulation_steps
            worker.add_step(time.perf_counter() - self._started, samples, None)

    return TrainfactorySteps()


def _wrap(module: Any, worker: Any, watch: Callable[[Any], Any]) -> tuple[Any, str, Any]:
    """Wrap ``module.prepare_trainer`` to add the callback; returns what undoes it."""
    original = module.prepare_trainer
    lightning = module.__name__ == LIGHTNING

    def prepare_trainer(trainer, *args, **kwargs):
        if lightning:
            trainer.callbacks.append(_lightning_callback(worker, watch))
        else:
            trainer.add_callback(_transformers_callback(worker, watch))
        return original(trainer, *args, **kwargs)

    prepare_trainer.__wrapped__ = original
    module.prepare_trainer = prepare_trainer
    return module, "prepare_trainer", original


def install(worker: Any, watch: Callable[[Any], Any]) -> Callable[[], None]:
    """Wrap the integrations' ``prepare_trainer`` for ``worker`` (a ``WorkerTelemetry``)
    now if imported, else when imported; returns the undo."""
    undone: list[tuple[Any, str, Any]] = []

    def hook(module: Any) -> None:
        if hasattr(module, "prepare_trainer"):
            undone.append(_wrap(module, worker, watch))

    unhook = when_imported((LIGHTNING, TRANSFORMERS), hook)

    def undo() -> None:
        unhook()
        for module, name, value in undone:
            setattr(module, name, value)

    return undo
