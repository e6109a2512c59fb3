"""Metric keys made valid for MLflow by a stable mapping, and non-finite values kept out.

MLflow accepts keys of at most 250 characters made of letters, digits, ``_ - . / :``
and space (``mlflow.utils.validation``); its file store, artifact views and exports also
treat ``/`` as a path, so no key may be a path prefix of another (``loss`` and
``loss/val`` cannot both be metrics).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

__all__ = ["MAX_KEY_LENGTH", "KeyMapper", "clean_key", "to_float"]

#: MLflow's limit on a metric key (``mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH``).
MAX_KEY_LENGTH = 250
#: Key prefixes whose points are not stepped by training steps (their step is a tick
#: count): every other key's step is a training step of the run.
NOT_STEPPED = ("system/", "goodput/", "badput/", "faults/", "energy/", "cost/")
_BAD = re.compile(r"[^\w\-. /:]", re.ASCII)
_SLASHES = re.compile(r"/+")


def clean_key(key: Any) -> str:
    """Characters MLflow refuses become ``_``; empty path segments are dropped and ``.``
    or ``..`` segments become ``_`` or ``__`` (MLflow refuses names a path normalization
    would change).

    A key longer than 250 characters keeps its first 241 and ends with ``-`` and 8 hex
    digits of the SHA-1 of the original key (MLflow refuses ``~`` in names), so two long keys that share a prefix stay
    distinct and the same key always maps to the same result.
    """
    text = str(key)
    out = _SLASHES.sub("/", _BAD.sub("_", text)).strip("/ ") or "_"
    # MLflow refuses names that normpath would change: "." and ".." segments become "_"s.
    out = "/".join("_" * len(p) if p in (".", "..") else p for p in out.split("/"))
    return _fit(out, text)


def _fit(key: str, original: str) -> str:
    """``key`` cut to 250 characters with a hash of ``original`` when it is longer."""
    if len(key) <= MAX_KEY_LENGTH:
        return key
    digest = hashlib.sha1(original.encode()).hexdigest()[:8]
    return key[: MAX_KEY_LENGTH - 9].rstrip("/") + "-" + digest


def to_float(value: Any) -> float | None:
    """``value`` as a float (bools as 0/1, numpy/torch scalars via ``.item()``), else None.

    Non-finite results (NaN, +-inf) are returned as they are; the caller decides.
    """
    if hasattr(value, "item") and callable(value.item):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    return None


class KeyMapper:
    """Maps raw metric keys to MLflow keys; a key once mapped keeps its mapping.

    Conflicts are settled first come, first served: when a new key would be a path
    prefix of a key already in use, or have one as a prefix, its first conflicting path
    segment gets a ``_`` suffix (``loss`` in use, then ``loss/val`` -> ``loss_/val``); two
    raw keys that clean to the same text are told apart the same way.
    ``renamed`` lists every key whose MLflow key differs from the raw key.
    """

    def __init__(self) -> None:
        self._map: dict[str, str] = {}
        self._leaves: set[str] = set()
        self._dirs: set[str] = set()
        self.renamed: dict[str, str] = {}

    def __call__(self, key: Any) -> str:
        raw = str(key)
        mapped = self._map.get(raw)
        if mapped is not None:
            return mapped
        mapped = self._free(clean_key(raw))
        self._map[raw] = mapped
        self._leaves.add(mapped)
        parts = mapped.split("/")
        self._dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if mapped != raw:
            self.renamed[raw] = mapped
        return mapped

    def _free(self, key: str) -> str:
        """``key`` changed until it neither collides with nor is a path prefix of a key in use."""
        while True:
            parts = key.split("/")
            for i in range(1, len(parts) + 1):
                prefix = "/".join(parts[:i])
                leaf = i == len(parts)
                if prefix in self._leaves or (leaf and prefix in self._dirs):
                    parts[i - 1] += "_"
                    break
            else:
                return key
            key = _fit("/".join(parts), "/".join(parts))

    def __len__(self) -> int:
        return len(self._map)
