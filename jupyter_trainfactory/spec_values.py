"""Checks of single JobSpec values that need nothing but the value (no file system, no
cluster): numbers, ``KEY=VALUE`` pairs, environment names, custom resources, placement
strategies, Ray label selectors and ``--dataset-config``. Standard library only: the job's driver imports it.
"""

from __future__ import annotations

import math
import re
from typing import Any

__all__ = [
    "PLACEMENTS",
    "SpecError",
    "check_number",
    "custom_resources",
    "dataset_config_text",
    "datasets_to_split",
    "label_selector",
    "parse_env",
    "parse_pairs",
    "placement_name",
    "positive_number",
    "selector_text",
]

_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``--placement`` -> Ray's placement group strategy (``ray.util.placement_group``), which
#: Ray Train uses for the workers' bundles (``ScalingConfig.placement_strategy``).
PLACEMENTS = {
    "pack": "PACK",
    "spread": "SPREAD",
    "strict-pack": "STRICT_PACK",
    "strict-spread": "STRICT_SPREAD",
}
#: Resources with their own option; ``resources`` holds the custom ones.
_BUILTIN_RESOURCES = {
    "CPU": "CPUs come from --cpus-per-worker",
    "GPU": "GPUs come from --gpus-per-worker",
    "NPU": "NPUs come from --gpus-per-worker with --accelerator npu",
    "HPU": "HPUs come from --gpus-per-worker with --accelerator hpu",
    "TPU": "TPUs are not supported",
    "memory": "Ray's memory resource is not reserved per worker by this tool",
    "object_store_memory": "Ray's object store is not reserved per worker by this tool",
}
_LABEL_KEY = re.compile(r"^([A-Za-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


class SpecError(ValueError):
    """Bad input for a job; the message is one sentence that says what to do instead."""


def parse_env(items: list[str] | dict[str, str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (or a dict) -> ``{"KEY": "VALUE"}``; raises SpecError on bad items."""
    if not items:
        return {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                raise SpecError(f"--env takes KEY=VALUE, got {item!r}.")
            pairs.append((key, value))
    for key, _ in pairs:
        if not _ENV_KEY.match(key):
            raise SpecError(f"{key!r} is not a valid environment variable name.")
    return {k: str(v) for k, v in pairs}


def parse_pairs(items: list[str] | dict[str, str] | None, option: str) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (or a dict) -> ``{"KEY": "VALUE"}`` for ``option``'s message;
    raises SpecError on an item without ``=`` or an empty key."""
    if not items:
        return {}
    if isinstance(items, dict):
        return {str(k): str(v) for k, v in items.items()}
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{option} takes KEY=VALUE, got {item!r}.")
        out[key.strip()] = value.strip()
    return out


def check_number(name: str, value: Any, minimum: float, integer: bool = False) -> None:
    """Raise SpecError unless ``value`` is a number (a whole one with ``integer``) of at
    least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SpecError(f"{name} must be a number, got {value!r}.")
    if integer and int(value) != value:
        raise SpecError(f"{name} must be a whole number, got {value!r}.")
    if value < minimum:
        raise SpecError(f"{name} must be at least {minimum:g}, got {value!r}.")


def positive_number(value: Any) -> bool:
    """Whether ``value`` is a finite number above 0 (a bool is no number)."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return number and math.isfinite(value) and value > 0


def custom_resources(resources: Any) -> dict[str, float]:
    """``{"rack_a": 1}`` (or ``["rack_a=1"]``) -> the custom Ray resources of one worker,
    amounts as floats, those of 0 dropped. Raises SpecError for a built-in resource
    (``CPU``, ``GPU``, ...: they have their own options) or an amount below 0."""
    resources = resources or {}
    if isinstance(resources, list):
        resources = parse_pairs(resources, "--resources")
    if not isinstance(resources, dict):
        raise SpecError(f"resources must be a dict, got {type(resources).__name__}.")
    checked = {}
    for key, value in resources.items():
        if key in _BUILTIN_RESOURCES:
            raise SpecError(f"--resources is for custom resources; {_BUILTIN_RESOURCES[key]}.")
        try:
            amount = float(value)
        except (TypeError, ValueError):
            amount = math.nan
        if not math.isfinite(amount) or amount < 0:
            raise SpecError(
                f"--resources {key} takes an amount of 0 or more, like {key}=1; got {value!r}."
            )
        if amount > 0:
            checked[str(key)] = amount
    return checked


def placement_name(placement: str | None) -> str:
    """``"STRICT_PACK"`` -> ``"strict-pack"`` (a key of :data:`PLACEMENTS`; None: ``pack``);
    raises SpecError for another strategy."""
    name = str(placement or "pack").lower().replace("_", "-")
    if name not in PLACEMENTS:
        raise SpecError(f"--placement takes {', '.join(PLACEMENTS)}, got {placement!r}.")
    return name


def label_selector(value: Any, workers: int) -> dict[str, str] | list[dict[str, str]]:
    """Validate a Ray label selector: one ``{label: expression}`` for every worker (or its
    ``["label=expression", ...]`` form), or a list of dicts, one per worker (Ray Train's
    per-worker-group form). An expression is ``value``, ``!value``, ``in(a,b)`` or
    ``!in(a,b)`` (Ray's label selector syntax). Raises SpecError."""
    value = value or {}
    if isinstance(value, (list, tuple)) and all(isinstance(x, str) for x in value):
        value = parse_pairs(list(value), "--label-selector")
    value = list(value) if isinstance(value, tuple) else value
    selectors = value if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) != workers:
        raise SpecError(
            f"A per-worker label_selector list needs one entry per worker ({workers}),"
            f" got {len(value)}."
        )
    out = []
    for selector in selectors:
        if not isinstance(selector, dict):
            raise SpecError(f"A label selector is a dict of label -> value, got {selector!r}.")
        for key, expr in selector.items():
            if not _LABEL_KEY.match(str(key)):
                raise SpecError(f"{key!r} is not a node label name (like 'ray.io/node-group').")
            if not str(expr).strip() or str(expr).strip() in ("!", "in()", "!in()"):
                raise SpecError(f"The label selector {key}= needs a value.")
        out.append({str(k): str(v).strip() for k, v in selector.items()})
    return out if isinstance(value, list) else out[0]


def selector_text(selector: dict[str, str] | list[dict[str, str]] | None) -> str:
    """A label selector (one dict, or one per worker) as ``key=value ...``, sorted."""
    selectors = selector if isinstance(selector, list) else [selector] if selector else []
    return " ".join(sorted({f"{k}={v}" for s in selectors for k, v in s.items()}))


def dataset_config_text(value: Any) -> str | None:
    """``--dataset-config``, normalized: None (Ray's default, every dataset split among
    the workers), ``"split=all"``, ``"split=none"`` or ``"split=train,validation"``.

    Takes ``all``, ``none``, ``split=all``, ``split=none``, ``split=NAME[,NAME...]`` or a
    list of names. Raises SpecError for anything else."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        value = "split=" + (",".join(str(v) for v in value) or "none")
    text = str(value).strip()
    key, sep, rest = text.partition("=")
    if not sep:
        key, rest = "split", text
    names = [n.strip() for n in rest.split(",") if n.strip()]
    if key.strip() != "split" or not names:
        raise SpecError(
            f"--dataset-config takes split=all, split=none or split=NAME[,NAME...], got {value!r}."
        )
    if names in (["all"], ["none"]):
        return f"split={names[0]}"
    bad = [n for n in names if not n.isidentifier()]
    if bad:
        raise SpecError(f"--dataset-config names datasets, and {bad[0]!r} is not a name.")
    return "split=" + ",".join(dict.fromkeys(names))


def datasets_to_split(config: str | None) -> str | list[str]:
    """Ray's ``DataConfig(datasets_to_split=...)`` of a normalized ``--dataset-config``
    (:func:`dataset_config_text`): ``"all"`` or a list of dataset names (empty: none)."""
    names = (config or "split=all").partition("=")[2]
    if names == "all":
        return "all"
    return [] if names == "none" else names.split(",")
