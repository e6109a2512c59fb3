"""Delivery of one job's points and tags to its MLflow run (inside its RunRecorder).

Queues, key mapping, first-write-wins steps, the bound on queued points, batching into
``log_batch`` requests, outages, the run's text artifacts and its checkpoints'
LoggedModels. The recorder calls the queueing methods under its lock and the writing
ones (:meth:`Delivery.write`, :meth:`Delivery.write_extras`) without it.
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from jupyter_trainfactory.telemetry.keys import KeyMapper, to_float
from jupyter_trainfactory.tracking import TAG
from ray_backend.logged_models import CheckpointModels

__all__ = ["MAX_BATCH_METRICS", "RECENT_POINTS", "Delivery", "Pending"]

#: MLflow's ``log_batch`` takes at most 1,000 metrics + params + tags per request
#: (``mlflow.utils.validation.MAX_ENTITIES_PER_BATCH``); metrics go 900 at a time so the
#: first request of a flush has room for up to 100 tags.
MAX_BATCH_METRICS = 900
_MAX_TAGS = 100
#: Points kept per key to tell an out-of-order point from a repeated one, and to give a
#: checkpoint's LoggedModel the run's own point at its step.
RECENT_POINTS = 256


@functools.cache
def _metric_class():
    from mlflow.entities import Metric  # imported on first use: the module loads without MLflow

    return Metric


@dataclass
class Pending:
    """What one flush takes from the queues: it goes back to them if a request fails."""

    user: list = field(default_factory=list)
    system: list = field(default_factory=list)
    tags: list = field(default_factory=list)  # RunTag

    def __len__(self) -> int:
        return len(self.user) + len(self.system)


class Delivery:
    """Queues a run's points and tags and writes them with ``log_batch``.

    A point is removed from its queue only when the request that carried it succeeded;
    a failed request puts its points back, so when the tracking server is away, points
    wait and are written when it returns. A retried request cannot create a duplicate:
    MLflow's SQL store skips a metric whose key, step, timestamp and value are already in
    the run. The queues hold at most ``max_queued`` points; beyond that the oldest
    *system* points are dropped (and counted), never user, ``train/`` or ``checkpoint/``
    points.

    ``client`` is the MLflow client (``tracking.client``; a test may replace it).
    """

    def __init__(self, client: Any, run_id: str, max_queued: int = 200_000):
        self.client = client
        self.run_id = run_id
        self.tags: dict[str, str] = {}  # tags still to write
        self.key = KeyMapper()  # raw key -> MLflow key
        self.models = CheckpointModels(MAX_BATCH_METRICS)
        self.dropped = 0  # system points dropped beyond the bound
        self.nonfinite = 0  # NaN and inf values seen (never written)
        self.offline_total = 0.0  # s without the tracking server, outages ended
        self._user: deque = deque()  # user, train/, checkpoint/ points: never dropped
        self._system: deque = deque()  # system/ points: dropped oldest-first beyond the bound
        self._max_queued = max_queued
        self._renamed_written = 0
        self._last_step: dict[str, int] = {}
        self._recent: dict[str, deque] = {}  # key -> its last points (step, value, ms)
        self._floor: dict[str, int] = {}  # key -> its last step before its recent points
        self._inflight = 0
        self._offline_since: float | None = None
        self._offline_peak = 0
        self._offline_error = ""
        self._texts: dict[str, str] = {}  # artifact path -> text still to be logged

    # -- queueing (under the recorder's lock) ----------------------------------------
    def add(self, key: str, value: Any, step: int, wall_time: float) -> None:
        """Queue a user, ``train/`` or ``checkpoint/`` point: ``key`` is mapped, a
        non-number is skipped, a non-finite one counted and flagged (tags
        ``trainfactory.nonfinite.*``, metric ``train/nonfinite_count``), and a key's step
        is written once (first write wins)."""
        number = to_float(value)
        if number is None:
            return
        mapped = self.key(key)
        if not math.isfinite(number):
            self.nonfinite += 1
            if self.nonfinite == 1:
                self.tags[TAG.NONFINITE_STEP] = str(step)
                self.tags[TAG.NONFINITE_KEY] = mapped
            self.tags[TAG.NONFINITE_COUNT] = str(self.nonfinite)
            ms = int(wall_time * 1000)
            self.push("train/nonfinite_count", self.nonfinite, ms, self.nonfinite)
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
        self.push(mapped, number, int(wall_time * 1000), step)
        recent = self._recent.setdefault(mapped, deque(maxlen=RECENT_POINTS))
        if len(recent) == recent.maxlen:  # its oldest point leaves the window
            self._floor[mapped] = max(self._floor.get(mapped, -1), recent[0][0])
        recent.append((step, number, int(wall_time * 1000)))
        if len(self._user) + len(self._system) > self._max_queued:
            self.bound()

    def push(self, key: str, value: float, ts: int, step: int) -> None:
        """Queue a point as it is (``ts`` in ms): never dropped."""
        self._user.append(_metric_class()(key, float(value), ts, int(step)))

    def push_system(self, series: list[tuple[str, float, int, int]]) -> None:
        """Queue system points ``(key, value, ms, step)`` as they are, then apply the bound."""
        metric = _metric_class()
        self._system.extend(metric(k, float(v), ts, int(s)) for k, v, ts, s in series)
        self.bound()

    def bound(self) -> None:
        """Drop the oldest system points beyond ``max_queued`` (counted in ``dropped``)."""
        over = len(self._user) + len(self._system) - self._max_queued
        while over > 0 and self._system:
            self._system.popleft()
            self.dropped += 1
            over -= 1

    def written_at(self, key: str, step: int, value: float, now: float) -> tuple[float, int] | None:
        """``(value, time in ms)`` of ``key``'s point at ``step`` as written to the run (one
        of its last :data:`RECENT_POINTS`), else ``(value, now)``; None when the run holds
        a point at that step this recorder did not write (an earlier submission's, below
        the key's floor): a copy at another time would be a second point of that step."""
        for at, number, ts in reversed(self._recent.get(key, ())):
            if at == step:
                return number, ts
        if step <= self._floor.get(key, -1):
            return None
        return value, int(now * 1000)

    def continue_steps(self, last_steps: dict[str, int]) -> None:
        """Every key's last step already in the run (a resume): those steps stay written
        once. Called again with a later read, a key keeps the higher step."""
        for key, step in last_steps.items():
            self._last_step[key] = max(self._last_step.get(key, -1), step)
            self._floor[key] = max(self._floor.get(key, -1), step)

    def add_text(self, path: str, text: str) -> None:
        """Log ``text`` as the run's artifact ``path`` at the next flush."""
        self._texts[path] = text

    def renamed_tags(self) -> dict[str, str]:
        """The ``trainfactory.renamed_keys`` tag when keys were renamed since the last call."""
        if len(self.key.renamed) == self._renamed_written:
            return {}
        self._renamed_written = len(self.key.renamed)
        return {TAG.RENAMED_KEYS: json.dumps(self.key.renamed)[:5000]}

    def queued(self) -> int:
        """Points waiting, the ones a flush in progress holds included."""
        return len(self._user) + len(self._system) + self._inflight

    def queued_user(self) -> int:
        return len(self._user)

    def empty(self) -> bool:
        """Nothing queued: no point and no tag."""
        return not (self._user or self._system or self.tags)

    # -- writing ----------------------------------------------------------------------
    def take(self) -> Pending:
        """Take everything queued for one flush (under the lock)."""
        from mlflow.entities import RunTag

        pending = Pending(list(self._user), list(self._system))
        pending.tags = [RunTag(k, v) for k, v in self.tags.items()]
        self._user, self._system, self.tags = deque(), deque(), {}
        self._inflight = len(pending)
        return pending

    def write(self, pending: Pending) -> None:
        """Write ``pending`` (900 metrics, 100 tags per request; without the lock). Raises
        if a request fails: what was written is removed from ``pending``, the rest stays."""
        items = [pending.user, pending.system]
        tags = pending.tags
        while tags or any(items):
            chunk_of = next((i for i in items if i), [])
            chunk = chunk_of[:MAX_BATCH_METRICS]
            self.client.log_batch(self.run_id, metrics=chunk, tags=tags[:_MAX_TAGS])
            del chunk_of[: len(chunk)]
            del tags[:_MAX_TAGS]

    def put_back(self, pending: Pending) -> None:
        """After a failed :meth:`write`: what it did not write goes back to the front of
        its queue (under the lock). Nothing is lost."""
        self._inflight = 0
        self._user.extendleft(reversed(pending.user))
        self._system.extendleft(reversed(pending.system))
        for tag in pending.tags:
            self.tags.setdefault(tag.key, tag.value)
        self._offline_peak = max(self._offline_peak, len(self._user) + len(self._system))
        self.bound()

    def written(self) -> None:
        """After a :meth:`write` that succeeded (under the lock)."""
        self._inflight = 0

    def write_extras(self, budget_s: float | None = None) -> None:
        """Write the checkpoints' LoggedModels (for up to ``budget_s`` s, see
        ``CheckpointModels.write``) and the text artifacts (without the lock); raises when
        the tracking server refuses (the rest is tried at the next flush)."""
        self.models.write(self.client, self.run_id, budget_s)
        while self._texts:
            path, text = next(iter(self._texts.items()))
            self.client.log_text(self.run_id, text, path)
            if self._texts.get(path) is text:  # not replaced meanwhile
                del self._texts[path]

    # -- outages ----------------------------------------------------------------------
    @property
    def offline(self) -> bool:
        return self._offline_since is not None

    def went_offline(self, exc: BaseException) -> None:
        """A flush failed with ``exc``: the first one of an outage says so in the job log."""
        if self._offline_since is None:
            self._offline_since = time.time()
            self._offline_error = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            print(
                f"trainfactory: tracking server unreachable ({self._offline_error});"
                " training goes on and points are queued.",
                flush=True,
            )

    def back_online(self, written: int) -> dict[str, str]:
        """A flush of ``written`` points succeeded after an outage; returns its tags
        (``trainfactory.tracking.offline_s``, ``.dropped_points``, ``.last_outage``)."""
        offline = time.time() - self._offline_since
        self._offline_since = None
        self.offline_total += offline
        message = (
            f"trainfactory: tracking server back after {offline:.1f} s offline;"
            f" {max(self._offline_peak, written)} points were queued, {self.dropped} system"
            " points dropped in all."
        )
        print(message, flush=True)
        self._offline_peak = 0
        return {
            TAG.OFFLINE_S: f"{self.offline_total:.1f}",
            TAG.DROPPED_POINTS: str(self.dropped),
            TAG.LAST_OUTAGE: message.removeprefix("trainfactory: "),
        }
