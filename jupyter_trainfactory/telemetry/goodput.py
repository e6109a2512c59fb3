"""Goodput accounting: where a job's wall-clock time went (pure Python).

The job's wall time, from submission to its end (or now), is tiled into goodput and badput
categories after the taxonomy of Google's ML goodput measurement ("ML Goodput", Google
Cloud, 2024; the ``ml-goodput-measurement`` package): every second lands in exactly one
category, so goodput and the badput categories add up to the wall time, and
``ETTR = goodput / wall time`` (effective training time ratio, as in Meta's Llama 3 paper,
which reports > 90 %).

Categories (seconds):

- ``startup``: submission to the first step of the first attempt (scheduling, worker
  start, process group, data and model setup);
- ``checkpoint_restore``: a later attempt's start to its first step (restore and setup);
- ``infrastructure_recovery``: a failure to the start of the next attempt;
- ``preemption``: the same, when the failure was a preemption;
- ``wasted_progress``: work after the last checkpoint saved before a failure, lost to it;
- ``checkpoint_save``: checkpoint saves inside kept work;
- ``data_loading``: time waiting for data inside kept work;
- ``other``: what is left (after the last step of the final attempt: teardown, the last
  report).

``goodput`` is the rest of kept work: training steps whose progress survived.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = [
    "BADPUT_CATEGORIES",
    "Attempt",
    "CheckpointSave",
    "FailureRecord",
    "Goodput",
    "Step",
    "account",
]

BADPUT_CATEGORIES = (
    "startup",
    "data_loading",
    "checkpoint_save",
    "checkpoint_restore",
    "wasted_progress",
    "infrastructure_recovery",
    "preemption",
    "other",
)


@dataclass(frozen=True)
class Step:
    """A training step that ended at ``end`` (s) having reached ``step``; it took
    ``duration`` s (its start is ``end - duration``), ``data_wait_s`` of them waiting for
    data."""

    end: float
    step: int
    duration: float = 0.0
    data_wait_s: float = 0.0

    @property
    def start(self) -> float:
        return self.end - self.duration


@dataclass(frozen=True)
class CheckpointSave:
    """A checkpoint save from ``start`` to ``end`` (s) that keeps progress up to ``step``."""

    start: float
    end: float
    step: int


@dataclass(frozen=True)
class Attempt:
    """One start of the job's workers (the first, or a restart after a failure).

    ``failed_at`` is when the attempt failed (None: it did not fail; it ran to the job's
    end); ``kind`` is ``"failure"`` or ``"preemption"``.
    """

    start: float
    failed_at: float | None = None
    kind: str = "failure"


@dataclass(frozen=True)
class FailureRecord:
    """One failure: when it happened, the step reached before it, the step training
    resumed from, and MTTR: failure to the first step past ``step_reached`` (None while
    training has not got there again)."""

    time: float
    kind: str
    step_reached: int
    restored_step: int | None
    steps_lost: int | None
    mttr_s: float | None


@dataclass
class Goodput:
    """The account of a job's wall time (all figures in seconds)."""

    wall_s: float
    goodput_s: float
    badput_s: dict[str, float] = field(default_factory=dict)
    failures: list[FailureRecord] = field(default_factory=list)

    @property
    def ettr(self) -> float:
        """Effective training time ratio: goodput / wall time (0 for no wall time)."""
        return self.goodput_s / self.wall_s if self.wall_s > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        """MLflow metrics: ``goodput/ettr``, ``goodput/goodput_s``, ``badput/<category>_s``,
        ``faults/count`` and, when known, ``faults/mttr_s`` (mean over failures)."""
        out = {"goodput/ettr": self.ettr, "goodput/goodput_s": self.goodput_s}
        out.update({f"badput/{k}_s": v for k, v in self.badput_s.items()})
        out["faults/count"] = float(len(self.failures))
        mttrs = [f.mttr_s for f in self.failures if f.mttr_s is not None]
        if mttrs:
            out["faults/mttr_s"] = sum(mttrs) / len(mttrs)
        return out


def _clip(a: float, b: float, lo: float, hi: float) -> float:
    """Length of [a, b] inside [lo, hi]."""
    return max(0.0, min(b, hi) - max(a, lo))


def account(
    submitted: float,
    ended: float,
    attempts: Sequence[Attempt],
    steps: Sequence[Step],
    checkpoints: Sequence[CheckpointSave] = (),
) -> Goodput:
    """Split ``[submitted, ended]`` into goodput and badput categories.

    Parameters
    ----------
    submitted, ended : float
        Job submission and end (or now), s since the epoch.
    attempts : sequence of Attempt
        In time order; each attempt runs until the next one starts (or ``ended``).
    steps : sequence of Step
        Completed steps, as rank 0 saw them.
    checkpoints : sequence of CheckpointSave
        Completed checkpoint saves.

    Returns
    -------
    Goodput
        ``goodput_s + sum(badput_s.values()) == wall_s`` (up to float rounding).

    Raises
    ------
    ValueError
        If ``ended < submitted``, attempts are out of order or start before submission,
        or a failure time lies outside its attempt.
    """
    if ended < submitted:
        raise ValueError("ended must not be before submitted.")
    bad = dict.fromkeys(BADPUT_CATEGORIES, 0.0)
    good = 0.0
    if not attempts:
        bad["startup"] = ended - submitted
        return Goodput(ended - submitted, 0.0, bad)
    ordered = list(attempts)
    for prev, cur in zip(ordered, ordered[1:], strict=False):
        if cur.start < prev.start:
            raise ValueError("attempts must be in time order.")
    if ordered[0].start < submitted:
        raise ValueError("an attempt starts before the job was submitted.")
    steps = sorted(steps, key=lambda s: s.end)
    saves = sorted(checkpoints, key=lambda c: c.end)
    bad["startup"] += min(ordered[0].start, ended) - submitted
    failures: list[FailureRecord] = []
    for i, attempt in enumerate(ordered):
        end = ordered[i + 1].start if i + 1 < len(ordered) else ended
        end = min(end, ended)
        start = min(attempt.start, end)
        failed = attempt.failed_at
        if failed is not None and not start <= failed <= end:
            raise ValueError("a failure time lies outside its attempt.")
        stop = failed if failed is not None else end  # the attempt's work ends here
        mine = [s for s in steps if start < s.end <= stop]
        setup = "startup" if i == 0 else "checkpoint_restore"
        if not mine:
            bad[setup] += stop - start
        else:
            first = max(start, mine[0].start)
            bad[setup] += first - start
            if failed is not None:
                kept_saves = [c for c in saves if first <= c.start and c.end <= failed]
                kept_end = kept_saves[-1].end if kept_saves else first
                bad["wasted_progress"] += stop - kept_end
            else:  # after the last step: a final checkpoint, the last report, teardown
                kept_end = mine[-1].end
                tail_saves = sum(_clip(c.start, c.end, kept_end, stop) for c in saves)
                bad["checkpoint_save"] += tail_saves
                bad["other"] += stop - kept_end - tail_saves
            kept = kept_end - first
            save_s = sum(_clip(c.start, c.end, first, kept_end) for c in saves)
            wait_s = sum(s.data_wait_s for s in mine if s.end <= kept_end)
            wait_s = min(wait_s, max(0.0, kept - save_s))
            bad["checkpoint_save"] += save_s
            bad["data_loading"] += wait_s
            good += kept - save_s - wait_s
        if failed is not None:
            bad["preemption" if attempt.kind == "preemption" else "infrastructure_recovery"] += (
                end - failed
            )
            failures.append(_failure_record(failed, attempt.kind, mine, steps, saves))
    return Goodput(ended - submitted, good, bad, failures)


def _failure_record(
    failed: float,
    kind: str,
    mine: list[Step],
    steps: list[Step],
    saves: list[CheckpointSave],
) -> FailureRecord:
    reached = max((s.step for s in mine), default=0)
    before = [c for c in saves if c.end <= failed]
    restored = before[-1].step if before else 0
    past = next((s for s in steps if s.end > failed and s.step > reached), None)
    return FailureRecord(
        time=failed,
        kind=kind,
        step_reached=reached,
        restored_step=restored,
        steps_lost=reached - restored,
        mttr_s=(past.end - failed) if past is not None else None,
    )
