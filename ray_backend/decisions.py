"""What the recorder's parts hand back to it: points and tags to write, decisions to carry out.

The parts of a RunRecorder (attempts, stall watch, stop and chaos control, derived
numbers, reports) never write to MLflow or act on the job themselves: they return an
:class:`Update` and the recorder alone writes it and carries out its :class:`Decision` s,
as Ray Train's controller executes the decisions its failure and scaling policies return.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Decision", "Update"]


@dataclass(frozen=True)
class Decision:
    """An action on the job that only the recorder carries out.

    ``kind``: ``stop`` (graceful: after the next checkpoint, or ``grace_s`` s without
    one; ``reason`` as in ``RunRecorder.request_stop``; ``at``: when it was asked, s since
    the epoch, None: now), ``restart`` (SIGKILL rank ``rank``: Ray Train restarts the
    whole worker group from the latest checkpoint) or ``chaos`` (a fault-injection
    ``request``: ``{"id", "rank"}`` or ``{"id", "node"}``). ``note``: a line to print
    before carrying it out.
    """

    kind: Literal["stop", "restart", "chaos"]
    reason: str = ""
    grace_s: float = 300.0
    at: float | None = None
    rank: int | None = None
    request: dict[str, Any] | None = None
    note: str = ""


@dataclass
class Update:
    """Points and tags for the run, and decisions, from one part.

    ``points``: ``(key, value, step, wall time s)``, written the way report and log
    points are (key mapping, first write wins, non-finite values counted); ``series``:
    ``(key, value, time ms, step)``, written as they are (derived series on the
    recorder's own clock); ``tags``: run tags; ``decisions``: for the recorder to carry out.
    """

    points: list[tuple[str, Any, int, float]] = field(default_factory=list)
    series: list[tuple[str, float, int, int]] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    decisions: list[Decision] = field(default_factory=list)

    def add(self, other: Update | None) -> Update:
        """Append ``other``'s points, series, tags and decisions to this one; returns self."""
        if other is not None:
            self.points += other.points
            self.series += other.series
            self.tags.update(other.tags)
            self.decisions += other.decisions
        return self
