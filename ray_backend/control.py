"""Stop and chaos control of one job (inside its RunRecorder): requests in, decisions out.

Requests reach a running job through its run's tags (written by ``JobManager.stop`` and
``JobManager.chaos``); :func:`decisions_from_tags` turns them into decisions the recorder
carries out. :class:`StopControl` keeps a stop request and the ranks' agreement on the
stop point; :class:`ChaosControl` the fault-injection requests carried out and the
processes they killed. Both are called under the recorder's lock.
"""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

from jupyter_trainfactory.fleet.kinds import BY_CHAOS_NODE, BY_CHAOS_WORKER
from jupyter_trainfactory.tracking import TAG
from ray_backend.decisions import Decision
from ray_backend.protocol import StopPoint, StopReply

__all__ = ["ChaosControl", "StopControl", "decisions_from_tags"]


class StopControl:
    """A job's stop request and the agreement of its ranks on where they stop.

    ``request`` is None, or ``{"reason", "grace_s", "time", "checkpointed"}`` plus, as
    the agreement goes, ``counts`` (rank -> stop points passed when it heard), ``world``,
    ``at`` (the agreed stop point), ``agreed`` (when), ``reached``, ``waiting`` and
    ``waiting_since`` (a rank the stop waits for, see :meth:`check_wait`).
    """

    def __init__(self) -> None:
        self.request: dict[str, Any] | None = None

    def ask(self, reason: str, grace_s: float = 300.0, at: float | None = None) -> bool:
        """Record a stop request (the first one counts); True when it is new."""
        if self.request is not None:
            return False
        at = time.time() if at is None else at
        self.request = {"reason": reason, "grace_s": grace_s, "time": at, "checkpointed": False}
        return True

    def checkpointed(self) -> None:
        """The workers reported the checkpoint after the request: they wait after it."""
        if self.request is not None:
            self.request["checkpointed"] = True

    def reply(self, rank: int, stop: StopPoint | None, step: int) -> StopReply:
        """The reply to rank ``rank``'s batch; ``stop``: its stop point count, if sent;
        ``step``: the furthest step known (counted by the ranks, or reported: a plain
        Ray Train loop counts none of its own)."""
        if self.request is None:
            return {"stop": False}
        if stop is not None:
            self._agree(rank, stop, step)
        return {"stop": True, "at": self.request.get("at")}

    def _agree(self, rank: int, info: StopPoint, step: int) -> None:
        """Take rank ``rank``'s stop point count, sent after it heard of the stop (it
        passes no further stop point until told the agreed one); once every rank's count
        is in, the stop point is one past the furthest: every rank can reach it (the
        ranks behind need no collective with the ones waiting ahead of them) and none
        has passed it. ``step``: the furthest step known, for the job log's note."""
        stop = self.request
        counts = stop.setdefault("counts", {})
        counts[rank] = int(info.get("checks", 0))
        world = max(int(info.get("world_size") or 1), 1)
        stop["world"] = world
        if stop.get("at") is None and len(counts) >= world:
            stop["at"] = max(counts.values()) + 1
            stop["agreed"] = time.time()
            print(
                f"trainfactory: stop agreed by {world} ranks: every rank stops at its next"
                f" stop point (about step {step + 1})",
                flush=True,
            )

    def new_attempt(self) -> None:
        """New workers count their stop points from zero: the agreement starts again."""
        if self.request is not None:
            for key in ("counts", "at", "agreed", "reached", "waiting"):
                self.request.pop(key, None)

    def check_wait(
        self,
        now: float,
        attempt: dict[str, Any] | None,
        world: int,
        rank_checks: dict[int, int],
        rank_steps: dict[int, int],
        max_gap: float,
    ) -> dict[str, str]:
        """Say when a stop cannot complete: a rank has not answered the stop, or has not
        reached the agreed stop point while another rank has (a hang, or stop points
        that differ between ranks), for ``max(30 s, 3 x max_gap)``. Returns the reason
        (``stopping: waiting for rank R at step S``) and the tag
        ``trainfactory.stop.waiting`` when they change."""
        stop = self.request
        if stop is None or stop["checkpointed"] or attempt is None or attempt["failed_at"]:
            return {}
        world = stop.get("world") or world
        at = stop.get("at")
        if at is None:  # not agreed: the ranks that have not answered since they heard
            behind = [r for r in range(world) if r not in stop.get("counts", {})]
            since = max(stop["time"], attempt["start"])
        else:
            behind = [r for r in range(world) if rank_checks.get(r, 0) < at]
            if len(behind) == world:  # all on their way (a loop that checks rarely)
                return {}
            since = stop.setdefault("reached", now)
        if not behind:
            if stop.pop("waiting", None):
                stop.pop("waiting_since", None)
                return {TAG.STOP_WAITING: ""}
            return {}
        if now - since < max(30.0, 3 * max_gap):
            return {}
        rank = min(behind, key=lambda r: (rank_checks.get(r, -1), r))
        text = f"stopping: waiting for rank {rank} at step {rank_steps.get(rank, 0)}"
        if stop.get("waiting") == text:
            return {}
        stop["waiting"], stop["waiting_since"] = text, since
        print(f"trainfactory: {text} (since {now - since:.0f} s)", flush=True)
        return {TAG.REASON: text, TAG.STOP_WAITING: text}

    def waiting_since(self) -> float | None:
        """Since when the stop waits for a rank (badput ``stop_wait``), else None."""
        return (self.request or {}).get("waiting_since")

    def status(self, running: bool, now: float) -> dict[str, Any] | None:
        """None, or the stop request with ``due``: True once training should end now (a
        checkpoint came after the request, the grace period is over, or training has not
        started: ``running`` False, so there is nothing to save)."""
        if self.request is None:
            return None
        stop = dict(self.request)
        stop["due"] = (
            stop["checkpointed"]
            or not running
            or stop["reason"] == "user-now"
            or now - stop["time"] >= stop["grace_s"]
        )
        return stop

    def final_reason(self) -> str:
        """The job's reason at its end: the request's reason (``user`` if none), with
        the rank it waited for when the grace ran out on it."""
        if self.request is None:
            return "user"
        reason = self.request["reason"]
        waiting = self.request.get("waiting")
        if waiting and not self.request["checkpointed"]:
            reason += f": grace ended {waiting.removeprefix('stopping: ')}"
        return reason


class ChaosControl:
    """Fault-injection requests: ``{"id", "rank": R}`` (R < 0: the highest rank) or
    ``{"id", "node": NODE}`` (every rank on it), each carried out once."""

    def __init__(self) -> None:
        self.done: set[str] = set()  # request ids carried out (or from before this job)
        self._killed: dict[int, str] = {}  # pid -> the request that killed it
        self._node_requests: set[str] = set()  # ids of requests for a whole node

    def seen_before(self, tag: str | None) -> None:
        """The run's ``trainfactory.chaos`` tag at the start: a request of an earlier
        submission, not for this one."""
        with contextlib.suppress(ValueError, AttributeError):
            self.done.add(str(json.loads(tag or "{}").get("id", "")))

    def new_request(self, tag: str | None) -> dict[str, Any] | None:
        """The request in the run's ``trainfactory.chaos`` tag if not yet carried out
        (it is then marked carried out), else None."""
        if not tag:
            return None
        try:
            request = json.loads(tag)
        except ValueError:
            return None
        if not request.get("id") or request["id"] in self.done:
            return None
        self.done.add(request["id"])
        if "node" in request:
            self._node_requests.add(request["id"])
        return request

    @staticmethod
    def targets(request: dict[str, Any], ranks: list[int], on_node: list[int]) -> list[int]:
        """The ranks ``request`` kills: ``on_node`` (the ranks on its node) for a node
        request, else its rank; ``ranks``: the running ones. Raises ValueError for a
        node without a worker of this job."""
        if "node" in request:
            if not on_node:
                raise ValueError(f"no worker of this job runs on node {request['node']}")
            return on_node
        rank = int(request.get("rank", -1))
        return [max(ranks, default=0) if rank < 0 else rank]

    def killed(self, request_id: str, pids: list[int]) -> None:
        """Request ``request_id`` killed ``pids``: their failure's cause."""
        self._killed.update({pid: request_id for pid in pids})

    def cause(self, pid: int | None) -> str | None:
        """``killed by chaos request ID`` for a process a request killed, else None."""
        request = self._killed.get(pid) if pid is not None else None
        return None if request is None else f"killed by chaos request {request}"

    def kind(self, pid: int | None) -> str | None:
        """``chaos-node`` or ``chaos`` (``fleet.kinds.BY_*``) for a process a node
        or a rank request killed, else None."""
        request = self._killed.get(pid) if pid is not None else None
        if request is None:
            return None
        return BY_CHAOS_NODE if request in self._node_requests else BY_CHAOS_WORKER


def decisions_from_tags(
    tags: dict[str, str], chaos: ChaosControl, stop: StopControl
) -> list[Decision]:
    """The decisions the run's control tags ask for: a new chaos request
    (``trainfactory.chaos``), then a stop (``trainfactory.stop_requested``,
    ``..._grace_s``, ``..._time``) when none was requested yet."""
    decisions = []
    request = chaos.new_request(tags.get(TAG.CHAOS))
    if request is not None:
        decisions.append(Decision("chaos", request=request))
    reason = tags.get(TAG.STOP)
    if reason and stop.request is None:
        grace = float(tags.get(TAG.STOP_GRACE) or 300.0)
        at = float(tags.get(TAG.STOP_TIME) or time.time())
        decisions.append(Decision("stop", reason=reason, grace_s=grace, at=at))
    return decisions
