"""A job's checkpoints as MLflow models: list them, register one, delete the surplus (gc).

Every checkpoint a job reports becomes a LoggedModel of type ``checkpoint`` (written by
the job's recorder) that holds its step, storage path and the metrics reported with it.
``register`` turns one into a Model Registry version: the user's ``model_fn`` rebuilds
the model from the checkpoint directory and MLflow stores it as a loadable model.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .spec import SpecError
from .tracking import TAG

__all__ = ["CheckpointModel", "checkpoint_models", "collect_garbage", "pick", "register"]

_ALIAS = r"^[A-Za-z_][A-Za-z0-9_-]*$"


@dataclass
class CheckpointModel:
    """One reported checkpoint of a job.

    ``step`` is the step it was reported at, ``path`` its storage URI or local path,
    ``metrics`` what was reported with it, ``exists`` whether storage still holds it
    (Ray Train's retention or ``gc`` may have deleted it), ``registered`` the
    ``NAME/VERSION`` it was registered as ("" when not), ``deleted`` when or by what it
    was deleted ("" when not known to be)."""

    model_id: str
    step: int
    path: str
    time: float
    metrics: dict[str, float] = field(default_factory=dict)
    exists: bool = True
    registered: str = ""
    deleted: str = ""


def _filesystem(path: str):
    """(pyarrow filesystem, path in it) for a local path or a storage URI."""
    import pyarrow.fs

    if "://" not in path:
        return pyarrow.fs.LocalFileSystem(), str(Path(path).expanduser().resolve())
    return pyarrow.fs.FileSystem.from_uri(path)


def _exists(path: str) -> bool:
    import pyarrow.fs

    try:
        fs, inner = _filesystem(path)
        return fs.get_file_info(inner).type != pyarrow.fs.FileType.NotFound
    except Exception:  # an unreachable store: not known to exist
        return False


def _size(path: str) -> int:
    """Bytes under ``path`` (0 when it is gone)."""
    import pyarrow.fs

    fs, inner = _filesystem(path)
    infos = fs.get_file_info(pyarrow.fs.FileSelector(inner, recursive=True, allow_not_found=True))
    return sum(i.size or 0 for i in infos if i.type == pyarrow.fs.FileType.File)


def checkpoint_models(mlflow_client, run) -> list[CheckpointModel]:
    """The job's checkpoints from its run's LoggedModels, oldest step first."""
    models = mlflow_client.search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    out = []
    for m in models:
        if m.model_type != "checkpoint" or TAG.CKPT_PATH not in m.tags:
            continue
        deleted = bool(m.tags.get(TAG.DELETED))
        out.append(
            CheckpointModel(
                model_id=m.model_id,
                step=int(m.tags.get(TAG.CKPT_STEP, 0)),
                path=m.tags[TAG.CKPT_PATH],
                time=float(m.tags.get(TAG.CKPT_TIME, 0)),
                metrics={x.key: x.value for x in (m.metrics or [])},
                exists=not deleted and _exists(m.tags[TAG.CKPT_PATH]),
                registered=m.tags.get(TAG.REGISTERED, ""),
                deleted=m.tags.get(TAG.DELETED, ""),
            )
        )
    return sorted(out, key=lambda c: (c.step, c.time))


def pick(
    checkpoints: list[CheckpointModel],
    which: str = "latest",
    metric: str | None = None,
    mode: str | None = None,
) -> CheckpointModel:
    """The ``latest`` checkpoint storage still holds, or the ``best`` by ``metric``
    (``mode`` ``max`` or ``min``: which way is better, never guessed) among those
    reported with that metric.

    Raises SpecError when there is none to pick or the arguments do not fit."""
    if which not in ("latest", "best"):
        raise SpecError(f"--checkpoint takes latest or best, got {which!r}.")
    if which == "latest" and (metric or mode):
        raise SpecError("--metric and --mode rank checkpoints: use them with --checkpoint best.")
    if which == "best" and not metric:
        raise SpecError("--checkpoint best needs --metric NAME and --mode max or min.")
    if which == "best" and mode not in ("max", "min"):
        raise SpecError(
            f"--checkpoint best needs --mode max or min (is a higher {metric} better?)."
        )
    kept = [c for c in checkpoints if c.exists]
    if not kept:
        gone = "all were deleted" if checkpoints else "none was reported with ray.train.report"
        raise SpecError(f"The job has no checkpoint in storage to register ({gone}).")
    if which == "latest":
        return kept[-1]
    scored = [c for c in kept if metric in c.metrics]
    if not scored:
        seen = sorted({k for c in kept for k in c.metrics})
        raise SpecError(
            f"No kept checkpoint was reported with {metric!r}; reported with them:"
            f" {', '.join(seen) or 'nothing'}."
        )
    choose = max if mode == "max" else min
    return choose(scored, key=lambda c: (c.metrics[metric], c.step))


_URI_ENV = "MLFLOW_TRACKING_URI"


@contextlib.contextmanager
def _mlflow_at(uri: str):
    """MLflow's fluent API (which ``log_model`` uses) pointed at ``uri`` for a while, its
    log quiet below errors (the pickle-format notice and the wait for a version to be
    ready are MLflow's own chatter; ``register`` says what it did)."""
    import logging

    import mlflow
    from mlflow.tracking._tracking_service import utils

    log = logging.getLogger("mlflow")
    # what the process had set, not get_tracking_uri()'s default: putting that back set
    # MLFLOW_TRACKING_URI to sqlite:///<cwd>/mlflow.db for the rest of the process
    previous, env, level = utils._tracking_uri, os.environ.get(_URI_ENV), log.level
    mlflow.set_tracking_uri(uri)
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)  # None: unset, as before
        if env is None:
            os.environ.pop(_URI_ENV, None)
        else:
            os.environ[_URI_ENV] = env
        log.setLevel(level)


def _log_model(model: Any, model_id: str) -> None:
    """Store ``model`` as the artifacts of LoggedModel ``model_id`` (an MLflow model)."""
    import mlflow

    from .payload import ship_by_value

    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None
    if torch is not None and isinstance(model, torch.nn.Module):
        import mlflow.pytorch

        ship_by_value(type(model))  # a fresh process need not import the notebook's files
        import cloudpickle

        # cloudpickle (MLflow's pickle module for PyTorch) keeps classes defined in a
        # notebook; the local version label (+cpu, +cu124) is not installable from PyPI
        mlflow.pytorch.log_model(
            model,
            name="model",
            model_id=model_id,
            serialization_format="pickle",
            pip_requirements=[
                f"torch=={torch.__version__.split('+')[0]}",
                f"cloudpickle=={cloudpickle.__version__}",
            ],
        )
    elif isinstance(model, mlflow.pyfunc.PythonModel):
        mlflow.pyfunc.log_model(name="model", python_model=model, model_id=model_id)
    else:
        raise SpecError(
            f"model_fn returned a {type(model).__name__}; return a torch.nn.Module or an"
            " mlflow.pyfunc.PythonModel."
        )


def _check_names(name: str, alias: str | None) -> None:
    """SpecError unless ``name`` is a registered model name and ``alias`` an alias."""
    import re

    if not name or not name.strip():
        raise SpecError("Give the model a name (--name NAME).")
    if "/" in name or ":" in name:  # MLflow's rule for registered model names
        raise SpecError(f"A model name cannot contain '/' or ':', got {name!r}.")
    if alias is not None and not re.match(_ALIAS, alias):
        raise SpecError(f"An alias is a letter then letters, digits, _ or -; got {alias!r}.")


def _build_model(model_fn, chosen: CheckpointModel):
    """``model_fn(directory)`` on the chosen checkpoint; SpecError when it fails."""
    import ray.train

    with ray.train.Checkpoint(chosen.path).as_directory() as directory:
        try:
            return model_fn(directory)
        except Exception as exc:
            raise SpecError(
                f"model_fn failed on the checkpoint of step {chosen.step}:"
                f" {type(exc).__name__}: {exc}"
            ) from None


def _version_tags(job_id: str, run, chosen: CheckpointModel) -> dict[str, str]:
    """The model version's tags: the job, run and checkpoint, the code's versions and the
    data digests of the run."""
    tags = {
        TAG.JOB_ID: job_id,
        TAG.RUN_ID: run.info.run_id,
        TAG.CKPT_STEP: str(chosen.step),
        TAG.CKPT_PATH: chosen.path,
    }
    for key, value in run.data.tags.items():
        if key.startswith(("trainfactory.code.", TAG.DATA, "mlflow.source.git.")):
            tags[key] = value
    return tags


def best_trial_run(client, sweep_run):
    """The child run of the best trial of sweep run ``sweep_run`` (tag
    ``trainfactory.sweep.best``, by the sweep's metric); raises SpecError before any."""
    best = json.loads(sweep_run.data.tags.get(TAG.SWEEP_BEST, "{}") or "{}")
    if not best.get("run_id"):
        job_id = sweep_run.data.tags.get(TAG.JOB_ID, "")
        raise SpecError(f"Sweep {job_id} has no trial with a result yet; nothing to register.")
    return client.get_run(best["run_id"])


def _trial_or_job(client, run, checkpoint: str, metric: str | None, mode: str | None):
    """What ``register`` picks from: the job's run, or a sweep's best trial's run with the
    sweep's metric and mode unless ``metric`` is given; ``(run, checkpoint, metric, mode)``."""
    if TAG.SWEEP not in run.data.tags:
        return run, checkpoint, metric, mode
    settings = json.loads(run.data.tags[TAG.SWEEP])
    if metric is None:
        checkpoint, metric, mode = "best", settings["metric"], settings["mode"]
    return best_trial_run(client, run), checkpoint, metric, mode


def register(
    manager,
    job_id: str,
    name: str,
    checkpoint: str = "latest",
    metric: str | None = None,
    mode: str | None = None,
    alias: str | None = None,
    model_fn=None,
) -> dict[str, Any]:
    """Register one of job ``job_id``'s checkpoints as a new version of model ``name``.

    ``model_fn(checkpoint_dir) -> model`` rebuilds the model from the checkpoint's
    directory (a ``torch.nn.Module``, logged with ``mlflow.pytorch``, or an
    ``mlflow.pyfunc.PythonModel``); None uses the one given at launch. The version's
    tags lead back to the job, run, checkpoint, code hashes and data digests; ``alias``
    (e.g. ``champion``) points at it. The model loads with
    ``mlflow.pyfunc.load_model("models:/NAME@ALIAS")`` in a fresh process whose MLflow
    tracking URI is this tool's server. For a sweep,
    the checkpoint is its best trial's (:func:`best_trial_run`): the ``best`` by the
    sweep's metric unless ``checkpoint`` and ``metric`` say otherwise, and the version's
    tags add the sweep and the trial.

    Returns ``{"name", "version", "alias", "uri", "step", "checkpoint", "model_id",
    "tracking_uri"}`` (the registry's server, which a loader must point MLflow at).

    Raises
    ------
    SpecError
        A bad name or alias, no checkpoint to pick, no ``model_fn``, or a ``model_fn``
        that fails or returns something MLflow cannot store.
    JobNotFound
        No such job.
    """
    _check_names(name, alias)
    client = manager.mlflow_client
    sweep = manager.find_run(job_id)
    run, checkpoint, metric, mode = _trial_or_job(client, sweep, checkpoint, metric, mode)
    chosen = pick(checkpoint_models(client, run), checkpoint, metric, mode)
    model_fn = model_fn or manager.model_fn(job_id, sweep.info.run_id)
    if model_fn is None:
        raise SpecError(
            f"Job {job_id} was launched without model_fn; give one that builds the model"
            " from a checkpoint directory (--model-fn NAME, or model_fn=)."
        )
    model = _build_model(model_fn, chosen)
    with _mlflow_at(manager.tracking_uri):
        _log_model(model, chosen.model_id)
    tags = _version_tags(job_id, run, chosen)
    if sweep is not run:
        tags[TAG.SWEEP_JOB] = job_id
        tags[TAG.TRIAL] = run.data.tags.get(TAG.TRIAL, "")
    if checkpoint == "best":
        tags[TAG.SELECTED_BY] = f"{mode} {metric} = {chosen.metrics[metric]:g}"
    from mlflow.exceptions import MlflowException

    with contextlib.suppress(MlflowException):  # it exists already
        client.create_registered_model(name)
    with _mlflow_at(manager.tracking_uri):
        version = client.create_model_version(
            name,
            source=f"models:/{chosen.model_id}",
            run_id=run.info.run_id,
            tags=tags,
            model_id=chosen.model_id,
        )
    if alias:
        client.set_registered_model_alias(name, alias, version.version)
    names = ", ".join(filter(None, [chosen.registered, f"{name}/{version.version}"]))
    client.set_logged_model_tags(chosen.model_id, {TAG.REGISTERED: names})
    return {
        "name": name,
        "version": int(version.version),
        "alias": alias or "",
        "uri": f"models:/{name}@{alias}" if alias else f"models:/{name}/{version.version}",
        "step": chosen.step,
        "checkpoint": chosen.path,
        "model_id": chosen.model_id,
        "tracking_uri": manager.tracking_uri,
    }


def collect_garbage(
    manager, experiment: str | None = None, keep: int = 1, all_users: bool = False
) -> list[dict[str, Any]]:
    """Delete the checkpoints of finished jobs beyond the newest ``keep`` of each job.

    Only jobs that ended (SUCCEEDED, FAILED or STOPPED) are touched, only yours unless
    ``all_users``, only in ``experiment`` when given; a registered checkpoint is never
    deleted. Each deleted checkpoint's LoggedModel is tagged
    ``trainfactory.checkpoint.deleted``, and the run's storage history
    (``trainfactory.storage``) gets the bytes still kept, so its storage cost stops
    accruing for what was freed.

    Returns one ``{"job", "deleted", "bytes_freed", "kept"}`` per job that had any.

    Raises SpecError when ``keep`` is below 1 or the experiment does not exist.
    """
    from . import runreads
    from .jobstate import TERMINAL_STATES
    from .spec import current_owner

    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise SpecError(f"--keep must be a whole number of at least 1, got {keep!r}.")
    client = manager.mlflow_client
    runs = runreads.search_job_runs(
        client,
        None if all_users else current_owner(),
        experiment_ids=manager.experiment_ids(experiment),
    )
    report = []
    for run in runs:
        if manager.run_info(run, reconcile=False).state not in TERMINAL_STATES:
            continue
        every = checkpoint_models(client, run)
        for c in every:  # deleted by Ray Train's retention (keep_checkpoints): say so
            if not c.exists and not c.deleted:
                client.set_logged_model_tags(c.model_id, {TAG.DELETED: "by retention"})
        kept = [c for c in every if c.exists]
        doomed = [c for c in kept[:-keep] if not c.registered] if len(kept) > keep else []
        if not doomed:
            continue
        freed = 0
        now = time.time()
        for c in doomed:
            size = _size(c.path)
            fs, inner = _filesystem(c.path)
            fs.delete_dir(inner)
            freed += size
            client.set_logged_model_tags(c.model_id, {TAG.DELETED: f"{now:.3f}"})
        remaining = [c for c in kept if c not in doomed]
        remaining_bytes = sum(_size(c.path) for c in remaining)
        storage = json.loads(run.data.tags.get(TAG.STORAGE) or "{}")
        storage.setdefault("history", []).append([round(now, 3), remaining_bytes])
        client.set_tag(run.info.run_id, TAG.STORAGE, json.dumps(storage))
        report.append(
            {
                "job": run.data.tags.get(TAG.JOB_ID, ""),
                "deleted": [c.step for c in doomed],
                "bytes_freed": freed,
                "kept": [c.step for c in remaining],
            }
        )
    return report
