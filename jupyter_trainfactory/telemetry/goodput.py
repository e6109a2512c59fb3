"""Goodput accounting: where a job's wall-clock time went (pure Python).

The job's wall time, from submission to its end (or now), is tiled into goodput and badput
categories after the taxonomy of Google's ML goodput measurement ("ML Goodput", Google
Cloud, 2024; the ``ml-goodput-measurement`` package): every second lands in exactly one
category, so goodput and the badput categories add up to the wall time, and
``ETTR = goodput / wall time`` (effective training time ratio, as in Meta's Llama 3 paper,
which reports > 90 %).

Categories (seconds):

- ``startup``: submission to the first step of the first attempt (scheduling, worker
  start, process group, data and model setup). A step begins with the first training
  work a worker sees (a ``trainfactory.step``, a watched model's first forward, a data
  batch), so a loop that reports once per epoch books its first epoch as training;
- ``checkpoint_restore``: a later attempt's start to its first step (restore and setup);
- ``infrastructure_recovery``: an infrastructure failure to the start of the next
  attempt;
- ``preemption``: the same, when the failure was a preemption;
- ``wasted_progress``: work after the last checkpoint saved before an infrastructure
  failure or a preemption, lost to it;
- ``user_error``: what an exception of the training code itself cost (the user's, not
  the cluster's): the work it lost since the last checkpoint saved and the time to the
  next attempt;
- ``drill``: the same for a failure injected on purpose (``%train chaos``, the poc's
  kill);
- ``checkpoint_save``: checkpoint saves inside kept work;
- ``data_loading``: time waiting for data inside kept work;
- ``stop_wait``: a graceful stop that could not complete, from when it was found waiting
  for a rank (``stopping: waiting for rank R at step S``) to the end;
- ``other``: what is left (after the last step of the final attempt: teardown, the last
  report).

``goodput`` is the rest of kept work: training steps whose progress survived.

``account`` also lays the categories out in time (``Goodput.segments``, drawn by the job
dashboard as a stacked bar from ``Goodput.timeline()``). Every category is placed at its
exact times except ``data_loading``: only each step's total wait is known, not when it
happened, so the waits of the steps that end in a stretch of kept work between two
checkpoint saves are drawn as one block at the start of that stretch.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

from ..tracking import TAG

__all__ = [
    "BADPUT_CATEGORIES",
    "CATEGORY_CODES",
    "FAILURE_CATEGORIES",
    "TIMELINE_TAG",
    "Attempt",
    "CheckpointSave",
    "FailureRecord",
    "Goodput",
    "Segment",
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
    "user_error",
    "drill",
    "stop_wait",
    "other",
)
#: The categories failures cost (a drill is no failure: it was asked for).
FAILURE_CATEGORIES = ("wasted_progress", "infrastructure_recovery", "preemption", "user_error")
#: A failed attempt's badput by its ``Attempt.kind``: (the work it lost, the time to the
#: next attempt).
_AFTER_FAILURE = {
    "failure": ("wasted_progress", "infrastructure_recovery"),
    "preemption": ("wasted_progress", "preemption"),
    "user_error": ("user_error", "user_error"),
    "drill": ("drill", "drill"),
}
#: Short codes of the categories in ``Goodput.timeline()`` (kept short for the tag limit).
CATEGORY_CODES = {
    "goodput": "g",
    "startup": "su",
    "data_loading": "dl",
    "checkpoint_save": "cs",
    "checkpoint_restore": "cr",
    "wasted_progress": "wp",
    "infrastructure_recovery": "ir",
    "preemption": "pe",
    "user_error": "ue",
    "drill": "dr",
    "stop_wait": "sw",
    "other": "ot",
}
#: Run tag holding ``json.dumps(Goodput.timeline())``, kept under 5,000 characters: the
#: tag value limit of older MLflow servers (MLflow 3 allows 8,000,
#: ``mlflow.utils.validation.MAX_TAG_VAL_LENGTH``).
TIMELINE_TAG = TAG.TIMELINE


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
    end); ``kind`` is what failed it (``fleet.kinds.attempt_kind``): ``"failure"`` (of
    the infrastructure), ``"preemption"``, ``"user_error"`` (an exception of the
    training code) or ``"drill"`` (injected on purpose); ``detected_at`` is when the
    failure was detected (Ray Train's health check; None: at ``failed_at``).
    """

    start: float
    failed_at: float | None = None
    kind: str = "failure"
    detected_at: float | None = None


@dataclass(frozen=True)
class FailureRecord:
    """One failure (times in s since the epoch, durations in s).

    ``time``: when it happened; ``detected``: when it was detected; ``restored``: when
    training stepped again (the restore done; None until then); ``step_reached``: the
    step reached before it; ``restored_step``: the checkpoint's step training resumed
    from; ``steps_lost``: their difference; ``mttr_s``: mean time to recovery, from the
    failure to the first step past ``step_reached`` (None while training has not got
    there again).
    """

    time: float
    kind: str
    step_reached: int
    restored_step: int | None
    steps_lost: int | None
    mttr_s: float | None
    detected: float | None = None
    restored: float | None = None


@dataclass(frozen=True)
class Segment:
    """``[start, end]`` (s since the epoch) spent in ``category``: ``"goodput"`` or one of
    ``BADPUT_CATEGORIES``."""

    start: float
    end: float
    category: str

    @property
    def length(self) -> float:
        return self.end - self.start


@dataclass
class Goodput:
    """The account of a job's wall time (all figures in seconds).

    ``segments`` tile ``[submitted, submitted + wall_s]`` in time order, without gaps or
    overlaps, no two neighbours of the same category; the lengths of a category's segments
    add up to ``goodput_s`` or its ``badput_s`` entry.
    """

    wall_s: float
    goodput_s: float
    badput_s: dict[str, float] = field(default_factory=dict)
    failures: list[FailureRecord] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    submitted: float = 0.0

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

    def timeline(self, max_segments: int = 120, max_failures: int = 30) -> dict:
        """The segments and failures, compact, for the ``TIMELINE_TAG`` run tag.

        Parameters
        ----------
        max_segments : int
            At most this many segments: above it, the shortest segment is merged into its
            longer neighbour (which keeps its category), repeatedly, so the bar stays
            readable and the tag small.
        max_failures : int
            At most this many failures, the latest.

        Returns
        -------
        dict
            ``{"t0": submitted, "wall_s": ..., "segments": [[start, end, code], ...],
            "failures": [[time, kind], ...]}``: times in s relative to ``t0``, rounded to
            0.1 s, ``code`` from ``CATEGORY_CODES``, ``kind`` an ``Attempt.kind``. With
            the defaults, ``json.dumps`` of it stays under 5,000 characters for jobs of
            up to a year (relative times of at most 10 digits).

        Raises
        ------
        ValueError
            If ``max_segments < 1`` or ``max_failures < 0``.
        """
        if max_segments < 1 or max_failures < 0:
            raise ValueError("max_segments must be >= 1 and max_failures >= 0.")
        t0 = self.submitted
        spans = [[s.start - t0, s.end - t0, s.category] for s in self.segments]
        segments: list[list] = []
        for start, end, category in _merge_shortest(spans, max_segments):
            rel_start, rel_end = round(start, 1), round(end, 1)
            if rel_end <= rel_start:
                continue
            code = CATEGORY_CODES[category]
            if segments and segments[-1][2] == code:
                segments[-1][1] = rel_end
            else:
                segments.append([rel_start, rel_end, code])
        kept = self.failures[max(0, len(self.failures) - max_failures) :]
        return {
            "t0": round(t0, 1),
            "wall_s": round(self.wall_s, 1),
            "segments": segments,
            "failures": [[round(f.time - t0, 1), f.kind] for f in kept],
        }


def _merge_shortest(spans: list[list], limit: int) -> list[list]:
    """``spans`` (``[start, end, category]``, contiguous, in time order) cut down to at most
    ``limit`` by merging the shortest span into its longer neighbour, which keeps its
    category, until few enough are left; neighbours then of one category are joined.

    A heap of lengths and a doubly linked list make it O(n log n) (``spans`` is changed).
    """
    n = len(spans)
    if n <= limit:
        return spans
    prev, nxt = list(range(-1, n - 1)), [*range(1, n), -1]
    alive = [True] * n
    heap = [(end - start, i) for i, (start, end, _) in enumerate(spans)]
    heapq.heapify(heap)
    count = n

    def length(i: int) -> float:
        return spans[i][1] - spans[i][0]

    def absorb(keep: int, gone: int) -> None:
        nonlocal count
        spans[keep][0] = min(spans[keep][0], spans[gone][0])
        spans[keep][1] = max(spans[keep][1], spans[gone][1])
        alive[gone] = False
        before, after = prev[gone], nxt[gone]
        if before >= 0:
            nxt[before] = after
        if after >= 0:
            prev[after] = before
        count -= 1

    while count > limit:
        size, i = heapq.heappop(heap)
        if not alive[i] or size != length(i):
            continue  # stale: merged away, or grown since it was pushed
        before, after = prev[i], nxt[i]
        keep = before if after < 0 or (before >= 0 and length(before) >= length(after)) else after
        absorb(keep, i)
        for other in (prev[keep], nxt[keep]):
            if other >= 0 and spans[other][2] == spans[keep][2]:
                absorb(keep, other)
        heapq.heappush(heap, (length(keep), keep))
    return [span for span, live in zip(spans, alive, strict=True) if live]


def _add(segments: list[Segment], start: float, end: float, category: str) -> None:
    """Append ``[start, end]`` (contiguous with the last segment) unless it is empty,
    merged into the last segment when that has the same category."""
    if end <= start:
        return
    if segments and segments[-1].category == category:
        segments[-1] = Segment(segments[-1].start, end, category)
    else:
        segments.append(Segment(start, end, category))


def _union(saves: Sequence[CheckpointSave], lo: float, hi: float) -> list[tuple[float, float]]:
    """The checkpoint saves clipped to ``[lo, hi]``, overlapping ones joined, in time order."""
    out: list[tuple[float, float]] = []
    for c in sorted(saves, key=lambda c: c.start):
        a, b = max(c.start, lo), min(c.end, hi)
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _split(lo: float, hi: float, saved: list[tuple[float, float]]) -> list[tuple]:
    """``[lo, hi]`` as ``(start, end, in_a_save)`` pieces in time order, ``saved`` being
    disjoint intervals inside it in time order."""
    out, cursor = [], lo
    for a, b in saved:
        if a > cursor:
            out.append((cursor, a, False))
        out.append((a, b, True))
        cursor = b
    if hi > cursor:
        out.append((cursor, hi, False))
    return out


def _place_waits(pieces: list[tuple[float, float]], steps: Sequence[Step]) -> list[float]:
    """Data loading (s) per piece of kept work between saves.

    A piece gets the data waits of the steps that end in it, up to its length. Waits that
    do not fit (steps that overlap a save) go to the first pieces with room left, so the
    total is ``min(sum of the waits, sum of the lengths)``, the attempt's data loading.
    """
    starts = [a for a, _ in pieces]
    room = [b - a for a, b in pieces]
    raw = [0.0] * len(pieces)
    for s in steps:
        k = bisect_left(starts, s.end) - 1
        if k >= 0:
            raw[k] += s.data_wait_s
    placed = [min(r, length) for r, length in zip(raw, room, strict=True)]
    left = min(sum(s.data_wait_s for s in steps), sum(room)) - sum(placed)
    for k, length in enumerate(room):
        extra = min(max(left, 0.0), length - placed[k])
        placed[k] += extra
        left -= extra
    return placed


def _kept_work(
    segments: list[Segment],
    first: float,
    kept_end: float,
    steps: Sequence[Step],
    saves: Sequence[CheckpointSave],
) -> None:
    """Tile kept work ``[first, kept_end]``: checkpoint saves at their times; between them,
    each piece's data loading at its start (``_place_waits``), then goodput."""
    pieces = _split(first, kept_end, _union(saves, first, kept_end))
    waits = iter(_place_waits([(a, b) for a, b, saving in pieces if not saving], steps))
    for a, b, saving in pieces:
        if saving:
            _add(segments, a, b, "checkpoint_save")
            continue
        wait = next(waits)
        mid = b if wait >= b - a else a + wait
        _add(segments, a, mid, "data_loading")
        _add(segments, mid, b, "goodput")


def _tally(
    submitted: float,
    ended: float,
    segments: list[Segment],
    failures: list[FailureRecord],
) -> Goodput:
    """The Goodput whose per-category totals are the lengths of ``segments``."""
    totals = dict.fromkeys(("goodput", *BADPUT_CATEGORIES), 0.0)
    for s in segments:
        totals[s.category] += s.length
    good = totals.pop("goodput")
    return Goodput(ended - submitted, good, totals, failures, segments, submitted)


def account(
    submitted: float,
    ended: float,
    attempts: Sequence[Attempt],
    steps: Sequence[Step],
    checkpoints: Sequence[CheckpointSave] = (),
    resumed: bool = False,
    stop_wait_from: float | None = None,
) -> Goodput:
    """Split ``[submitted, ended]`` into goodput and badput categories.

    Each attempt's time is, in order: setup (``startup`` for the first attempt,
    ``checkpoint_restore`` for later ones and, with ``resumed``, for the first attempt of
    a resumed job too, whose workers start by restoring a checkpoint) until its first
    step starts; kept work (goodput,
    ``checkpoint_save``, ``data_loading``) until the end of the last checkpoint saved before
    a failure, or of the last step; then ``wasted_progress`` until the failure and
    ``infrastructure_recovery`` or ``preemption`` until the next attempt (both
    ``user_error`` after an exception of the training code, both ``drill`` after an
    injected failure: ``Attempt.kind``), or, for the last attempt, saves and ``other``
    until ``ended``.

    Parameters
    ----------
    submitted, ended : float
        Job submission and end (or now), s since the epoch.
    attempts : sequence of Attempt
        In time order; each attempt runs until the next one starts (or ``ended``).
    steps : sequence of Step
        Completed steps, as rank 0 saw them.
    checkpoints : sequence of CheckpointSave
        Completed checkpoint saves (overlapping saves count once).
    resumed : bool
        The job was resumed (``%train resume``): submission to the first attempt's start
        is still ``startup`` (scheduling), the rest of its setup ``checkpoint_restore``.
    stop_wait_from : float, optional
        When a graceful stop was found waiting for a rank that does not reach the stop
        point: ``other`` time from then on is ``stop_wait``.

    Returns
    -------
    Goodput
        ``goodput_s + sum(badput_s.values()) == wall_s`` (up to float rounding); the totals
        are the sums of ``segments``, whose ``data_loading`` blocks are placed as the module
        docstring says.

    Raises
    ------
    ValueError
        If ``ended < submitted``, attempts are out of order or start before submission,
        or a failure time lies outside its attempt.
    """
    if ended < submitted:
        raise ValueError("ended must not be before submitted.")
    segments: list[Segment] = []
    if not attempts:
        _add(segments, submitted, ended, "startup")
        return _tally(submitted, ended, segments, [])
    ordered = _in_order(submitted, attempts)
    steps = sorted(steps, key=lambda s: s.end)
    saves = sorted(checkpoints, key=lambda c: c.end)
    _add(segments, submitted, min(ordered[0].start, ended), "startup")
    failures: list[FailureRecord] = []
    for i, attempt in enumerate(ordered):
        end = ordered[i + 1].start if i + 1 < len(ordered) else ended
        setup = "startup" if i == 0 and not resumed else "checkpoint_restore"
        spans, failure = _attempt_time(attempt, min(end, ended), setup, steps, saves)
        for seg in spans:
            _add(segments, seg.start, seg.end, seg.category)
        if failure is not None:
            failures.append(failure)
    if stop_wait_from is not None:
        segments = _relabel_after(segments, stop_wait_from, "other", "stop_wait")
    return _tally(submitted, ended, segments, failures)


def _in_order(submitted: float, attempts: Sequence[Attempt]) -> list[Attempt]:
    """``attempts`` as a list; ValueError when they are out of time order or the first
    starts before ``submitted``."""
    ordered = list(attempts)
    for prev, cur in zip(ordered, ordered[1:], strict=False):
        if cur.start < prev.start:
            raise ValueError("attempts must be in time order.")
    if ordered[0].start < submitted:
        raise ValueError("an attempt starts before the job was submitted.")
    return ordered


def _attempt_time(
    attempt: Attempt,
    end: float,
    setup: str,
    steps: list[Step],
    saves: list[CheckpointSave],
) -> tuple[list[Segment], FailureRecord | None]:
    """One attempt's time up to ``end`` (the next attempt's start, or the job's end) as
    segments in time order, and its FailureRecord (None when it did not fail).

    ``setup`` (``startup`` or ``checkpoint_restore``) until its first step, kept work,
    then ``wasted_progress`` and recovery after a failure, or saves and ``other`` after
    the last step. ``steps`` and ``saves`` are the job's, sorted by end. ValueError when
    the failure time lies outside the attempt."""
    segments: list[Segment] = []
    start = min(attempt.start, end)
    failed = attempt.failed_at
    if failed is not None and not start <= failed <= end:
        raise ValueError("a failure time lies outside its attempt.")
    stop = failed if failed is not None else end  # the attempt's work ends here
    mine = [s for s in steps if start < s.end <= stop]
    if not mine:
        _add(segments, start, stop, setup)
    else:
        first = max(start, mine[0].start)
        _add(segments, start, first, setup)
        if failed is not None:
            kept_saves = [c for c in saves if first <= c.start and c.end <= failed]
            kept_end = kept_saves[-1].end if kept_saves else first
        else:
            kept_end = mine[-1].end
        _kept_work(segments, first, kept_end, [s for s in mine if s.end <= kept_end], saves)
        if failed is not None:
            _add(segments, kept_end, stop, _after_failure(attempt.kind)[0])
        else:  # after the last step: a final checkpoint, the last report, teardown
            for a, b, saving in _split(kept_end, stop, _union(saves, kept_end, stop)):
                _add(segments, a, b, "checkpoint_save" if saving else "other")
    if failed is None:
        return segments, None
    _add(segments, failed, end, _after_failure(attempt.kind)[1])
    failure = _failure_record(failed, attempt.detected_at, end, attempt.kind, mine, steps, saves)
    return segments, failure


def _after_failure(kind: str) -> tuple[str, str]:
    """The badput of an attempt failed by ``kind`` (an ``Attempt.kind``; an unknown one is
    an infrastructure failure): (its lost work, the time to the next attempt)."""
    return _AFTER_FAILURE.get(kind, _AFTER_FAILURE["failure"])


def _relabel_after(segments: list[Segment], t: float, old: str, new: str) -> list[Segment]:
    """``segments`` with the part of each ``old`` segment after ``t`` made ``new``."""
    out: list[Segment] = []
    for seg in segments:
        if seg.category != old or seg.end <= t:
            _add(out, seg.start, seg.end, seg.category)
        else:
            _add(out, seg.start, max(seg.start, t), old)
            _add(out, max(seg.start, t), seg.end, new)
    return out


def _failure_record(
    failed: float,
    detected: float | None,
    restart: float,
    kind: str,
    mine: list[Step],
    steps: list[Step],
    saves: list[CheckpointSave],
) -> FailureRecord:
    reached = max((s.step for s in mine), default=0)
    before = [c for c in saves if c.end <= failed]
    restored = before[-1].step if before else 0
    # recovery is measured on the next attempt's steps (``restart`` is its start): steps
    # the failed attempt's surviving ranks made after the failure do not count
    past = next((s for s in steps if s.end > restart and s.step > reached), None)
    again = next((s for s in steps if s.start >= restart), None)
    return FailureRecord(
        time=failed,
        kind=kind,
        step_reached=reached,
        restored_step=restored,
        steps_lost=reached - restored,
        mttr_s=(past.end - failed) if past is not None else None,
        detected=failed if detected is None else detected,
        restored=again.start if again is not None else None,
    )
