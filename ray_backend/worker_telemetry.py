"""One worker process's telemetry buffer, shipped to its job's RunRecorder in the background.

The buffer builds the :class:`~ray_backend.protocol.WorkerBatch` es the recorder decodes
and takes its :class:`~ray_backend.protocol.StopReply` s (the stop agreement). It
imports neither Ray nor torch at import time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from ray_backend.protocol import (
    CheckpointSaved,
    Counters,
    InfoKind,
    StopPoint,
    StopReply,
    WorkerBatch,
)

__all__ = ["WorkerTelemetry"]

_STEP_TIMES_KEPT = 256  # per batch; a worker above 500 steps/s sends a sample of them


class WorkerTelemetry:
    """One worker process's telemetry buffer, shipped to the recorder in the background.

    ``send(rank, batch)`` is called with :class:`~ray_backend.protocol.WorkerBatch` es:
    ``counters`` (cumulative :class:`~jupyter_trainfactory.telemetry.stats.StepCounters`
    fields), ``points`` (``[key, value, step, time]`` lists), ``checks`` and, when new,
    ``stop``, ``checkpoints`` and the facts of :meth:`set_info`; its result (an ObjectRef
    of the recorder's :class:`~ray_backend.protocol.StopReply`) is read back by the
    shipping thread.
    """

    def __init__(
        self,
        send: Callable[[int, WorkerBatch], Any] | None,
        rank: int = 0,
        world_size: int = 1,
        flush_interval_s: float = 0.5,
    ):
        self.rank = rank
        self.world_size = world_size
        self._send = send
        self._lock = threading.Lock()
        self._agreed = threading.Condition(self._lock)  # notified when the stop point is known
        self._points: list[list] = []
        self._steps = 0
        self._log_calls = 0
        self._samples = 0.0
        self._tokens = 0.0
        self._step_time = 0.0
        self._data_wait = 0.0
        self._comm = 0.0
        self._comm_kinds = {"all_gather": 0.0, "reduce_scatter": 0.0}
        self._ingest_rows = 0.0
        self._step_times: list[float] = []
        self._extra: dict[InfoKind, dict[str, Any]] = {}
        self._started: float | None = None  # when the first training work began
        self._checkpoints: list[CheckpointSaved] = []
        self._dirty = False
        self._warned: set[str] = set()
        self._last_sent = 0.0
        self._comm_events: list[tuple[Any, Any, str | None]] = []  # CUDA (start, end, kind)
        self._interval = flush_interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stop_requested = False  # set from the recorder's reply; read by should_stop()
        # Stop agreement: every rank counts its stop points (should_stop() calls and
        # reports; the same sequence on every rank of an SPMD loop). Once a stop is
        # requested, a rank does not pass its next stop point until the recorder has told
        # it the agreed one (``stop_at``: one past the furthest rank), so no rank can be
        # in a collective that another rank never joins.
        self._checks = 0
        self.stop_at: int | None = None
        self._closing = False
        self._logged_step: int | None = None  # the last step given to log()
        self._replies: list[Any] = []
        #: Set at this rank's first step, ``log()`` or report: what waits for it (the
        #: versions, read in a thread) stays off the path to the first step.
        self.progressed = threading.Event()

    # -- recording (called from the training loop; cheap) ----------------------------
    @property
    def steps(self) -> int:
        return self._steps or self._log_calls

    def log(
        self,
        metrics: dict[str, Any],
        step: int | None = None,
        samples: float | None = None,
        tokens: float | None = None,
        rank_zero_only: bool = True,
    ) -> None:
        now = time.time()
        self.progressed.set()
        with self._lock:
            self._log_calls += 1
            if samples:
                self._samples += samples
            if tokens:
                self._tokens += tokens
            self._dirty = True
            if rank_zero_only and self.rank != 0:
                return
            at = self.steps if step is None else int(step)
            if step is not None:
                self._logged_step = at
            prefix = "" if rank_zero_only else f"rank{self.rank}/"
            for key, value in metrics.items():
                number = _to_float(value)
                if number is None:
                    self._warn_once(key, f"trainfactory.log: {key!r} is not a number; not logged.")
                    continue
                self._points.append([prefix + str(key), number, at, now])

    def started(self, when: float) -> None:
        """This worker's first training work began at ``when`` (s since the epoch): the
        first forward of a watched model, batch of a dataset shard or ``step``. Said to
        the recorder once (``started`` in the next batch): setup ends there, not at the
        first report (issue 48: a loop with one report per epoch booked its whole first
        epoch as startup)."""
        with self._lock:
            if self._started is not None:
                return
            self._started = when
            self._extra["started"] = {"time": when}
            self._dirty = True

    def add_step(self, seconds: float, samples: float | None, tokens: float | None) -> None:
        self.progressed.set()
        if self._started is None:  # once: no clock read or lock on every later step
            self.started(time.time() - seconds)
        with self._lock:
            self._steps += 1
            self._step_time += seconds
            if len(self._step_times) < _STEP_TIMES_KEPT:
                self._step_times.append(seconds)
            if samples:
                self._samples += samples
            if tokens:
                self._tokens += tokens
            self._dirty = True

    def add_data_wait(self, seconds: float) -> None:
        if self._started is None:  # a batch arrived: training on it begins
            self.started(time.time())
        with self._lock:
            self._data_wait += seconds
            self._dirty = True

    def add_ingest_rows(self, rows: float) -> None:
        with self._lock:
            self._ingest_rows += rows
            self._dirty = True

    def add_comm(self, seconds: float, kind: str | None = None) -> None:
        """A collective's ``seconds`` in flight; ``kind``: ``all_gather``,
        ``reduce_scatter`` or None (an allreduce)."""
        with self._lock:
            self._comm += seconds
            if kind is not None:
                self._comm_kinds[kind] += seconds
            self._dirty = True

    def add_comm_events(self, start: Any, end: Any, kind: str | None = None) -> None:
        """A CUDA collective's start and end events, resolved by the shipping thread."""
        with self._lock:
            self._comm_events.append((start, end, kind))

    def add_checkpoint(self, seconds: float, nbytes: int | None, step: int | None = None) -> None:
        """A checkpoint saved in ``seconds``: ``nbytes`` big, keeping progress up to
        ``step`` (the report's ``step``; default: the last step given to ``log``)."""
        with self._lock:
            ckpt = CheckpointSaved(save_s=seconds, bytes=nbytes, time=time.time())
            step = self._logged_step if step is None else step
            if step is not None:
                ckpt["step"] = int(step)
            self._checkpoints.append(ckpt)
            self._dirty = True

    def check(self, wait_s: float | None = None) -> bool:
        """One stop point (a ``should_stop()`` call or a report): True when the job stops
        here, the same answer on every rank at the same stop point.

        Without a stop request it is a counter increment. With one, the first stop point
        before the agreed one is known waits for it (the recorder agrees within about a
        second of every rank hearing of the request); ``wait_s`` bounds that wait (None:
        until agreed or closed; then the stop is taken here).
        """
        with self._agreed:
            if self.stop_requested and self.stop_at is None:
                deadline = None if wait_s is None else time.monotonic() + wait_s
                self._dirty = True  # the next batch carries this rank's stop point
                while self.stop_at is None and not self._closing:
                    left = 1.0 if deadline is None else deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._agreed.wait(min(left, 1.0))
            self._checks += 1
            self._dirty = True
            return self.stop_requested and (self.stop_at is None or self._checks >= self.stop_at)

    def set_info(self, kind: InfoKind, info: dict[str, Any]) -> None:
        """Once-in-a-while facts: ``model`` (parameters, shape) or ``device`` (name, node)."""
        with self._lock:
            self._extra[kind] = {**self._extra.get(kind, {}), **info}
            self._dirty = True

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            print(message, flush=True)

    # -- shipping -------------------------------------------------------------------
    def _resolve_comm_events(self) -> None:
        with self._lock:
            events, self._comm_events = self._comm_events, []
        pending = []
        done: list[tuple[float, str | None]] = []
        for start, end, kind in events:
            if end.query():
                done.append((start.elapsed_time(end) / 1000.0, kind))
            else:
                pending.append((start, end, kind))
        with self._lock:
            self._comm_events[:0] = pending
        for seconds, kind in done:
            self.add_comm(seconds, kind)

    def batch(self) -> WorkerBatch | None:
        """Take what was recorded since the previous batch (None when nothing changed)."""
        if self._comm_events:
            self._resolve_comm_events()
        with self._lock:
            if not self._dirty:
                return None
            counters = Counters(
                time=time.time(),
                steps=self.steps,
                samples=self._samples,
                tokens=self._tokens,
                step_time_s=self._step_time,
                data_wait_s=self._data_wait,
                comm_s=self._comm,
                all_gather_s=self._comm_kinds["all_gather"],
                reduce_scatter_s=self._comm_kinds["reduce_scatter"],
                ingest_rows=self._ingest_rows,
                step_times=self._step_times,
            )
            batch = WorkerBatch(counters=counters, points=self._points, checks=self._checks)
            if self.stop_requested and self.stop_at is None or self._closing:
                # this rank's stop point count, valid for the agreement: after the rank
                # heard of the stop it passes no further stop point until agreed
                batch["stop"] = StopPoint(
                    checks=self._checks, world_size=self.world_size, final=self._closing
                )
            if self._extra:
                batch.update(self._extra)
            if self._checkpoints:
                batch["checkpoints"] = self._checkpoints
            self._points, self._step_times, self._checkpoints, self._extra = [], [], [], {}
            self._dirty = False
            return batch

    def flush(self, force: bool = False, write: bool = False) -> Any:
        """Send what is buffered now; returns the send call's result (an ObjectRef).

        Without new data, an empty batch still goes out every few seconds (at once with
        ``force``) so that the recorder's reply (a stop request) reaches a worker that
        logs nothing. ``write``: the recorder writes it to MLflow before it replies."""
        pending = self.stop_requested and self.stop_at is None
        if pending:
            with self._lock:
                self._dirty = True  # the recorder waits for this rank's stop point count
        batch = self.batch()
        if batch is None and (force or time.time() - self._last_sent > 2.0):
            batch = WorkerBatch()
        if batch is None or self._send is None:
            return None
        if write:
            batch["write"] = True
        self._last_sent = time.time()
        ref = self._send(self.rank, batch)
        if ref is not None:
            self._replies.append(ref)
        return ref

    def drain(self, timeout: float = 30.0) -> None:
        """Send what is buffered and wait (up to ``timeout`` s) until the recorder has taken
        every batch sent so far: before the last checkpoint of a stop, so that no step
        logged before it arrives after the job has ended."""
        self.flush()
        pending = list(self._replies)
        if not pending:
            return
        import ray

        with contextlib.suppress(Exception):  # the recorder is gone: nothing to wait for
            ray.wait(pending, num_returns=len(pending), timeout=timeout)

    def confirm(self, timeout: float = 60.0) -> bool | None:
        """Send what is buffered and wait (up to ``timeout`` s) until the recorder wrote
        it to MLflow: True when it did, with every earlier batch (Ray runs one caller's
        calls to an actor in order); False when the job's record is closed or its recorder
        is gone (the job ends: what was sent is not in the run); None without an answer
        in time or when the tracking server is away (the points wait in the recorder).
        Outside a job (no recorder to send to) True: nothing waits."""
        ref = self.flush(force=True, write=True)
        if ref is None:
            return True
        import ray

        try:
            reply = ray.get(ref, timeout=timeout) or {}
        except ray.exceptions.GetTimeoutError:
            return None
        except Exception:  # the recorder died: with the driver, or the job is failing
            return False
        self.hear(reply)
        if reply.get("closed"):
            return False
        return True if reply.get("written", True) else None

    def _read_replies(self) -> None:
        """Look at the recorder's replies that have arrived (never waits for one)."""
        if not self._replies:
            return
        import ray

        ready, self._replies = ray.wait(self._replies, num_returns=len(self._replies), timeout=0)
        for ref in ready:
            try:
                reply = ray.get(ref) or {}
            except Exception:  # the recorder is gone or failed: no stop from it
                continue
            self.hear(reply)

    def hear(self, reply: StopReply) -> None:
        """Take the recorder's reply to a batch: ``{"stop": bool, "at": stop point or
        None}``; wakes a stop point waiting for the agreement."""
        if not reply.get("stop"):
            return
        with self._agreed:
            if not self.stop_requested:
                self.stop_requested = True
                self._dirty = True
            at = reply.get("at")
            if at is not None and self.stop_at is None:
                self.stop_at = int(at)
                self._agreed.notify_all()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="trainfactory-log", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(
            0.1 if self.stop_requested and self.stop_at is None else self._interval
        ):
            try:
                self.flush()
                self._read_replies()
            except Exception as exc:  # never break training over telemetry
                self._warn_once("__send__", f"trainfactory: telemetry not sent: {exc}")

    def close(self, timeout: float = 10.0) -> None:
        """Stop the shipping thread and send the rest, waiting up to ``timeout`` s for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        with self._agreed:  # a finished rank passes no more stop points: its count is final
            self._closing = True
            self._dirty = True
            self._agreed.notify_all()
        ref = self.flush()
        if ref is not None:
            import ray

            try:
                ray.get(ref, timeout=timeout)
            except Exception as exc:
                print(f"trainfactory: last telemetry not confirmed: {exc}", flush=True)


def _to_float(value: Any) -> float | None:
    if type(value) is float or type(value) is int:  # the common case, without a call
        return float(value)
    from jupyter_trainfactory.telemetry.keys import to_float

    return to_float(value)
