"""Which plot goes where, in the order a person watching a training run reads it (pure).

Sections, top to bottom, under the header line of numbers:

1. ``user``: the loop's own metrics (``loss``, ``val_accuracy``, ...), one plot each, by step;
2. ``system``: throughput (by step), GPU utilization and memory (one line per GPU), or
   without GPUs each node's CPU utilization and host memory (one line per node), by elapsed
   time, with their legends beside the plot, and the step time split into
   compute, data wait and communication (allreduce, or all-gather and reduce-scatter; by step);
3. ``cost``: goodput and cost plots, in a collapsed section (their numbers are in the header).

Everything else (checkpoint, energy, fault and ``train/*`` counters) is a number in the
header only.
"""

from __future__ import annotations

import re

__all__ = [
    "SECTION_TITLES",
    "STEP_SPLIT",
    "TOOL_PREFIXES",
    "cost_plot",
    "device_plot",
    "device_series",
    "is_user_metric",
    "throughput_key",
]

#: Metric families the tool writes; anything else is the user's own metric.
TOOL_PREFIXES = (
    "train/",
    "checkpoint/",
    "energy/",
    "goodput/",
    "badput/",
    "faults/",
    "cost/",
    "system/",
    "data/",
    "poc/",  # a proof of concept's stage figures: its report shows them
)
SECTION_TITLES = {
    "user": "metrics",
    "system": "throughput and devices",
    "cost": "goodput and cost",
}
#: ``{(plot id, has GPUs): (title, y axis label)}`` of the per-device plots, by elapsed time.
_DEVICE_PLOTS = {
    ("utilization", True): ("GPU utilization", "%"),
    ("memory", True): ("GPU memory used", "GiB"),
    ("utilization", False): ("CPU utilization per node (no GPUs)", "%"),
    ("memory", False): ("host memory used per node", "GiB"),
}
#: The step-time split's plot: ``(id, title)``; its parts (ms) come from ``train/step_time_s``
#: times ``train/data_wait_fraction`` and ``train/comm_fraction`` (compute is the rest).
STEP_SPLIT = ("step_split", "step time by part (ms)")
#: Cost and goodput series worth a plot (in the collapsed section), with their titles. The
#: recorder logs them once a second, at the tick of its clock (``ray_backend/derived.py``),
#: which a resume continues: their x axis is that running time, not a training step.
_COST_PLOTS = {
    "goodput/ettr": "ETTR (effective training time ratio)",
    "cost/usd": "cost so far",
    "cost/wasted_usd": "cost outside goodput (start-up, saves, failures)",
    "cost/rate_per_h": "burn rate (per hour)",
}
_GPU = re.compile(r"^system/(?P<node>.+)/(?P<dev>gpu\d+)/(?P<metric>utilization|memory_used_mb)$")
_HOST = re.compile(r"^system/(?P<node>.+)/(?P<metric>cpu_utilization|memory_used_mb)$")


def is_user_metric(key: str) -> bool:
    """Whether ``key`` is the training loop's own metric (not one of :data:`TOOL_PREFIXES`,
    also under a ``rank<r>/`` prefix)."""
    return not re.sub(r"^rank\d+/", "", key).startswith(TOOL_PREFIXES)


def throughput_key(keys) -> str | None:
    """The throughput series to plot: tokens/s when the job reports tokens, else samples/s."""
    keys = set(keys)
    for key in ("train/tokens_per_s", "train/samples_per_s"):
        if key in keys:
            return key
    return None


def cost_plot(key: str) -> str | None:
    """The title of ``key``'s plot in the collapsed cost section, or None (no plot)."""
    return _COST_PLOTS.get(key)


def device_plot(plot_id: str, has_gpus: bool) -> tuple[str, str]:
    """``(title, y axis label)`` of the per-device plot ``plot_id`` (``"utilization"`` or
    ``"memory"``, from :func:`device_series`): GPU plots on a job with GPUs, else the
    nodes' CPU and host memory, named as such. KeyError for another id."""
    return _DEVICE_PLOTS[(plot_id, has_gpus)]


def device_series(key: str, has_gpus: bool) -> tuple[str, str, float] | None:
    """``(plot id, line label, scale to the plot's unit)`` of a ``system/`` key, or None.

    With GPUs on the job (``has_gpus``) each GPU is a line (``node gpu0``) of the
    utilization (%) and memory (MB to GiB) plots; without, each node's CPU utilization and
    host memory are. The cluster aggregates (``system/cluster/...``) are not lines.
    """
    if key.startswith("system/cluster/"):
        return None
    gpu = _GPU.match(key)
    if gpu:
        if not has_gpus:
            return None
        label = f"{gpu['node']} {gpu['dev']}"
        if gpu["metric"] == "utilization":
            return "utilization", label, 1.0
        return "memory", label, 1 / 1024
    host = _HOST.match(key)
    if host is None or has_gpus:
        return None
    label = host["node"]
    if host["metric"] == "cpu_utilization":
        return "utilization", f"{label} CPU", 1.0
    return "memory", f"{label} host", 1 / 1024
