"""Submit a sweep: one detached Ray job whose driver runs Ray Tune over the job's
function (``ray_backend.sweep_driver``), its MLflow run the sweep's parent run."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from ..spec import JobSpec
from ..submission import JobKind
from ..tracking import TAG
from .space import SPACE_FILE, SweepSettings, domain_text, grid_size, parse_space

__all__ = ["SWEEP_DRIVER", "submit_sweep", "sweep_kind", "trials_that_fit"]

#: The sweep's entrypoint module (``python -m ray_backend.sweep_driver PAYLOAD``).
SWEEP_DRIVER = "ray_backend.sweep_driver"


def trials_that_fit(slots: dict[str, int], workers: int) -> int:
    """How many trials of ``workers`` workers the idle cluster holds at once:
    ``slots`` is workers of the trial's shape per node (``cluster.Placement.slots``)."""
    return sum(slots.values()) // max(workers, 1)


def sweep_kind(
    space: dict[str, Any], settings: SweepSettings, workers: int, notice: Callable[[str], None]
) -> JobKind:
    """The sweep's :class:`~.submission.JobKind`: the sweep driver, the search space as a
    payload file, the settings in ``job.json`` and on the parent run. Its ``check`` bounds
    ``--concurrent`` by the trials the cluster holds at once (``notice`` says so)."""
    settings.space_text = {name: domain_text(value) for name, value in space.items()}
    settings.grid_size = grid_size(space)
    meta = {"sweep": settings.to_dict()}
    tags = {TAG.SWEEP: json.dumps(settings.to_dict())}

    def check(placement) -> None:
        fit = trials_that_fit(placement.slots, workers)
        if 0 < fit < settings.concurrent:
            notice(
                f"--concurrent {settings.concurrent}: the cluster holds {fit} trial"
                f"{'s' if fit != 1 else ''} of {workers} worker{'s' if workers != 1 else ''}"
                f" at once, so {fit} run at a time."
            )
            settings.concurrent = fit
        meta["sweep"] = settings.to_dict()
        tags[TAG.SWEEP] = json.dumps(settings.to_dict())

    return JobKind(
        driver=SWEEP_DRIVER,
        meta=meta,
        files={SPACE_FILE: space},
        tags=tags,
        # a swept key's config value is no trial's: the parent says where its values came from
        params={
            **settings.params(),
            **{f"config.{name}": f"swept: {text}" for name, text in settings.space_text.items()},
        },
        check=check,
    )


def submit_sweep(
    manager,
    fn: Callable[[dict], Any],
    spec: JobSpec,
    params: dict[str, Any] | list[str],
    settings: SweepSettings,
    notice: Callable[[str], None] = print,
    model_fn: Callable[[str], Any] | None = None,
):
    """Check and submit the sweep of ``fn`` over ``params`` (text or Ray Tune domains) with
    ``spec``'s worker shape and options per trial; returns its :class:`~.job.Job` (the
    parent run's). Raises SpecError (one sentence, nothing submitted) for a bad search
    space or settings, or a trial the cluster can never hold. ``spec.budget`` is the
    whole sweep's: its driver stops every trial at a checkpoint before it would pass.
    Each trial keeps its ``spec.keep_checkpoints`` best checkpoints by the sweep's metric
    unless ``spec.keep_best`` says otherwise. ``model_fn(checkpoint_dir) -> model`` is
    kept for ``register``."""
    settings.validate()
    if spec.keep_best is None:
        # each trial keeps its best checkpoints by the sweep's metric (and its newest, for a
        # resume): the newest two alone lost the peak that register is asked for
        spec.keep_best = f"{settings.metric}:{settings.mode}"
    space = parse_space(params)
    taken = set(space) & set(spec.config)
    if taken:
        notice(
            f"--param {', '.join(sorted(taken))} replace{'s' if len(taken) == 1 else ''} --config's value."
        )
    kind = sweep_kind(space, settings, spec.workers, notice)
    return manager.submit(fn, spec, model_fn=model_fn, kind=kind)
