"""Host checks of one node with psutil (CPU nodes and GPU nodes alike): available
memory, free disk in the Ray temp dir and in the job storage path, CPUs.

``psutil`` is an argument (the node imports it), so the checks run the same in tests.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlparse

from .check import FAIL, OK, Check

__all__ = [
    "MAX_DISK_USED_FRACTION",
    "MIN_AVAILABLE_MEMORY_GB",
    "MIN_FREE_STORAGE_GB",
    "MIN_FREE_TEMP_GB",
    "host_checks",
]

_GB = 1e9
#: Below this much available memory a worker (Python, torch, a data loader: about 1 GB
#: each) and Ray's object store (which takes 30 % of memory by default) leave the node
#: to the OOM killer; Ray's own memory monitor kills workers at 95 % used.
MIN_AVAILABLE_MEMORY_GB = 2.0
#: The Ray temp dir holds the session's logs, the runtime_env (the shipped packages)
#: and objects spilled from the object store; below this, spilling and log writes fail.
MIN_FREE_TEMP_GB = 5.0
#: Ray refuses to spill objects to a filesystem fuller than this
#: (``RAY_local_fs_capacity_threshold``, default 0.95).
MAX_DISK_USED_FRACTION = 0.95
#: Checkpoints go to the storage path; below this a model's checkpoints (a 1B-parameter
#: model's weights and Adam state are about 16 GB, keeping two is the default) no longer fit.
MIN_FREE_STORAGE_GB = 10.0


def _existing(path: str) -> str:
    """``path``, or its nearest existing parent (the storage dir may not exist yet)."""
    path = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def _memory(psutil: Any) -> Check:
    try:
        mem = psutil.virtual_memory()
    except Exception:
        return Check.na("memory", "available memory")
    avail = mem.available / _GB
    text = f"{avail:.1f} GB of {mem.total / _GB:.1f} GB memory available"
    if avail < MIN_AVAILABLE_MEMORY_GB:
        return Check("memory", FAIL, f"{text}, under {MIN_AVAILABLE_MEMORY_GB:g} GB.")
    return Check("memory", OK, f"{text}.")


def _disk(psutil: Any, name: str, what: str, path: str | None, min_gb: float) -> Check:
    if not path:
        return Check.na(name, what)
    scheme = urlparse(path).scheme.lower()
    if len(scheme) > 1 and scheme != "file":  # s3://, gs://...: not a local disk
        return Check.na(name, f"{what} {path} (remote storage)")
    local = _existing(path.removeprefix("file://"))
    try:
        usage = psutil.disk_usage(local)
    except Exception:
        return Check.na(name, f"{what} {local}")
    free, used = usage.free / _GB, usage.percent / 100.0
    text = f"{free:.1f} GB free in {local} ({used:.0%} used)"
    if free < min_gb:
        return Check(name, FAIL, f"{text}, under {min_gb:g} GB.")
    if used > MAX_DISK_USED_FRACTION:
        return Check(
            name, FAIL, f"{text}, over Ray's spilling limit of {MAX_DISK_USED_FRACTION:.0%}."
        )
    return Check(name, OK, f"{text}.")


def _cpus(psutil: Any) -> Check:
    try:
        logical, physical = psutil.cpu_count(logical=True), psutil.cpu_count(logical=False)
    except Exception:
        logical = physical = None
    if not logical:
        return Check.na("cpus", "CPU count")
    return Check("cpus", OK, f"{logical} logical CPUs ({physical or '?'} cores).")


def host_checks(psutil: Any, temp_dir: str | None, storage: str | None) -> list[Check]:
    """The host's checks, in table order: ``memory`` (available memory at least
    :data:`MIN_AVAILABLE_MEMORY_GB`), ``temp_disk`` (free space in the Ray temp dir
    ``temp_dir``: at least :data:`MIN_FREE_TEMP_GB` and at most
    :data:`MAX_DISK_USED_FRACTION` used), ``storage_disk`` (the same in the job storage
    path ``storage``, :data:`MIN_FREE_STORAGE_GB`; n/a for remote storage such as
    ``s3://``), ``cpus`` (the logical CPU count, compared with Ray's in the report).
    ``psutil`` may be None (not installed): every check is then n/a. Never raises."""
    if psutil is None:
        return [
            Check.na(n, "psutil not installed")
            for n in ("memory", "temp_disk", "storage_disk", "cpus")
        ]
    return [
        _memory(psutil),
        _disk(psutil, "temp_disk", "Ray temp dir", temp_dir, MIN_FREE_TEMP_GB),
        _disk(psutil, "storage_disk", "storage path", storage, MIN_FREE_STORAGE_GB),
        _cpus(psutil),
    ]
