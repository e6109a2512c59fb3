"""Derived training numbers: throughput, step time, time split, MFU, energy (pure Python).

Workers send cumulative counters (:class:`StepCounters`); :class:`JobThroughput` turns the
counters of every rank into the job's ``train/*`` metrics. Everything here is arithmetic on
plain numbers, so it is unit-tested with exact values.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .flops import mfu

__all__ = [
    "EnergyMeter",
    "JobThroughput",
    "StepCounters",
    "energy_kwh",
    "percentile",
    "summarize",
]


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) with linear interpolation between closest ranks.

    The same definition as ``numpy.percentile(values, q)`` (method ``"linear"``): position
    ``(n - 1) * q / 100`` in the sorted values. Raises ValueError on empty input or ``q``
    outside [0, 100].
    """
    if not values:
        raise ValueError("percentile of no values.")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q}.")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(values: Iterable[float]) -> dict[str, float]:
    """``{"min", "mean", "max"}`` of ``values`` (``{}`` for none): the cluster view of a metric."""
    vals = list(values)
    if not vals:
        return {}
    return {"min": min(vals), "mean": sum(vals) / len(vals), "max": max(vals)}


def energy_kwh(times_s: Sequence[float], power_w: Sequence[float]) -> float:
    """Energy in kWh of a sampled power trace: the trapezoid integral of W over s / 3.6e6.

    Raises ValueError if the sequences differ in length or the times are not increasing.
    """
    if len(times_s) != len(power_w):
        raise ValueError("times_s and power_w must have the same length.")
    joules = 0.0
    for i in range(1, len(times_s)):
        dt = times_s[i] - times_s[i - 1]
        if dt <= 0:
            raise ValueError("times_s must be strictly increasing.")
        joules += 0.5 * (power_w[i] + power_w[i - 1]) * dt
    return joules / 3.6e6


class EnergyMeter:
    """Running energy of several devices from power samples (trapezoid rule, kWh).

    ``add(device, t, watts)`` with ``t`` in seconds. A gap longer than ``max_gap_s``
    between two samples of a device is not integrated (the device may have been gone);
    ``gap_s`` counts such time so a reader knows the figure is a lower bound.
    """

    def __init__(self, max_gap_s: float = 30.0):
        self.max_gap_s = max_gap_s
        self.joules = 0.0
        self.gap_s = 0.0
        self._last: dict[str, tuple[float, float]] = {}

    def add(self, device: str, t: float, watts: float) -> None:
        last = self._last.get(device)
        if last is not None and t > last[0]:
            dt = t - last[0]
            if dt <= self.max_gap_s:
                self.joules += 0.5 * (watts + last[1]) * dt
            else:
                self.gap_s += dt
        if last is None or t > last[0]:
            self._last[device] = (t, watts)

    @property
    def kwh(self) -> float:
        return self.joules / 3.6e6


@dataclass
class StepCounters:
    """One rank's cumulative counters, as its worker sends them.

    Attributes
    ----------
    time : float
        When the counters were read on the worker, s since the epoch.
    steps : int
        Steps completed (``trainfactory.step()`` blocks, else ``trainfactory.log`` calls).
    samples, tokens : float
        Samples and tokens this rank processed.
    step_time_s : float
        Total time inside ``trainfactory.step()`` blocks, s.
    data_wait_s : float
        Total time inside ``trainfactory.data_wait()``, s.
    comm_s : float
        Total time collectives were in flight, s: DDP's gradient allreduces (its comm
        hook) and FSDP2's all-gathers and reduce-scatters. It may overlap compute, so it
        is an upper bound on exposed communication.
    all_gather_s, reduce_scatter_s : float
        The part of ``comm_s`` that ``torch.distributed.all_gather_single`` and
        ``reduce_scatter_single`` took (the collectives FSDP2 issues), s.
    ingest_rows : float
        Rows a Ray Data shard's iterators handed to the loop (``ray_backend.ingest``).
    step_times : list of float
        Durations of the steps completed since the previous counters, s (at most a few
        hundred; older ones are dropped by the worker).
    """

    time: float
    steps: int = 0
    samples: float = 0.0
    tokens: float = 0.0
    step_time_s: float = 0.0
    data_wait_s: float = 0.0
    comm_s: float = 0.0
    all_gather_s: float = 0.0
    reduce_scatter_s: float = 0.0
    ingest_rows: float = 0.0
    step_times: list[float] = field(default_factory=list)


@dataclass
class _Rank:
    prev: StepCounters
    cur: StepCounters
    received: float  # when the latest counters arrived, on the deriving side's clock
    rates: dict[str, float] = field(default_factory=dict)


class JobThroughput:
    """The job's ``train/*`` numbers from every rank's :class:`StepCounters`.

    Rates are per rank over the window between two derivations, using the worker's own
    clock, then summed over ranks (data parallel: each rank processes its own samples).
    Time fractions are of the rank's wall time in the window, averaged over ranks.

    Parameters
    ----------
    gpus_per_worker : float
        0 on CPU: then ``per_accelerator`` is per worker and no ``_per_gpu`` key is made.
    flops_per_token : float, optional
        Model FLOPs per token (:func:`~.flops.flops_per_token`); with ``peak_flops``
        (FLOP/s per accelerator) gives ``train/mfu``.
    window : int
        Step durations kept for the p50/p95 step time.
    stale_s : float
        A rank whose counters have not moved for this long counts with rate 0.
    world_size : int, optional
        The job's ranks. When given, rates are made only once every rank has a window
        (the first windows of a starting job would otherwise sum only the ranks that
        reported first, an undercount).
    """

    def __init__(
        self,
        gpus_per_worker: float = 0.0,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        window: int = 512,
        stale_s: float = 10.0,
        world_size: int | None = None,
    ):
        self.gpus_per_worker = gpus_per_worker
        self.world_size = world_size
        self.flops_per_token = flops_per_token
        self.peak_flops = peak_flops
        self.stale_s = stale_s
        self._ranks: dict[int, _Rank] = {}
        self._durations: deque[float] = deque(maxlen=window)

    def update(self, rank: int, counters: StepCounters, received: float | None = None) -> None:
        """Take rank ``rank``'s latest counters (older or repeated ones are ignored).

        ``received``: when they arrived, on the clock :meth:`derive`'s ``now`` uses
        (default: ``counters.time``); staleness is judged on that clock, so a worker
        whose clock is off does not look stale.
        """
        received = counters.time if received is None else received
        state = self._ranks.get(rank)
        if state is not None and counters.time <= state.cur.time:
            return
        if state is None or counters.steps < state.cur.steps:  # new, or restarted: a baseline
            self._ranks[rank] = _Rank(counters, counters, received)
        else:
            state.cur = counters
            state.received = received
        self._durations.extend(counters.step_times)

    @property
    def steps(self) -> int:
        """Steps completed by rank 0 (else the lowest rank seen): the x-axis of ``train/*``."""
        if not self._ranks:
            return 0
        return self._ranks[min(self._ranks)].cur.steps

    @property
    def steps_done_by_all(self) -> int:
        """Steps every rank seen has completed (the lowest rank count): a ``train/*`` point
        at this step holds every rank's totals up to it, so the last one is the job's whole
        count even when a rank's last counters arrive after rank 0's."""
        return min((state.cur.steps for state in self._ranks.values()), default=0)

    def derive(self, now: float) -> dict[str, float]:
        """The job's numbers over the window since the previous call.

        Keys (units): ``train/samples_per_s``, ``train/tokens_per_s`` (sum over ranks),
        ``train/tokens_per_s_per_worker``, ``train/tokens_per_s_per_gpu`` (GPU jobs),
        ``train/samples``, ``train/tokens`` (totals), ``train/step_time_s`` (mean, s),
        ``train/step_time_p50_s``, ``train/step_time_p95_s``, ``train/data_wait_fraction``,
        ``train/comm_s`` (collective time per step, s), ``train/comm_fraction`` (of wall
        time; may overlap compute), ``train/all_gather_s`` and ``train/reduce_scatter_s``
        (FSDP2's collectives per step, s), ``train/ingest_rows`` and
        ``train/ingest_rows_per_s`` (Ray Data rows handed to the loops, sum over ranks),
        ``train/mfu`` (fraction; only with a FLOPs count and a peak). A key is left out
        when nothing measured it (no tokens reported, say).
        """
        if not self._ranks:
            return {}
        counted = ("samples", "tokens", "ingest_rows")
        totals = dict.fromkeys(counted, 0.0)
        rates = dict.fromkeys(counted, 0.0)
        fractions: dict[str, list[float]] = {"data_wait": [], "comm": []}
        per_step = dict.fromkeys(("comm_s", "all_gather_s", "reduce_scatter_s"), 0.0)
        d_steps = d_step_time = 0.0
        saw = dict.fromkeys((*counted, *per_step, "step_time", "data_wait"), False)
        for state in self._ranks.values():
            cur, prev = state.cur, state.prev
            for name in (*counted, *per_step):
                totals[name] = totals.get(name, 0.0) + getattr(cur, name)
                saw[name] |= getattr(cur, name) > 0
            saw["step_time"] |= cur.step_time_s > 0
            saw["data_wait"] |= cur.data_wait_s > 0
            dt = cur.time - prev.time
            if dt > 0:
                state.rates = {
                    name: (getattr(cur, name) - getattr(prev, name)) / dt for name in counted
                }
                state.rates["data_wait"] = (cur.data_wait_s - prev.data_wait_s) / dt
                state.rates["comm"] = (cur.comm_s - prev.comm_s) / dt
                d_steps += cur.steps - prev.steps
                d_step_time += cur.step_time_s - prev.step_time_s
                for name in per_step:
                    per_step[name] += getattr(cur, name) - getattr(prev, name)
                state.prev = cur
            elif now - state.received > self.stale_s:
                state.rates = {k: 0.0 for k in state.rates}
            for name in counted:
                rates[name] += state.rates.get(name, 0.0)
            for name in fractions:
                if name in state.rates:
                    fractions[name].append(state.rates[name])
        out: dict[str, float] = {}
        workers = sum(1 for state in self._ranks.values() if state.rates) or len(self._ranks)
        measured = any(state.rates for state in self._ranks.values())
        if self.world_size and sum(1 for s in self._ranks.values() if s.rates) < self.world_size:
            measured = False  # not every rank has a window yet
        if saw["samples"]:
            out["train/samples"] = totals["samples"]
            if measured:
                out["train/samples_per_s"] = rates["samples"]
        if saw["tokens"]:
            out["train/tokens"] = totals["tokens"]
        if saw["tokens"] and measured:
            out["train/tokens_per_s"] = rates["tokens"]
            per_worker = rates["tokens"] / workers
            out["train/tokens_per_s_per_worker"] = per_worker
            per_accelerator = per_worker
            if self.gpus_per_worker:
                per_accelerator = per_worker / self.gpus_per_worker
                out["train/tokens_per_s_per_gpu"] = per_accelerator
            if self.flops_per_token and self.peak_flops:
                out["train/mfu"] = mfu(per_accelerator, self.flops_per_token, self.peak_flops)
        if saw["step_time"] and d_steps > 0:
            out["train/step_time_s"] = d_step_time / d_steps
        if self._durations:
            out["train/step_time_p50_s"] = percentile(self._durations, 50)
            out["train/step_time_p95_s"] = percentile(self._durations, 95)
        if saw["data_wait"] and fractions["data_wait"]:
            out["train/data_wait_fraction"] = sum(fractions["data_wait"]) / workers
        if saw["comm_s"] and fractions["comm"]:
            out["train/comm_fraction"] = sum(fractions["comm"]) / workers
        for name, seconds in per_step.items():
            if saw[name] and d_steps > 0:
                out[f"train/{name}"] = seconds / d_steps
        if saw["ingest_rows"]:
            out["train/ingest_rows"] = totals["ingest_rows"]
            if measured:
                out["train/ingest_rows_per_s"] = rates["ingest_rows"]
        return out
