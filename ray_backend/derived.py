"""The numbers a RunRecorder derives for its job: throughput and MFU, energy, checkpoint figures.

Also the node samples' thinning for large jobs and the cluster's GPU aggregates. Pure
bookkeeping: every method returns the points and tags to write (see
``ray_backend.decisions``); the recorder calls them under its lock.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from typing import Any

from jupyter_trainfactory.telemetry.flops import flops_per_token, lookup_peak
from jupyter_trainfactory.telemetry.stats import EnergyMeter, JobThroughput, StepCounters, summarize
from jupyter_trainfactory.tracking import TAG
from ray_backend.decisions import Update

__all__ = ["GPU_METRICS", "DerivedNumbers"]

#: Per-GPU values a node sample holds (``system/<node>/gpu<i>/<name>``).
GPU_METRICS = ("utilization", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz")
_NO_PEAK = "MFU unavailable: no peak FLOP/s known for this device; give --peak-tflops."
_NO_FLOPS = (
    "MFU unavailable: no model FLOPs; use ray.train.torch.prepare_model,"
    " trainfactory.watch(model) or --flops-per-token."
)


class DerivedNumbers:
    """A job's ``train/*``, ``system/cluster/*``, ``energy/*`` and ``checkpoint/*`` numbers.

    Throughput comes from the workers' counters (``trainfactory.step`` / ``log``) once
    they count anything; ``train/*`` use the steps completed by rank 0 and go on after
    earlier attempts' and submissions' steps and totals (their workers count from zero).
    MFU needs the model's FLOPs per token (``flops_per_token``, else from the parameter
    count the workers send) and the device's peak FLOP/s (``peak_tflops`` x 1e12, else
    ``telemetry.flops.lookup_peak`` for the reported device, bf16 then fp16).

    Node samples: per-GPU and per-node series are written for every 1 Hz sample while the
    job's per-device values (5 per GPU, 2 per node) number at most
    ``device_points_per_s``; above that each node's series is written every
    ``ceil(n_values / device_points_per_s)``-th sample, the nodes staggered over that
    period by ``crc32(node)``. The cluster ``min``/``mean``/``max`` of each GPU metric are
    derived every tick from the samples of the last 5 s.
    """

    def __init__(
        self,
        gpus_per_worker: float = 0.0,
        peak_tflops: float | None = None,
        flops_per_token: float | None = None,
        workers: int | None = None,
        device_points_per_s: float = 500.0,
    ):
        self._user_flops = flops_per_token
        self._user_peak = peak_tflops * 1e12 if peak_tflops else None
        self.throughput = JobThroughput(
            gpus_per_worker, peak_flops=self._user_peak, world_size=workers
        )
        self.worker_counters = False  # the workers count samples or tokens themselves
        self.ticks = 0  # the derive clock: the step of system/cluster, energy, goodput series
        self.tick_offset = 0  # a resumed job's node samples continue its earlier ones
        self._derived_step = -1
        self._train_offset = 0
        self._train_before: dict[str, float] = {}
        self._train_totals: dict[str, float] = {}
        self._checkpoints = 0
        self._checkpoint_rank: int | None = None
        self._device_budget = device_points_per_s
        self._gpu_latest: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}
        self._node_offset: dict[str, int] = {}
        self._energy = EnergyMeter()
        self._kwh_before = 0.0

    # -- workers ----------------------------------------------------------------------
    def counters(self, rank: int, counters: dict[str, Any], now: float) -> None:
        """Rank ``rank``'s cumulative counters (``protocol.Counters``) received at ``now``."""
        if counters.get("samples") or counters.get("tokens"):
            self.worker_counters = True
        self.throughput.update(rank, StepCounters(**counters), now)

    def model(self, info: dict[str, Any]) -> dict[str, str]:
        """The model rank 0 watched (``n_params``, shape, ``flops_per_token``); returns tags."""
        tags = {}
        fpt = self._user_flops or info.get("flops_per_token")
        n_params = info.get("n_params")
        if fpt is None and n_params is not None:
            shape = [info.get(k) for k in ("layers", "heads", "head_dim", "seq_len")]
            fpt = flops_per_token(n_params, *shape) if all(shape) else flops_per_token(n_params)
        if fpt:
            self.throughput.flops_per_token = float(fpt)
            tags[TAG.FLOPS_PER_TOKEN] = f"{fpt:.6g}"
        if n_params is not None:
            tags[TAG.N_PARAMS] = str(n_params)
        return {**tags, **self._mfu_note()}

    def device(self, info: dict[str, Any]) -> dict[str, str]:
        """Rank 0's device (``device_name``): its peak FLOP/s unless given; returns tags."""
        tags = {}
        name = info.get("device_name")
        if name:
            tags[TAG.DEVICE_NAME] = name
            if self._user_peak is None:  # --peak-tflops wins over the table
                peak = lookup_peak(name, "bf16") or lookup_peak(name, "fp16")
                self.throughput.peak_flops = peak
        return {**tags, **self._mfu_note()}

    def _mfu_note(self) -> dict[str, str]:
        t = self.throughput
        tags = {}
        if t.peak_flops:
            tags[TAG.PEAK_FLOPS] = f"{t.peak_flops:.6g}"
        if t.peak_flops and t.flops_per_token:
            tags[TAG.MFU_NOTE] = ""
        else:
            tags[TAG.MFU_NOTE] = _NO_PEAK if not t.peak_flops else _NO_FLOPS
        return tags

    def checkpoint_rank(self, rank: int) -> bool:
        """True for the rank whose checkpoint saves are the job's (the first that sends one)."""
        if self._checkpoint_rank is None:
            self._checkpoint_rank = rank
        return rank == self._checkpoint_rank

    def checkpoint(self, ckpt: dict[str, Any], ts: float) -> Update:
        """The ``checkpoint/save_s``, ``/bytes``, ``/mb_per_s`` points of a save
        (``protocol.CheckpointSaved``) ended at ``ts``; step: the save's number."""
        self._checkpoints += 1
        n = self._checkpoints
        points = [("checkpoint/save_s", ckpt["save_s"], n, ts)]
        if ckpt.get("bytes") is not None:
            points.append(("checkpoint/bytes", ckpt["bytes"], n, ts))
            if ckpt["save_s"] > 0:
                points.append(("checkpoint/mb_per_s", ckpt["bytes"] / 1e6 / ckpt["save_s"], n, ts))
        return Update(points=points)

    def new_attempt(self) -> None:
        """A fresh throughput window for a new attempt's workers (they count from zero);
        its ``train/*`` points go on after the steps and totals derived so far."""
        old = self.throughput
        self.throughput = JobThroughput(
            old.gpus_per_worker,
            flops_per_token=old.flops_per_token,
            peak_flops=old.peak_flops,
            world_size=old.world_size,
        )
        self._train_offset = max(self._train_offset, self._derived_step)
        for key, value in self._train_totals.items():
            self._train_before[key] = self._train_before.get(key, 0.0) + value
        self._train_totals = {}

    def resume(
        self, ticks: int, train_offset: int, train_before: dict[str, float], kwh: float, saves: int
    ) -> None:
        """Go on after earlier submissions: their last derive tick, ``train/*`` step and
        totals, GPU energy (kWh) and number of checkpoint saves."""
        self.ticks = self.tick_offset = ticks
        self._train_offset = train_offset
        self._train_before = dict(train_before)
        self._kwh_before = kwh
        self._checkpoints = saves

    # -- nodes ------------------------------------------------------------------------
    def node_sample(
        self, values: dict[str, float], step: int, wall_time: float, key: Callable[[str], str]
    ) -> list[tuple[str, float, int, int]]:
        """One node sample (``system/<node>/...`` keys; ``step``: its index, offset
        already added) -> the system series to write now (thinned; ``key`` maps a key)."""
        by_node: dict[str, dict[str, float]] = {}
        for name, value in values.items():
            _, node, metric = name.split("/", 2)
            by_node.setdefault(node, {})[metric] = value
            if "/" in metric:  # gpu<i>/<name>
                label, gpu_metric = metric.split("/", 1)
                _, latest = self._gpu_latest.setdefault((node, label), (wall_time, {}))
                latest[gpu_metric] = value
                self._gpu_latest[(node, label)] = (wall_time, latest)
                if gpu_metric == "power_w":
                    self._energy.add(f"{node}/{label}", wall_time, value)
        n_values = len(self._gpu_latest) * len(GPU_METRICS) + 2 * len(self._node_offset)
        every = max(1, math.ceil(n_values / self._device_budget))  # samples per write
        ts = int(wall_time * 1000)
        series = []
        for node, metrics in by_node.items():
            offset = self._node_offset.setdefault(node, zlib.crc32(node.encode()))
            if (step + offset) % every:
                continue  # not this node's turn: nodes are staggered over `every` samples
            series += [
                (key(f"system/{node}/{metric}"), value, ts, step)
                for metric, value in metrics.items()
                if math.isfinite(value)
            ]
        return series

    # -- the derive clock -------------------------------------------------------------
    def tick(self, now: float, key: Callable[[str], str], report_step: int = -1) -> Update:
        """One tick of the derive clock at ``now``: ``train/*`` (when rank 0 made
        progress), the cluster GPU aggregates and ``energy/gpu_kwh``.

        Progress is rank 0's counted steps (``trainfactory.step``/``log``); in a loop that
        counts none (plain Ray Train code), it is ``report_step``, the last step a report
        wrote, so its data wait, communication and ingest are derived at each report,
        not once."""
        self.ticks += 1
        ts = int(now * 1000)
        update = Update()
        # the steps every rank completed: a rank's last counters may arrive after rank 0's
        # (a point at rank 0's last step then held the job's totals less that rank's last)
        counted = self.throughput.steps_done_by_all
        step = self._train_offset + counted if counted or report_step < 0 else report_step
        if self.throughput.steps and not counted:
            step = -1  # a rank has not counted its first step yet: nothing to derive at
        if step > self._derived_step:
            values = self.throughput.derive(now)
            if values:
                self._derived_step = step
                for name in ("train/samples", "train/tokens"):
                    if name in values:
                        self._train_totals[name] = values[name]
                        values[name] += self._train_before.get(name, 0.0)
                update.points += [(k, v, step, now) for k, v in values.items()]
        fresh = [v for t, v in self._gpu_latest.values() if now - t < 5.0]
        for metric in GPU_METRICS:
            stats = summarize(v[metric] for v in fresh if metric in v)
            for stat, value in stats.items():
                update.series.append(
                    (key(f"system/cluster/gpu_{metric}_{stat}"), value, ts, self.ticks)
                )
        if self._energy.joules:
            kwh = self._energy.kwh + self._kwh_before
            update.series.append(("energy/gpu_kwh", kwh, ts, self.ticks))
        return update
