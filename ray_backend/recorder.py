"""RunRecorder: the single writer of one job's MLflow run (runs as a Ray actor in the job)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import os
import threading
import time
import zlib
from collections import deque
from typing import Any

from jupyter_trainfactory.telemetry.cost import projected_cost
from jupyter_trainfactory.telemetry.flops import flops_per_token, lookup_peak
from jupyter_trainfactory.telemetry.goodput import (
    TIMELINE_TAG,
    Attempt,
    CheckpointSave,
    Step,
    account,
)
from jupyter_trainfactory.telemetry.keys import KeyMapper, to_float
from jupyter_trainfactory.telemetry.stats import EnergyMeter, JobThroughput, StepCounters, summarize
from jupyter_trainfactory.tracking import TAG, client
from ray_backend.costs import CostMeter
from ray_backend.session import STOP_SEEN

__all__ = ["MAX_BATCH_METRICS", "RESERVED_KEYS", "RunRecorder"]

#: Report keys with a meaning to this tool. ``step``: the report's step (else the
#: report count). ``samples``: samples this rank processed since its previous report.
#: ``STOP_SEEN`` (``trainfactory_stop_seen``): added by the workers to the first report
#: with a checkpoint after they learnt of a stop request; they wait after it, so it is the
#: last checkpoint of the job.
RESERVED_KEYS = frozenset({"step", "samples", STOP_SEEN})
#: MLflow's ``log_batch`` takes at most 1,000 metrics + params + tags per request
#: (``mlflow.utils.validation.MAX_ENTITIES_PER_BATCH``); metrics go 900 at a time so the
#: first request of a flush has room for up to 100 tags.
MAX_BATCH_METRICS = 900
_MAX_TAGS = 100
#: Points kept per key to tell an out-of-order point from a repeated one, and to give a
#: checkpoint's LoggedModel the run's own point at its step.
_RECENT_POINTS = 256
_GPU_METRICS = ("utilization", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz")


def _kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL these processes of this node (a Ray task pinned to the node); returns the
    pids that were alive and got the signal."""
    import signal

    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


@functools.cache
def _metric_class():
    from mlflow.entities import Metric  # imported on first use: the module loads without MLflow

    return Metric


class RunRecorder:
    """Buffers a job's metrics and tags and writes them to its MLflow run in batches.

    Callers (the Ray Train controller callback, the workers' telemetry threads, the node
    samplers) only append to in-memory queues; a background thread derives the job's
    ``train/*`` numbers every ``derive_interval_s`` and writes the queues with
    ``log_batch`` every ``flush_interval_s``.

    Delivery. A point is removed from its queue only when the request that carried it
    succeeded; a failed request puts its points back, so when the tracking server is
    away, points wait and are written when it returns. A retried request cannot create a
    duplicate: MLflow's SQL store skips a metric whose key, step, timestamp and value are
    already in the run. The queues hold at most ``max_queued`` points; beyond that the
    oldest *system* points are dropped (and counted), never user or ``train/`` points.

    Scale. Per-GPU and per-node series (``system/<node>/...``) are written for every 1 Hz
    sample while the job's per-device values (5 per GPU, 2 per node) number at most
    ``device_points_per_s`` (500); above that each node's series is written every
    ``ceil(n_values / device_points_per_s)``-th sample, the nodes staggered over that
    period (1,000 GPUs on 125 nodes: 5,250 values, every 11th sample, about 477 points/s).
    The live view always gets the cluster ``min``/``mean``/``max`` of each GPU metric at
    1 Hz (``system/cluster/gpu_<metric>_<stat>``). User, ``train/`` and ``checkpoint/``
    points are never thinned.

    Steps follow the design: a report's step is its ``step`` value, else the number of
    reports so far; a key's step is written once (first write wins). ``train/*`` numbers
    use the steps completed by rank 0; system series their sample index.
    """

    def __init__(
        self,
        tracking_uri: str,
        run_id: str,
        flush_interval_s: float = 1.0,
        *,
        gpus_per_worker: float = 0.0,
        peak_tflops: float | None = None,
        flops_per_token: float | None = None,
        max_queued: int = 200_000,
        device_points_per_s: float = 500.0,
        derive_interval_s: float = 1.0,
        mlflow_timeout_s: int = 30,
        stall_timeout_s: float | None = None,
        on_stall: str = "warn",
        resume: int = 0,
        cost: CostMeter | None = None,
        workers: int | None = None,
        target_steps: int | None = None,
    ):
        # Our own retry loop replaces the MLflow client's (7 retries, minutes of backoff):
        # a request fails fast and its points go back to the queue.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(mlflow_timeout_s))
        self._client = client(tracking_uri)
        self.run_id = run_id
        self._lock = threading.Lock()
        self._user: deque = deque()  # user, train/, checkpoint/ points: never dropped
        self._system: deque = deque()  # system/ points: dropped oldest-first beyond the bound
        self._tags: dict[str, str] = {}
        self._keys = KeyMapper()
        self._renamed_written = 0
        self._last_step: dict[str, int] = {}
        self._recent: dict[str, deque] = {}  # key -> its last points (step, value, ms)
        self._floor: dict[str, int] = {}  # key -> its last step before its recent points
        self._reports = 0
        self._last_report_step = -1
        self._last_report_time: float | None = None
        self._samples_total = 0.0
        self._running_since: float | None = None
        self._max_queued = max_queued
        self._dropped = 0
        self._nonfinite = 0
        # derived numbers
        self._user_flops = flops_per_token
        self._user_peak = peak_tflops * 1e12 if peak_tflops else None
        self._throughput = JobThroughput(
            gpus_per_worker, peak_flops=self._user_peak, world_size=workers
        )
        self._worker_counters = False
        self._derived_step = -1
        # train/* of a restarted or resumed job go on after the earlier attempts' steps
        # and totals (their workers count from zero)
        self._train_offset = 0
        self._train_before: dict[str, float] = {}
        self._train_totals: dict[str, float] = {}
        self._ticks = 0
        self._derive_interval = derive_interval_s
        self._checkpoints = 0
        self._checkpoint_rank: int | None = None
        self._checkpoint_step: int | None = None
        self._checkpoint_models: deque = deque()  # checkpoints still to become LoggedModels
        self._run_info: tuple[str, str] | None = None  # (experiment id, job id)
        self._texts: dict[str, str] = {}  # artifact path -> text still to be logged
        self._pip_freeze = ""
        # node samples
        self._device_budget = device_points_per_s
        self._gpu_latest: dict[tuple[str, str], tuple[float, dict[str, float]]] = {}
        self._node_offset: dict[str, int] = {}
        self._energy = EnergyMeter()
        # faults and goodput (telemetry.goodput): attempts, rank 0's progress, saves
        self._chaos_done: set[str] = set()  # chaos requests carried out (or from before)
        self._chaos_killed: dict[int, str] = {}  # pid -> the chaos request that killed it
        self._submitted = self._read_submitted()
        self._attempts: list[dict[str, Any]] = []
        self._progress: list[Step] = []
        self._saves: list[CheckpointSave] = []
        self._global_step = 0
        self._counted_steps = False  # the workers count steps (trainfactory.step, log)
        self._last_counters: dict[str, float] | None = None
        self._faults = 0
        self._failed_rank: int | None = None
        self._pending_restore: tuple[int, int, int] | None = None
        self._ranks: dict[int, dict[str, Any]] = {}  # rank -> pid, node_id, node_ip
        self._errors: dict[int, dict[str, str]] = {}  # rank -> its exception's traceback
        self._rank_seen: dict[int, float] = {}  # rank -> its telemetry's last batch
        self._failure: dict[str, Any] | None = None  # the last failure's root cause
        self._rank_steps: dict[int, int] = {}
        self._rank_checks: dict[int, int] = {}  # rank -> stop points passed (should_stop, reports)
        # stalls: no step or report for stall_timeout_s (None: not watched)
        self._stall_timeout = stall_timeout_s
        self._on_stall = on_stall
        self._last_progress: float | None = None
        self._progress_seen = False
        self._max_gap = 0.0  # longest wait between steps or reports: the suggested timeout
        self._stalled: dict[str, Any] | None = None
        self._stall_restart = False
        self._suggested_stall = 0
        self._tags[TAG.STALL_TIMEOUT] = f"{stall_timeout_s:g}" if stall_timeout_s else "off"
        # control requests through the run's tags (stop, chaos)
        self._budget_stop: float | None = None
        # a resume continues the run: what earlier submissions wrote
        self._resume = resume
        self._before: dict[str, float] = {}
        self._restarts_before = 0
        self._tick_offset = 0
        # stop requests (read from the run's tags, written by JobManager.stop)
        self._stop: dict[str, Any] | None = None
        self._stop_polled = 0.0
        # delivery
        self._offline_since: float | None = None
        self._offline_total = 0.0
        self._offline_peak = 0
        self._offline_error = ""
        self._closed = False
        self._interval = flush_interval_s
        self._inflight = 0
        self._wake = threading.Event()  # set by finish(): the loops end without a last sleep
        self._cost = cost
        self._target_steps = target_steps
        self._rate_anchor: tuple[float, int] | None = None  # (time, step) of the first step
        if resume:
            self._load_previous()
        self._flusher = threading.Thread(target=self._flush_loop, name="run-recorder", daemon=True)
        self._flusher.start()
        self._deriver = threading.Thread(target=self._derive_loop, name="derive", daemon=True)
        self._deriver.start()

    # -- inputs ---------------------------------------------------------------------
    def set_state(self, state: str, reason: str = "") -> None:
        """Record the job's state (``PENDING``, ``RUNNING``, ``RESTARTING``) and its reason."""
        now = time.time()
        with self._lock:
            if state == "RUNNING" and self._running_since is None:
                self._running_since = now
            if state == "RUNNING":  # rank 0 says so at the start of every attempt
                self._attempt_started(now)
            self._tags[TAG.STATE] = state
            self._tags[TAG.REASON] = reason

    def set_tags(self, tags: dict[str, str]) -> None:
        """Record run tags (values cut to 5,000 characters)."""
        with self._lock:
            self._tags.update({k: str(v)[:5000] for k, v in tags.items()})

    def set_environment(self, versions: dict[str, str], pip_freeze: str) -> None:
        """Record what the workers run with: tags ``trainfactory.env.<name>`` (Python, Ray,
        PyTorch, CUDA, driver; ``lineage.environment``) and the artifact
        ``environment/pip_freeze.txt`` (credentials in URLs already masked by the worker)."""
        with self._lock:
            self._tags.update({f"{TAG.ENV}{k}": str(v)[:500] for k, v in versions.items() if v})
            if pip_freeze and pip_freeze != self._pip_freeze:
                self._pip_freeze = pip_freeze
                self._texts["environment/pip_freeze.txt"] = pip_freeze

    def report(
        self,
        metrics_per_rank: list[dict[str, Any]],
        checkpoint_path: str | None,
        wall_time: float | None = None,
    ) -> int | None:
        """Record one ``ray.train.report`` round.

        Parameters
        ----------
        metrics_per_rank : list of dict
            ``metrics_per_rank[r]`` is what rank ``r`` reported. Rank 0's numeric values
            are logged; ``samples`` is summed over ranks for ``train/samples_per_s``
            (unless the workers count samples through ``trainfactory``).
        checkpoint_path : str or None
            Storage path of the checkpoint persisted with this report.
        wall_time : float, optional
            When the round completed, s since the epoch (default: now).

        Returns
        -------
        int or None
            The step written, or None when that step was already written.
        """
        now = wall_time or time.time()
        rank0 = metrics_per_rank[0] if metrics_per_rank else {}
        with self._lock:
            self._settle_restore(None)  # a plain loop's first report after a restore
            self._reports += 1
            raw_step = rank0.get("step")
            step = int(raw_step) if isinstance(raw_step, (int, float)) else self._reports
            previous = self._last_report_time or self._running_since
            self._last_report_time = now
            self._progressed(now)
            self._report_progress(step, now)
            stop_seen = any(m.get(STOP_SEEN) for m in metrics_per_rank)
            if checkpoint_path and self._stop is not None and stop_seen:
                self._stop["checkpointed"] = True  # the workers wait after this report
            if step <= self._last_report_step:
                return None
            self._last_report_step = step
            for key, value in rank0.items():
                if key not in RESERVED_KEYS:
                    self._add_user(key, value, step, now)
            samples = [m.get("samples") for m in metrics_per_rank]
            if samples and all(isinstance(s, (int, float)) for s in samples):
                batch = float(sum(samples))
                self._samples_total += batch
                if not self._worker_counters:
                    self._add_user("train/samples", self._samples_total, step, now)
                    if previous is not None and now > previous:
                        self._add_user("train/samples_per_s", batch / (now - previous), step, now)
            if checkpoint_path:
                self._checkpoint_step = step
                self._add_user("checkpoint/step", step, step, now)
                values = {k: to_float(v) for k, v in rank0.items() if k not in RESERVED_KEYS}
                # the checkpoint's metrics as the run holds them at this step (value and
                # time): written again with the model's id, MLflow keeps the run's one
                # point (a key from trainfactory.log and save_checkpoint: each step once)
                metrics = {
                    self._keys(k): self._written_at(self._keys(k), step, v, now)
                    for k, v in values.items()
                    if v is not None and math.isfinite(v)
                }
                self._checkpoint_models.append((step, checkpoint_path, now, metrics))
                self._tags.update(
                    {
                        TAG.CKPT_PATH: checkpoint_path,
                        TAG.CKPT_STEP: str(step),
                        TAG.CKPT_TIME: f"{now:.3f}",
                    }
                )
            self._tags[TAG.STEP] = str(step)
            return step

    def worker_batch(self, rank: int, batch: dict[str, Any]) -> dict[str, bool]:
        """Record one batch of a worker's telemetry (see ``ray_backend.session``).

        Returns ``{"stop": True}`` once a stop was requested: the worker's
        ``trainfactory.should_stop()`` reads it."""
        with self._lock:
            self._worker_batch(rank, batch)
            if self._stop is None:
                return {"stop": False}
            if "stop" in batch:
                self._agree_stop(rank, batch["stop"])
            return {"stop": True, "at": self._stop.get("at")}

    def _agree_stop(self, rank: int, info: dict[str, Any]) -> None:
        """Take rank ``rank``'s stop point count, sent after it heard of the stop (it
        passes no further stop point until told the agreed one); once every rank's count
        is in, the stop point is one past the furthest: every rank can reach it (the
        ranks behind need no collective with the ones waiting ahead of them) and none
        has passed it. Called under the lock."""
        stop = self._stop
        counts = stop.setdefault("counts", {})
        counts[rank] = int(info.get("checks", 0))
        world = max(int(info.get("world_size") or 1), 1)
        stop["world"] = world
        if stop.get("at") is None and len(counts) >= world:
            stop["at"] = max(counts.values()) + 1
            stop["agreed"] = time.time()
            step = max(self._rank_steps.values(), default=0)
            print(
                f"trainfactory: stop agreed by {world} ranks: every rank stops at its next"
                f" stop point (about step {step + 1})",
                flush=True,
            )

    def _worker_batch(self, rank: int, batch: dict[str, Any]) -> None:
        self._rank_seen[rank] = time.time()
        if "checks" in batch:
            self._rank_checks[rank] = int(batch["checks"])
        if "worker" in batch:
            self._set_worker(rank, batch["worker"])
        if "error" in batch:
            self._worker_error(rank, batch["error"])
        counters = batch.get("counters")
        points = batch.get("points", ())
        reached = max([int(p[2]) for p in points] + [int((counters or {}).get("steps", 0))])
        if reached > self._rank_steps.get(rank, 0):  # a new step or logged step: progress
            self._rank_steps[rank] = reached
            self._progressed(time.time())
        if counters:
            # throughput comes from the workers once they count anything themselves
            if counters.get("samples") or counters.get("tokens"):
                self._worker_counters = True
            self._throughput.update(rank, StepCounters(**counters), time.time())
        for key, value, step, wall_time in points:
            self._add_user(key, value, step, wall_time)
        if rank == 0 and "restore" in batch:
            self._settle_restore(batch["restore"].get("step"))
        if rank == 0 and counters:
            logged = max((int(p[2]) for p in points), default=None)
            if counters.get("steps"):
                self._settle_restore(None)
            self._add_progress(counters, logged)
        if rank == 0 and "model" in batch:
            self._set_model(batch["model"])
        if rank == 0 and "device" in batch:
            self._set_device(batch["device"])
        for ckpt in batch.get("checkpoints", ()):
            if self._checkpoint_rank is None:
                self._checkpoint_rank = rank
            if rank == self._checkpoint_rank:
                self._add_checkpoint(ckpt)

    def node_metrics(self, values: dict[str, float], step: int, wall_time: float) -> None:
        """Record one node sample: keys ``system/<node>/...``; ``step`` = sample index."""
        step += self._tick_offset  # a resumed job's samples continue its earlier ones
        with self._lock:
            by_node: dict[str, dict[str, float]] = {}
            for key, value in values.items():
                _, node, metric = key.split("/", 2)
                by_node.setdefault(node, {})[metric] = value
                if "/" in metric:  # gpu<i>/<name>
                    label, name = metric.split("/", 1)
                    _, latest = self._gpu_latest.setdefault((node, label), (wall_time, {}))
                    latest[name] = value
                    self._gpu_latest[(node, label)] = (wall_time, latest)
                    if name == "power_w":
                        self._energy.add(f"{node}/{label}", wall_time, value)
            n_values = len(self._gpu_latest) * len(_GPU_METRICS) + 2 * len(self._node_offset)
            every = max(1, math.ceil(n_values / self._device_budget))  # samples per write
            ts = int(wall_time * 1000)
            for node, metrics in by_node.items():
                offset = self._node_offset.setdefault(node, zlib.crc32(node.encode()))
                if (step + offset) % every:
                    continue  # not this node's turn: nodes are staggered over `every` samples
                for metric, value in metrics.items():
                    if math.isfinite(value):
                        self._push(
                            self._system, self._keys(f"system/{node}/{metric}"), value, ts, step
                        )
            self._bound()

    def gpu_info(self, node: str, devices: list[dict[str, Any]], note: str | None) -> None:
        """Which GPUs node ``node`` samples (label, uuid, name, mig), or why none."""
        tags = {}
        if devices:
            tags[f"trainfactory.gpus.{node}"] = json.dumps(devices)
        if note:
            tags[f"trainfactory.gpu_note.{node}"] = note
            print(f"trainfactory: {node}: {note}", flush=True)
        self.set_tags(tags)

    def worker_failure(
        self,
        rank: int,
        error: str,
        kind: str = "failure",
        detail: dict[str, str] | None = None,
    ) -> None:
        """Record that rank ``rank`` failed with ``error`` (its last line); Ray Train
        restarts the workers when the failure budget allows, else the job fails.

        ``kind`` is ``failure`` or ``preemption``; ``detail`` (``type``, ``message``,
        ``traceback``: see ``ray_backend.callbacks.failure_detail``) becomes the run's
        ``trainfactory.failure`` tag with the rank's node and pid: the root cause that
        ``%train status`` and the dashboard show.

        The failure's time is the job's last sign of life: the failing rank's last
        telemetry (sent at least every 2 s) or a later step of another rank; the
        detection time is now (Ray Train's health check).
        """
        now = time.time()
        with self._lock:
            self._tags[TAG.STATE] = "RESTARTING"
            self._tags[TAG.REASON] = f"rank {rank} failed: {error}"[:4000]
            self._failed_rank = rank
            if self._attempts and self._attempts[-1]["failed_at"] is None:
                if self._stall_restart:  # we killed it: the cause is the stall
                    detail = {**(detail or {}), "cause": self._stalled_text()}
                pid = self._ranks.get(rank, {}).get("pid")
                if pid in self._chaos_killed:
                    request = self._chaos_killed[pid]
                    detail = {**(detail or {}), "cause": f"killed by chaos request {request}"}
                attempt = self._attempts[-1]
                # the last sign of life: of the failing rank, or progress of the others
                seen = [self._rank_seen.get(rank, attempt["start"]), attempt["start"]]
                seen += [s.end for s in self._progress[-1:]]
                failed = min(now, max(seen))
                attempt.update(failed_at=failed, detected_at=now, kind=kind)
                self._faults += 1
                ts = int(now * 1000)
                self._push(self._user, "faults/count", self._faults, ts, self._faults)
                self._tags["trainfactory.faults.last"] = (
                    f"{time.strftime('%H:%M:%S', time.localtime(now))} rank {rank}: {error}"
                )[:4000]
                where = self._ranks.get(rank, {})
                failure = {
                    "rank": rank,
                    "node": where.get("node_ip", ""),
                    "node_id": where.get("node_id", ""),
                    "pid": where.get("pid"),
                    "time": round(failed, 3),
                    "detected": round(now, 3),
                    "attempt": len(self._attempts),
                    "kind": kind,
                    "message": error,
                    **(detail or {}),
                }
                if rank in self._errors:  # the worker's own traceback came first
                    failure.update(self._errors[rank])
                self._failure = failure
                self._tags[TAG.FAILURE] = json.dumps(failure)[:5000]
            self._ranks.clear()  # their processes are gone; the restarted ones report anew

    def _attempt_started(self, now: float) -> None:
        if self._attempts and self._attempts[-1]["failed_at"] is None:
            return  # the same attempt (rank 0 said RUNNING again)
        self._attempts.append({"start": now, "failed_at": None, "kind": "failure"})
        if self._cost is not None:
            self._cost.started(now)
        self._last_progress, self._progress_seen = now, False
        self._rank_steps.clear()
        self._rank_checks.clear()
        if self._stop is not None:  # new workers count their stop points from zero
            for key in ("counts", "at", "agreed", "reached", "waiting"):
                self._stop.pop(key, None)
        self._errors.clear()
        self._rank_seen.clear()
        self._stall_restart = False
        if self._stalled is not None:
            self._stalled = None
            self._tags[TAG.STALL] = ""
        restarts = len(self._attempts) - 1
        if restarts:
            restarts += self._restarts_before
            ts = int(now * 1000)
            self._push(self._user, "faults/restarts", restarts, ts, restarts)
            self._tags["trainfactory.faults.restarts"] = str(restarts)
            # the step restored from: what trainfactory.get_checkpoint() chose, else the
            # latest reported checkpoint (Ray Train's own choice); settled on first progress
            default = int(self._checkpoint_step or 0)
            self._pending_restore = (restarts, ts, default)
            # a loop without a `step` key counts reports from the restored checkpoint's:
            # a report repeated after the restore falls on a step already written
            self._reports = default
            self._last_counters = None  # the new workers count from zero
            self._new_throughput()

    # -- ranks, progress and stalls ---------------------------------------------------
    def _set_worker(self, rank: int, info: dict[str, Any]) -> None:
        self._ranks[rank] = dict(info)
        self._tags[f"{TAG.RANK}{rank}"] = json.dumps(info)

    def _worker_error(self, rank: int, error: dict[str, str]) -> None:
        """A worker's exception with its traceback (Ray Train passes the controller only
        the bare exception); it completes the failure's root cause, before or after."""
        self._errors[rank] = error
        failure = self._failure
        current = failure is not None and failure["attempt"] == len(self._attempts)
        if current and failure["rank"] == rank:
            failure.update(error)
            self._tags[TAG.FAILURE] = json.dumps(failure)[:5000]

    def _progressed(self, now: float) -> None:
        """A step or report arrived (called under the lock)."""
        if self._last_progress is not None and self._progress_seen:  # not the setup
            self._max_gap = max(self._max_gap, now - self._last_progress)
        self._progress_seen = True
        self._last_progress = now
        if self._stalled is not None:
            print(f"trainfactory: progress again after the stall ({self._stalled_text()})")
            self._stalled = None
            self._tags[TAG.STALL] = ""

    def _laggard(self) -> int | None:
        """The running rank that progressed least (the last on a tie): the likeliest to
        hang, since the others wait for it at their next collective."""
        ranks = self._rank_steps
        return min(self._ranks, key=lambda r: (ranks.get(r, -1), -r)) if self._ranks else None

    def _stalled_text(self) -> str:
        s = self._stalled or {}
        since = time.strftime("%H:%M:%S", time.localtime(s.get("since", 0)))
        text = f"no step or report for {s.get('after_s', 0):.0f} s since {since}"
        if s.get("rank") is not None:
            text += f"; least progress: rank {s['rank']} (step {s.get('rank_step', '?')})"
        return text

    def _check_stall(self, now: float) -> str | None:
        """Mark a stall when no progress came for ``stall_timeout_s``; returns the action
        to take (``restart``, ``stop``) once per stall, else None. Also keeps the
        suggested timeout tag: 10 x the longest gap between steps or reports seen so far
        (checkpoints and evaluations included), at least 60 s."""
        with self._lock:
            if self._max_gap:
                suggested = max(60, 10 * math.ceil(self._max_gap))
                if suggested != self._suggested_stall:
                    self._suggested_stall = suggested
                    self._tags[TAG.STALL_SUGGESTED] = str(suggested)
            attempt = self._attempts[-1] if self._attempts else None
            if (
                self._stall_timeout is None
                or attempt is None
                or attempt["failed_at"] is not None
                or self._stalled is not None
                or self._last_progress is None
                or now - self._last_progress < self._stall_timeout
            ):
                return None
            rank = self._laggard()
            self._stalled = {
                "since": self._last_progress,
                "after_s": now - self._last_progress,
                "rank": rank,
                "rank_step": self._rank_steps.get(rank) if rank is not None else None,
            }
            text = self._stalled_text()
            self._tags[TAG.STALL] = text
            print(f"trainfactory: stalled: {text} (--on-stall {self._on_stall})", flush=True)
            return self._on_stall if self._on_stall in ("restart", "stop") else None

    def _act_on_stall(self, action: str) -> None:
        if action == "stop":
            self.request_stop("stall", grace_s=0.0)
        elif action == "restart":
            with self._lock:
                rank = self._laggard()
                self._stall_restart = True
            # killing one is enough: Ray Train restarts the whole group from the checkpoint
            rank = 0 if rank is None else rank
            try:
                killed = self.kill_ranks([rank])
            except Exception as exc:  # no worker known, or the node does not answer
                print(f"trainfactory: cannot restart the stalled job: {exc}", flush=True)
                return
            print(f"trainfactory: restarting the stalled job: killed {killed}", flush=True)

    def kill_ranks(self, ranks: list[int]) -> list[dict[str, Any]]:
        """SIGKILL the worker processes of ``ranks`` (one Ray task pinned to each node).

        Returns ``[{"rank", "pid", "node"}]`` of the processes killed. Raises ValueError
        for a rank that has not reported where it runs.
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            missing = [r for r in ranks if r not in self._ranks]
            if missing:
                known = ", ".join(map(str, sorted(self._ranks))) or "none yet"
                raise ValueError(f"rank {missing[0]} is not running (running ranks: {known})")
            where = {r: self._ranks[r] for r in ranks}
        by_node: dict[str, list[int]] = {}
        for rank, info in where.items():
            by_node.setdefault(info["node_id"], []).append(rank)
        killer = ray.remote(_kill_pids)
        refs = {
            node: killer.options(
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
            ).remote([where[r]["pid"] for r in node_ranks])
            for node, node_ranks in by_node.items()
        }
        killed = []
        for node, ref in refs.items():
            dead = set(ray.get(ref, timeout=60))
            killed += [
                {"rank": r, "pid": where[r]["pid"], "node": where[r]["node_ip"]}
                for r in by_node[node]
                if where[r]["pid"] in dead
            ]
        return killed

    def ranks(self) -> dict[int, dict[str, Any]]:
        """Where the current attempt's ranks run: ``{rank: {pid, node_id, node_ip,
        visible}}`` (ranks appear as their workers start)."""
        with self._lock:
            return {r: dict(info) for r, info in self._ranks.items()}

    def ranks_on_node(self, node: str) -> list[int]:
        """Ranks whose worker runs on ``node`` (an IP, or a node id or its prefix)."""
        with self._lock:
            return sorted(
                r
                for r, info in self._ranks.items()
                if node in (info.get("node_ip"), info.get("node_id"))
                or (len(node) >= 8 and str(info.get("node_id", "")).startswith(node))
            )

    def _chaos(self, request: dict[str, Any]) -> dict[str, Any]:
        """Carry out one fault-injection request: ``{"rank": R}`` or ``{"node": NODE}``."""
        done: dict[str, Any] = {"id": request.get("id", ""), "time": round(time.time(), 3)}
        try:
            if "node" in request:
                ranks = self.ranks_on_node(str(request["node"]))
                if not ranks:
                    raise ValueError(f"no worker of this job runs on node {request['node']}")
            else:
                rank = int(request.get("rank", -1))
                with self._lock:
                    rank = max(self._ranks, default=0) if rank < 0 else rank
                ranks = [rank]
            done["killed"] = self.kill_ranks(ranks)
            with self._lock:
                self._chaos_killed.update({k["pid"]: done["id"] for k in done["killed"]})
            print(f"trainfactory: chaos: killed {done['killed']}", flush=True)
        except Exception as exc:
            done["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return done

    def _settle_restore(self, step: int | None) -> None:
        if self._pending_restore is None:
            return
        restarts, ts, default = self._pending_restore
        self._pending_restore = None
        restore = default if step is None else int(step)
        self._reports = restore
        self._push(self._user, "faults/restore_step", restore, ts, restarts)
        self._tags["trainfactory.faults.restore_step"] = str(restore)

    def poll_control(self) -> None:
        """Read the requests that reach the job through its run's tags; called every 2 s
        by the flush thread: a stop (``trainfactory.stop_requested``, ``..._grace_s``,
        ``..._time``, written by ``JobManager.stop``) and fault injection
        (``trainfactory.chaos``, written by ``JobManager.chaos``; answered in
        ``trainfactory.chaos.done``)."""
        try:
            tags = self._client.get_run(self.run_id).data.tags
        except Exception:  # tracking server away: ask again later
            return
        chaos = tags.get(TAG.CHAOS)
        if chaos:
            try:
                request = json.loads(chaos)
            except ValueError:
                request = {}
            if request.get("id") and request["id"] not in self._chaos_done:
                self._chaos_done.add(request["id"])
                self.set_tags({TAG.CHAOS_DONE: json.dumps(self._chaos(request))})
        reason = tags.get(TAG.STOP)
        if reason and self._stop is None:
            self.request_stop(
                reason,
                float(tags.get(TAG.STOP_GRACE) or 300.0),
                float(tags.get(TAG.STOP_TIME) or time.time()),
            )

    def request_stop(self, reason: str, grace_s: float = 300.0, at: float | None = None) -> None:
        """Stop the job after its next checkpoint, or after ``grace_s`` s without one."""
        with self._lock:
            if self._stop is not None:
                return
            at = time.time() if at is None else at
            self._stop = {"reason": reason, "grace_s": grace_s, "time": at, "checkpointed": False}
        print(
            f"trainfactory: stop requested ({reason}); training ends after the next"
            f" checkpoint, or in {grace_s:g} s without one.",
            flush=True,
        )

    def _check_stop_wait(self, now: float) -> None:
        """Say when a stop cannot complete: a rank has not answered the stop, or has not
        reached the agreed stop point while another rank has (a hang, or stop points
        that differ between ranks), for ``max(30 s, 3 x the longest step seen)``. Sets
        the reason (``stopping: waiting for rank R at step S``) and the tag
        ``trainfactory.stop.waiting``. Called under the lock."""
        stop = self._stop
        attempt = self._attempts[-1] if self._attempts else None
        if stop is None or stop["checkpointed"] or attempt is None or attempt["failed_at"]:
            return
        world = stop.get("world") or self._throughput.world_size or len(self._ranks) or 1
        at = stop.get("at")
        if at is None:  # not agreed: the ranks that have not answered since they heard
            behind = [r for r in range(world) if r not in stop.get("counts", {})]
            since = max(stop["time"], attempt["start"])
        else:
            counts = self._rank_checks
            behind = [r for r in range(world) if counts.get(r, 0) < at]
            if len(behind) == world:  # all on their way (a loop that checks rarely)
                return
            since = stop.setdefault("reached", now)
        if not behind:
            if stop.pop("waiting", None):
                stop.pop("waiting_since", None)
                self._tags["trainfactory.stop.waiting"] = ""
            return
        if now - since < max(30.0, 3 * self._max_gap):
            return
        rank = min(behind, key=lambda r: (self._rank_checks.get(r, -1), r))
        text = f"stopping: waiting for rank {rank} at step {self._rank_steps.get(rank, 0)}"
        if stop.get("waiting") != text:
            stop["waiting"], stop["waiting_since"] = text, since
            self._tags[TAG.REASON] = text
            self._tags["trainfactory.stop.waiting"] = text
            print(f"trainfactory: {text} (since {now - since:.0f} s)", flush=True)

    def stop_status(self) -> dict[str, Any] | None:
        """None, or the stop request with ``due``: True once training should end now (a
        checkpoint came after the request, the grace period is over, or training has not
        started, so there is nothing to save)."""
        with self._lock:
            if self._stop is None:
                return None
            stop = dict(self._stop)
        running = bool(self._attempts)
        stop["due"] = (
            stop["checkpointed"]
            or not running
            or stop["reason"] == "user-now"
            or time.time() - stop["time"] >= stop["grace_s"]
        )
        return stop

    def _load_previous(self) -> None:
        """Continue what earlier submissions of this job wrote to the run (a resume).

        Every key's last step (so a step is still written once), the report, sample
        and failure counts, and the goodput totals (added to this submission's; the
        time between submissions, when the job held no resources, is not counted).
        """
        try:
            run = self._client.get_run(self.run_id)
        except Exception as exc:  # tracking server away at start: counts restart
            print(f"trainfactory: earlier submissions not read ({exc}).", flush=True)
            return
        tags = run.data.tags
        latest = {m.key: m for m in run.data.to_proto().metrics}
        for key, m in latest.items():
            if not key.startswith(
                ("system/", "goodput/", "badput/", "faults/", "energy/", "cost/")
            ):
                self._last_step[key] = self._floor[key] = int(m.step)
        self._before = {
            k: m.value
            for k, m in latest.items()
            if k.startswith(("goodput/", "badput/")) or k == "energy/gpu_kwh"
        }
        self._before.update({k: latest[k].value for k in ("faults/mttr_s",) if k in latest})
        if self._cost is not None:
            self._cost.add_before({k: m.value for k, m in latest.items() if k.startswith("cost/")})
        self._tick_offset = max(
            [
                int(m.step)
                for k, m in latest.items()
                if k.startswith(("system/", "goodput/", "energy/", "cost/"))
            ]
            + [0]
        )
        self._ticks = self._tick_offset
        self._faults = int(latest["faults/count"].value) if "faults/count" in latest else 0
        if "faults/restarts" in latest:
            self._restarts_before = int(latest["faults/restarts"].value)
        if "train/samples" in latest:
            self._samples_total = latest["train/samples"].value
        step = tags.get(TAG.STEP)
        self._last_report_step = int(step) if step and step.isdigit() else 0
        ckpt = tags.get(TAG.CKPT_STEP)
        self._checkpoint_step = int(ckpt) if ckpt and ckpt.isdigit() else None
        # reports count on from the checkpoint the resume restores (else the last report)
        self._reports = (
            self._checkpoint_step if self._checkpoint_step is not None else self._last_report_step
        )
        # train/* go on from the earlier submissions' steps and totals
        self._train_offset = max(
            [int(m.step) for k, m in latest.items() if k.startswith("train/")] + [0]
        )
        self._train_before = {
            k: latest[k].value for k in ("train/samples", "train/tokens") if k in latest
        }
        self._checkpoints = (
            int(latest["checkpoint/save_s"].step) if "checkpoint/save_s" in latest else 0
        )
        self._tags.update({TAG.RESUMES: str(self._resume), TAG.STALL: ""})

    def _costs(self, acc, now: float) -> dict[str, float]:
        """The job's ``cost/*`` metrics now (called under the lock); asks for a graceful
        stop (reason ``budget``) when the budget would be passed."""
        cost = self._cost.cost(acc.segments, now)
        metrics = self._cost.metrics(cost)
        self._tags.update(self._cost.tags(cost))
        if self._stop is None and self._cost.over_budget(metrics["cost/usd"], cost.rate_per_h, now):
            self._budget_stop = metrics["cost/usd"]
        step = max(self._global_step, self._last_report_step)
        if self._target_steps and step > 0 and not self._closed:
            if self._rate_anchor is None:
                self._rate_anchor = (now, step)
            t0, s0 = self._rate_anchor
            if now > t0 and step > s0:
                metrics["cost/projected_usd"] = projected_cost(
                    metrics["cost/usd"],
                    cost.rate_per_h,
                    step,
                    self._target_steps,
                    (step - s0) / (now - t0),
                )
        return metrics

    def _with_previous(self, values: dict[str, float]) -> dict[str, float]:
        """This submission's goodput metrics plus those of earlier submissions."""
        before = self._before
        if not before:
            return values
        out = dict(values)
        for key, value in before.items():
            if key.startswith("badput/") or key in ("goodput/goodput_s", "goodput/wall_s"):
                out[key] = out.get(key, 0.0) + value
        if out.get("goodput/wall_s"):
            out["goodput/ettr"] = out["goodput/goodput_s"] / out["goodput/wall_s"]
        if "faults/mttr_s" in before and "faults/mttr_s" not in values:
            out["faults/mttr_s"] = before["faults/mttr_s"]
        return out

    def _read_submitted(self) -> float:
        """When the job was submitted (the run's ``trainfactory.started`` tag), else now."""
        try:
            run = self._client.get_run(self.run_id)
        except Exception:  # tracking server away at start: the recorder's start will do
            return time.time()
        with contextlib.suppress(ValueError, AttributeError):  # a request of an earlier
            old = json.loads(run.data.tags.get(TAG.CHAOS) or "{}")  # submission: not ours
            self._chaos_done.add(str(old.get("id", "")))
        return float(run.data.tags.get(TAG.STARTED) or run.info.start_time / 1000)

    def _report_progress(self, step: int, now: float) -> None:
        """A report as a goodput ``Step`` when the workers count no steps themselves
        (plain Ray Train code: ``ray.train.report`` only). The time from the attempt's
        start to its first report is setup (startup or checkpoint restore); each later
        report's step took the time since the previous one."""
        if self._counted_steps or not self._attempts:
            return
        attempt = self._attempts[-1]
        if attempt["failed_at"] is not None:
            return
        previous = attempt.get("last_report")
        attempt["last_report"] = now
        duration = 0.0 if previous is None else now - previous
        self._global_step = max(self._global_step, step)
        self._progress.append(Step(now, step, duration))

    def _add_progress(self, counters: dict[str, Any], logged_step: int | None) -> None:
        """Rank 0's progress since its previous batch, as one goodput ``Step`` record."""
        last = self._last_counters
        steps = counters.get("steps", 0)
        if last is None or steps < last.get("steps", 0):
            last = {"steps": 0, "step_time_s": 0.0, "data_wait_s": 0.0, "time": None}
        new_steps = steps - last["steps"]
        if steps:
            self._counted_steps = True  # the workers count steps: reports are not steps
        if new_steps <= 0:
            self._last_counters = counters
            return
        # the step the user logs, else steps counted on from the previous batch
        self._global_step = self._global_step + new_steps if logged_step is None else logged_step
        busy = counters.get("step_time_s", 0.0) - last.get("step_time_s", 0.0)
        wait = counters.get("data_wait_s", 0.0) - last.get("data_wait_s", 0.0)
        if busy <= 0 and last.get("time") is not None:  # no step() blocks: the window's time
            busy = counters["time"] - last["time"]
        self._progress.append(Step(counters["time"], self._global_step, max(busy, 0.0), wait))
        self._last_counters = counters

    def goodput(self, now: float | None = None):
        """The job's :class:`~jupyter_trainfactory.telemetry.goodput.Goodput` so far."""
        now = now or time.time()
        with self._lock:
            attempts = [
                Attempt(a["start"], a["failed_at"], a["kind"], a.get("detected_at"))
                for a in self._attempts
            ]
            progress, saves = list(self._progress), list(self._saves)
            waiting = (self._stop or {}).get("waiting_since") if self._stop else None
        return account(
            min(self._submitted, now),
            now,
            attempts,
            progress,
            saves,
            resumed=self._resume > 0,
            stop_wait_from=waiting,
        )

    def finish(
        self,
        status: str,
        state: str,
        error: str = "",
        reason: str | None = "",
        timeout_s: float = 300.0,
    ) -> dict[str, Any]:
        """Write everything queued and close the run.

        ``status`` is the MLflow run status (``FINISHED``, ``FAILED``, ``KILLED``),
        ``state`` the job state shown to users (design: "Job states"). ``reason`` None:
        the stop request's reason (``user``, ``user-now``, ...; ``user`` if none was
        seen). A failure names the failing rank. When the tracking server is away,
        retries for up to ``timeout_s`` s. Returns the delivery counts.
        """
        if reason is None:
            if self._stop is None:
                self.poll_control()
            reason = self._stop["reason"] if self._stop is not None else "user"
            waiting = (self._stop or {}).get("waiting")
            if waiting and not self._stop["checkpointed"]:  # the grace ran out on it
                reason += f": grace ended {waiting.removeprefix('stopping: ')}"
        if error and self._failed_rank is not None and not error.startswith("rank "):
            error = f"rank {self._failed_rank}: {error}"
        with self._lock:
            self._tags[TAG.STATE] = state
            self._tags[TAG.REASON] = reason
            if error:
                self._tags[TAG.ERROR] = error[:4000]
            self._closed = True
            if self._cost is not None:
                now = time.time()
                self._cost.released(now)
                # storage goes on costing after the job, until `%train gc` frees it
                storage = {
                    "price_gb_month": self._cost.catalog.storage_gb_month,
                    "history": [[round(now, 3), self._cost.kept_bytes()]],
                }
                self._tags[TAG.STORAGE] = json.dumps(storage)
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        self._flusher.join(timeout=timeout_s)  # a flush in flight holds points: let it end
        self._deriver.join(timeout=5)
        self._derive(time.time())
        delay = 0.5
        while True:
            try:
                self.flush()
                if not (self._user or self._system or self._tags):
                    self._client.set_terminated(self.run_id, status=status)
                    break
            except Exception as exc:
                self._went_offline(exc)
                if time.monotonic() > deadline:
                    print(
                        f"trainfactory: tracking server unreachable for {timeout_s:.0f} s at"
                        f" the end of the job; {len(self._user) + len(self._system)} points"
                        " not written.",
                        flush=True,
                    )
                    break
                time.sleep(delay)
                delay = min(delay * 2, 5.0)
        return self.stats()

    def stats(self) -> dict[str, Any]:
        """Delivery counts: queued, dropped (system points), offline seconds, non-finite values."""
        with self._lock:
            return {
                "queued": len(self._user) + len(self._system) + self._inflight,
                "queued_user": len(self._user),
                "dropped": self._dropped,
                "offline_s": self._offline_total,
                "nonfinite": self._nonfinite,
            }

    # -- derived numbers ------------------------------------------------------------
    def _new_throughput(self) -> None:
        """A fresh throughput window for a new attempt's workers (they count from zero);
        its ``train/*`` points go on after the steps and totals derived so far. Called
        under the lock."""
        old = self._throughput
        self._throughput = JobThroughput(
            old.gpus_per_worker,
            flops_per_token=old.flops_per_token,
            peak_flops=old.peak_flops,
            world_size=old.world_size,
        )
        self._train_offset = max(self._train_offset, self._derived_step)
        for key, value in self._train_totals.items():
            self._train_before[key] = self._train_before.get(key, 0.0) + value
        self._train_totals = {}

    def _set_model(self, info: dict[str, Any]) -> None:
        fpt = self._user_flops or info.get("flops_per_token")
        n_params = info.get("n_params")
        if fpt is None and n_params is not None:
            shape = [info.get(k) for k in ("layers", "heads", "head_dim", "seq_len")]
            fpt = flops_per_token(n_params, *shape) if all(shape) else flops_per_token(n_params)
        if fpt:
            self._throughput.flops_per_token = float(fpt)
            self._tags["trainfactory.flops_per_token"] = f"{fpt:.6g}"
        if n_params is not None:
            self._tags["trainfactory.model.n_params"] = str(n_params)
        self._mfu_note()

    def _set_device(self, info: dict[str, Any]) -> None:
        name = info.get("device_name")
        if name:
            self._tags["trainfactory.device_name"] = name
            if self._cost is not None:
                self._cost.device(name)
            if self._user_peak is None:  # --peak-tflops wins over the table
                peak = lookup_peak(name, "bf16") or lookup_peak(name, "fp16")
                self._throughput.peak_flops = peak
        self._mfu_note()

    def _mfu_note(self) -> None:
        t = self._throughput
        if t.peak_flops:
            self._tags["trainfactory.peak_flops"] = f"{t.peak_flops:.6g}"
        if t.peak_flops and t.flops_per_token:
            self._tags["trainfactory.mfu_note"] = ""
        elif not t.peak_flops:
            self._tags["trainfactory.mfu_note"] = (
                "MFU unavailable: no peak FLOP/s known for this device; give --peak-tflops."
            )
        else:
            self._tags["trainfactory.mfu_note"] = (
                "MFU unavailable: no model FLOPs; use ray.train.torch.prepare_model,"
                " trainfactory.watch(model) or --flops-per-token."
            )

    def _add_checkpoint(self, ckpt: dict[str, Any]) -> None:
        self._checkpoints += 1
        n, ts = self._checkpoints, ckpt.get("time", time.time())
        step = ckpt.get("step")  # the reported or logged step the worker gave, if any
        step = int(step) if step is not None else max(self._global_step, self._last_report_step)
        self._saves.append(CheckpointSave(ts - ckpt["save_s"], ts, step))
        if self._cost is not None:
            self._cost.checkpoint(ts, ckpt.get("bytes"))
        self._add_user("checkpoint/save_s", ckpt["save_s"], n, ts)
        if ckpt.get("bytes") is not None:
            self._add_user("checkpoint/bytes", ckpt["bytes"], n, ts)
            if ckpt["save_s"] > 0:
                self._add_user("checkpoint/mb_per_s", ckpt["bytes"] / 1e6 / ckpt["save_s"], n, ts)

    def _derive(self, now: float) -> None:
        with self._lock:
            self._ticks += 1
            ts = int(now * 1000)
            step = self._train_offset + self._throughput.steps
            if step > self._derived_step:
                values = self._throughput.derive(now)
                if values:
                    self._derived_step = step
                    for key in ("train/samples", "train/tokens"):
                        if key in values:
                            self._train_totals[key] = values[key]
                            values[key] += self._train_before.get(key, 0.0)
                    for key, value in values.items():
                        self._add_user(key, value, step, now)
            fresh = [v for t, v in self._gpu_latest.values() if now - t < 5.0]
            for metric in _GPU_METRICS:
                stats = summarize(v[metric] for v in fresh if metric in v)
                for stat, value in stats.items():
                    key = self._keys(f"system/cluster/gpu_{metric}_{stat}")
                    self._push(self._user, key, value, ts, self._ticks)
            if self._energy.joules:
                kwh = self._energy.kwh + self._before.get("energy/gpu_kwh", 0.0)
                self._push(self._user, "energy/gpu_kwh", kwh, ts, self._ticks)
        if self._attempts:
            acc = self.goodput(now)
            with self._lock:
                values = self._with_previous({**acc.metrics(), "goodput/wall_s": acc.wall_s})
                self._tags[TIMELINE_TAG] = json.dumps(acc.timeline())
                if self._cost is not None:
                    values.update(self._costs(acc, now))
                if acc.failures:  # per failure: time, kind, steps reached/restored/lost, MTTR
                    records = [dataclasses.asdict(f) for f in acc.failures[-20:]]
                    self._tags[TAG.FAILURES] = json.dumps(records)[:5000]
                values.pop("faults/count", None)  # written when a failure happens
                for key, value in values.items():
                    self._push(self._user, key, value, ts, self._ticks)
        with self._lock:
            self._check_stop_wait(now)
        action = self._check_stall(now)
        if action:
            self._act_on_stall(action)
        if self._budget_stop is not None:
            spent, self._budget_stop = self._budget_stop, None
            print(
                f"trainfactory: budget {self._cost.budget:g} {self._cost.catalog.currency}"
                f" would be passed before the checkpoint after the next ({spent:.2f} spent)",
                flush=True,
            )
            self.request_stop("budget", grace_s=300.0)
        with self._lock:
            if len(self._keys.renamed) != self._renamed_written:
                self._renamed_written = len(self._keys.renamed)
                self._tags["trainfactory.renamed_keys"] = json.dumps(self._keys.renamed)[:5000]

    # -- queues ---------------------------------------------------------------------
    def _add_user(self, key: str, value: Any, step: int, wall_time: float) -> None:
        number = to_float(value)
        if number is None:
            return
        mapped = self._keys(key)
        if not math.isfinite(number):
            self._nonfinite += 1
            if self._nonfinite == 1:
                self._tags["trainfactory.nonfinite.first_step"] = str(step)
                self._tags["trainfactory.nonfinite.first_key"] = mapped
            self._tags["trainfactory.nonfinite.count"] = str(self._nonfinite)
            self._push(
                self._user,
                "train/nonfinite_count",
                self._nonfinite,
                int(wall_time * 1000),
                self._nonfinite,
            )
            return
        recent = self._recent.get(mapped, ())
        if step <= self._last_step.get(mapped, -1):
            # first write wins. A step below the last one is written only when it is past
            # the key's floor (its last step before the recent points; the last step of
            # earlier submissions after a resume) and not among the recent points: a
            # worker's batch of earlier steps that arrives after a report's later step
            if step <= self._floor.get(mapped, -1) or any(at == step for at, _, _ in recent):
                return
        else:
            self._last_step[mapped] = step
        self._push(self._user, mapped, number, int(wall_time * 1000), step)
        recent = self._recent.setdefault(mapped, deque(maxlen=_RECENT_POINTS))
        if len(recent) == recent.maxlen:  # its oldest point leaves the window
            self._floor[mapped] = max(self._floor.get(mapped, -1), recent[0][0])
        recent.append((step, number, int(wall_time * 1000)))
        if len(self._user) + len(self._system) > self._max_queued:
            self._bound()

    def _written_at(self, key: str, step: int, value: float, now: float) -> tuple[float, int]:
        """``(value, time in ms)`` of ``key``'s point at ``step`` as written to the run (one
        of its last :data:`_RECENT_POINTS`), else ``(value, now)``. Called under the lock."""
        for at, number, ts in reversed(self._recent.get(key, ())):
            if at == step:
                return number, ts
        return value, int(now * 1000)

    @staticmethod
    def _push(queue: deque, key: str, value: float, ts: int, step: int) -> None:
        queue.append(_metric_class()(key, float(value), ts, int(step)))

    def _bound(self) -> None:
        over = len(self._user) + len(self._system) - self._max_queued
        while over > 0 and self._system:
            self._system.popleft()
            self._dropped += 1
            over -= 1

    def flush(self) -> None:
        """Write what is queued (900 metrics per request); raise if a request fails.

        Points of a failed request, and all after it, go back to the front of their queue.
        """
        from mlflow.entities import RunTag

        with self._lock:
            user, self._user = list(self._user), deque()
            system, self._system = list(self._system), deque()
            tags, self._tags = self._tags, {}
            queued = len(user) + len(system)
            self._inflight = queued
        tag_list = [RunTag(k, v) for k, v in tags.items()]
        pending: list[tuple[str, list]] = [("user", user), ("system", system)]
        try:
            while tag_list or any(items for _, items in pending):
                name, items = next(((n, i) for n, i in pending if i), ("user", []))
                chunk = items[:MAX_BATCH_METRICS]
                self._client.log_batch(self.run_id, metrics=chunk, tags=tag_list[:_MAX_TAGS])
                del items[: len(chunk)]
                del tag_list[:_MAX_TAGS]
        except Exception:
            with self._lock:  # nothing is lost: put back what was not written
                self._inflight = 0
                self._user.extendleft(reversed(user))
                self._system.extendleft(reversed(system))
                for tag in tag_list:
                    self._tags.setdefault(tag.key, tag.value)
                self._offline_peak = max(self._offline_peak, len(self._user) + len(self._system))
                self._bound()
            raise
        with self._lock:
            self._inflight = 0
        self._log_checkpoint_models()
        while self._texts:
            path, text = next(iter(self._texts.items()))
            self._client.log_text(self.run_id, text, path)
            with self._lock:
                if self._texts.get(path) is text:
                    del self._texts[path]
        if self._offline_since is not None:
            self._back_online(queued)

    def _log_checkpoint_models(self) -> None:
        """Each reported checkpoint as an MLflow LoggedModel (``model_type="checkpoint"``)
        linked to the run, its step and the metrics reported with it; the weights stay in
        the job's storage (tag ``trainfactory.checkpoint.path``) until ``%train register``
        logs them as an MLflow model. Raises when the tracking server refuses; what is left
        is tried again at the next flush (a model already created is not created again).
        Each is also the run's output at its step (``log_outputs``): the run page of the
        MLflow UI lists a run's models from its outputs, not from ``source_run_id``."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric

        while self._checkpoint_models:
            step, path, when, metrics, *created = self._checkpoint_models[0]
            if self._run_info is None:
                run = self._client.get_run(self.run_id)
                self._run_info = (run.info.experiment_id, run.data.tags.get(TAG.JOB_ID, ""))
            experiment_id, job_id = self._run_info
            model = created[0] if created else None
            if model is None:
                model = self._client.create_logged_model(
                    experiment_id,
                    name=f"checkpoint-step-{step}",
                    source_run_id=self.run_id,
                    model_type="checkpoint",
                    tags={
                        TAG.JOB_ID: job_id,
                        TAG.CKPT_PATH: path,
                        TAG.CKPT_STEP: str(step),
                        TAG.CKPT_TIME: f"{when:.3f}",
                    },
                )
                self._checkpoint_models[0] = (step, path, when, metrics, model)
            self._client.log_outputs(self.run_id, [LoggedModelOutput(model.model_id, step)])
            points = [
                Metric(k, v, ts, step, model_id=model.model_id) for k, (v, ts) in metrics.items()
            ]
            if points:
                self._client.log_batch(self.run_id, metrics=points[:MAX_BATCH_METRICS])
            self._client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
            self._checkpoint_models.popleft()

    def _went_offline(self, exc: BaseException) -> None:
        if self._offline_since is None:
            self._offline_since = time.time()
            self._offline_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            print(
                f"trainfactory: tracking server unreachable ({self._offline_error});"
                " training goes on and points are queued.",
                flush=True,
            )

    def _back_online(self, written: int) -> None:
        offline = time.time() - self._offline_since
        self._offline_since = None
        self._offline_total += offline
        message = (
            f"trainfactory: tracking server back after {offline:.1f} s offline;"
            f" {max(self._offline_peak, written)} points were queued, {self._dropped} system"
            " points dropped in all."
        )
        print(message, flush=True)
        self._offline_peak = 0
        self.set_tags(
            {
                "trainfactory.tracking.offline_s": f"{self._offline_total:.1f}",
                "trainfactory.tracking.dropped_points": str(self._dropped),
                "trainfactory.tracking.last_outage": message.removeprefix("trainfactory: "),
            }
        )

    def _derive_loop(self) -> None:
        """Derived numbers on their own clock, so a slow tracking server does not thin them."""
        while not self._wake.wait(self._derive_interval):
            try:
                self._derive(time.time())
            except Exception as exc:  # a bug in a derived number must not stop recording
                print(f"trainfactory: derived metrics failed: {exc!r}", flush=True)

    def _flush_loop(self) -> None:
        delay = self._interval
        while not self._wake.wait(delay):
            if time.monotonic() - self._stop_polled >= 2.0:
                self._stop_polled = time.monotonic()
                self.poll_control()
            try:
                self.flush()
                delay = self._interval
            except Exception as exc:  # keep recording; MLflow may be briefly unreachable
                self._went_offline(exc)
                delay = min(delay * 2, 5.0)

    def ping(self) -> bool:
        """Liveness check for the driver."""
        return True
