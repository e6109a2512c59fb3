"""Stall watch of one job (inside its RunRecorder): flags a stall, decides, never acts."""

from __future__ import annotations

import math
import time
from typing import Any

from jupyter_trainfactory.tracking import TAG
from ray_backend.decisions import Decision

__all__ = ["StallWatch"]


class StallWatch:
    """Watches the job's progress (steps and reports) for a stall.

    A stall is ``timeout_s`` s without progress in a running attempt (None: not
    watched). :meth:`check` flags it once (tag ``trainfactory.stall``) and returns the
    decision ``on_stall`` asks for: ``stop`` (graceful, no grace period) or ``restart``
    (kill the rank that progressed least: Ray Train restarts the group from the latest
    checkpoint); ``warn`` only flags it. Progress clears the flag. The suggested timeout
    (tag ``trainfactory.stall.suggested_s``) is 10 x the longest gap between steps or
    reports seen so far (checkpoints and evaluations included), at least 60 s.

    Methods return the tags to write; the recorder calls them under its lock.
    """

    def __init__(self, timeout_s: float | None = None, on_stall: str = "warn"):
        self.timeout_s = timeout_s
        self.on_stall = on_stall
        self.max_gap = 0.0  # s: the longest wait between steps or reports
        self._last_progress: float | None = None
        self._progress_seen = False
        self._stalled: dict[str, Any] | None = None
        self._restarting = False  # a restart decided: the next failure is the stall's
        self._suggested = 0

    def tags(self) -> dict[str, str]:
        """The job's timeout tag, written once at the start."""
        return {TAG.STALL_TIMEOUT: f"{self.timeout_s:g}" if self.timeout_s else "off"}

    def started(self, now: float) -> dict[str, str]:
        """A new attempt started at ``now``: its setup is not a gap; an old stall is over."""
        self._last_progress, self._progress_seen = now, False
        self._restarting = False
        if self._stalled is not None:
            self._stalled = None
            return {TAG.STALL: ""}
        return {}

    def progressed(self, now: float) -> dict[str, str]:
        """A step or report arrived at ``now``."""
        if self._last_progress is not None and self._progress_seen:  # not the setup
            self.max_gap = max(self.max_gap, now - self._last_progress)
        self._progress_seen = True
        self._last_progress = now
        if self._stalled is not None:
            print(f"trainfactory: progress again after the stall ({self.text()})")
            self._stalled = None
            return {TAG.STALL: ""}
        return {}

    def cause(self) -> str | None:
        """The failure's cause when it followed a restart this watch decided, else None."""
        return self.text() if self._restarting else None

    def text(self) -> str:
        """``no step or report for N s since HH:MM:SS; least progress: rank R (step S)``."""
        s = self._stalled or {}
        since = time.strftime("%H:%M:%S", time.localtime(s.get("since", 0)))
        text = f"no step or report for {s.get('after_s', 0):.0f} s since {since}"
        if s.get("rank") is not None:
            text += f"; least progress: rank {s['rank']} (step {s.get('rank_step', '?')})"
        return text

    def check(
        self,
        now: float,
        running: bool,
        laggard: int | None = None,
        laggard_step: int | None = None,
    ) -> tuple[dict[str, str], Decision | None]:
        """Look for a stall at ``now``; ``running``: an attempt runs (not failed);
        ``laggard``: the running rank that progressed least, at step ``laggard_step``.

        Returns ``(tags, decision)``: the decision (``stop`` or ``restart`` of the
        laggard, rank 0 when none is known) once per stall, else None.
        """
        tags = {}
        if self.max_gap:
            suggested = max(60, 10 * math.ceil(self.max_gap))
            if suggested != self._suggested:
                self._suggested = suggested
                tags[TAG.STALL_SUGGESTED] = str(suggested)
        if (
            self.timeout_s is None
            or not running
            or self._stalled is not None
            or self._last_progress is None
            or now - self._last_progress < self.timeout_s
        ):
            return tags, None
        self._stalled = {
            "since": self._last_progress,
            "after_s": now - self._last_progress,
            "rank": laggard,
            "rank_step": laggard_step,
        }
        text = self.text()
        tags[TAG.STALL] = text
        print(f"trainfactory: stalled: {text} (--on-stall {self.on_stall})", flush=True)
        if self.on_stall == "stop":
            return tags, Decision("stop", reason="stall", grace_s=0.0)
        if self.on_stall == "restart":
            self._restarting = True
            return tags, Decision("restart", reason="stall", rank=0 if laggard is None else laggard)
        return tags, None
