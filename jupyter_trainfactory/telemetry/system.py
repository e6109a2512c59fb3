"""Host (psutil) and GPU (NVML) readers: pure functions over modules passed in.

The ``psutil`` and ``pynvml`` (nvidia-ml-py) modules are arguments, never imported
here, so this module imports on a machine without pynvml, Ray, MLflow or a GPU, and
tests can pass fakes.

Every NVML call is guarded on its own: a value NVML cannot read is reported as
``None`` ("unavailable"), never as a fake 0 (the lesson of jupyterlab-nvdashboard),
and a device NVML cannot describe is skipped rather than raising.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "GpuDevice",
    "gpu_sample",
    "host_sample",
    "init_nvml",
    "nvml_shutdown",
    "visible_gpus",
]

_MIB = 2**20
_FALLBACK = "sampling CPU and host memory only"


@dataclass(frozen=True)
class GpuDevice:
    """One GPU (or MIG instance) a process can see.

    ``label`` is the metric-key label: ``"gpu<nvml index>"`` for a full GPU and
    ``"gpu<parent index>-mig<k>"`` for a MIG device, ``k`` being the index under
    which ``nvmlDeviceGetMigDeviceHandleByIndex(parent, k)`` returns it.
    ``index`` is the NVML index of the physical GPU (the parent, for MIG);
    ``uuid`` comes from ``nvmlDeviceGetUUID`` (``"GPU-..."`` or ``"MIG-..."``);
    ``name`` from ``nvmlDeviceGetName`` (``""`` if unreadable); ``handle`` is the
    NVML device handle to pass to :func:`gpu_sample`.
    """

    label: str
    index: int
    uuid: str
    name: str
    mig: bool
    handle: Any = field(repr=False, compare=False)


def host_sample(psutil_module: Any) -> dict[str, float]:
    """CPU utilization and host memory, from psutil.

    Keys: ``cpu_utilization`` (%, all cores, since the previous call:
    ``psutil.cpu_percent(interval=None)``), ``memory_used_mb`` (MB of 2**20 bytes,
    ``virtual_memory().total - .available``) and ``memory_total_mb`` (MB,
    ``virtual_memory().total``).

    The first ``cpu_percent`` call of a process returns 0.0 by psutil's definition;
    callers discard that first sample.
    """
    mem = psutil_module.virtual_memory()
    return {
        "cpu_utilization": float(psutil_module.cpu_percent(interval=None)),
        "memory_used_mb": (mem.total - mem.available) / _MIB,
        "memory_total_mb": mem.total / _MIB,
    }


def _error_class(pynvml: Any, name: str) -> type[BaseException] | tuple[()]:
    """``pynvml.<name>`` if it is an exception class, else ``()`` (matches nothing)."""
    cls = getattr(pynvml, name, None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else ()


def init_nvml(pynvml: Any) -> str | None:
    """Initialise NVML (``nvmlInit``).

    Returns ``None`` on success; otherwise one sentence for the job log and the
    dashboard saying why GPU metrics are missing, e.g. ``"NVML unavailable (NVML
    shared library not found): sampling CPU and host memory only."``. ``pynvml``
    may be ``None`` (nvidia-ml-py not installed). Never raises.
    """
    if pynvml is None:
        reason = "the nvidia-ml-py package (module pynvml) is not installed"
    else:
        try:
            pynvml.nvmlInit()
            return None
        except _error_class(pynvml, "NVMLError_LibraryNotFound"):
            reason = "NVML shared library not found"
        except _error_class(pynvml, "NVMLError_DriverNotLoaded"):
            reason = "NVIDIA driver not loaded"
        except Exception as exc:  # any other NVMLError, or a broken binding
            try:
                detail = str(exc).strip().rstrip(".")
            except Exception:  # NVMLError.__str__ itself may call into NVML
                detail = ""
            reason = detail or type(exc).__name__
    return f"NVML unavailable ({reason}): {_FALLBACK}."


def nvml_shutdown(pynvml: Any) -> None:
    """``nvmlShutdown``, guarded: never raises (also fine when ``pynvml`` is None)."""
    if pynvml is None:
        return
    _try(lambda: pynvml.nvmlShutdown())  # not initialised, library gone, ...: nothing to release


def _text(value: Any) -> str:
    """nvidia-ml-py returns str in recent versions, bytes in old ones."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _try(read: Callable[[], Any]) -> Any:
    """``read()``, or ``None`` if it raises (NVML errors and anything else)."""
    try:
        return read()
    except Exception:
        return None


@dataclass
class _Physical:
    """One physical GPU as NVML enumerates it, with its MIG devices if MIG is on."""

    device: GpuDevice
    migs: list[GpuDevice] | None  # None: MIG mode not enabled

    def visible(self) -> list[GpuDevice]:
        """What CUDA exposes for this GPU: its MIG devices when MIG is on, else itself."""
        return [self.device] if self.migs is None else list(self.migs)


def _mig_devices(pynvml: Any, index: int, parent: Any) -> list[GpuDevice]:
    """MIG devices of a MIG-enabled GPU, from ``nvmlDeviceGetMaxMigDeviceCount`` and
    ``nvmlDeviceGetMigDeviceHandleByIndex``; empty slots (NVMLError_NotFound) and
    handles whose UUID cannot be read are skipped."""
    count = _try(lambda: int(pynvml.nvmlDeviceGetMaxMigDeviceCount(parent))) or 0
    out: list[GpuDevice] = []
    for k in range(count):
        handle = _try(lambda k=k: pynvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k))
        described = _describe(pynvml, handle)
        if described is None:
            continue
        uuid, name = described
        out.append(GpuDevice(f"gpu{index}-mig{k}", index, uuid, name, True, handle))
    return out


def _describe(pynvml: Any, handle: Any) -> tuple[str, str] | None:
    """``(uuid, name)`` of a device handle; None without a handle or a readable UUID."""
    if handle is None:
        return None
    uuid = _try(lambda: _text(pynvml.nvmlDeviceGetUUID(handle)))
    if not uuid:
        return None
    return uuid, _try(lambda: _text(pynvml.nvmlDeviceGetName(handle))) or ""


def _inventory(pynvml: Any) -> tuple[int, dict[int, _Physical]]:
    """(``nvmlDeviceGetCount``, readable GPUs by NVML index). A GPU whose handle or
    UUID NVML cannot read is left out of the dict but still counted."""
    count = _try(lambda: int(pynvml.nvmlDeviceGetCount())) or 0
    mig_enable = getattr(pynvml, "NVML_DEVICE_MIG_ENABLE", 1)
    gpus: dict[int, _Physical] = {}
    for i in range(count):
        handle = _try(lambda i=i: pynvml.nvmlDeviceGetHandleByIndex(i))
        described = _describe(pynvml, handle)
        if described is None:
            continue
        uuid, name = described
        # nvmlDeviceGetMigMode -> [current, pending]; NotSupported on GPUs without MIG.
        mode = _try(lambda h=handle: pynvml.nvmlDeviceGetMigMode(h))
        mig_on = mode is not None and mode[0] == mig_enable
        gpus[i] = _Physical(
            GpuDevice(f"gpu{i}", i, uuid, name, False, handle),
            _mig_devices(pynvml, i, handle) if mig_on else None,
        )
    return count, gpus


def _by_uuid_prefix(candidates: list[GpuDevice], prefix: str) -> GpuDevice | None:
    """The one candidate whose UUID starts with ``prefix``; None if none or ambiguous."""
    matches = [d for d in candidates if d.uuid.startswith(prefix)]
    return matches[0] if len(matches) == 1 else None


_ORDINAL = re.compile(r"\+?(\d+)")


def visible_gpus(pynvml: Any, cuda_visible_devices: str | None) -> list[GpuDevice]:
    """The GPUs a process with this ``CUDA_VISIBLE_DEVICES`` sees, in CUDA's order.

    Call after a successful :func:`init_nvml`. Rules (those of CUDA, as mirrored by
    ``torch.cuda._parse_visible_devices``):

    * ``None`` (unset): every GPU by NVML index; a GPU with MIG mode enabled
      (``nvmlDeviceGetMigMode`` current mode ``NVML_DEVICE_MIG_ENABLE``) stands for
      its MIG devices instead of itself (none, if no MIG instance was created).
    * Comma-separated entries, whitespace around each ignored, kind set by the first:
      integers are NVML indices (this assumes ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so
      that the CUDA index equals the NVML index; CUDA's default FASTEST_FIRST order
      may differ on mixed-GPU nodes); as in CUDA (strtoul) leading digits count,
      so ``"1gpu"`` is 1. ``"GPU-<uuid>"`` may be a unique prefix of a GPU UUID
      (``nvmlDeviceGetUUID``); ``"MIG-<uuid>"`` likewise among the MIG devices
      (``nvmlDeviceGetMaxMigDeviceCount`` + ``nvmlDeviceGetMigDeviceHandleByIndex``).
      A GPU named by index or ``GPU-`` UUID that has MIG enabled stands for its
      MIG devices, as in the unset case.
    * The first invalid entry (not of the first entry's kind, negative such as
      ``"-1"``, ``"NoDevFiles"``, empty, out of range, no or ambiguous UUID match)
      ends the list; later entries are ignored. ``""`` therefore gives ``[]``.
    * A device named twice makes CUDA see no device: ``[]``.

    Never raises: a device NVML cannot read (handle or UUID) is skipped, and if
    NVML cannot count devices the result is ``[]``.
    """
    if cuda_visible_devices is None:
        _, gpus = _inventory(pynvml)
        return [d for i in sorted(gpus) for d in gpus[i].visible()]

    entries = [e.strip() for e in cuda_visible_devices.split(",")]
    first = entries[0]
    kind = "GPU-" if first.startswith("GPU-") else "MIG-" if first.startswith("MIG-") else ""
    if not kind and not _ORDINAL.match(first):
        return []  # "", "-1", "NoDevFiles", ...: no device, and no NVML call needed

    count, gpus = _inventory(pynvml)
    physical = [gpus[i].device for i in sorted(gpus)]
    migs = [m for i in sorted(gpus) for m in (gpus[i].migs or [])]
    chosen: list[GpuDevice] = []
    seen: set[str] = set()  # UUIDs of the named devices, to catch repeats
    for entry in entries:
        if kind == "":
            match = _ORDINAL.match(entry)
            if match is None or int(match.group(1)) >= count:
                break
            index = int(match.group(1))
            if index not in gpus:  # exists but NVML cannot read it: skip
                continue
            named: GpuDevice | None = gpus[index].device
        elif not entry.startswith(kind):
            break
        elif kind == "GPU-":
            named = _by_uuid_prefix(physical, entry)
        else:
            named = _by_uuid_prefix(migs, entry)
        if named is None:
            break
        if named.uuid in seen:
            return []
        seen.add(named.uuid)
        chosen.extend(gpus[named.index].visible() if not named.mig else [named])
    return chosen


def gpu_sample(pynvml: Any, handle: Any) -> dict[str, float | None]:
    """One GPU's (or MIG device's) current readings; ``None`` where NVML cannot read.

    Keys, units and sources:

    * ``utilization``: % of the last sample period in which a kernel ran
      (``nvmlDeviceGetUtilizationRates(h).gpu``; NotSupported on MIG devices).
    * ``memory_used_mb``, ``memory_total_mb``: MB of 2**20 bytes
      (``nvmlDeviceGetMemoryInfo(h).used`` / ``.total``, bytes / 2**20).
    * ``power_w``: W (``nvmlDeviceGetPowerUsage(h)``, mW / 1000).
    * ``temperature_c``: °C (``nvmlDeviceGetTemperature(h, NVML_TEMPERATURE_GPU)``).
    * ``sm_clock_mhz``: MHz (``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)``).

    Every call is guarded on its own: a value NVML cannot read (NotSupported on
    MIG, power on some boards, ...) is ``None`` and the others are still read.
    Never a fake 0; never raises.
    """

    mem = _try(lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    readers: dict[str, Callable[[], float]] = {
        "utilization": lambda: float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
        "memory_used_mb": lambda: mem.used / _MIB,
        "memory_total_mb": lambda: mem.total / _MIB,
        "power_w": lambda: pynvml.nvmlDeviceGetPowerUsage(handle) / 1000.0,
        "temperature_c": lambda: float(
            pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU)
        ),
        "sm_clock_mhz": lambda: float(pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM)),
    }
    return {key: _try(read) for key, read in readers.items()}
