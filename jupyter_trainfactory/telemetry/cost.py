"""Cost metering: what a job's held resources cost, and how much of that went to waste.

Pure Python: a price catalog, the resources a job held and when, and the goodput
timeline (:mod:`.goodput`) in; money out.

Cost accrues while resources are held, from the moment a job's workers hold their
accelerators (or CPUs) until they are released, whatever the workers do meanwhile:
idle, recovering or training, that is what a cluster bills (cloud instances are billed
per second of allocation, not of use). Each held second is attributed to the goodput
category it fell in, so the cost of goodput is the productive cost and the cost of
each badput category (wasted progress, infrastructure recovery, checkpoint restore, ...)
is money lost to it: "this failure cost $X".

Units: prices per accelerator-hour, per vCPU-hour, per GiB-hour of host memory, per
GB-month of storage (a month is 730 hours, the convention of AWS and Google Cloud
pricing pages: 24 x 365 / 12) and per GB of network egress; GB = 1e9 bytes, GiB = 2**30.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .goodput import Segment

__all__ = [
    "BUDGET_WARN_FRACTION",
    "EXAMPLE_CATALOG",
    "HOURS_PER_MONTH",
    "AcceleratorPrice",
    "Allocation",
    "Cost",
    "PriceCatalog",
    "StorageSample",
    "hourly_rate",
    "meter",
    "projected_cost",
    "money",
    "storage_cost",
]

#: The dashboard warns when a job has spent this share of its budget.
BUDGET_WARN_FRACTION = 0.8
#: Hours in a billing month (24 x 365 / 12), as AWS and Google Cloud price storage.
HOURS_PER_MONTH = 730.0
_GB = 1e9
_GIB = 2.0**30


@dataclass(frozen=True)
class AcceleratorPrice:
    """Price of one accelerator for one hour: ``on_demand``, and ``spot`` (preemptible
    capacity) when the catalog knows it (None: spot is billed at the on-demand price)."""

    on_demand: float
    spot: float | None = None


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", name.lower().replace("nvidia", "")).strip()


@dataclass(frozen=True)
class PriceCatalog:
    """Prices the meter uses (see the module docstring for units).

    Attributes
    ----------
    version : str
        Recorded with every cost (tag ``trainfactory.cost.catalog``).
    currency : str
        ISO 4217 code of every price.
    accelerators : mapping of str to AcceleratorPrice
        Accelerator type (as the device reports its name, e.g. ``"H100 SXM"``) to price;
        a device name matches the longest key all of whose words it contains.
    fallback : str
        The key used for an accelerator the catalog does not list (with a warning,
        never silently zero).
    cpu_vcpu_hour, memory_gib_hour : float
        Host CPU and memory, charged for workers without accelerators (an accelerator's
        price covers its share of the host, as cloud GPU instance prices do).
    storage_gb_month, egress_gb : float
        Checkpoint storage and network egress.
    example : bool
        True for the shipped example prices: results say so.
    """

    version: str
    currency: str = "USD"
    accelerators: Mapping[str, AcceleratorPrice] = field(default_factory=dict)
    fallback: str = ""
    cpu_vcpu_hour: float = 0.0
    memory_gib_hour: float = 0.0
    storage_gb_month: float = 0.0
    egress_gb: float = 0.0
    example: bool = False

    def __post_init__(self) -> None:
        numbers = {
            "cpu_vcpu_hour": self.cpu_vcpu_hour,
            "memory_gib_hour": self.memory_gib_hour,
            "storage_gb_month": self.storage_gb_month,
            "egress_gb": self.egress_gb,
        }
        for name, price in self.accelerators.items():
            numbers[f"accelerators.{name}.on_demand"] = price.on_demand
            if price.spot is not None:
                numbers[f"accelerators.{name}.spot"] = price.spot
        for name, value in numbers.items():
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value < 0:
                raise ValueError(f"price {name} must be a number of at least 0, got {value!r}.")
        if not re.fullmatch(r"[A-Z]{3}", self.currency):
            raise ValueError(
                f"currency must be an ISO 4217 code such as USD, got {self.currency!r}."
            )
        if self.accelerators and self.fallback not in self.accelerators:
            raise ValueError(
                f"fallback {self.fallback!r} is not one of the catalog's accelerators"
                f" ({', '.join(sorted(self.accelerators))})."
            )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PriceCatalog:
        """A catalog from a dict shaped like the TOML file (see :meth:`load`).

        Raises ValueError, one sentence, for a missing version, an unknown field or a
        price that is not a number of at least 0."""
        data = dict(data)
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown catalog field {unknown[0]!r}; fields: {sorted(known)}.")
        if not data.get("version"):
            raise ValueError("a price catalog needs a version (any string, recorded with costs).")
        accelerators = {}
        for name, price in dict(data.pop("accelerators", {}) or {}).items():
            if isinstance(price, Mapping):
                accelerators[str(name)] = AcceleratorPrice(
                    price.get("on_demand"), price.get("spot")
                )
            else:
                accelerators[str(name)] = AcceleratorPrice(price)
        return cls(accelerators=accelerators, **data)

    @classmethod
    def load(cls, path: str | Path) -> PriceCatalog:
        """Read a TOML catalog::

            version = "acme-2026-11"
            currency = "EUR"
            fallback = "H100"
            cpu_vcpu_hour = 0.04
            memory_gib_hour = 0.005
            storage_gb_month = 0.02
            egress_gb = 0.08
            [accelerators]
            "H100" = { on_demand = 2.9, spot = 1.1 }
            "L4" = 0.6

        Raises ValueError (one sentence) for a file that is not valid TOML or not a
        valid catalog, FileNotFoundError for a missing file."""
        try:
            import tomllib
        except ModuleNotFoundError:  # Python 3.10
            import tomli as tomllib

        path = Path(path).expanduser()
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ValueError(f"{path} is not valid TOML: {exc}.") from exc
        try:
            return cls.from_dict(data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: {exc}") from exc

    def accelerator_price(self, name: str, spot: bool = False) -> tuple[float, str]:
        """Hourly price of one accelerator named ``name`` and a warning ("" when none).

        The longest catalog key whose words all appear in the device name wins
        (``"H100 SXM"`` over ``"H100"``); an unknown name takes the ``fallback`` price
        with a warning naming both."""
        words = set(_norm(name).split())
        matches = [k for k in self.accelerators if set(_norm(k).split()) <= words and _norm(k)]
        warning = ""
        if matches:
            key = max(matches, key=lambda k: len(_norm(k)))
        elif self.fallback:
            key = self.fallback
            warning = (
                f"no price for accelerator {name!r} in catalog {self.version}; "
                f"charged as {self.fallback}"
            )
        else:
            raise ValueError(f"catalog {self.version} has no accelerator prices.")
        price = self.accelerators[key]
        if spot and price.spot is not None:
            return price.spot, warning
        return price.on_demand, warning


#: Shipped example prices: round figures of the order of public cloud GPU list prices
#: (per GPU-hour on demand, 2025), NOT a quote for any provider. Give your own catalog
#: (``--price-catalog``, or ``prices.toml`` in the state directory) for real figures.
EXAMPLE_CATALOG = PriceCatalog(
    version="example-2026-11",
    currency="USD",
    accelerators={
        "B200": AcceleratorPrice(6.00, 2.50),
        "H200": AcceleratorPrice(4.00, 1.60),
        "H100": AcceleratorPrice(3.00, 1.20),
        "A100": AcceleratorPrice(1.80, 0.70),
        "L40S": AcceleratorPrice(1.20, 0.50),
        "A10": AcceleratorPrice(0.90, 0.35),
        "L4": AcceleratorPrice(0.70, 0.28),
        "V100": AcceleratorPrice(0.90, 0.35),
        "T4": AcceleratorPrice(0.35, 0.15),
    },
    fallback="H100",
    cpu_vcpu_hour=0.04,
    memory_gib_hour=0.005,
    storage_gb_month=0.023,
    egress_gb=0.09,
    example=True,
)


@dataclass(frozen=True)
class Allocation:
    """Resources a job held from ``start`` to ``end`` (s since the epoch; None: still
    held). ``accelerators`` of ``accelerator_type`` (0 for CPU workers), ``vcpus`` and
    ``memory_gib`` of host; ``spot`` for preemptible capacity."""

    start: float
    end: float | None
    accelerators: float = 0.0
    accelerator_type: str = ""
    vcpus: float = 0.0
    memory_gib: float = 0.0
    spot: bool = False


@dataclass(frozen=True)
class StorageSample:
    """From ``time`` (s since the epoch) on, the job keeps ``bytes`` of checkpoints."""

    time: float
    bytes: float


def hourly_rate(allocation: Allocation, catalog: PriceCatalog) -> tuple[float, str]:
    """What ``allocation`` costs per hour under ``catalog``, and a price warning ("")."""
    if allocation.accelerators > 0:
        price, warning = catalog.accelerator_price(allocation.accelerator_type, allocation.spot)
        return allocation.accelerators * price, warning
    host = allocation.vcpus * catalog.cpu_vcpu_hour
    return host + allocation.memory_gib * catalog.memory_gib_hour, ""


@dataclass
class Cost:
    """A job's cost so far, in ``currency``.

    ``compute`` is the held resources' cost, split by goodput category in
    ``by_category`` (``goodput`` is the productive part, the others are wasted);
    ``storage`` and ``egress`` are not split. ``rate_per_h`` is the burn rate of the
    resources held at the end of the metered window."""

    currency: str
    catalog: str
    example: bool
    compute: float
    storage: float
    egress: float
    accelerator_hours: float
    by_category: dict[str, float]
    rate_per_h: float
    warnings: list[str] = field(default_factory=list)
    vcpu_hours: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.storage + self.egress

    @property
    def productive(self) -> float:
        return self.by_category.get("goodput", 0.0)

    @property
    def wasted(self) -> float:
        """Compute spent outside goodput: startup, recovery, wasted progress, ..."""
        return self.compute - self.productive

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: ``cost/usd`` (the total, in the catalog's currency despite the
        name, which is the field's usual one; the tag ``trainfactory.cost.currency`` says
        which), ``cost/accelerator_hours``, ``cost/vcpu_hours`` (host vCPUs of CPU
        workers, held; an accelerator job's host is in its accelerator's price), ``cost/wasted_usd``, ``cost/storage_usd``,
        ``cost/rate_per_h`` and ``cost/<category>_usd`` for each category with a cost."""
        out = {
            "cost/usd": self.total,
            "cost/accelerator_hours": self.accelerator_hours,
            "cost/vcpu_hours": self.vcpu_hours,
            "cost/wasted_usd": self.wasted,
            "cost/storage_usd": self.storage,
            "cost/rate_per_h": self.rate_per_h,
        }
        out.update({f"cost/{k}_usd": v for k, v in self.by_category.items() if v})
        return out


def _overlap(a: float, b: float, lo: float, hi: float) -> float:
    return max(0.0, min(b, hi) - max(a, lo))


def meter(
    segments: Sequence[Segment],
    allocations: Sequence[Allocation],
    catalog: PriceCatalog,
    until: float,
    storage: Sequence[StorageSample] = (),
    egress_bytes: float = 0.0,
) -> Cost:
    """Meter a job up to ``until`` (s since the epoch).

    Parameters
    ----------
    segments : sequence of Segment
        The goodput timeline (:attr:`.goodput.Goodput.segments`): which category each
        second of the job fell in.
    allocations : sequence of Allocation
        What the job held and when; an open one (``end`` None) runs to ``until``.
    catalog : PriceCatalog
    until : float
        End of the metered window (the job's end, or now).
    storage : sequence of StorageSample
        Checkpoint bytes kept over time, in time order (a step function).
    egress_bytes : float
        Bytes sent out of the cluster's network, where known.

    Returns
    -------
    Cost
        ``sum(by_category.values()) == compute`` up to float rounding when the segments
        cover every held second; held time outside every segment is put under ``other``.
    """
    compute = 0.0
    gpu_hours = vcpu_hours = 0.0
    by_category: dict[str, float] = {}
    warnings: list[str] = []
    rate_now = 0.0
    for alloc in allocations:
        end = min(until, alloc.end if alloc.end is not None else until)
        if end <= alloc.start:
            continue
        rate, warning = hourly_rate(alloc, catalog)
        if warning and warning not in warnings:
            warnings.append(warning)
        held = end - alloc.start
        compute += rate * held / 3600.0
        gpu_hours += alloc.accelerators * held / 3600.0
        vcpu_hours += alloc.vcpus * held / 3600.0
        if alloc.end is None or alloc.end >= until:
            rate_now += rate
        placed = 0.0
        for seg in segments:
            seconds = _overlap(seg.start, seg.end, alloc.start, end)
            if seconds:
                by_category[seg.category] = (
                    by_category.get(seg.category, 0.0) + rate * seconds / 3600
                )
                placed += seconds
        if held - placed > 1e-9:
            rest = rate * (held - placed) / 3600
            by_category["other"] = by_category.get("other", 0.0) + rest
    stored_gb_s = 0.0
    samples = sorted(storage, key=lambda s: s.time)
    for i, sample in enumerate(samples):
        stop = min(samples[i + 1].time, until) if i + 1 < len(samples) else until
        stored_gb_s += sample.bytes / _GB * max(0.0, stop - sample.time)
    storage_cost = stored_gb_s / (HOURS_PER_MONTH * 3600.0) * catalog.storage_gb_month
    return Cost(
        currency=catalog.currency,
        catalog=catalog.version,
        example=catalog.example,
        compute=compute,
        storage=storage_cost,
        egress=egress_bytes / _GB * catalog.egress_gb,
        accelerator_hours=gpu_hours,
        by_category=by_category,
        rate_per_h=rate_now,
        warnings=warnings,
        vcpu_hours=vcpu_hours,
    )


def projected_cost(
    cost_so_far: float, rate_per_h: float, step: float, target_step: float, steps_per_s: float
) -> float | None:
    """Cost at ``target_step`` if the job goes on at ``steps_per_s`` and ``rate_per_h``:
    ``cost_so_far + rate_per_h * (target_step - step) / steps_per_s / 3600``. None when
    the step rate is unknown (not above 0)."""
    if steps_per_s <= 0:
        return None
    remaining_s = max(0.0, target_step - step) / steps_per_s
    return cost_so_far + rate_per_h * remaining_s / 3600.0


def storage_cost(history: Sequence[Sequence[float]], price_gb_month: float, until: float) -> float:
    """Cost of keeping checkpoints after a job: ``history`` is ``[[time, bytes], ...]``
    (from ``time`` on, ``bytes`` are kept; times in s since the epoch, ascending), priced
    at ``price_gb_month`` per GB (1e9 bytes) per month of :data:`HOURS_PER_MONTH` hours,
    up to ``until``. The storage part of a cost report; ``%train gc`` appends a point."""
    total = 0.0
    for i, (start, nbytes) in enumerate(history):
        end = history[i + 1][0] if i + 1 < len(history) else until
        hours = max(0.0, min(end, until) - start) / 3600.0
        total += nbytes / _GB * price_gb_month * hours / HOURS_PER_MONTH
    return total


#: The smallest amount :func:`money` writes out; below it, ``"<0.000001"``.
MONEY_FLOOR = 1e-6


def money(amount: float) -> str:
    """An amount for people: to the cent (``1,234.50``), or to 2 significant digits when it
    is less than a cent (``0.00071``, ``0.000081``; never ``8.1e-05``), so a small CPU job
    does not read as free; ``"<0.000001"`` below :data:`MONEY_FLOOR`."""
    if amount == 0 or abs(amount) >= 0.01:
        return f"{amount:,.2f}"
    if abs(amount) < MONEY_FLOOR:
        return f"<{MONEY_FLOOR:.6f}"
    decimals = 1 - math.floor(math.log10(abs(amount)))
    return f"{amount:.{decimals}f}"
