"""Attempts of one job (inside its RunRecorder): ranks, failures and their root causes, restores,
and the progress records goodput is computed from.

Pure bookkeeping: methods return the points and tags to write (``ray_backend.decisions``);
the recorder calls them under its lock.
"""

from __future__ import annotations

import json
import time
from typing import Any

from jupyter_trainfactory.fleet.kinds import attempt_kind, is_process_loss
from jupyter_trainfactory.telemetry.goodput import Attempt, CheckpointSave, Step
from jupyter_trainfactory.tracking import TAG
from ray_backend.decisions import Update

__all__ = ["Attempts"]


class Attempts:
    """The job's attempts (one per start of its worker group) and what happened in them.

    An attempt starts when rank 0 says ``RUNNING`` and ends with a failure (Ray Train
    restarts the group while its failure budget allows). Per attempt: where each rank
    runs (``ranks``), its progress (``rank_steps``, ``rank_checks``: stop points passed)
    and its last sign of life; per failure, the root cause (tag ``trainfactory.failure``:
    rank, node, pid, times, kind, message, the worker's own traceback). Rank 0's progress
    (``Step`` records), checkpoint saves and the attempts give the job's goodput
    (``telemetry.goodput.account``).

    ``submitted``: when the job was submitted, s since the epoch; ``resumed``: a resume
    of an earlier submission.
    """

    def __init__(self, submitted: float, resumed: bool = False):
        self.submitted = submitted
        self.resumed = resumed
        self.attempts: list[dict[str, Any]] = []  # start, failed_at, detected_at, kind
        self.ranks: dict[int, dict[str, Any]] = {}  # rank -> pid, node_id, node_ip, visible
        self.rank_steps: dict[int, int] = {}
        self.rank_checks: dict[int, int] = {}
        self.global_step = 0  # rank 0's step: logged, else counted, else reported
        self.faults = 0
        self.failed_rank: int | None = None
        self.failed_error = ""  # the last line of the last failed rank's error
        self.restarts_before = 0  # restarts of earlier submissions (a resume)
        self._progress: list[Step] = []
        self._saves: list[CheckpointSave] = []
        self._counted_steps = False  # the workers count steps (trainfactory.step, log)
        self._last_counters: dict[str, float] | None = None
        self._pending_restore: tuple[int, int, int] | None = None  # restarts, ms, default
        self._errors: dict[int, dict[str, str]] = {}  # rank -> its exception's traceback
        self._rank_seen: dict[int, float] = {}  # rank -> its telemetry's last batch
        self._failure: dict[str, Any] | None = None  # the last failure's root cause
        self._gone: dict[int, dict[str, Any]] = {}  # where the failed attempts' ranks ran

    # -- attempts ---------------------------------------------------------------------
    def current(self) -> dict[str, Any] | None:
        """The latest attempt (``start``, ``failed_at``, ...), else None."""
        return self.attempts[-1] if self.attempts else None

    def running(self) -> bool:
        """An attempt runs: started and not failed."""
        return bool(self.attempts) and self.attempts[-1]["failed_at"] is None

    def start(self, now: float, restore_default: int) -> Update | None:
        """Rank 0 says RUNNING at ``now``: a new attempt unless the current one still
        runs (then None). A restart (``faults/restarts``) waits for its restore step
        (:meth:`settle_restore`; default ``restore_default``, the latest reported
        checkpoint's step: Ray Train's own choice)."""
        if self.running():
            return None
        self.attempts.append({"start": now, "failed_at": None, "kind": "failure"})
        self.rank_steps.clear()
        self.rank_checks.clear()
        self._errors.clear()
        self._rank_seen.clear()
        update = Update()
        restarts = len(self.attempts) - 1
        if restarts:
            restarts += self.restarts_before
            ts = int(now * 1000)
            update.series.append(("faults/restarts", restarts, ts, restarts))
            update.tags[TAG.FAULTS_RESTARTS] = str(restarts)
            self._pending_restore = (restarts, ts, restore_default)
            self._last_counters = None  # the new workers count from zero
        return update

    def restarted(self) -> bool:
        """The current attempt is a restart (not the first of this submission)."""
        return len(self.attempts) > 1

    def settle_restore(self, step: int | None) -> tuple[int, Update] | None:
        """The step a restart restored: ``step`` (what ``trainfactory.get_checkpoint()``
        chose), None: the default. Returns ``(step, update)`` once per restart, else None."""
        if self._pending_restore is None:
            return None
        restarts, ts, default = self._pending_restore
        self._pending_restore = None
        restore = default if step is None else int(step)
        update = Update(series=[("faults/restore_step", restore, ts, restarts)])
        update.tags[TAG.RESTORE_STEP] = str(restore)
        return restore, update

    def fail(
        self,
        rank: int,
        error: str,
        kind: str,
        detail: dict[str, str] | None,
        now: float,
        cause: str | None = None,
        by: str | None = None,
    ) -> Update:
        """Rank ``rank`` failed with ``error`` (its last line), detected at ``now``;
        ``kind``: ``failure`` or ``preemption``; ``detail``: type, message, traceback;
        ``cause``: why, when this job caused it (a stall restart, a chaos request), and
        ``by``: which (``fleet.kinds.BY_*``), for the failure's kind.

        The failure's time is the job's last sign of life: the failing rank's last
        telemetry (sent at least every 2 s) or a later step of another rank.
        """
        update = Update()
        update.tags[TAG.STATE] = "RESTARTING"
        update.tags[TAG.REASON] = f"rank {rank} failed: {error}"[:4000]
        self.failed_rank, self.failed_error = rank, error
        attempt = self.current()
        if cause:
            detail = {**(detail or {}), "cause": cause, **({"by": by} if by else {})}
        if attempt is not None and self._explains(attempt, rank, detail, now):
            # a rank whose process died explains the others' broken collectives
            failure = {**attempt["failure"], **self._where(rank), "rank": rank}
            failure.update({k: v for k, v in (detail or {}).items() if k != "kind"})
            failure.update(self._errors.get(rank, {}))  # its own word (the poc's drill)
            failure["message"] = error
            self._failure = attempt["failure"] = failure
            update.tags[TAG.FAILURE] = json.dumps(failure)[:5000]
        if attempt is not None and attempt["failed_at"] is None:
            seen = [self._rank_seen.get(rank, attempt["start"]), attempt["start"]]
            seen += [s.end for s in self._progress[-1:]]
            failed = min(now, max(seen))
            attempt.update(failed_at=failed, detected_at=now, kind=kind)
            self.faults += 1
            update.series.append(("faults/count", self.faults, int(now * 1000), self.faults))
            update.tags[TAG.FAULTS_LAST] = (
                f"{time.strftime('%H:%M:%S', time.localtime(now))} rank {rank}: {error}"
            )[:4000]
            failure = {
                "rank": rank,
                **self._where(rank),
                "time": round(failed, 3),
                "detected": round(now, 3),
                "attempt": len(self.attempts),
                "kind": kind,
                "message": error,
                **(detail or {}),
            }
            if rank in self._errors:  # the worker's own traceback came first
                failure.update(self._errors[rank])
            self._failure = attempt["failure"] = failure
            update.tags[TAG.FAILURE] = json.dumps(failure)[:5000]
        self._gone = {**self._gone, **self.ranks}  # where they ran, for a later root cause
        self.ranks.clear()  # their processes are gone; the restarted ones report anew
        return update

    def _where(self, rank: int) -> dict[str, Any]:
        where = self.ranks.get(rank) or self._gone.get(rank, {})
        return {
            "node": where.get("node_ip", ""),
            "node_id": where.get("node_id", ""),
            "pid": where.get("pid"),
        }

    #: How long after an attempt's first failure another rank's process death still
    #: counts as its cause (s): Ray detects a dead worker at its next poll (about 2 s).
    EXPLAINS_WITHIN_S = 30.0

    def _explains(self, attempt: dict, rank: int, detail: dict | None, now: float) -> bool:
        """Whether rank ``rank``'s failure (``detail``) is the root cause of ``attempt``'s
        already recorded one: its process died, while the recorded rank raised (a peer's
        death breaks the survivors' collectives first: gloo's "Connection reset by peer",
        NCCL's watchdog), within :attr:`EXPLAINS_WITHIN_S` of it."""
        first = attempt.get("failure")
        if attempt["failed_at"] is None or not first or first.get("rank") == rank:
            return False
        dead = is_process_loss(str((detail or {}).get("type", "")))
        raised = not is_process_loss(str(first.get("type", "")))
        return dead and raised and now - first.get("detected", now) <= self.EXPLAINS_WITHIN_S

    def failure_causes(self) -> list[dict[str, Any]]:
        """The root cause of each failed attempt, in order (one per failure of
        ``telemetry.goodput.account``): rank, node, type, message, kind, by."""
        return [a.get("failure") or {} for a in self.attempts if a["failed_at"] is not None]

    # -- ranks ------------------------------------------------------------------------
    def seen(self, rank: int, now: float, checks: int | None) -> None:
        """A batch of rank ``rank``'s telemetry arrived; ``checks``: its stop points passed."""
        self._rank_seen[rank] = now
        if checks is not None:
            self.rank_checks[rank] = int(checks)

    def set_worker(self, rank: int, info: dict[str, Any]) -> dict[str, str]:
        """Where rank ``rank`` runs (pid, node_id, node_ip, visible); returns its tag."""
        self.ranks[rank] = dict(info)
        return {f"{TAG.RANK}{rank}": json.dumps(info)}

    def worker_error(self, rank: int, error: dict[str, str]) -> dict[str, str]:
        """A worker's exception with its traceback (Ray Train passes the controller only
        the bare exception); it completes the failure's root cause, before or after."""
        self._errors[rank] = error
        failure = self._failure
        current = failure is not None and failure["attempt"] == len(self.attempts)
        if current and failure["rank"] == rank:
            failure.update(error)
            return {TAG.FAILURE: json.dumps(failure)[:5000]}
        return {}

    def reached(self, rank: int, step: int) -> bool:
        """Rank ``rank`` reached ``step`` (counted or logged); True when that is progress."""
        if step > self.rank_steps.get(rank, 0):
            self.rank_steps[rank] = step
            return True
        return False

    def laggard(self) -> int | None:
        """The running rank that progressed least (the last on a tie): the likeliest to
        hang, since the others wait for it at their next collective."""
        steps = self.rank_steps
        return min(self.ranks, key=lambda r: (steps.get(r, -1), -r)) if self.ranks else None

    def ranks_on_node(self, node: str) -> list[int]:
        """Ranks whose worker runs on ``node``: an IP, a node id or its prefix (8 or more
        characters), or the node's label in the placement tag and the dashboard's node
        table (``10-0-0-12``, ``10-0-0-12-<node id[:6]>`` where nodes share an IP)."""
        from ray_backend.sampler import node_label

        def names(info: dict[str, Any]) -> set[str]:
            ip, node_id = str(info.get("node_ip", "")), str(info.get("node_id", ""))
            return {ip, node_id, node_label(ip), f"{node_label(ip)}-{node_id[:6]}"}

        return sorted(
            r
            for r, info in self.ranks.items()
            if node in names(info)
            or (len(node) >= 8 and str(info.get("node_id", "")).startswith(node))
        )

    def where(self, ranks: list[int]) -> dict[int, dict[str, Any]]:
        """Where ``ranks`` run. Raises ValueError for a rank that has not said so."""
        missing = [r for r in ranks if r not in self.ranks]
        if missing:
            known = ", ".join(map(str, sorted(self.ranks))) or "none yet"
            raise ValueError(f"rank {missing[0]} is not running (running ranks: {known})")
        return {r: dict(self.ranks[r]) for r in ranks}

    # -- progress (goodput inputs) ----------------------------------------------------
    def report_step(self, step: int, now: float) -> None:
        """A report as a goodput ``Step`` when the workers count no steps themselves
        (plain Ray Train code: ``ray.train.report`` only). The first report's step began
        with the attempt's first training work a worker saw (:meth:`training_started`: a
        model's first forward, a dataset shard's first batch), else at the report itself:
        the time before is setup (startup or checkpoint restore); each later report's
        step took the time since the previous one."""
        if self._counted_steps or not self.running():
            return
        attempt = self.attempts[-1]
        # the first report's step began with the attempt's first training work, when a
        # worker saw it (a forward, a batch); else setup lasts until this report
        previous = attempt.get("last_report", attempt.get("training_started"))
        attempt["last_report"] = now
        duration = 0.0 if previous is None else max(now - previous, 0.0)
        self.global_step = max(self.global_step, step)
        self._progress.append(Step(now, step, duration))

    def training_started(self, when: float) -> None:
        """A worker's first training work of the current attempt began at ``when`` (s since
        the epoch; the earliest of the ranks counts): the first report's step starts there
        (:meth:`report_step`). A time before the attempt's start (a clock apart) is ignored."""
        if not self.running():
            return
        attempt = self.attempts[-1]
        if when < attempt["start"] or "last_report" in attempt:
            return
        attempt["training_started"] = min(when, attempt.get("training_started", when))

    def counters(self, counters: dict[str, Any], logged_step: int | None) -> None:
        """Rank 0's progress since its previous batch (``protocol.Counters``), as one
        goodput ``Step``; ``logged_step``: the batch's last logged step, if any."""
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
        self.global_step = self.global_step + new_steps if logged_step is None else logged_step
        busy = counters.get("step_time_s", 0.0) - last.get("step_time_s", 0.0)
        wait = counters.get("data_wait_s", 0.0) - last.get("data_wait_s", 0.0)
        if busy <= 0 and last.get("time") is not None:  # no step() blocks: the window's time
            busy = counters["time"] - last["time"]
        self._progress.append(Step(counters["time"], self.global_step, max(busy, 0.0), wait))
        self._last_counters = counters

    def save(self, start: float, end: float, step: int) -> None:
        """A checkpoint save from ``start`` to ``end`` (s since the epoch) keeping ``step``."""
        self._saves.append(CheckpointSave(start, end, step))

    def goodput_inputs(self, now: float, stop_wait_from: float | None = None) -> dict[str, Any]:
        """The arguments of :func:`~jupyter_trainfactory.telemetry.goodput.account` for the
        job at ``now`` (copies: ``account`` runs without the recorder's lock);
        ``stop_wait_from``: since when a stop waits for a rank. A failed attempt's kind
        comes from its root cause as it stands now (``fleet.kinds.attempt_kind``: a user
        error's and a drill's time are booked as theirs, not as infrastructure's)."""
        attempts = [
            Attempt(
                a["start"],
                a["failed_at"],
                attempt_kind(a["failure"]) if a.get("failure") else a["kind"],
                a.get("detected_at"),
            )
            for a in self.attempts
        ]
        return {
            "submitted": min(self.submitted, now),
            "ended": now,
            "attempts": attempts,
            "steps": list(self._progress),
            "checkpoints": list(self._saves),
            "resumed": self.resumed,
            "stop_wait_from": stop_wait_from,
        }
