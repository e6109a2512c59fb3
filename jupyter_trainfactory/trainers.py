"""An existing ``ray.train.torch.TorchTrainer`` as a job: its loop, config, scaling,
failure and checkpoint settings and datasets become the job's, options given override.

Imports no Ray at import time (a value is recognised by its class's module and name).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .spec_values import SpecError, dataset_config_text

__all__ = ["TrainerParts", "is_torch_trainer", "merge_options", "trainer_parts"]

#: Placement strategies of Ray's ScalingConfig -> ``--placement`` (``spec.PLACEMENTS``).
_PLACEMENTS = {
    "PACK": "pack",
    "SPREAD": "spread",
    "STRICT_PACK": "strict-pack",
    "STRICT_SPREAD": "strict-spread",
}


@dataclass
class TrainerParts:
    """What a job takes from a TorchTrainer.

    Attributes
    ----------
    fn : callable
        ``train_loop_per_worker``.
    options : dict
        JobSpec field values (``workers``, ``cpus_per_worker``, ``gpus_per_worker``,
        ``resources``, ``placement``, ``max_failures``, ``max_preemptions``,
        ``keep_checkpoints``, ``keep_best``, ``config``, ``dataset_config``); a setting
        the trainer leaves at Ray's default that this tool cannot express (keep every
        checkpoint) is left out, so the tool's default applies.
    datasets : dict
        The trainer's ``datasets`` (name -> Dataset or function), as given.
    """

    fn: Any
    options: dict[str, Any] = field(default_factory=dict)
    datasets: dict[str, Any] = field(default_factory=dict)


def is_torch_trainer(value: Any) -> bool:
    """Whether ``value`` is a ``ray.train.torch.TorchTrainer`` (Ray Train V2's or V1's)."""
    return any(
        c.__name__ == "TorchTrainer" and c.__module__.startswith("ray.train")
        for c in type(value).__mro__
    )


def _trainer_fields(trainer: Any) -> dict[str, Any]:
    """The trainer's settings, read from its attributes. Checked on Ray 2.60.0 (Ray Train
    V2, ``ray/train/v2/api/data_parallel_trainer.py``): ``train_loop_per_worker``,
    ``train_loop_config``, ``scaling_config``, ``run_config``, ``datasets`` and
    ``data_config`` are plain attributes set by ``__init__``, though not documented;
    ``DataConfig`` keeps ``datasets_to_split`` only as the private ``_datasets_to_split``."""
    data_config = getattr(trainer, "data_config", None)
    return {
        "fn": trainer.train_loop_per_worker,
        "config": getattr(trainer, "train_loop_config", None),
        "scaling": getattr(trainer, "scaling_config", None),
        "run": getattr(trainer, "run_config", None),
        "datasets": getattr(trainer, "datasets", None) or {},
        "split": getattr(data_config, "_datasets_to_split", "all"),
    }


def trainer_parts(trainer: Any, name: str = "") -> TrainerParts:
    """The job's function, options and datasets taken from ``trainer`` (``name``: what
    the user called it, for the message).

    Raises SpecError (one sentence) when ``trainer`` is no TorchTrainer or its settings
    cannot be read."""
    if not is_torch_trainer(trainer):
        what = f"{name!r} is a" if name else "The job's target is a"
        raise SpecError(
            f"{what} {type(trainer).__name__}, not a function or a ray.train.torch.TorchTrainer."
        )
    try:
        got = _trainer_fields(trainer)
    except AttributeError as exc:
        raise SpecError(f"Cannot read this TorchTrainer's settings ({exc}).") from None
    options: dict[str, Any] = {"config": dict(got["config"] or {})}
    scaling = got["scaling"]
    if scaling is not None:
        options.update(_scaling_options(scaling))
    run = got["run"]
    failure = getattr(run, "failure_config", None)
    if failure is not None:
        options["max_failures"] = int(failure.max_failures)
        preemptions = getattr(failure, "max_preemption_failures", None)
        if preemptions is not None:
            options["max_preemptions"] = int(preemptions)
    checkpoint = getattr(run, "checkpoint_config", None)
    if checkpoint is not None:
        if checkpoint.num_to_keep is not None:  # None (keep all): the tool's default
            options["keep_checkpoints"] = int(checkpoint.num_to_keep)
        if checkpoint.checkpoint_score_attribute:
            order = checkpoint.checkpoint_score_order or "max"
            options["keep_best"] = f"{checkpoint.checkpoint_score_attribute}:{order}"
    split = got["split"]
    if split != "all" and got["datasets"]:
        options["dataset_config"] = dataset_config_text(list(split))
    return TrainerParts(got["fn"], options, dict(got["datasets"]))


def _scaling_options(scaling: Any) -> dict[str, Any]:
    """``ScalingConfig`` -> ``workers``, per-worker CPUs/GPUs/custom resources, placement."""
    options: dict[str, Any] = {"workers": int(scaling.num_workers or 1)}
    resources = dict(scaling.resources_per_worker or {})
    use_gpu = bool(scaling.use_gpu)
    gpus = float(resources.pop("GPU", 1.0 if use_gpu else 0.0))
    cpus = float(resources.pop("CPU", 0.0 if use_gpu else 1.0))
    options["cpus_per_worker"] = cpus
    options["gpus_per_worker"] = gpus if use_gpu or gpus else 0.0
    if resources:
        options["resources"] = {k: float(v) for k, v in resources.items()}
    placement = _PLACEMENTS.get(str(getattr(scaling, "placement_strategy", "PACK")))
    if placement:
        options["placement"] = placement
    return options


def merge_options(
    trainer: dict[str, Any], values: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, Any]:
    """The job's options: ``values`` (a door's, every option) where they differ from
    their ``defaults`` (an option left at its default cannot be told from one not
    given), else the ``trainer``'s, else the default."""
    merged = dict(values)
    for name, value in trainer.items():
        if name not in values or values[name] == defaults.get(name):
            merged[name] = value
    return merged
