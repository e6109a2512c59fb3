"""A job's payload: the training function, its ``model_fn``, config and Ray Data datasets packed as an
importable package that Ray ships with runtime_env ``py_modules``, kept in the state
directory and in the job's run (a resume from another machine fetches it from there)."""

from __future__ import annotations

import inspect
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .services import state_dir
from .spec import JobSpec, SpecError

__all__ = [
    "CONFIG_FILE",
    "DATASETS_FILE",
    "DRIVER_MODULE",
    "FUNCTION_FILE",
    "MODEL_FN_FILE",
    "PAYLOAD_ARTIFACTS",
    "HEALTH_CHECK_ENV",
    "REPORT_POLL_INTERVAL_S",
    "fetch_payload",
    "function_source",
    "load_model_fn",
    "log_payload",
    "payload_path",
    "runtime_env",
    "ship_by_value",
    "write_payload",
]

#: The payload file of the training function.
FUNCTION_FILE = "function.pkl"
#: The payload file of the function that rebuilds a model from a checkpoint directory.
MODEL_FN_FILE = "model_fn.pkl"
#: The job's entrypoint module (``python -m DRIVER_MODULE PAYLOAD``) unless ``job.json``
#: names another (``"driver"``: a sweep's ``ray_backend.sweep_driver``).
DRIVER_MODULE = "ray_backend.driver"
CONFIG_FILE = "config.pkl"  # the config as given (job.json holds tracking.json_safe's copy)
#: The payload file of the job's Ray Data datasets (name -> Dataset or function).
DATASETS_FILE = "datasets.pkl"
#: Where the payload lives in the run's artifacts.
PAYLOAD_ARTIFACTS = "trainfactory/payload"
_PACKAGE_EXCLUDES = ["__pycache__", "*.pyc", "labextension"]


def function_source(fn: Callable) -> str:
    """``fn``'s source code, "" when Python cannot find it (a lambda typed in a shell)."""
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def payload_path(job_id: str) -> Path:
    """Where job ``job_id``'s payload package lives in the state directory."""
    return state_dir() / "jobs" / job_id / f"_tf_payload_{job_id.replace('-', '_')}"


def write_payload(
    job_id: str,
    fn: Callable,
    model_fn: Callable | None = None,
    config: Any = None,
    datasets: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write the job's payload as an importable package shipped with runtime_env py_modules;
    returns its directory.

    The function (and ``model_fn``, kept for ``register``), the config (``config.pkl``:
    the job gets it exactly as given, tensors, tuple keys and all) and the datasets
    (``datasets.pkl``: lazy Datasets and functions the driver calls) are pickled first, so
    an unshippable one fails before a run exists; ``extra`` (file name -> object) adds
    other pickles (a sweep's search space); ``job.json`` is added once the run id
    is known. Raises SpecError (nothing is left behind) when one cannot be pickled.
    """
    import cloudpickle

    path = payload_path(job_id)
    path.mkdir(parents=True, exist_ok=True)
    (path / "__init__.py").write_text(f'"""Payload of trainfactory job {job_id}."""\n')
    items = ((FUNCTION_FILE, fn), (MODEL_FN_FILE, model_fn), (CONFIG_FILE, config))
    for name, item in (*items, (DATASETS_FILE, datasets or None), *(extra or {}).items()):
        if item is None:
            continue
        if name in (FUNCTION_FILE, MODEL_FN_FILE):
            ship_by_value(item)
        elif name == DATASETS_FILE:
            for value in item.values():
                if callable(value):
                    ship_by_value(value)
        try:
            (path / name).write_bytes(cloudpickle.dumps(item))
        except Exception as exc:
            shutil.rmtree(path.parent, ignore_errors=True)
            what = {MODEL_FN_FILE: "model_fn", CONFIG_FILE: "The config"}.get(name, "The function")
            what = "The datasets" if name == DATASETS_FILE else what
            if name in (extra or {}):  # search_space.pkl: "The search space"
                what = "The " + name.removesuffix(".pkl").replace("_", " ")
            raise SpecError(
                f"{what} cannot be shipped to the cluster (cloudpickle: {exc})."
            ) from exc
    return path


def log_payload(mlflow_client, run_id: str, payload: Path, meta: dict[str, Any]) -> None:
    """The payload in the run's artifacts (a resume from another machine finds it there),
    with ``meta`` (already redacted: secrets never reach MLflow) as its ``job.json``; the
    pickled config stays out when something in it was redacted."""
    import tempfile

    skip = ["job.json", "__pycache__"] + ([CONFIG_FILE] if meta.get("redacted") else [])
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "payload"
        shutil.copytree(payload, copy, ignore=shutil.ignore_patterns(*skip))
        (copy / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        mlflow_client.log_artifacts(run_id, str(copy), PAYLOAD_ARTIFACTS)


def fetch_payload(mlflow_client, job_id: str, run_id: str) -> Path:
    """The job's payload directory: here, or downloaded from its run's artifacts.

    Raises SpecError when it is in neither place, or when the run's copy lacks settings
    that were secrets (those never reach MLflow)."""
    path = payload_path(job_id)
    if (path / "job.json").is_file() and (path / FUNCTION_FILE).is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    try:
        fetched = mlflow_client.download_artifacts(run_id, PAYLOAD_ARTIFACTS, str(path))
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecError(
            f"Job {job_id}'s function is neither in {path} nor in its run's artifacts"
            f" ({text}); launch it again."
        ) from exc
    for item in Path(fetched).iterdir():  # <path>/trainfactory/payload/* -> <path>/*
        item.replace(path / item.name)
    shutil.rmtree(path / PAYLOAD_ARTIFACTS.split("/")[0], ignore_errors=True)
    redacted = json.loads((path / "job.json").read_text()).get("redacted")
    if redacted:
        shutil.rmtree(path.parent, ignore_errors=True)
        raise SpecError(
            f"Job {job_id}'s settings held secrets ({', '.join(redacted)}) that are never"
            " stored in MLflow; resume it from the machine that launched it (its state"
            " directory keeps them), or launch it again."
        )
    return path


def load_model_fn(payload: Path) -> Callable[[str], Any] | None:
    """The ``model_fn`` of the payload at ``payload``, None when the job was given none."""
    import cloudpickle

    path = payload / MODEL_FN_FILE
    return cloudpickle.loads(path.read_bytes()) if path.is_file() else None


def ship_by_value(fn: Callable) -> None:
    """Pickle ``fn``'s module by value when it is a local file the cluster cannot import.

    A training function imported from a file next to the notebook (``from tiny_gpt_train
    import train_func``) would otherwise be pickled as a reference to that module, which
    the workers do not have. Installed packages (site-packages, the standard library) and
    this project's own packages stay references.
    """
    import sysconfig

    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if module is None or not path or module.__name__ == "__main__":
        return
    if module.__name__.split(".")[0] in ("jupyter_trainfactory", "ray_backend"):
        return
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    resolved = str(Path(path).resolve())
    if any(resolved.startswith(str(Path(p).resolve()) + os.sep) for p in installed):
        return
    cloudpickle.register_pickle_by_value(module)


#: Ray Train's controller takes each ``ray.train.report`` on its next poll of the workers
#: and a report blocks until the previous one was taken, so a report waits up to one
#: interval (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``, Ray's default 2.0 s:
#: ray/train/v2/_internal/execution/controller/controller.py, ``_poll_workers``). A job
#: gets this interval (seconds) unless its user sets one; its cost, the controller's CPU
#: while polling, is measured by benchmarks/report_latency.py
#: (benchmarks/results/report_latency_2cpu.txt).
REPORT_POLL_INTERVAL_S = 0.1
HEALTH_CHECK_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def runtime_env(spec: JobSpec, payload: Path, ray_address: str | None = None) -> dict[str, Any]:
    """The job's Ray ``runtime_env``: this project's two packages and the payload as
    ``py_modules``, the ``RAY_TRAIN_*`` variables of this process and the spec's ``env``,
    and the spec's extras; ``ray_address`` (the embedded head's GCS address) is the job's
    ``RAY_ADDRESS`` unless the spec sets one. The Ray Train controller polls the workers
    every :data:`REPORT_POLL_INTERVAL_S` unless this process or the spec sets
    ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``."""
    import ray_backend

    env_vars = {k: v for k, v in os.environ.items() if k.startswith("RAY_TRAIN_")}
    env_vars.update(spec.env)
    env_vars.setdefault(HEALTH_CHECK_ENV, str(REPORT_POLL_INTERVAL_S))
    env_vars.setdefault("PYTHONUNBUFFERED", "1")
    env_vars.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    if ray_address:  # not "auto": another head may run here
        env_vars.setdefault("RAY_ADDRESS", ray_address)
    result: dict[str, Any] = {
        "py_modules": [
            str(Path(__file__).parent),  # jupyter_trainfactory
            str(Path(ray_backend.__file__).parent),
            str(payload),
        ],
        "excludes": _PACKAGE_EXCLUDES,
        "env_vars": env_vars,
    }
    result.update(spec.runtime_env_extras())
    return result
