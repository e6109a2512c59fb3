"""Thresholds of a proof of concept: a TOML file of bounds, one per check.

A file names itself and bounds checks by name (the names of
:data:`~.checks.CHECKS`)::

    name = "H100 SXM x 8 (examples)"
    [thresholds]
    allreduce_busbw_gb_per_s = { min = 460.0, source = "Azure/azurehpc-health-checks ..." }
    recovery_mttr_s = { max = 600 }

Each bound has ``min`` or ``max`` (or both) and an optional ``source``. The shipped
files (``thresholds/cpu.toml``, ``h100.toml``, ``h200.toml``) are examples from cited
public figures; :func:`default_for` picks one from the accelerator's name. A check the
file does not bound is shown as measured, never as passed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import tomllib

from ..spec_values import SpecError

__all__ = ["Bound", "Thresholds", "default_for", "load"]

SHIPPED = Path(__file__).resolve().parent / "thresholds"


@dataclass(frozen=True)
class Bound:
    """``min`` and/or ``max`` for one check's value, and where the figure comes from."""

    min: float | None = None
    max: float | None = None
    source: str = ""

    def passes(self, value: float) -> bool:
        """True when ``value`` is within the bound (inclusive); NaN never passes."""
        if math.isnan(value):
            return False
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)

    def text(self, unit: str = "") -> str:
        """``">= 460"``, ``"<= 600"`` or ``"10 .. 20"``; shares (``unit`` ``"x"``) in percent."""

        def show(v: float) -> str:
            return f"{100 * v:g} %" if unit == "x" else f"{v:g}"

        if self.min is not None and self.max is not None:
            return f"{show(self.min)} .. {show(self.max)}"
        return f">= {show(self.min)}" if self.min is not None else f"<= {show(self.max)}"


@dataclass(frozen=True)
class Thresholds:
    """A file's ``name``, its ``path`` and its bounds by check name."""

    name: str
    path: str
    bounds: dict[str, Bound]


def _bound(check: str, value: object, path: Path) -> Bound:
    if not isinstance(value, dict) or not ({"min", "max"} & set(value)):
        raise SpecError(f"{path}: threshold {check} needs min or max, as {{ min = 1.0 }}.")
    try:
        low = None if value.get("min") is None else float(value["min"])
        high = None if value.get("max") is None else float(value["max"])
    except (TypeError, ValueError):
        raise SpecError(f"{path}: threshold {check} has a min or max that is no number.") from None
    return Bound(low, high, str(value.get("source", "")))


def load(path: str | Path, known: set[str] | None = None) -> Thresholds:
    """The thresholds of the TOML file at ``path``.

    Raises SpecError (one sentence) for a missing or unreadable file, a file without a
    ``[thresholds]`` table, a bound with neither ``min`` nor ``max``, or a check name
    not in ``known`` (when given), so a typo does not silently bound nothing.
    """
    path = Path(path).expanduser()
    try:
        data = tomllib.loads(path.read_text())
    except OSError as exc:
        raise SpecError(f"Cannot read the thresholds file {path}: {exc.strerror}.") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"The thresholds file {path} is not valid TOML: {exc}.") from None
    table = data.get("thresholds")
    if not isinstance(table, dict):
        raise SpecError(f"The thresholds file {path} has no [thresholds] table.")
    unknown = sorted(set(table) - known) if known is not None else []
    if unknown:
        raise SpecError(
            f"The thresholds file {path} bounds unknown checks: {', '.join(unknown)};"
            f" known: {', '.join(sorted(known))}."
        )
    bounds = {name: _bound(name, value, path) for name, value in table.items()}
    return Thresholds(str(data.get("name", path.stem)), str(path), bounds)


def default_for(device_name: str, accelerator: str) -> Path | None:
    """The shipped file for an accelerator: ``h200.toml`` for an H200, ``h100.toml`` for an
    H100, ``cpu.toml`` for CPU workers; None for anything else (measured, not passed)."""
    name = (device_name or "").upper()
    if accelerator == "cpu":
        return SHIPPED / "cpu.toml"
    for key in ("H200", "H100"):
        if key in name:
            return SHIPPED / f"{key.lower()}.toml"
    return None
