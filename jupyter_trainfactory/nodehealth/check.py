"""One health check's outcome, shared by the GPU, host and cross-node checks."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["FAIL", "NA", "NOT_AVAILABLE", "OK", "Check"]

OK, FAIL, NA = "ok", "fail", "n/a"
#: The detail of a check whose field NVML (or the host) cannot read: never a pass.
NOT_AVAILABLE = "not available on this device"


@dataclass(frozen=True)
class Check:
    """``name`` (e.g. ``"ecc_uncorrected"``), ``status`` (``"ok"``, ``"fail"`` or
    ``"n/a"``) and ``detail``: one sentence with the measured value."""

    name: str
    status: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Check:
        return cls(str(data["name"]), str(data["status"]), str(data.get("detail", "")))

    @classmethod
    def na(cls, name: str, what: str = "") -> Check:
        """A check whose field cannot be read: ``"n/a"``, "<what> not available on this
        device."""
        return cls(name, NA, f"{what + ': ' if what else ''}{NOT_AVAILABLE}.")
