"""The kinds of failure the reliability report counts, and how a recorded failure gets one.

A failure is one end of an attempt of a job's workers (``ray_backend.attempts``). Its
kind is decided once, by the job's recorder when it writes the run's
``trainfactory.faults.records`` tag, so every door that reads the run (the notebook, the
command line, the side panel) counts it the same way:

- ``worker_crash``: a worker process died or Ray lost it (``RayActorError``,
  ``ActorDiedError``, ``WorkerCrashedError``, Ray's ``OutOfMemoryError``, a lost object),
  and what a drill of ``%train chaos --kill-worker`` simulates;
- ``node_loss``: the node under a worker died or was removed (``NodeDiedError``, or an
  actor error that says its node died), and what ``%train chaos --kill-node`` simulates;
- ``preemption``: Ray marked the dead worker's actor as preempted
  (``RayActorError.preempted``: spot capacity taken back);
- ``stall``: the job's stall watch restarted workers that made no progress, or Ray
  Train's health check timed out on a worker that stopped answering;
- ``user_error``: an exception raised by the training code itself (any other type: a
  ``ValueError`` in the loop, a CUDA error in the model, an assertion);
- ``unclassified``: a failure recorded before kinds were recorded.

The first four, and ``unclassified``, are **infrastructure failures**: what a cluster
(its hardware, its scheduler, its provider) is accountable for. User errors and
planned stops (``%train stop``, a budget stop) are counted apart and never enter a
failure rate.

A **drill** is a failure injected on purpose (:func:`injected`): a kill of
``%train chaos`` (carried out by the job's recorder, which marks the processes it
killed) or the proof-of-concept job's own kill (``ray_backend.poc_loop``: the dying
rank says so to the recorder first). It keeps the kind it simulates, is marked
``drill`` in the run's failure log and counted apart: never in a failure rate, MTBF or
MTTR of real failures.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DRILL",
    "INFRASTRUCTURE",
    "KINDS",
    "NODE_LOSS",
    "PREEMPTION",
    "STALL",
    "UNCLASSIFIED",
    "USER_ERROR",
    "WORKER_CRASH",
    "attempt_kind",
    "classify",
    "injected",
    "is_process_loss",
]

WORKER_CRASH = "worker_crash"
NODE_LOSS = "node_loss"
PREEMPTION = "preemption"
STALL = "stall"
USER_ERROR = "user_error"
UNCLASSIFIED = "unclassified"
#: Every kind, in the order reports list them.
KINDS = (WORKER_CRASH, NODE_LOSS, PREEMPTION, STALL, UNCLASSIFIED, USER_ERROR)
#: The kinds a cluster is accountable for.
INFRASTRUCTURE = (WORKER_CRASH, NODE_LOSS, PREEMPTION, STALL, UNCLASSIFIED)

#: ``by`` values of a failure this job caused itself (``ray_backend.record``).
BY_CHAOS_WORKER, BY_CHAOS_NODE, BY_STALL = "chaos", "chaos-node", "stall"
#: ``by`` values of a failure injected on purpose (a drill); a stall restart is not one:
#: the job's stall watch reacted to a real stall.
_INJECTED = frozenset({BY_CHAOS_WORKER, BY_CHAOS_NODE})
#: A failed attempt the goodput account books apart (``telemetry.goodput.Attempt.kind``).
DRILL = "drill"

# Exception type names from ray.exceptions and ray.train (Ray 2.5x): a process or node gone.
_NODE_ERRORS = frozenset({"NodeDiedError", "LocalRayletDiedError", "RayletDiedError"})
_PROCESS_ERRORS = frozenset(
    {
        "RayActorError",
        "ActorDiedError",
        "ActorUnavailableError",
        "ActorUnschedulableError",
        "WorkerCrashedError",
        "OutOfMemoryError",
        "ObjectLostError",
        "OwnerDiedError",
        "ObjectReconstructionFailedError",
        "RaySystemError",
        "WorkerHealthCheckFailedError",
    }
)
_HANG_ERRORS = frozenset({"WorkerHealthCheckTimeoutError"})
_NODE_WORDS = ("node has died", "node died", "node was removed", "node is dead", "node failed")


def is_process_loss(type_name: str) -> bool:
    """True for an exception type (its name) that says a worker's process or node is
    gone (``ActorDiedError``, ``NodeDiedError``...), not that the code raised."""
    return type_name in _PROCESS_ERRORS or type_name in _NODE_ERRORS


def injected(failure: Mapping[str, Any]) -> bool:
    """True for a failure injected on purpose, a drill: its root cause says it was
    caused ``by`` a chaos kill (``%train chaos``, the poc's own kill)."""
    return failure.get("by") in _INJECTED


def attempt_kind(failure: Mapping[str, Any]) -> str:
    """How the goodput account books the attempt that ended in ``failure`` (its root
    cause, as :func:`classify` takes it): ``drill`` when :func:`injected`, ``user_error``
    for an exception of the training code, ``preemption``, else ``failure`` (an
    infrastructure failure). The values of ``telemetry.goodput.Attempt.kind``."""
    if injected(failure):
        return DRILL
    kind = classify(failure)
    return kind if kind in (USER_ERROR, PREEMPTION) else "failure"


def classify(failure: Mapping[str, Any]) -> str:
    """The kind of one failure, from its root cause as ``ray_backend.attempts`` records
    it (``kind``: ``failure`` or ``preemption``; ``type``: the root exception's type
    name; ``message``; ``by``: ``chaos``, ``chaos-node`` or ``stall`` when this job
    caused it). Returns one of :data:`KINDS` but ``unclassified``; for a drill
    (:func:`injected`), the kind it simulates."""
    if failure.get("kind") == PREEMPTION:
        return PREEMPTION
    by = failure.get("by")
    if by == BY_CHAOS_NODE:
        return NODE_LOSS
    if by == BY_CHAOS_WORKER:
        return WORKER_CRASH
    if by == BY_STALL or failure.get("type") in _HANG_ERRORS:
        return STALL
    kind = str(failure.get("type") or "")
    message = str(failure.get("message") or "").lower()
    if kind in _NODE_ERRORS or (kind in _PROCESS_ERRORS and any(w in message for w in _NODE_WORDS)):
        return NODE_LOSS
    if kind in _PROCESS_ERRORS:
        return WORKER_CRASH
    return USER_ERROR
