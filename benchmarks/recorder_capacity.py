"""Capacity of one job's RunRecorder: can a single actor record a 1,000-worker, 1,000-GPU job?

What it runs. The embedded services (``ensure_services()``: local Ray head + MLflow server
with its SQLite store), one real MLflow run (experiment ``trainfactory-bench``) and ONE
``RunRecorder`` actor created exactly as ``ray_backend.driver`` creates it. ``--generators``
load-generator actors (``num_cpus=0``) then make, for ``--seconds`` seconds, the calls a job
of ``--workers`` workers on ``--gpus`` GPUs would make, all fire-and-forget ``.remote()``:

- per simulated worker, one ``worker_batch(rank, batch)`` per second: cumulative counters
  (4 steps/s of about 0.2 s, 32 samples x 1,024 tokens a step, data wait, comm time) and
  one user point ``rank<r>/loss`` at a strictly increasing step (rank 0 also sends
  ``loss``), i.e. about ``--workers`` user points/s;
- per simulated node (``--gpus / --gpus-per-node`` nodes), one ``node_metrics(values,
  index, time)`` per second with ``gpu<i>/{utilization, memory_used_mb, power_w,
  temperature_c, sm_clock_mhz}`` for its GPUs plus ``cpu_utilization`` and
  ``memory_used_mb``.

Each generator spreads its second's calls over ten 100 ms slots (workers are not in step).
When a generator cannot keep up, it runs late rather than skipping: the offered load
printed is what was actually sent, and a warning says when it fell short of the target.

How to read it. One line per second::

    t  calls/s  user/s  sys/s | written/s | queued  (user)  dropped | rtt  lag | cpu% ...

``calls/s``, ``user/s``, ``sys/s``: actor calls and user/system points the generators sent
in that second. ``written/s``: metric rows of the run that appeared in the SQLite store in
that second (read-only queries; the store is in WAL mode so they do not block the server).
``queued``/``user``/``dropped``: the recorder's ``stats()`` (points waiting to be written,
of them user points, system points dropped so far; ``queued`` includes the points a flush
in progress holds). The recorder's Ray mailbox (calls received but not yet run)
is invisible to it: ``rtt`` (how long that ``stats()`` call took; ``>x`` = still pending)
and ``lag`` (seconds of generator calls not yet run by the recorder, from the completion
of each generator's last call of each second) show that backlog. ``cpu%``: the recorder
process, the generators together, the MLflow server (all its processes) and the whole
machine (100 = one core).

At the end the generators wait until the recorder has run their last call, then
``recorder.finish("FINISHED", "SUCCEEDED")`` writes what is queued, and the run is read
back from SQLite: every ``rank<r>/loss`` key must hold exactly the points sent for it (lost
= sent - written; written > sent would be duplicates). MLflow requests are derived, not
counted: ``ceil(rows / 900)`` (``MAX_BATCH_METRICS``) is a lower bound. The per-GPU write
rate is compared with RunRecorder's documented rule (``device_points_per_s`` = 500: each
node written every ``ceil(n_values / device_points_per_s)``-th sample, ``n_values`` = 5 per
GPU + 2 per node, nodes staggered); the steady figure comes from the sample indexes
between a node's writes. ``node writes`` shows how many points are written at one sample
index (staggered nodes spread them; in phase they would come as one burst), and
``live cadence`` how often the recorder's derived ``system/cluster/*`` and ``train/*``
points were written during the load (documented: 1 Hz).

Prints a summary and one JSON object (also written to ``--json PATH``). Exit code 0 when
no user point was lost and the recorder's queue stayed within its ``max_queued``; 1
otherwise (or when a generator failed). Services that were already running are used and
left running; the ones this script started are stopped at the end.

Usage: python benchmarks/recorder_capacity.py [--seconds 120] [--workers 1000]
       [--gpus 1000] [--generators 4] [--gpus-per-node 8] [--json PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import json
import logging
import math
import os
import random
import sqlite3
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

GPU_METRICS = ("utilization", "memory_used_mb", "power_w", "temperature_c", "sm_clock_mhz")
HOST_METRICS = ("cpu_utilization", "memory_used_mb")
#: (low, span) of each simulated reading
_RANGES = {
    "utilization": (85.0, 15.0),
    "memory_used_mb": (60_000.0, 10_000.0),
    "power_w": (500.0, 200.0),
    "temperature_c": (60.0, 20.0),
    "sm_clock_mhz": (1_900.0, 80.0),
    "cpu_utilization": (20.0, 60.0),
}
_HOST_MEMORY = (800_000.0, 100_000.0)
SLICES = 10  # a generator spreads one second's calls over 10 slots of 100 ms
STEPS_PER_S = 4
BATCH_SIZE = 32
SEQ_LEN = 1024


def node_layout(gpus: int, gpus_per_node: int) -> list[tuple[str, int]]:
    """Simulated nodes: (label as ``node_label`` makes it, GPUs on the node)."""
    nodes = []
    for i in range(math.ceil(gpus / gpus_per_node)):
        label = f"10-{i // 65536 % 256}-{i // 256 % 256}-{i % 256}"
        nodes.append((label, min(gpus_per_node, gpus - i * gpus_per_node)))
    return nodes


class LoadGenerator:
    """Simulates workers ``ranks`` and node samplers ``nodes`` calling one recorder at 1 Hz."""

    def __init__(self, recorder: Any, ranks: list[int], nodes: list[tuple[str, int]], seed: int):
        self._rec = recorder
        self._ranks = ranks
        self._nodes = []
        for label, n_gpus in nodes:
            spec = [
                (f"system/{label}/gpu{i}/{m}", *_RANGES[m])
                for i in range(n_gpus)
                for m in GPU_METRICS
            ]
            spec.append((f"system/{label}/cpu_utilization", *_RANGES["cpu_utilization"]))
            spec.append((f"system/{label}/memory_used_mb", *_HOST_MEMORY))
            self._nodes.append(spec)
        self._rng = random.Random(seed)
        self._workers = {
            r: {
                "steps": 0,
                "samples": 0.0,
                "tokens": 0.0,
                "step_time_s": 0.0,
                "data_wait_s": 0.0,
                "comm_s": 0.0,
            }
            for r in ranks
        }
        self.user_sent = dict.fromkeys(ranks, 0)
        self.loss_sent = 0  # rank 0's plain ``loss``
        self.worker_calls = 0
        self.node_calls = 0
        self.user_points = 0
        self.system_points = 0
        self.ticks = 0
        self.late_s = 0.0
        self.max_late_s = 0.0
        self.processed_tick = -1
        self.done = False
        self.error = ""
        self._markers: deque = deque()
        self._markers_lock = threading.Lock()
        self._last_ref = None
        self._thread: threading.Thread | None = None

    def pid(self) -> int:
        return os.getpid()

    def start(self, t0: float, seconds: float) -> None:
        self._thread = threading.Thread(target=self._run, args=(t0, seconds), daemon=True)
        self._thread.start()

    def _run(self, t0: float, seconds: float) -> None:
        try:
            self._loop(t0, t0 + seconds)
        except BaseException as exc:  # reported to the driver
            self.error = repr(exc)
        finally:
            self.done = True

    def _loop(self, t0: float, end: float) -> None:
        rank_slots = [self._ranks[s::SLICES] for s in range(SLICES)]
        node_slots = [self._nodes[s::SLICES] for s in range(SLICES)]
        tick = 0
        while True:
            for s in range(SLICES):
                target = t0 + tick + s / SLICES
                now = time.time()
                if now < target:
                    time.sleep(target - now)
                    now = time.time()
                if now >= end:
                    return
                self.late_s = now - target
                self.max_late_s = max(self.max_late_s, self.late_s)
                for rank in rank_slots[s]:
                    self._send_worker(rank, now)
                for spec in node_slots[s]:
                    self._send_node(spec, tick, now)
            if self._last_ref is not None:
                with self._markers_lock:
                    self._markers.append((tick, self._last_ref))
            tick += 1
            self.ticks = tick

    def _send_worker(self, rank: int, now: float) -> None:
        rng = self._rng
        w = self._workers[rank]
        step_times = [0.19 + 0.02 * rng.random() for _ in range(STEPS_PER_S)]
        w["steps"] += STEPS_PER_S
        w["samples"] += STEPS_PER_S * BATCH_SIZE
        w["tokens"] += STEPS_PER_S * BATCH_SIZE * SEQ_LEN
        w["step_time_s"] += sum(step_times)
        w["data_wait_s"] += 0.02 * rng.random()
        w["comm_s"] += 0.03 + 0.01 * rng.random()
        loss = 2.0 * math.exp(-w["steps"] / 20_000) + 0.05 * rng.random()
        points = [[f"rank{rank}/loss", loss, w["steps"], now]]
        if rank == 0:
            points.append(["loss", loss, w["steps"], now])
        batch = {"counters": {"time": now, **w, "step_times": step_times}, "points": points}
        self._last_ref = self._rec.worker_batch.remote(rank, batch)
        self.worker_calls += 1
        self.user_points += len(points)
        self.user_sent[rank] += 1
        self.loss_sent += rank == 0

    def _send_node(self, spec: list[tuple[str, float, float]], index: int, now: float) -> None:
        rnd = self._rng.random
        values = {key: low + span * rnd() for key, low, span in spec}
        self._last_ref = self._rec.node_metrics.remote(values, index, now)
        self.node_calls += 1
        self.system_points += len(values)

    def _check_markers(self) -> None:
        import ray

        with self._markers_lock:
            if not self._markers:
                return
            refs = [ref for _, ref in self._markers]
            ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
            ready_set = set(ready)
            while self._markers and self._markers[0][1] in ready_set:
                self.processed_tick = self._markers.popleft()[0]

    def progress(self) -> dict[str, Any]:
        self._check_markers()
        return {
            "worker_calls": self.worker_calls,
            "node_calls": self.node_calls,
            "user_points": self.user_points,
            "system_points": self.system_points,
            "ticks": self.ticks,
            "processed_tick": self.processed_tick,
            "late_s": self.late_s,
            "done": self.done,
            "error": self.error,
        }

    def finish(self, timeout_s: float) -> dict[str, Any]:
        """Wait for the load to end and for the recorder to have run this generator's last call."""
        import ray

        if self._thread is not None:
            self._thread.join()
        t = time.monotonic()
        drained = True
        if self._last_ref is not None:
            try:
                ray.get(self._last_ref, timeout=timeout_s)
            except Exception as exc:
                drained = False
                self.error = self.error or f"last call not confirmed: {exc!r}"
        return {
            **self.progress(),
            "max_late_s": self.max_late_s,
            "drain_s": time.monotonic() - t,
            "drained": drained,
            "user_sent": {str(r): n for r, n in self.user_sent.items()},
            "loss_sent": self.loss_sent,
        }


# -- measuring from outside ------------------------------------------------------------
class Store:
    """Read-only queries on the MLflow server's SQLite store."""

    def __init__(self, db: Path, run_id: str):
        self._conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
        self._run = run_id

    def rows(self, where: str = "", *args: Any) -> int:
        sql = "SELECT COUNT(*) FROM metrics WHERE run_uuid=?" + (f" AND {where}" if where else "")
        return self._conn.execute(sql, (self._run, *args)).fetchone()[0]

    def counts(self, like: str) -> dict[str, int]:
        sql = "SELECT key, COUNT(*) FROM metrics WHERE run_uuid=? AND key LIKE ? GROUP BY key"
        return dict(self._conn.execute(sql, (self._run, like)).fetchall())

    def per_step(self, where: str) -> list[int]:
        """Rows per step of the keys matching ``where`` (system series: per sample index)."""
        sql = f"SELECT COUNT(*) FROM metrics WHERE run_uuid=? AND {where} GROUP BY step"
        return [n for (n,) in self._conn.execute(sql, (self._run,))]

    def write_intervals(self, like: str) -> list[int]:
        """Steps between consecutive written points of each key matching ``like``."""
        sql = "SELECT key, step FROM metrics WHERE run_uuid=? AND key LIKE ? ORDER BY key, step"
        gaps, last = [], {}
        for key, step in self._conn.execute(sql, (self._run, like)):
            if key in last:
                gaps.append(step - last[key])
            last[key] = step
        return gaps

    def close(self) -> None:
        self._conn.close()


class CpuMeter:
    """CPU% (100 = one core) of process groups, since the previous reading."""

    def __init__(self, groups: dict[str, list[int]]):
        import psutil

        self._psutil = psutil
        self._groups: dict[str, list[Any]] = {}
        for name, pids in groups.items():
            procs = []
            for pid in pids:
                with contextlib.suppress(psutil.Error):
                    proc = psutil.Process(pid)
                    procs.append(proc)
                    if name == "mlflow":
                        procs.extend(proc.children(recursive=True))
            self._groups[name] = procs
        self.read()
        psutil.cpu_percent(interval=None)
        self.history: dict[str, list[float]] = {name: [] for name in [*groups, "machine"]}

    def read(self) -> dict[str, float]:
        out = {}
        for name, procs in self._groups.items():
            total = 0.0
            for proc in procs:
                with contextlib.suppress(self._psutil.Error):
                    total += proc.cpu_percent(interval=None)
            out[name] = total
        return out

    def sample(self) -> dict[str, float]:
        out = self.read()
        out["machine"] = self._psutil.cpu_percent(interval=None) * self._psutil.cpu_count()
        for name, value in out.items():
            self.history[name].append(value)
        return out


def _actor_pid(actor: Any, ray_pid: int | None) -> int | None:
    """The recorder's process id: Ray's state API, else the only ``ray::RunRecorder`` below our head."""
    with contextlib.suppress(Exception):
        from ray.util.state import get_actor

        info = get_actor(actor._actor_id.hex())
        if info is not None and info.pid:
            return int(info.pid)
    if ray_pid is None:
        return None
    import psutil

    with contextlib.suppress(psutil.Error):
        found = [
            p.pid
            for p in psutil.Process(ray_pid).children(recursive=True)
            if "RunRecorder" in " ".join(p.cmdline()[:1])
        ]
        if len(found) == 1:
            return found[0]
    return None


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else 0.0


# -- the benchmark -----------------------------------------------------------------------
@dataclasses.dataclass
class Load:
    """The running benchmark: the run, its recorder, the generators and the meters."""

    run_id: str
    job_id: str
    recorder: Any
    gens: list[Any]
    nodes: list[tuple[str, int]]
    cpu: CpuMeter
    store: Store
    rows_before: int
    max_queued: int
    budget: float
    warnings: list[str]


@dataclasses.dataclass
class Seconds:
    """What the per-second loop saw: one line per second and the recorder's queue."""

    t0: float
    lines: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    stats_ref: Any = None
    rtts: list[float] = dataclasses.field(default_factory=list)
    max_queued: int = 0
    max_user: int = 0
    rows_at_end: int = 0

    def saw(self, stats: dict[str, Any]) -> None:
        self.stats = stats
        self.max_queued = max(self.max_queued, stats["queued"])
        self.max_user = max(self.max_user, stats["queued_user"])


def start_load(args: argparse.Namespace, services: Any) -> Load:
    """One MLflow run, its RunRecorder (created as ``ray_backend.driver`` creates it) and
    ``--generators`` LoadGenerator actors, ready to start."""
    import ray

    from jupyter_trainfactory.tracking import TAG, client, create_job_run
    from ray_backend.protocol import RECORDER_NAMESPACE, recorder_name
    from ray_backend.recorder import RunRecorder

    defaults = inspect.signature(RunRecorder.__init__).parameters
    nodes = node_layout(args.gpus, args.gpus_per_node)
    ray.init(address=services.ray_address, logging_level=logging.WARNING, log_to_driver=True)
    job_id = f"bench-{time.strftime('%Y%m%d-%H%M%S')}"
    run = create_job_run(
        client(services.tracking_uri),
        "trainfactory-bench",
        job_id,
        tags={TAG.JOB_ID: job_id, TAG.SOURCE: "benchmarks/recorder_capacity.py"},
        params={
            "workers": str(args.workers),
            "gpus": str(args.gpus),
            "gpus_per_node": str(args.gpus_per_node),
            "generators": str(args.generators),
            "seconds": str(args.seconds),
        },
    )
    run_id = run.info.run_id
    recorder = (
        ray.remote(RunRecorder)
        .options(
            name=recorder_name(job_id),
            namespace=RECORDER_NAMESPACE,
            num_cpus=0,
            lifetime=None,
        )
        .remote(services.tracking_uri, run_id, gpus_per_worker=1.0)
    )
    ray.get(recorder.ping.remote(), timeout=180)
    recorder.set_state.remote("RUNNING", "")

    generator = ray.remote(LoadGenerator).options(num_cpus=0)
    ranks = list(range(args.workers))
    gens = [
        generator.remote(recorder, ranks[g :: args.generators], nodes[g :: args.generators], g)
        for g in range(args.generators)
    ]
    gen_pids = ray.get([g.pid.remote() for g in gens], timeout=180)
    ray_proc = services.processes.get("ray")
    rec_pid = _actor_pid(recorder, ray_proc.pid if ray_proc else None)
    mlflow_proc = services.processes.get("mlflow")
    cpu = CpuMeter(
        {
            "recorder": [rec_pid] if rec_pid else [],
            "generators": gen_pids,
            "mlflow": [mlflow_proc.pid] if mlflow_proc else [],
        }
    )
    warnings = [] if rec_pid else ["recorder process not found: its CPU% is not measured"]
    store = Store(Path(services.home) / "mlflow" / "mlflow.db", run_id)
    return Load(
        run_id=run_id,
        job_id=job_id,
        recorder=recorder,
        gens=gens,
        nodes=nodes,
        cpu=cpu,
        store=store,
        rows_before=store.rows(),
        max_queued=defaults["max_queued"].default,
        budget=defaults["device_points_per_s"].default,
        warnings=warnings,
    )


def _print_header(args: argparse.Namespace, load: Load) -> None:
    n_nodes = len(load.nodes)
    print(
        f"run {load.run_id} ({load.job_id}): {args.workers} workers, {args.gpus} GPUs on"
        f" {n_nodes} nodes, {args.generators} generators, {args.seconds:g} s; target"
        f" {args.workers + n_nodes} calls/s, {args.workers + 1} user points/s,"
        f" {args.gpus * len(GPU_METRICS) + n_nodes * len(HOST_METRICS)} system points/s",
        flush=True,
    )
    print(
        f"{'t':>4} {'calls/s':>7} {'user/s':>6} {'sys/s':>6} | {'written/s':>9} |"
        f" {'queued':>7} {'(user)':>7} {'dropped':>7} | {'rtt':>6} {'lag':>4} |"
        f" cpu% rec  gens mlflow machine",
        flush=True,
    )


def run_seconds(args: argparse.Namespace, load: Load) -> Seconds:
    """Start the generators and, once a second until they are done, read what they sent,
    the rows written and the recorder's ``stats()`` (without waiting for a slow one);
    prints one line a second."""
    import ray

    _print_header(args, load)
    seen = Seconds(t0=time.time() + 1.0, rows_at_end=load.rows_before)
    ray.get([g.start.remote(seen.t0, args.seconds) for g in load.gens], timeout=60)
    prev = {"calls": 0, "user": 0, "system": 0, "rows": load.rows_before}
    stats_at, second = 0.0, 0
    while True:
        second += 1
        delay = seen.t0 + second - time.time()
        if delay > 0:
            time.sleep(delay)
        if seen.stats_ref is None:
            seen.stats_ref, stats_at = load.recorder.stats.remote(), time.time()
        ready, _ = ray.wait([seen.stats_ref], timeout=0.3)
        if ready:
            seen.saw(ray.get(seen.stats_ref))
            seen.rtts.append(time.time() - stats_at)
            rtt_text = f"{seen.rtts[-1]:6.2f}"
            seen.stats_ref = None
        else:
            rtt_text = f">{time.time() - stats_at:5.1f}"
        progress = ray.get([g.progress.remote() for g in load.gens], timeout=60)
        rows = load.store.rows()
        now = {
            "calls": sum(p["worker_calls"] + p["node_calls"] for p in progress),
            "user": sum(p["user_points"] for p in progress),
            "system": sum(p["system_points"] for p in progress),
            "rows": rows,
        }
        lag = max(p["ticks"] - 1 - p["processed_tick"] for p in progress)
        usage = load.cpu.sample()
        line = {
            "t": second,
            "calls": now["calls"] - prev["calls"],
            "user": now["user"] - prev["user"],
            "system": now["system"] - prev["system"],
            "written": rows - prev["rows"],
            "queued": seen.stats.get("queued", 0),
            "queued_user": seen.stats.get("queued_user", 0),
            "dropped": seen.stats.get("dropped", 0),
            "lag_s": lag,
            **{f"cpu_{k}": round(v, 1) for k, v in usage.items()},
        }
        seen.lines.append(line)
        prev = now
        print(
            f"{second:4d} {line['calls']:7d} {line['user']:6d} {line['system']:6d} |"
            f" {line['written']:9d} | {line['queued']:7d} {line['queued_user']:7d}"
            f" {line['dropped']:7d} | {rtt_text} {lag:4d} |"
            f"      {usage['recorder']:4.0f} {usage['generators']:5.0f} {usage['mlflow']:6.0f}"
            f" {usage['machine']:7.0f}",
            flush=True,
        )
        if second <= args.seconds + 0.5:
            seen.rows_at_end = rows
        if all(p["done"] for p in progress):
            return seen


def drain(load: Load, seen: Seconds) -> dict[str, Any]:
    """Wait until the recorder has run every generator call, then ``finish()`` the run;
    returns the generators' final counts and the times each part took."""
    import ray

    t_drain = time.time()
    finals = ray.get([g.finish.remote(600.0) for g in load.gens], timeout=660)
    drained_s = time.time() - t_drain
    with contextlib.suppress(Exception):
        if seen.stats_ref is not None:
            seen.saw(ray.get(seen.stats_ref, timeout=600))
    queued_before_finish = ray.get(load.recorder.stats.remote(), timeout=600)
    seen.max_queued = max(seen.max_queued, queued_before_finish["queued"])
    t_finish = time.time()
    final_stats = ray.get(load.recorder.finish.remote("FINISHED", "SUCCEEDED"), timeout=660)
    done = time.time()
    for f in finals:
        if f["error"]:
            load.warnings.append(f"generator failed: {f['error']}")
    return {
        "finals": finals,
        "drained_s": drained_s,
        "queued_before_finish": queued_before_finish["queued"],
        "final_stats": final_stats,
        "finish_s": done - t_finish,
        "done": done,
    }


def read_back(load: Load, finals: list[dict[str, Any]], t0: float, load_s: float) -> dict:
    """The run's rows in the SQLite store against what the generators sent: user points
    lost, duplicated or under a wrong key; system rows, per-GPU rows, node write
    intervals, points per sample index, and the derived live series during the load."""
    store = load.store
    user_sent = {f"rank{r}/loss": n for f in finals for r, n in f["user_sent"].items()}
    loss_sent = sum(f["loss_sent"] for f in finals)
    written_rank = store.counts("rank%/loss")
    lost = sum(max(0, n - written_rank.get(k, 0)) for k, n in user_sent.items())
    dup = sum(max(0, written_rank.get(k, 0) - n) for k, n in user_sent.items())
    dup += sum(n for k, n in written_rank.items() if k not in user_sent)
    bad_keys = sum(written_rank.get(k, 0) != n for k, n in user_sent.items())
    loss_written = store.rows("key = 'loss'")
    system_like = "key LIKE 'system/%' AND key NOT LIKE 'system/cluster/%'"
    window = "timestamp BETWEEN ? AND ?", int(t0 * 1000), int((t0 + load_s) * 1000)
    counts = {
        "user_sent": sum(user_sent.values()) + loss_sent,
        "user_written": sum(written_rank.values()) + loss_written,
        "lost": lost + max(0, loss_sent - loss_written),
        "duplicates": dup + max(0, loss_written - loss_sent),
        "keys": len(user_sent) + 1,
        "keys_mismatched": bad_keys + (loss_written != loss_sent),
        "system_written": store.rows(system_like),
        "gpu_rows": store.rows(system_like + " AND key LIKE 'system/%/gpu%/%'"),
        "gaps": store.write_intervals("system/%/gpu0/utilization"),
        "bursts": store.per_step(system_like),
        "cluster_points": store.rows(
            "key = 'system/cluster/gpu_utilization_mean' AND " + window[0], *window[1:]
        ),
        "train_points": store.rows("key = 'train/tokens_per_s' AND " + window[0], *window[1:]),
        "total_rows": store.rows(),
    }
    store.close()
    return counts


def _offered(
    args: argparse.Namespace, load: Load, finals: list, user_sent: int, load_s: float
) -> dict:
    """The load the generators sent (``user_sent``: user points, as read back), per second,
    against the target; a warning when short."""
    n_nodes = len(load.nodes)
    worker_calls = sum(f["worker_calls"] for f in finals)
    node_calls = sum(f["node_calls"] for f in finals)
    system_points = sum(f["system_points"] for f in finals)
    fraction = min(
        worker_calls / max(1, args.workers * load_s), node_calls / max(1, n_nodes * load_s)
    )
    late = max(f["max_late_s"] for f in finals)
    if fraction < 0.95:
        load.warnings.append(
            f"the generators could not offer the target load on this machine: they sent"
            f" {worker_calls / load_s:.0f} of {args.workers} worker calls/s and"
            f" {node_calls / load_s:.0f} of {n_nodes} node calls/s"
            f" ({fraction:.0%}); max lateness {late:.1f} s"
        )
    return {
        "target_calls_per_s": args.workers + n_nodes,
        "calls_per_s": (worker_calls + node_calls) / load_s,
        "worker_calls_per_s": worker_calls / load_s,
        "node_calls_per_s": node_calls / load_s,
        "user_points_per_s": user_sent / load_s,
        "system_points_per_s": system_points / load_s,
        "points_per_s": (user_sent + system_points) / load_s,
        "fraction_of_target": fraction,
        "max_generator_late_s": late,
    }


def _system(args: argparse.Namespace, load: Load, got: dict, drained: dict, load_s: float):
    """The system points: sent, written, dropped, the per-GPU rate against RunRecorder's
    documented rule, the node write intervals and the live derived series' cadence."""
    # RunRecorder's documented rule: 5 values per GPU + 2 per node; each node's series is
    # written every ceil(n_values / device_points_per_s)-th 1 Hz sample, nodes staggered.
    n_values = args.gpus * len(GPU_METRICS) + 2 * len(load.nodes)
    doc_every = max(1, math.ceil(n_values / load.budget))
    doc_period = float(doc_every)
    gaps = got["gaps"]
    return {
        "sent": sum(f["system_points"] for f in drained["finals"]),
        "written": got["system_written"],
        "dropped": drained["final_stats"].get("dropped", 0),
        "per_gpu_points_per_s": got["gpu_rows"] / load_s / max(1, args.gpus),
        "documented_per_gpu_points_per_s": len(GPU_METRICS) / doc_period,
        "documented_node_period_s": doc_period,
        "code_node_period_s": doc_period,
        "code_node_every_samples": doc_every,
        "measured_node_interval_samples": _mean(gaps) if gaps else None,
        "measured_node_interval_median": statistics.median(gaps) if gaps else None,
        "per_gpu_points_per_s_steady": len(GPU_METRICS) / _mean(gaps) if gaps else None,
        "sample_indexes_written": len(got["bursts"]),
        "max_points_one_sample_index": max(got["bursts"], default=0),
        "cluster_view_hz": got["cluster_points"] / load_s,
        "train_hz": got["train_points"] / load_s,
    }


def run_benchmark(args: argparse.Namespace, services: Any, ours: bool) -> dict[str, Any]:
    """Start the load, run it for ``--seconds``, drain it and read the run back; returns
    the result printed by :func:`summary` (and written by ``--json``)."""
    from ray_backend.recorder import MAX_BATCH_METRICS

    load = start_load(args, services)
    seen = run_seconds(args, load)
    load_s = float(args.seconds)
    drained = drain(load, seen)
    finals = drained["finals"]
    got = read_back(load, finals, seen.t0, load_s)
    offered = _offered(args, load, finals, got["user_sent"], load_s)
    n_nodes = len(load.nodes)
    elapsed = drained["done"] - seen.t0
    rows = got["total_rows"] - load.rows_before
    requests = math.ceil(rows / MAX_BATCH_METRICS)
    return {
        "config": {
            "seconds": args.seconds,
            "workers": args.workers,
            "gpus": args.gpus,
            "nodes": n_nodes,
            "gpus_per_node": args.gpus_per_node,
            "generators": args.generators,
            "max_queued": load.max_queued,
            "device_points_per_s": load.budget,
            "cpu_count": os.cpu_count(),
            "services": "started by this script" if ours else "already running",
            "run_id": load.run_id,
            "tracking_uri": services.tracking_uri,
        },
        "offered": offered,
        "user": {
            "sent": got["user_sent"],
            "written": got["user_written"],
            "lost": got["lost"],
            "duplicates": got["duplicates"],
            "keys": got["keys"],
            "keys_mismatched": got["keys_mismatched"],
        },
        "system": _system(args, load, got, drained, load_s),
        "recorder_derived_rows": got["total_rows"] - got["user_written"] - got["system_written"],
        "queue": {
            "max_queued": seen.max_queued,
            "max_queued_user": seen.max_user,
            "bound": load.max_queued,
            "bounded": seen.max_queued <= load.max_queued,
            "queued_before_finish": drained["queued_before_finish"],
            "stats_rtt_max_s": max(seen.rtts) if seen.rtts else None,
            "stats_rtt_mean_s": _mean(seen.rtts) if seen.rtts else None,
            "max_lag_s": max((ln["lag_s"] for ln in seen.lines), default=0),
        },
        "mlflow": {
            "rows": rows,
            "rows_per_s_during_load": (seen.rows_at_end - load.rows_before) / load_s,
            "rows_per_s_overall": rows / elapsed,
            "requests_lower_bound": requests,
            "requests_per_s_lower_bound": requests / elapsed,
            "requests_note": "derived: ceil(rows / 900), not counted",
        },
        "timing": {
            "load_s": load_s,
            "drain_generators_s": drained["drained_s"],
            "finish_s": drained["finish_s"],
            "elapsed_s": elapsed,
        },
        "cpu_mean_percent": {k: _mean(v) for k, v in load.cpu.history.items()},
        "cpu_max_percent": {k: max(v, default=0.0) for k, v in load.cpu.history.items()},
        "final_stats": drained["final_stats"],
        "per_second": seen.lines,
        "warnings": load.warnings,
    }


def summary(r: dict[str, Any]) -> str:
    c, o, u, s, q, m, t = (
        r[k] for k in ("config", "offered", "user", "system", "queue", "mlflow", "timing")
    )
    interval = s["measured_node_interval_samples"]
    cpu, cpu_max = r["cpu_mean_percent"], r["cpu_max_percent"]
    out = [
        "",
        "== RunRecorder capacity ==",
        f"job          : {c['workers']} workers, {c['gpus']} GPUs / {c['nodes']} nodes,"
        f" {c['seconds']:g} s of load, {c['generators']} generators, {c['cpu_count']} CPUs",
        f"offered      : {o['calls_per_s']:.0f} calls/s of {o['target_calls_per_s']} target"
        f" ({o['fraction_of_target']:.0%}); {o['user_points_per_s']:.0f} user +"
        f" {o['system_points_per_s']:.0f} system = {o['points_per_s']:.0f} points/s",
        f"user points  : sent {u['sent']}, written {u['written']}, LOST {u['lost']},"
        f" duplicates {u['duplicates']} ({u['keys_mismatched']} of {u['keys']} keys off)",
        f"system points: sent {s['sent']}, written {s['written']}, dropped {s['dropped']}",
        f"per-GPU rate : {s['per_gpu_points_per_s']:.3f} points/s/GPU written; documented"
        f" {s['documented_per_gpu_points_per_s']:.3f} (node every {s['documented_node_period_s']:.2f} s);"
        f" code's formula {s['code_node_period_s']:.2f} s -> every {s['code_node_every_samples']}"
        f" samples; measured every {interval:.2f} samples"
        f" (steady {s['per_gpu_points_per_s_steady']:.3f} points/s/GPU)"
        if interval is not None
        else f"per-GPU rate : {s['per_gpu_points_per_s']:.3f} points/s/GPU (no repeated node write)",
        f"node writes  : {s['sample_indexes_written']} distinct sample indexes written, up to"
        f" {s['max_points_one_sample_index']} system points at one index",
        f"live cadence : system/cluster/* {s['cluster_view_hz']:.2f} Hz (documented 1 Hz),"
        f" train/tokens_per_s {s['train_hz']:.2f} Hz, during the load",
        f"derived rows : {r['recorder_derived_rows']} (train/*, system/cluster/*, energy/*)",
        f"queue        : max {q['max_queued']} (user {q['max_queued_user']}) of bound {q['bound']};"
        f" stats() rtt mean {q['stats_rtt_mean_s'] or 0:.2f} s, max {q['stats_rtt_max_s'] or 0:.2f}"
        f" s; max mailbox lag {q['max_lag_s']} s",
        f"MLflow       : {m['rows']} rows; {m['rows_per_s_during_load']:.0f} rows/s during load,"
        f" {m['rows_per_s_overall']:.0f} rows/s overall; >= {m['requests_lower_bound']}"
        f" log_batch requests ({m['requests_per_s_lower_bound']:.1f}/s, {m['requests_note']})",
        f"timing       : drain after load {t['drain_generators_s']:.1f} s, finish()"
        f" {t['finish_s']:.1f} s, load start to closed run {t['elapsed_s']:.1f} s",
        f"cpu% mean/max: recorder {cpu.get('recorder', 0):.0f}/{cpu_max.get('recorder', 0):.0f},"
        f" generators {cpu.get('generators', 0):.0f}/{cpu_max.get('generators', 0):.0f},"
        f" mlflow {cpu.get('mlflow', 0):.0f}/{cpu_max.get('mlflow', 0):.0f},"
        f" machine {cpu.get('machine', 0):.0f}/{cpu_max.get('machine', 0):.0f}"
        " (100 = one core)",
    ]
    out += [f"WARNING      : {w}" for w in r["warnings"]]
    out.append(f"result       : {'PASS' if r['passed'] else 'FAIL'}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--workers", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--generators", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--json", type=Path, default=None, metavar="PATH")
    args = parser.parse_args(argv)
    if min(args.workers, args.gpus, args.generators, args.gpus_per_node) < 1 or args.seconds <= 0:
        parser.error("--seconds, --workers, --gpus, --generators and --gpus-per-node must be > 0")

    from jupyter_trainfactory.services import ensure_services, load_services, stop_services

    before = load_services()
    running = {n for n, p in (before.processes.items() if before else ()) if p.alive()}
    services = ensure_services()
    started = tuple(n for n in ("ray", "mlflow") if n not in running)
    if running:
        print(
            f"using the already running {' and '.join(sorted(running))} of {services.home};"
            " they are left running",
            flush=True,
        )
    if started:
        print(f"started {' and '.join(started)} under {services.home}", flush=True)
    try:
        result = run_benchmark(args, services, ours=bool(started))
    finally:
        with contextlib.suppress(Exception):
            import ray

            ray.shutdown()
        if started:
            print(f"stopping {', '.join(stop_services(started)) or 'nothing'}", flush=True)
    # a failed generator makes the run invalid; an offered load short of target is a warning
    result["passed"] = (
        result["user"]["lost"] == 0
        and result["queue"]["bounded"]
        and not any(w.startswith("generator failed") for w in result["warnings"])
    )
    print(summary(result), flush=True)
    text = json.dumps({k: v for k, v in result.items() if k != "per_second"}, indent=2)
    print(text, flush=True)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
