"""JobRecord: what a job's inputs make of its run, wired across the RunRecorder's parts.

Each input (a report round, a worker batch, a node sample, a failure, a tick of the
derive clock) is handed to the parts it concerns, and what they return (points, tags,
decisions: ``ray_backend.decisions``) is queued for delivery or handed back. A JobRecord
does no I/O, starts no thread and takes no lock: its RunRecorder calls it under its
lock and carries out the decisions.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_trainfactory.fleet.kinds import BY_STALL
from jupyter_trainfactory.fleet.records import failure_tags
from jupyter_trainfactory.telemetry.goodput import TIMELINE_TAG
from jupyter_trainfactory.tracking import TAG
from ray_backend.attempts import Attempts
from ray_backend.control import ChaosControl, StopControl
from ray_backend.costs import CostMeter
from ray_backend.decisions import Decision, Update
from ray_backend.delivery import Delivery
from ray_backend.derived import DerivedNumbers
from ray_backend.protocol import StopReply, WorkerBatch
from ray_backend.reports import Reports
from ray_backend.resume import Previous, with_previous
from ray_backend.stall import StallWatch

__all__ = ["JobRecord"]


class JobRecord:
    """The parts of one job's record and the routing of its inputs between them.

    ``delivery`` queues what is to be written; ``reports``, ``attempts``, ``stall``,
    ``stop_control``, ``chaos_control``, ``derived`` and ``cost`` (None: not metered)
    keep their own state (see their modules). Times are s since the epoch.
    """

    def __init__(
        self,
        delivery: Delivery,
        derived: DerivedNumbers,
        stall: StallWatch,
        cost: CostMeter | None = None,
        target_steps: int | None = None,
        resumed: bool = False,
    ):
        self.delivery = delivery
        self.derived = derived
        self.state, self.reason = "", ""  # the last set_state's
        self.stall = stall
        self.cost = cost
        self.reports = Reports()
        self.attempts = Attempts(time.time(), resumed=resumed)
        self.stop_control = StopControl()
        self.chaos_control = ChaosControl()
        self.closed = False  # the job ended: nothing is projected any more
        self._target_steps = target_steps
        self._before: dict[str, float] = {}  # goodput of earlier submissions (a resume)
        self._failures_before: tuple[list, dict] = ([], {})  # their failure records, counts
        self._pip_freeze = ""
        delivery.tags.update(stall.tags())

    def resume(self, prev: Previous, resumes: int) -> None:
        """Go on from what earlier submissions wrote (``resumes``: how many there were)."""
        self.delivery.continue_steps(prev.last_steps)
        self._before = prev.before
        self._failures_before = (prev.failure_records, prev.failure_counts)
        if self.cost is not None:
            self.cost.add_before(prev.cost)
        kwh = prev.before.get("energy/gpu_kwh", 0.0)
        self.derived.resume(prev.ticks, prev.train_offset, prev.train_before, kwh, prev.saves)
        if prev.samples is not None:
            self.reports.samples_total = prev.samples
        self.reports.last_step = prev.report_step
        self.reports.checkpoint_step = prev.checkpoint_step
        self.reports.count = prev.reports
        self.attempts.faults, self.attempts.restarts_before = prev.faults, prev.restarts
        self.delivery.tags.update({TAG.RESUMES: str(resumes), TAG.STALL: ""})

    def apply(self, update: Update) -> list[Decision]:
        """Queue a part's points, series and tags; returns its decisions."""
        delivery = self.delivery
        for key, value, step, wall_time in update.points:
            delivery.add(key, value, step, wall_time)
        for key, value, ts, step in update.series:
            delivery.push(key, value, ts, step)
        delivery.tags.update(update.tags)
        return update.decisions

    # -- inputs -----------------------------------------------------------------------
    def set_state(self, state: str, reason: str, now: float, line: str = "") -> None:
        """The job's state and its reason (``line``: a ``PENDING`` job's in a few words,
        tag ``trainfactory.waiting``, cleared by any other state); ``RUNNING`` starts an
        attempt (rank 0 says it)."""
        if state == "RUNNING":
            if self.reports.running_since is None:
                self.reports.running_since = now
            self._attempt_started(now)
        self.delivery.tags[TAG.STATE] = state
        self.delivery.tags[TAG.REASON] = reason
        self.delivery.tags[TAG.WAITING] = line if state == "PENDING" else ""
        self.state, self.reason = state, reason

    def pending_reason(self, reason: str, line: str = "") -> bool:
        """A new reason for a job still ``PENDING`` (what it waits for now, in full and in
        a few words); returns False, changing nothing, once the job has left ``PENDING``."""
        if self.state != "PENDING":
            return False
        if reason != self.reason:
            self.delivery.tags[TAG.REASON] = self.reason = reason
            self.delivery.tags[TAG.WAITING] = line
        return True

    def _attempt_started(self, now: float) -> None:
        update = self.attempts.start(now, int(self.reports.checkpoint_step or 0))
        if update is None:
            return  # the same attempt (rank 0 said RUNNING again)
        if self.cost is not None:
            self.cost.started(now)
        update.tags.update(self.stall.started(now))
        self.stop_control.new_attempt()  # new workers count their stop points from zero
        if self.attempts.restarted():
            # a loop without a `step` key counts reports from the restored checkpoint's:
            # a report repeated after the restore falls on a step already written
            self.reports.count = int(self.reports.checkpoint_step or 0)
            self.derived.new_attempt()
        self.apply(update)

    def set_environment(self, versions: dict[str, str], pip_freeze: str) -> None:
        """Tags ``trainfactory.env.<name>`` and the artifact ``environment/pip_freeze.txt``."""
        self.delivery.tags.update({f"{TAG.ENV}{k}": str(v)[:500] for k, v in versions.items() if v})
        if pip_freeze and pip_freeze != self._pip_freeze:
            self._pip_freeze = pip_freeze
            self.delivery.add_text("environment/pip_freeze.txt", pip_freeze)

    def report(
        self, metrics_per_rank: list[dict[str, Any]], checkpoint_path: str | None, now: float
    ) -> int | None:
        """One report round (see ``RunRecorder.report``); returns the step written, or
        None when that step was already written."""
        self._settle_restore(None)  # a plain loop's first report after a restore
        count_samples = not self.derived.worker_counters
        rnd = self.reports.take(metrics_per_rank, checkpoint_path, now, count_samples)
        self.progressed(now)
        self.attempts.report_step(rnd.step, now)
        if checkpoint_path and rnd.stop_seen:
            self.stop_control.checkpointed()  # the workers wait after this report
        if not rnd.new:
            return None
        self.apply(rnd.update)
        if rnd.checkpoint_values is not None:
            # the checkpoint's metrics as the run holds them at this step (value and
            # time): written again with the model's id, MLflow keeps the run's one
            # point (a key from trainfactory.log and save_checkpoint: each step once)
            d = self.delivery
            d.models.add(rnd.step, checkpoint_path, now, rnd.checkpoint_values, d.written_at, d.key)
        return rnd.step

    def worker_batch(self, rank: int, batch: WorkerBatch, now: float) -> StopReply:
        """Decode rank ``rank``'s batch (``protocol.WorkerBatch``) into its parts; returns
        the stop reply for the worker; once the job ended (:meth:`finish`) nothing is
        taken: the run is closed, and the reply says so (a worker then reports no
        checkpoint: ``session._hold_unless_recorded``)."""
        if self.closed:
            return StopReply(stop=False, closed=True)
        tags = self.delivery.tags
        self.attempts.seen(rank, now, batch.get("checks"))
        if "worker" in batch:
            tags.update(self.attempts.set_worker(rank, batch["worker"]))
        if "started" in batch:
            self.attempts.training_started(float(batch["started"]["time"]))
        if "error" in batch:
            tags.update(self.attempts.worker_error(rank, batch["error"]))
        counters = batch.get("counters")
        points = batch.get("points", ())
        reached = max([int(p[2]) for p in points] + [int((counters or {}).get("steps", 0))])
        if self.attempts.reached(rank, reached):  # a new step or logged step: progress
            self.progressed(now)
        if counters:  # throughput comes from the workers once they count anything
            self.derived.counters(rank, counters, now)
        for key, value, step, wall_time in points:
            self.delivery.add(key, value, step, wall_time)
        if rank == 0:
            self._rank0_batch(batch, counters, points)
        for ckpt in batch.get("checkpoints", ()):
            if self.derived.checkpoint_rank(rank):
                self._checkpoint_saved(ckpt)
        step = max([0, *self.attempts.rank_steps.values(), self.reports.last_step])
        return self.stop_control.reply(rank, batch.get("stop"), step)

    def _rank0_batch(self, batch: WorkerBatch, counters: Any, points: Any) -> None:
        if "restore" in batch:
            self._settle_restore(batch["restore"].get("step"))
        if counters:
            logged = max((int(p[2]) for p in points), default=None)
            if counters.get("steps"):
                self._settle_restore(None)
            self.attempts.counters(counters, logged)
        if "model" in batch:
            self.delivery.tags.update(self.derived.model(batch["model"]))
        if "device" in batch:
            self.delivery.tags.update(self.derived.device(batch["device"]))
            name = batch["device"].get("device_name")
            if name and self.cost is not None:
                self.cost.device(name)

    def _checkpoint_saved(self, ckpt: dict[str, Any]) -> None:
        ts = ckpt.get("time", time.time())
        step = ckpt.get("step")  # the reported or logged step the worker gave, if any
        reached = max(self.attempts.global_step, self.reports.last_step)
        step = int(step) if step is not None else reached
        self.attempts.save(ts - ckpt["save_s"], ts, step)
        if self.cost is not None:
            self.cost.checkpoint(ts, ckpt.get("bytes"))
        self.apply(self.derived.checkpoint(ckpt, ts))

    def _settle_restore(self, step: int | None) -> None:
        settled = self.attempts.settle_restore(step)
        if settled is not None:
            restore, update = settled
            self.reports.count = restore
            self.apply(update)

    def node_sample(self, values: dict[str, float], step: int, wall_time: float) -> None:
        """One node sample (``step``: its index, the resume offset already added)."""
        self.delivery.push_system(
            self.derived.node_sample(values, step, wall_time, self.delivery.key)
        )

    def worker_failure(
        self, rank: int, error: str, kind: str, detail: dict[str, str] | None, now: float
    ) -> None:
        """Rank ``rank`` failed (see ``RunRecorder.worker_failure``)."""
        pid = self.attempts.ranks.get(rank, {}).get("pid")
        cause, by = self.chaos_control.cause(pid), self.chaos_control.kind(pid)
        if cause is None and self.stall.cause() is not None:  # we restarted it
            cause, by = self.stall.cause(), BY_STALL
        self.apply(self.attempts.fail(rank, error, kind, detail, now, cause, by))

    def progressed(self, now: float) -> None:
        """A step or report arrived at ``now`` (for the stall watch)."""
        self.delivery.tags.update(self.stall.progressed(now))

    # -- the derive clock -------------------------------------------------------------
    def tick(self, now: float) -> None:
        """The derived numbers of one tick of the derive clock."""
        self.apply(self.derived.tick(now, self.delivery.key, self.reports.last_step))

    def goodput_inputs(self, now: float) -> dict[str, Any]:
        """The arguments of ``telemetry.goodput.account`` at ``now``."""
        return self.attempts.goodput_inputs(now, self.stop_control.waiting_since())

    def goodput_update(self, acc: Any, now: float) -> list[Decision]:
        """Queue the ``goodput/*``, ``badput/*``, ``faults/*`` and ``cost/*`` series of the
        job's goodput ``acc`` at ``now`` and their tags; returns the cost meter's decision
        (a budget stop), if any."""
        values = with_previous({**acc.metrics(), "goodput/wall_s": acc.wall_s}, self._before)
        update = Update(tags={TIMELINE_TAG: json.dumps(acc.timeline())})
        if self.cost is not None:
            step = max(self.attempts.global_step, self.reports.last_step)
            target = None if self.closed else self._target_steps
            may_stop = self.stop_control.request is None
            metrics, tags, decision = self.cost.update(acc.segments, now, step, target, may_stop)
            values.update(metrics)
            update.tags.update(tags)
            update.decisions += [decision] if decision else []
        if acc.failures:  # per failure: time, kind, rank, node, steps reached/lost, MTTR
            update.tags.update(
                failure_tags(
                    acc.failures,
                    self.attempts.failure_causes(),
                    *self._failures_before,
                )
            )
        values.pop("faults/count", None)  # written when a failure happens
        ts, tick = int(now * 1000), self.derived.ticks
        update.series += [(key, value, ts, tick) for key, value in values.items()]
        return self.apply(update)

    def check_stop_wait(self, now: float) -> None:
        """Name the rank a stop waits for (``StopControl.check_wait``) in the run's tags."""
        a = self.attempts
        world = self.derived.throughput.world_size or len(a.ranks) or 1
        self.delivery.tags.update(
            self.stop_control.check_wait(
                now, a.current(), world, a.rank_checks, a.rank_steps, self.stall.max_gap
            )
        )

    def check_stall(self, now: float) -> Decision | None:
        """Look for a stall at ``now``: its tags are queued, its decision returned."""
        laggard = self.attempts.laggard()
        step = self.attempts.rank_steps.get(laggard) if laggard is not None else None
        tags, decision = self.stall.check(now, self.attempts.running(), laggard, step)
        self.delivery.tags.update(tags)
        return decision

    # -- the end ----------------------------------------------------------------------
    def finish(self, state: str, reason: str, error: str, now: float) -> None:
        """The job ended in ``state`` with ``reason`` and ``error`` (may be empty)."""
        tags = self.delivery.tags
        tags[TAG.STATE] = state
        tags[TAG.REASON] = reason
        self.state, self.reason = state, reason
        if error:
            tags[TAG.ERROR] = error[:4000]
        self.closed = True
        if self.cost is not None:
            self.cost.released(now)
            # storage goes on costing after the job, until `%train gc` frees it
            storage = {
                "price_gb_month": self.cost.catalog.storage_gb_month,
                "history": [[round(now, 3), self.cost.kept_bytes()]],
            }
            tags[TAG.STORAGE] = json.dumps(storage)

    def stats(self) -> dict[str, Any]:
        """Delivery counts: queued, dropped (system points), offline seconds, non-finite values."""
        d = self.delivery
        return {
            "queued": d.queued(),
            "queued_user": d.queued_user(),
            "dropped": d.dropped,
            "offline_s": d.offline_total,
            "nonfinite": d.nonfinite,
        }
