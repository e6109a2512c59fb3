"""Ray Data datasets of a job: checked in the kernel, built in the job's driver, recorded.

A job's ``datasets`` (name -> a Ray ``Dataset`` or a zero-argument function returning
one) travel in the payload (:mod:`.payload`): a Dataset as its plan (Ray's lineage
serialization, :func:`pack`), a function cloudpickled; the driver calls each function
and hands the Datasets to ``TorchTrainer(datasets=...)`` (``ray_backend.ingest``). What
the run records of each (:func:`describe`) uses only the plan's metadata
(``Dataset.input_files()``, a schema already known, a row count from file metadata):
nothing here executes a dataset. Imports no Ray at import time: the driver imports it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .lineage import CONTENT_DIGEST_LIMIT, DataInput
from .spec_values import SpecError, datasets_to_split

__all__ = [
    "MAX_LISTED_PATHS",
    "check_datasets",
    "describe",
    "is_dataset",
    "lineage_tag",
    "lineage_tags",
    "pack",
    "unpack",
]

#: Paths a dataset's lineage lists (the digest covers all of them).
MAX_LISTED_PATHS = 20
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_LINEAGE = "ray_dataset_lineage"  # payload key of a Dataset's serialized lineage


def is_dataset(value: Any) -> bool:
    """Whether ``value`` is a Ray Data ``Dataset`` (without importing Ray Data)."""
    cls = type(value)
    return cls.__module__.startswith("ray.data") and hasattr(value, "input_files")


def _zero_arg(fn: Callable) -> bool:
    try:
        inspect.signature(fn).bind()
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): let it try
        return True
    return True


def check_datasets(
    datasets: Mapping[str, Any] | None, dataset_config: str | None = None
) -> dict[str, Any]:
    """Check a job's ``datasets`` in the kernel, before anything is submitted.

    Each name must be an identifier and each value a Ray ``Dataset`` or a function that
    takes no argument (called in the job's driver); a Dataset's plain local input files
    must exist here (a URI, or a path in a function, is the cluster's to read). The
    ``dataset_config`` (normalized ``--dataset-config``) may only name given datasets.

    Returns
    -------
    dict
        The datasets, in order. Raises SpecError (one sentence) on the first problem.
    """
    if datasets is not None and not isinstance(datasets, Mapping):
        raise SpecError(
            f"datasets must be a dict of name -> Dataset, got {type(datasets).__name__}."
        )
    datasets = dict(datasets or {})
    for name, value in datasets.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise SpecError(f"A dataset's name must be an identifier, got {name!r}.")
        if is_dataset(value):
            missing = [p for p in _local_paths(value) if not os.path.exists(p)]
            if not _travels(value):
                raise SpecError(
                    f"Dataset {name!r} holds blocks of this kernel's Ray session"
                    " (ray.data.from_*), which cannot travel to the job; give a function"
                    " that builds it instead (lambda: ray.data.from_numpy(x))."
                )
            if missing:
                raise SpecError(
                    f"Dataset {name!r} reads {missing[0]!r}, which does not exist here;"
                    " give a path the cluster's nodes can read."
                )
        elif not callable(value) or not _zero_arg(value):
            kind = "function with arguments" if callable(value) else type(value).__name__
            raise SpecError(
                f"Dataset {name!r} is a {kind}; give a Ray Dataset (ray.data.read_csv(...))"
                " or a function of no arguments that returns one."
            )
    split = datasets_to_split(dataset_config)
    unknown = [n for n in split if n not in datasets] if isinstance(split, list) else []
    if dataset_config and not datasets:
        raise SpecError("--dataset-config needs datasets; give them with --dataset NAME=EXPR.")
    if unknown:
        raise SpecError(
            f"--dataset-config names {unknown[0]!r}, which is none of the datasets"
            f" ({', '.join(datasets)})."
        )
    return datasets


def _travels(dataset: Any) -> bool:
    """Whether Ray can rebuild ``dataset`` in another driver from its plan
    (``Dataset.has_serializable_lineage``: every ``read_*``, no ``from_*``)."""
    check = getattr(dataset, "has_serializable_lineage", None)
    try:
        return bool(check()) if check is not None else True
    except Exception:
        return True  # cannot tell: pack() says so if it fails


def pack(datasets: Mapping[str, Any]) -> dict[str, Any]:
    """The payload form of checked datasets: a Dataset as its serialized lineage (Ray's
    ``serialize_lineage``: the plan, no data, rebuilt from scratch in the job's
    driver), a function as itself. Raises SpecError when a plan cannot be serialized."""
    packed: dict[str, Any] = {}
    for name, value in datasets.items():
        if not is_dataset(value):
            packed[name] = value
            continue
        try:
            packed[name] = {_LINEAGE: value.serialize_lineage()}
        except Exception as exc:
            detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError(f"Dataset {name!r} cannot travel to the job: {detail}") from None
    return packed


def unpack(packed: Mapping[str, Any] | None) -> dict[str, Any]:
    """The datasets of a payload (:func:`pack`), each Dataset rebuilt from its lineage
    (needs Ray connected: the job's driver); functions are not called here."""
    out: dict[str, Any] = {}
    for name, value in (packed or {}).items():
        if isinstance(value, dict) and _LINEAGE in value:
            from ray.data import Dataset

            value = Dataset.deserialize_lineage(value[_LINEAGE])
        out[name] = value
    return out


def _input_files(dataset: Any) -> list[str]:
    """The files a Dataset's plan reads, without executing it: ``input_files()``, else
    (a read whose listing is itself a step of the plan, as Ray 2.60's ``read_parquet``)
    the paths given to the read, local directories listed as the read lists them."""
    try:
        files = sorted(str(p) for p in dataset.input_files())
    except Exception:
        files = []
    return files or _listed(_read_paths(dataset))


def _read_paths(dataset: Any) -> list[str]:
    """The ``paths`` given to the reads of ``dataset``'s logical plan (its ``ListFiles``
    operators' ``source_paths``); [] when the plan is not one Ray exposes so."""
    paths: list[str] = []
    try:
        stack = [dataset._logical_plan.dag]
        while stack:
            op = stack.pop()
            found = getattr(op, "source_paths", None)
            if isinstance(found, (list, tuple)):
                paths += [str(p) for p in found]
            stack += list(getattr(op, "_input_dependencies", None) or ())
    except Exception:
        return []
    return paths


def _listed(paths: list[str]) -> list[str]:
    """``paths`` with each local directory replaced by the files under it (sorted; names
    starting with ``.`` or ``_`` left out, as Arrow's dataset discovery does)."""
    files: list[str] = []
    for path in paths:
        if _SCHEME.match(path) or not os.path.isdir(path):
            files.append(path)
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
            files += [os.path.join(root, n) for n in names if not n.startswith((".", "_"))]
    return sorted(files)


def _local_paths(dataset: Any) -> list[str]:
    """The plain local paths among a Dataset's input files (no URI scheme, absolute)."""
    return [p for p in _input_files(dataset) if not _SCHEME.match(p) and os.path.isabs(p)]


def _schema(dataset: Any) -> dict[str, str] | None:
    """The schema when the plan already knows it (never fetched: that would execute)."""
    try:
        schema = dataset.schema(fetch_if_missing=False)
    except Exception:
        return None
    if schema is None:
        return None
    try:
        return {str(n): str(t) for n, t in zip(schema.names, schema.types, strict=False)}
    except Exception:
        return {"schema": str(schema)}


def _rows(dataset: Any) -> int | None:
    """The row count from the source's metadata (Parquet footers), None when only
    executing would tell. ``Dataset._meta_count`` is private (checked on Ray 2.60.0):
    ``Dataset.count()`` executes the plan when the metadata lacks it."""
    try:
        rows = dataset._meta_count()
    except Exception:
        return None
    return int(rows) if isinstance(rows, int) else None


def _digest_files(paths: list[str]) -> tuple[str, str, int | None]:
    """(digest, digest_of, bytes) of the readable local files among ``paths``: their
    content up to :data:`~.lineage.CONTENT_DIGEST_LIMIT` bytes together, else their
    listing (path, size, ``st_mtime_ns``); ``("unknown", "unknown", None)`` when none is
    readable here."""
    stats = []
    for path in sorted(paths):
        try:
            stats.append((path, os.stat(path)))
        except OSError:
            continue
    if not stats:
        return "unknown", "unknown", None
    size = sum(st.st_size for _, st in stats)
    sha = hashlib.sha256()
    if size > CONTENT_DIGEST_LIMIT:
        for path, st in stats:
            sha.update(f"{path}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
        return sha.hexdigest(), "listing", size
    for path, st in stats:
        sha.update(f"{path}\0{st.st_size}\0".encode())
        try:
            with open(path, "rb") as f:
                while chunk := f.read(2**20):
                    sha.update(chunk)
        except OSError:
            return "unknown", "unknown", None
    return sha.hexdigest(), "content", size


def describe(name: str, value: Any, where: str = "kernel") -> DataInput:
    """What the run records of dataset ``name``: a :class:`~.lineage.DataInput`.

    For a Dataset: its input files (``source``: the first, or their common directory;
    ``profile["paths"]``: the first :data:`MAX_LISTED_PATHS`), a digest of the local ones
    readable ``where`` it runs (``kernel`` or ``driver``: content, or listing when large;
    ``digest`` and ``digest_of`` ``"unknown"`` otherwise), and the schema and row count
    when the plan knows them without executing (else ``"unknown"``). For a function (not
    called here): ``source`` ``<function NAME>``, everything else unknown until the
    driver builds it. Never raises.
    """
    if not is_dataset(value):
        label = getattr(value, "__qualname__", type(value).__name__)
        profile = {"ray_dataset": "function", "files": "unknown", "schema": "unknown"}
        profile["rows"] = "unknown"
        source = f"<function {label}>"
        return DataInput(name, source, "ray_dataset", "unknown", "unknown", None, profile)
    files = _input_files(value)
    digest, digest_of, size = _digest_files([p for p in files if os.path.isabs(p)])
    schema, rows = _schema(value), _rows(value)
    profile = {
        "ray_dataset": where,
        "files": len(files) if files else "unknown",
        "paths": files[:MAX_LISTED_PATHS],
        "schema": schema if schema is not None else "unknown",
        "rows": rows if rows is not None else "unknown",
    }
    if len(files) == 1:
        source = files[0]
    elif files:
        source = os.path.commonpath(files) if all(os.path.isabs(p) for p in files) else files[0]
    else:
        source = f"<ray dataset {type(value).__name__}, no input files>"
    source_type = "local" if files and os.path.isabs(files[0]) else "ray_dataset"
    if files and _SCHEME.match(files[0]):
        source_type = files[0].split("://", 1)[0]
    source = str(Path(source)) if source_type == "local" else source
    return DataInput(name, source, source_type, digest, digest_of, size, profile)


def lineage_tag(data: DataInput) -> str:
    """The ``trainfactory.dataset.<name>`` tag's JSON: source, digest and profile."""
    body = {"source": data.source, "digest": data.digest, "digest_of": data.digest_of}
    body.update(data.profile)
    body["size_bytes"] = data.size_bytes if data.size_bytes is not None else "unknown"
    return json.dumps(body, default=str)[:5000]


def lineage_tags(described: list[DataInput]) -> dict[str, str]:
    """``{"trainfactory.dataset.<name>": JSON}`` of each described dataset."""
    from .tracking import TAG

    return {f"{TAG.DATASET}{d.name}": lineage_tag(d) for d in described}
