"""RunRecorder: the single writer of one job's MLflow run (runs as a Ray actor in the job).

The recorder is the actor's facade: its remote methods, its two loops, the one lock, the
I/O (MLflow, worker kills) and the carrying out of decisions. What the inputs make of
the run is kept by its :class:`~ray_backend.record.JobRecord` and the parts it wires
together, which return points, tags and decisions (``ray_backend.decisions``):

- ``delivery``: queues, key mapping, batching to MLflow, outages, LoggedModels,
- ``reports``: the ``ray.train.report`` rounds and their steps,
- ``attempts``: attempts, ranks, failures and their root causes, restores, goodput inputs,
- ``stall``: the stall watch (decides ``stop`` or ``restart`` rank R),
- ``stop_control``, ``chaos_control``: stop requests and their agreement, fault injection,
- ``derived``: throughput, MFU, energy, checkpoint figures, node-sample thinning,
- the cost meter (``ray_backend.costs``) and the resume state (``ray_backend.resume``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from jupyter_trainfactory.telemetry.goodput import account
from jupyter_trainfactory.tracking import TAG, client
from ray_backend.control import decisions_from_tags
from ray_backend.costs import CostMeter
from ray_backend.decisions import Decision
from ray_backend.delivery import MAX_BATCH_METRICS, Delivery
from ray_backend.derived import DerivedNumbers
from ray_backend.kills import kill_workers
from ray_backend.protocol import RESERVED_KEYS, StopReply, WorkerBatch
from ray_backend.record import JobRecord
from ray_backend.resume import read_previous
from ray_backend.stall import StallWatch

__all__ = ["MAX_BATCH_METRICS", "RESERVED_KEYS", "RunRecorder"]


class RunRecorder:
    """Buffers a job's metrics and tags and writes them to its MLflow run in batches.

    Callers (the Ray Train controller callback, the workers' telemetry threads, the node
    samplers) only append to in-memory queues; a background thread derives the job's
    ``train/*`` numbers every ``derive_interval_s`` and another writes the queues with
    ``log_batch`` every ``flush_interval_s`` (see :class:`~ray_backend.delivery.Delivery`
    for delivery and the bound on queued points, and
    :class:`~ray_backend.derived.DerivedNumbers` for the thinning of node samples).

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
        self.run_id = run_id
        self._lock = threading.Lock()
        self._writing = threading.Lock()  # one flush's MLflow requests at a time
        self._record = JobRecord(
            Delivery(client(tracking_uri), run_id, max_queued),
            DerivedNumbers(
                gpus_per_worker, peak_tflops, flops_per_token, workers, device_points_per_s
            ),
            StallWatch(stall_timeout_s, on_stall),
            cost,
            target_steps,
            resumed=resume > 0,
        )
        # its parts, as attributes for callers in this process (use them under the lock)
        record = self._record
        self.delivery, self.attempts, self.stall = record.delivery, record.attempts, record.stall
        self.stop_control, self.chaos_control = record.stop_control, record.chaos_control
        self._interval = flush_interval_s
        self._derive_interval = derive_interval_s
        self._stop_polled = 0.0
        self._wake = threading.Event()  # set by finish(): the loops end without a last sleep
        self._reread_at_start = resume > 0
        self._start(resume)
        self._flusher = threading.Thread(target=self._flush_loop, name="run-recorder", daemon=True)
        self._flusher.start()
        self._deriver = threading.Thread(target=self._derive_loop, name="derive", daemon=True)
        self._deriver.start()

    def _start(self, resume: int) -> None:
        """Read the run: when the job was submitted (tag ``trainfactory.started``, else
        now), the chaos request of an earlier submission and, for a resume, what earlier
        submissions wrote (their steps, counts and totals go on)."""
        try:
            run = self.delivery.client.get_run(self.run_id)
        except Exception as exc:  # tracking server away at start: counts restart
            if resume:
                print(f"trainfactory: earlier submissions not read ({exc}).", flush=True)
            return
        tags = run.data.tags
        self.attempts.submitted = float(tags.get(TAG.STARTED) or run.info.start_time / 1000)
        self.chaos_control.seen_before(tags.get(TAG.CHAOS))
        if resume:
            self._record.resume(read_previous(run), resume)

    # -- inputs ---------------------------------------------------------------------
    def set_state(self, state: str, reason: str = "", line: str = "") -> None:
        """Record the job's state (``PENDING``, ``RUNNING``, ``RESTARTING``), its reason and,
        for ``PENDING``, the reason in a few words (``line``)."""
        if state == "RUNNING" and self._reread_at_start:
            self._reread_steps()
        now = time.time()
        with self._lock:
            self._record.set_state(state, reason, now, line)

    def _reread_steps(self) -> None:
        """A resume's first RUNNING: read the run's last steps again. The earlier
        submission's recorder may still have written after this one read the run at its
        start (a request in flight when ``stop --now`` killed it, seconds before these
        workers started): its steps stay written once (issue 48: step 119 twice)."""
        self._reread_at_start = False
        try:
            previous = read_previous(self.delivery.client.get_run(self.run_id))
        except Exception as exc:  # tracking server away: the start's read stands
            print(f"trainfactory: earlier submissions' steps not read again ({exc}).", flush=True)
            return
        with self._lock:
            self.delivery.continue_steps(previous.last_steps)

    def pending_reason(self, reason: str, line: str = "") -> bool:
        """Say what a ``PENDING`` job waits for now (in full and in a few words); False
        once it has left ``PENDING``."""
        with self._lock:
            return self._record.pending_reason(reason, line)

    def set_tags(self, tags: dict[str, str]) -> None:
        """Record run tags (values cut to 5,000 characters)."""
        with self._lock:
            self.delivery.tags.update({k: str(v)[:5000] for k, v in tags.items()})

    def set_environment(self, versions: dict[str, str], pip_freeze: str) -> None:
        """Record what the workers run with: tags ``trainfactory.env.<name>`` (Python, Ray,
        PyTorch, CUDA, driver; ``lineage.environment``) and the artifact
        ``environment/pip_freeze.txt`` (credentials in URLs already masked by the worker)."""
        with self._lock:
            self._record.set_environment(versions, pip_freeze)

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
        with self._lock:
            return self._record.report(metrics_per_rank, checkpoint_path, now)

    def worker_batch(self, rank: int, batch: WorkerBatch) -> StopReply:
        """Record one batch of a worker's telemetry (``protocol.WorkerBatch``).

        Returns ``{"stop": True, "at": ...}`` once a stop was requested (else
        ``{"stop": False}``): the worker's ``trainfactory.should_stop()`` reads it. A
        batch with ``write`` (sent before a checkpoint) is written to MLflow with all the
        recorder holds before the reply (``written``): a job killed right after (``stop
        --now``: Ray kills the driver, and this actor, 3 s after its SIGTERM) cannot
        take with it the steps before a checkpoint that a resume restores."""
        now = time.time()
        with self._lock:
            reply = self._record.worker_batch(rank, batch, now)
        if batch.get("write") and not reply.get("closed"):
            try:
                self._write_points()
                reply = {**reply, "written": True}
            except Exception as exc:  # the tracking server away: the points stay queued
                self.delivery.went_offline(exc)
                reply = {**reply, "written": False}
        return reply

    def node_metrics(self, values: dict[str, float], step: int, wall_time: float) -> None:
        """Record one node sample: keys ``system/<node>/...``; ``step`` = sample index."""
        step += self._record.derived.tick_offset  # a resumed job's samples go on
        with self._lock:
            self._record.node_sample(values, step, wall_time)

    def gpu_info(self, node: str, devices: list[dict[str, Any]], note: str | None) -> None:
        """Which GPUs node ``node`` samples (label, uuid, name, mig), or why none."""
        tags = {}
        if devices:
            tags[f"{TAG.GPUS}{node}"] = json.dumps(devices)
        if note:
            tags[f"{TAG.GPU_NOTE}{node}"] = note
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
        ``%train status`` and the dashboard show (see ``Attempts.fail`` for its time).
        """
        now = time.time()
        with self._lock:
            self._record.worker_failure(rank, error, kind, detail, now)

    # -- ranks and control ----------------------------------------------------------
    def kill_ranks(self, ranks: list[int]) -> list[dict[str, Any]]:
        """SIGKILL the worker processes of ``ranks`` (one Ray task pinned to each node).

        Returns ``[{"rank", "pid", "node"}]`` of the processes killed. Raises ValueError
        for a rank that has not reported where it runs.
        """
        with self._lock:
            where = self.attempts.where(ranks)
        return kill_workers(where)

    def ranks(self) -> dict[int, dict[str, Any]]:
        """Where the current attempt's ranks run and how far they got: ``{rank: {pid,
        node_id, node_ip, visible, step}}`` (ranks appear as their workers start; ``step``
        0 until the rank's first step or report of this attempt arrives)."""
        with self._lock:
            steps = self.attempts.rank_steps
            return {r: {**info, "step": steps.get(r, 0)} for r, info in self.attempts.ranks.items()}

    def ranks_on_node(self, node: str) -> list[int]:
        """Ranks whose worker runs on ``node`` (an IP, or a node id or its prefix)."""
        with self._lock:
            return self.attempts.ranks_on_node(node)

    def chaos(self, request: dict[str, Any]) -> dict[str, Any]:
        """Carry out one fault-injection request: ``{"id", "rank": R}`` or ``{"id", "node":
        NODE}``. Returns ``{"id", "time", "killed": [...]}``, or ``"error"`` instead of
        ``killed`` when it could not be carried out (no such rank or worker)."""
        done: dict[str, Any] = {"id": request.get("id", ""), "time": round(time.time(), 3)}
        try:
            with self._lock:
                node = str(request["node"]) if "node" in request else None
                on_node = self.attempts.ranks_on_node(node) if node is not None else []
                ranks = self.chaos_control.targets(request, list(self.attempts.ranks), on_node)
            done["killed"] = self.kill_ranks(ranks)
            with self._lock:
                self.chaos_control.killed(done["id"], [k["pid"] for k in done["killed"]])
            print(f"trainfactory: chaos: killed {done['killed']}", flush=True)
        except Exception as exc:
            done["error"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return done

    def poll_control(self) -> None:
        """Read the requests that reach the job through its run's tags and carry them
        out (see ``control.decisions_from_tags``); called every 2 s by the flush thread.
        A chaos request is answered in ``trainfactory.chaos.done``."""
        try:
            tags = self.delivery.client.get_run(self.run_id).data.tags
        except Exception:  # tracking server away: ask again later
            return
        with self._lock:
            decisions = decisions_from_tags(tags, self.chaos_control, self.stop_control)
        self.carry_out(decisions)

    def carry_out(self, decisions: list[Decision]) -> None:
        """Carry out the parts' decisions, in order (see ``decisions.Decision``)."""
        for decision in decisions:
            if decision.note:
                print(decision.note, flush=True)
            if decision.kind == "stop":
                self.request_stop(decision.reason, decision.grace_s, decision.at)
            elif decision.kind == "chaos":
                self.set_tags({TAG.CHAOS_DONE: json.dumps(self.chaos(decision.request))})
            elif decision.kind == "restart":
                # killing one is enough: Ray Train restarts the whole group from the checkpoint
                try:
                    killed = self.kill_ranks([decision.rank])
                except Exception as exc:  # no worker known, or the node does not answer
                    print(f"trainfactory: cannot restart the stalled job: {exc}", flush=True)
                    continue
                print(f"trainfactory: restarting the stalled job: killed {killed}", flush=True)

    def request_stop(self, reason: str, grace_s: float = 300.0, at: float | None = None) -> None:
        """Stop the job after its next checkpoint, or after ``grace_s`` s without one."""
        with self._lock:
            if not self.stop_control.ask(reason, grace_s, at):
                return
        print(
            f"trainfactory: stop requested ({reason}); training ends after the next"
            f" checkpoint, or in {grace_s:g} s without one.",
            flush=True,
        )

    def stop_status(self) -> dict[str, Any] | None:
        """None, or the stop request with ``due``: True once training should end now (a
        checkpoint came after the request, the grace period is over, or training has not
        started, so there is nothing to save)."""
        with self._lock:
            return self.stop_control.status(bool(self.attempts.attempts), time.time())

    def goodput(self, now: float | None = None):
        """The job's :class:`~jupyter_trainfactory.telemetry.goodput.Goodput` so far."""
        now = now or time.time()
        with self._lock:
            inputs = self._record.goodput_inputs(now)
        return account(**inputs)

    # -- the derive clock -----------------------------------------------------------
    def derive(self, now: float) -> None:
        """One tick of the derive clock at ``now`` (s since the epoch): derived numbers,
        goodput and cost, the stop and stall watches; carries out their decisions."""
        with self._lock:
            self._record.tick(now)
        decisions = []
        if self.attempts.attempts:
            acc = self.goodput(now)
            with self._lock:
                decisions = self._record.goodput_update(acc, now)
        self.check_stop_wait(now)
        stall = self.check_stall(now)
        self.carry_out(([stall] if stall else []) + decisions)
        with self._lock:
            self.delivery.tags.update(self.delivery.renamed_tags())

    def check_stop_wait(self, now: float) -> None:
        """Name the rank a stop waits for in the run's tags (``StopControl.check_wait``)."""
        with self._lock:
            self._record.check_stop_wait(now)

    def check_stall(self, now: float) -> Decision | None:
        """Look for a stall at ``now`` (``StallWatch.check``): its tags go to the run; its
        decision is returned, not carried out."""
        with self._lock:
            return self._record.check_stall(now)

    def progressed(self, now: float) -> None:
        """A step or report arrived at ``now`` (for the stall watch)."""
        with self._lock:
            self._record.progressed(now)

    # -- writing ----------------------------------------------------------------------
    def flush(self, models_budget_s: float | None = None) -> None:
        """Write what is queued (900 metrics per request), then the checkpoints' models
        for up to ``models_budget_s`` s (None: all); raise if a request fails.

        Points of a failed request, and all after it, go back to the front of their queue.
        """
        queued = self._write_points()
        self.delivery.write_extras(models_budget_s)
        if self.delivery.offline:
            self.set_tags(self.delivery.back_online(queued))

    def _write_points(self) -> int:
        """Write the queued points and tags (a flush in flight ends first, so that after
        this every point taken before the call is in MLflow); returns how many were
        queued. Raises when a request fails, the points back at the front of the queue."""
        with self._writing:
            with self._lock:
                pending = self.delivery.take()
            try:
                self.delivery.write(pending)
            except Exception:
                with self._lock:  # nothing is lost: put back what was not written
                    self.delivery.put_back(pending)
                raise
            with self._lock:
                self.delivery.written()
        return len(pending)

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
        seen). A failure names the failing rank; one without ``error`` gets that rank's
        own (``Attempts.failed_error``). When the tracking server is away,
        retries for up to ``timeout_s`` s. Returns the delivery counts.
        """
        if reason is None:
            if self.stop_control.request is None:
                self.poll_control()
            reason = self.stop_control.final_reason()
        failed_rank = self.attempts.failed_rank
        if state == "FAILED" and not error:  # the failing rank's own, else a plain word
            error = self.attempts.failed_error or "the training failed"
        if error and failed_rank is not None and not error.startswith("rank "):
            error = f"rank {failed_rank}: {error}"
        with self._lock:
            self._record.finish(state, reason, error, time.time())
        self._wake.set()
        deadline = time.monotonic() + timeout_s
        self._flusher.join(timeout=timeout_s)  # a flush in flight holds points: let it end
        self._deriver.join(timeout=5)
        self.derive(time.time())
        self._last_flush(status, deadline, timeout_s)
        return self.stats()

    def _last_flush(self, status: str, deadline: float, timeout_s: float) -> None:
        delay = 0.5
        while True:
            try:
                self.flush()
                if self.delivery.empty():
                    self.delivery.client.set_terminated(self.run_id, status=status)
                    return
            except Exception as exc:
                self.delivery.went_offline(exc)
                if time.monotonic() > deadline:
                    print(
                        f"trainfactory: tracking server unreachable for {timeout_s:.0f} s at"
                        f" the end of the job; {self.delivery.queued()} points not written.",
                        flush=True,
                    )
                    return
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def stats(self) -> dict[str, Any]:
        """Delivery counts: queued, dropped (system points), offline seconds, non-finite values."""
        with self._lock:
            return self._record.stats()

    # -- loops ------------------------------------------------------------------------
    def _derive_loop(self) -> None:
        """Derived numbers on their own clock, so a slow tracking server does not thin them."""
        while not self._wake.wait(self._derive_interval):
            try:
                self.derive(time.time())
            except Exception as exc:  # a bug in a derived number must not stop recording
                print(f"trainfactory: derived metrics failed: {exc!r}", flush=True)

    def _flush_loop(self) -> None:
        delay = self._interval
        while not self._wake.wait(delay):
            if time.monotonic() - self._stop_polled >= 2.0:
                self._stop_polled = time.monotonic()
                self.poll_control()
            try:
                # a backlog of checkpoint models must not hold back the points and the
                # stop poll: a flush gives them at most one flush interval
                self.flush(models_budget_s=self._interval)
                delay = self._interval
            except Exception as exc:  # keep recording; MLflow may be briefly unreachable
                self.delivery.went_offline(exc)
                delay = min(delay * 2, 5.0)

    def ping(self) -> bool:
        """Liveness check for the driver."""
        return True
