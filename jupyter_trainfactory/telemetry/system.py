"""Host (psutil) and GPU (NVML) readers: pure functions that return plain dicts.

Every NVML call is guarded: on a machine without an NVIDIA driver the GPU readers
return nothing, and no fake 0 % is ever reported (the lesson of jupyterlab-nvdashboard).
"""

from __future__ import annotations

from typing import Any

__all__ = ["gpu_sample", "host_sample", "nvml_handles"]


def host_sample(psutil_module: Any) -> dict[str, float]:
    """CPU utilization (%, all cores, since the previous call) and memory in use (MB).

    The first ``cpu_percent`` call of a process returns 0.0 by psutil's definition;
    callers discard that first sample.
    """
    mem = psutil_module.virtual_memory()
    return {
        "cpu_utilization": float(psutil_module.cpu_percent(interval=None)),
        "memory_used_mb": (mem.total - mem.available) / 2**20,
    }


def nvml_handles(pynvml: Any) -> list[Any]:
    """Handles of this node's GPUs, or ``[]`` when NVML is missing or has no device."""
    try:
        pynvml.nvmlInit()
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no GPU here
        return []


def gpu_sample(pynvml: Any, handle: Any) -> dict[str, float]:
    """One GPU's utilization (%), memory in use (MB) and power draw (W).

    Values NVML cannot read on this device are left out rather than reported as 0.
    Sources: NVML ``nvmlDeviceGetUtilizationRates`` (percent of the last sample
    period a kernel ran), ``nvmlDeviceGetMemoryInfo`` (bytes), ``nvmlDeviceGetPowerUsage`` (mW).
    """
    readers = {
        "utilization": lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        "memory_used_mb": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20,
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
    }
    out: dict[str, float] = {}
    for key, read in readers.items():
        try:
            out[key] = read()
        except Exception:  # NVMLError_NotSupported etc.: leave the value out
            continue
    return out
