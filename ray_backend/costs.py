"""The running cost of one job (inside its RunRecorder): what it holds, keeps and may spend."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from jupyter_trainfactory.telemetry.cost import (
    Allocation,
    Cost,
    PriceCatalog,
    StorageSample,
    meter,
    projected_cost,
)
from jupyter_trainfactory.telemetry.goodput import Segment
from jupyter_trainfactory.tracking import TAG
from ray_backend.decisions import Decision

__all__ = ["STOP_ALLOWANCE_S", "CostMeter", "projected_spend"]

#: Seconds a graceful stop takes after its checkpoint (the driver ends the job, the
#: recorder writes the last points), while the resources are still held and billed.
STOP_ALLOWANCE_S = 10.0


def projected_spend(
    spent: float,
    rate_per_h: float,
    times: list[float],
    now: float,
    allowance_s: float = STOP_ALLOWANCE_S,
) -> float:
    """What a job will have spent (``spent``'s currency) at the checkpoint after its next
    one, plus ``allowance_s``, at ``rate_per_h`` (per hour): a graceful stop asked now
    ends at its next checkpoint, so this is the cost that stop can reach.

    ``times``: the job's start, then each checkpoint's time (s since the epoch); the next
    checkpoint is one interval (the last between two checkpoints; before two, the time
    since the start; at least 1 s) after the last, rolled past ``now``."""
    interval = max(1.0, times[-1] - times[-2] if len(times) >= 2 else now - times[0])
    next_at = times[-1] + interval
    if next_at < now:  # checkpoints came late: the next is due an interval on
        next_at += math.ceil((now - next_at) / interval) * interval
    ahead_s = next_at - now + interval + allowance_s
    return spent + rate_per_h * ahead_s / 3600.0


class CostMeter:
    """Meters a job from its first worker start to its end (see ``telemetry.cost``).

    The job holds ``workers x gpus_per_worker`` accelerators (or, for CPU workers,
    ``workers x cpus_per_worker`` vCPUs) from the first attempt's start until it ends,
    recoveries included: that is what a cluster bills. Checkpoint storage is the size of
    the ``keep_checkpoints`` newest checkpoints over time. ``before`` holds an earlier
    submission's ``cost/*`` metrics (a resume), added to this one's.

    Budget: with ``budget`` set, :meth:`over_budget` turns True, once, when the cost
    projected at the checkpoint after the next one, plus :data:`STOP_ALLOWANCE_S`, would
    exceed it (the interval between the last two checkpoints is the guess; before the
    first checkpoint, the time since the start), so a graceful stop requested then ends
    at the next checkpoint, within the budget.
    """

    def __init__(
        self,
        catalog: PriceCatalog,
        workers: int,
        gpus_per_worker: float,
        cpus_per_worker: float,
        keep_checkpoints: int = 2,
        spot: bool = False,
        budget: float | None = None,
        before: dict[str, float] | None = None,
    ):
        self.catalog = catalog
        self._workers = workers
        self._gpus = gpus_per_worker
        self._cpus = cpus_per_worker
        self._keep = keep_checkpoints
        self._spot = spot
        self.budget = budget
        self._before = dict(before or {})
        self._device = ""
        self._held: tuple[float, float | None] | None = None
        self._sizes: list[float] = []
        self._saved_at: list[float] = []
        self._storage: list[StorageSample] = []
        self._budget_hit = False
        self._rate_anchor: tuple[float, int] | None = None  # (time, step) of the first step

    def add_before(self, metrics: dict[str, float]) -> None:
        """``cost/*`` metrics of earlier submissions of the job (a resume)."""
        self._before.update(metrics)

    def started(self, now: float) -> None:
        """The workers hold their resources from ``now`` (the first call counts)."""
        if self._held is None:
            self._held = (now, None)

    def released(self, now: float) -> None:
        if self._held is not None and self._held[1] is None:
            self._held = (self._held[0], now)

    def device(self, name: str) -> None:
        """The accelerator type the workers report (``torch.cuda.get_device_name``)."""
        self._device = name

    def checkpoint(self, when: float, nbytes: float | None) -> None:
        """A checkpoint of ``nbytes`` was saved at ``when``; storage keeps the newest."""
        self._saved_at.append(when)
        if nbytes is None:
            return
        self._sizes.append(nbytes)
        self._storage.append(StorageSample(when, sum(self._sizes[-self._keep :])))

    def kept_bytes(self) -> float:
        """Bytes of the checkpoints storage keeps now (the newest ``keep_checkpoints``)."""
        return self._storage[-1].bytes if self._storage else 0.0

    def allocation(self) -> list[Allocation]:
        if self._held is None:
            return []
        start, end = self._held
        if self._gpus > 0:
            return [
                Allocation(start, end, self._workers * self._gpus, self._device, spot=self._spot)
            ]
        return [Allocation(start, end, vcpus=self._workers * self._cpus, spot=self._spot)]

    def cost(self, segments: Sequence[Segment], now: float) -> Cost:
        return meter(segments, self.allocation(), self.catalog, now, self._storage)

    def metrics(self, cost: Cost) -> dict[str, float]:
        """``Cost.metrics()`` plus what earlier submissions spent, and the budget share."""
        out = cost.metrics()
        for key, value in self._before.items():
            if key not in ("cost/rate_per_h", "cost/budget_fraction", "cost/projected_usd"):
                out[key] = out.get(key, 0.0) + value
        if self.budget:
            out["cost/budget_fraction"] = out["cost/usd"] / self.budget
        return out

    def tags(self, cost: Cost) -> dict[str, Any]:
        tags = {
            TAG.COST_CURRENCY: cost.currency,
            TAG.COST_CATALOG: cost.catalog
            + (" (example prices, not a quote)" if cost.example else ""),
            TAG.COST_WARNINGS: "; ".join(cost.warnings),
        }
        if self.budget:
            tags[TAG.COST_BUDGET] = f"{self.budget:g}"
        return tags

    def over_budget(self, spent: float, rate_per_h: float, now: float) -> bool:
        """True once: the cost at the checkpoint after the next would pass the budget."""
        if not self.budget or self._budget_hit or self._held is None:
            return False
        times = [self._held[0], *self._saved_at]  # the start, then every checkpoint
        projected = projected_spend(spent, rate_per_h, times, now)
        self._budget_hit = math.isfinite(projected) and projected > self.budget
        return self._budget_hit

    def update(
        self,
        segments: Sequence[Segment],
        now: float,
        step: int,
        target_steps: int | None = None,
        may_stop: bool = True,
    ) -> tuple[dict[str, float], dict[str, Any], Decision | None]:
        """The job's ``cost/*`` metrics and tags at ``now``, and a graceful stop (reason
        ``budget``) when the budget would be passed and ``may_stop`` (no stop requested yet).

        ``segments``: the goodput timeline so far; ``step``: the step reached; with
        ``target_steps``, ``cost/projected_usd`` is the cost at that step at the rate
        measured from the first step seen (0 < ``step``; ``target_steps`` None: the job
        has ended, nothing is projected).
        """
        cost = self.cost(segments, now)
        metrics = self.metrics(cost)
        decision = None
        if may_stop and self.over_budget(metrics["cost/usd"], cost.rate_per_h, now):
            decision = Decision(
                "stop",
                reason="budget",
                grace_s=300.0,
                note=f"trainfactory: budget {self.budget:g} {self.catalog.currency} would be"
                f" passed before the checkpoint after the next ({metrics['cost/usd']:.2f} spent)",
            )
        if target_steps and step > 0:
            if self._rate_anchor is None:
                self._rate_anchor = (now, step)
            t0, s0 = self._rate_anchor
            if now > t0 and step > s0:
                metrics["cost/projected_usd"] = projected_cost(
                    metrics["cost/usd"],
                    cost.rate_per_h,
                    step,
                    target_steps,
                    (step - s0) / (now - t0),
                )
        return metrics, self.tags(cost), decision
