"""NVML health checks of one node's GPUs: pure functions over the ``pynvml`` module.

``pynvml`` (nvidia-ml-py) is an argument, never imported here (as in
:mod:`~jupyter_trainfactory.telemetry.system`, whose ``init_nvml`` and GPU inventory this
reuses), so the checks are tested against a fake NVML. Every read is guarded on its own:
a field NVML does not have on this device (``NVMLError_NotSupported``,
``NVMLError_FunctionNotFound``, ``NVMLError_NoPermission``, or a function this
nvidia-ml-py lacks) gives status ``"n/a"``, "not available on this device", never
``"ok"``; any other NVML error on a read fails the check with the error's name.

Sources: NVIDIA's NVML API reference (docs.nvidia.com/deploy/nvml-api/), "Device Queries"
(ECC, retired pages, row remapper, PCIe, clocks event reasons) and "System Queries"
(driver version).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..telemetry.system import _inventory, _text, _try, init_nvml, nvml_shutdown
from .check import FAIL, NA, OK, Check

__all__ = ["THROTTLE_FAILS", "device_checks", "gpu_checks"]

#: Clock event (throttle) reasons that fail the check: the hardware or the driver holds
#: the clocks down for heat or power, so the GPU runs slower than its peers. Names are
#: nvidia-ml-py's (``nvmlClocksEventReason*``, the older ``nvmlClocksThrottleReason*``
#: carry the same bits). Idle, application-clock, power-cap and sync-boost reasons are
#: normal operation and do not fail.
THROTTLE_FAILS = {
    "HwSlowdown": "HW slowdown",
    "HwThermalSlowdown": "HW thermal slowdown",
    "SwThermalSlowdown": "SW thermal slowdown",
    "HwPowerBrakeSlowdown": "HW power brake",
}
_NA_ERRORS = ("NVMLError_NotSupported", "NVMLError_FunctionNotFound", "NVMLError_NoPermission")


class _NotAvailable(Exception):
    """The field is not there on this device (or in this nvidia-ml-py)."""


def _call(pynvml: Any, function: str, *args: Any) -> Any:
    """``pynvml.<function>(*args)``; raises _NotAvailable when NVML lacks the field."""
    fn = getattr(pynvml, function, None)
    if fn is None:
        raise _NotAvailable(function)
    try:
        return fn(*args)
    except Exception as exc:
        if any(isinstance(exc, c) for c in _classes(pynvml, _NA_ERRORS)):
            raise _NotAvailable(function) from exc
        raise


def _classes(pynvml: Any, names: tuple[str, ...]) -> list[type]:
    found = (getattr(pynvml, n, None) for n in names)
    return [c for c in found if isinstance(c, type) and issubclass(c, BaseException)]


def _guarded(name: str, what: str, check: Callable[[], Check]) -> Check:
    """``check()``, or n/a when a field is missing, or fail naming the NVML error."""
    try:
        return check()
    except _NotAvailable:
        return Check.na(name, what)
    except Exception as exc:
        return Check(name, FAIL, f"{what}: NVML could not read it ({type(exc).__name__}).")


def _ecc(pynvml: Any, h: Any) -> Check:
    def read() -> Check:
        kind = getattr(pynvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", None)
        counter = getattr(pynvml, "NVML_VOLATILE_ECC", None)
        if kind is None or counter is None:
            raise _NotAvailable("ECC constants")
        n = int(_call(pynvml, "nvmlDeviceGetTotalEccErrors", h, kind, counter))
        status = FAIL if n > 0 else OK
        return Check(
            "ecc_uncorrected", status, f"{n} uncorrected ECC errors since the driver loaded."
        )

    return _guarded("ecc_uncorrected", "uncorrected ECC errors", read)


def _memory_repair(pynvml: Any, h: Any) -> Check:
    """Row remapping (A100 and later); retired pages pending where remapping is absent."""
    try:
        corr, unc, pending, failure = _call(pynvml, "nvmlDeviceGetRemappedRows", h)
    except _NotAvailable:
        return _guarded("retired_pages", "retired pages pending", lambda: _retired(pynvml, h))
    except Exception as exc:
        return Check(
            "row_remap", FAIL, f"row remapping: NVML could not read it ({type(exc).__name__})."
        )
    bad = bool(pending) or bool(failure)
    detail = (
        f"{int(corr)} correctable and {int(unc)} uncorrectable rows remapped,"
        f" remap pending {'yes' if pending else 'no'}, remap failure {'yes' if failure else 'no'}"
        + ("; reset the GPU (pending) or replace it (failure)." if bad else ".")
    )
    return Check("row_remap", FAIL if bad else OK, detail)


def _retired(pynvml: Any, h: Any) -> Check:
    pending = int(_call(pynvml, "nvmlDeviceGetRetiredPagesPendingStatus", h))
    enabled = getattr(pynvml, "NVML_FEATURE_ENABLED", 1)
    if pending == enabled:
        return Check("retired_pages", FAIL, "retired pages are pending: reset the GPU.")
    return Check("retired_pages", OK, "no retired pages pending.")


def _throttle(pynvml: Any, h: Any) -> Check:
    def read() -> Check:
        newer = getattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons", None) is not None
        function, prefix = (
            ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlClocksEventReason")
            if newer
            else ("nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlClocksThrottleReason")
        )
        mask = int(_call(pynvml, function, h))
        hits = [
            text
            for name, text in THROTTLE_FAILS.items()
            if getattr(pynvml, prefix + name, None) and mask & getattr(pynvml, prefix + name)
        ]
        if hits:
            return Check(
                "throttle", FAIL, f"clocks held down now by {', '.join(hits)} (mask {mask:#x})."
            )
        return Check("throttle", OK, f"no thermal or power slowdown now (mask {mask:#x}).")

    return _guarded("throttle", "clock throttle reasons", read)


def _pcie(pynvml: Any, h: Any) -> Check:
    """Current PCIe link vs the maximum of the device and system
    (``nvmlDeviceGetMaxPcieLink*``). NVML's docs note the current link may be lower when
    the GPU is idle (it downshifts to save power), so a fail at idle is worth a second
    look under load before the node is blamed."""

    def read() -> Check:
        width = int(_call(pynvml, "nvmlDeviceGetCurrPcieLinkWidth", h))
        gen = int(_call(pynvml, "nvmlDeviceGetCurrPcieLinkGeneration", h))
        max_width = int(_call(pynvml, "nvmlDeviceGetMaxPcieLinkWidth", h))
        max_gen = int(_call(pynvml, "nvmlDeviceGetMaxPcieLinkGeneration", h))
        link = f"PCIe gen{gen} x{width} of gen{max_gen} x{max_width}"
        if width < max_width or gen < max_gen:
            return Check(
                "pcie_link",
                FAIL,
                f"{link}: below the maximum (an idle GPU may downshift its link, per NVIDIA's"
                " NVML docs; check again under load).",
            )
        return Check("pcie_link", OK, f"{link}.")

    return _guarded("pcie_link", "PCIe link", read)


def device_checks(pynvml: Any, handle: Any, name: str) -> list[Check]:
    """Every check of one GPU, in table order: model name, uncorrected ECC errors, row
    remapping (or retired pages), clock throttle reasons, PCIe link."""
    model = Check("model", OK, f"{name}.") if name else Check.na("model", "model name")
    return [
        model,
        _ecc(pynvml, handle),
        _memory_repair(pynvml, handle),
        _throttle(pynvml, handle),
        _pcie(pynvml, handle),
    ]


def gpu_checks(pynvml: Any) -> dict[str, Any]:
    """One node's GPU checks, plain data (JSON-ready).

    Returns ``{"nvml": Check-dict, "driver": str or None (``nvmlSystemGetDriverVersion``),
    "driver_check": Check-dict, "gpu_count": int or None,
    "gpus": [{"label": "gpu0", "uuid", "name", "checks": [Check-dict, ...]}, ...]}``.
    ``nvml`` is ok when ``nvmlInit`` works and NVML counts as many readable GPUs as it
    finds, fail when a GPU cannot be read, and n/a (no NVML: a CPU node, or no driver)
    with the reason; then ``gpu_count`` is None and ``gpus`` empty. MIG is not split:
    each physical GPU is checked once. ``pynvml`` may be None. Never raises.
    """
    reason = init_nvml(pynvml)
    if reason is not None:
        why = reason.split(": sampling")[0]
        return {
            "nvml": Check("nvml", NA, f"{why}: {_na_text()}").to_dict(),
            "driver": None,
            "driver_check": Check.na("driver", "driver version").to_dict(),
            "gpu_count": None,
            "gpus": [],
        }
    try:
        count, found = _inventory(pynvml)
        driver = _try(lambda: _text(_call(pynvml, "nvmlSystemGetDriverVersion")))
        missing = count - len(found)
        nvml = (
            Check("nvml", FAIL, f"NVML counts {count} GPUs but cannot read {missing} of them.")
            if missing
            else Check("nvml", OK, f"NVML readable, {count} GPUs.")
        )
        gpus = [
            {
                "label": p.device.label,
                "uuid": p.device.uuid,
                "name": p.device.name,
                "checks": [
                    c.to_dict() for c in device_checks(pynvml, p.device.handle, p.device.name)
                ],
            }
            for _, p in sorted(found.items())
        ]
        return {
            "nvml": nvml.to_dict(),
            "driver": driver,
            "driver_check": (
                Check("driver", OK, f"driver {driver}.")
                if driver
                else Check.na("driver", "driver version")
            ).to_dict(),
            "gpu_count": count,
            "gpus": gpus,
        }
    finally:
        nvml_shutdown(pynvml)


def _na_text() -> str:
    return "GPU checks not available on this device."
