"""Ray Train ``UserCallback`` that forwards reports and failures to the job's RunRecorder."""

from __future__ import annotations

import time
import traceback
from typing import Any

from ray.train import UserCallback

from ray_backend.session import TRACEBACK_LINES

__all__ = ["RecorderCallback", "failure_detail", "first_cause", "last_line", "root_error"]


def root_error(exc: BaseException) -> tuple[BaseException, str]:
    """The error a user should see inside Ray Train's wrappers, and its traceback text.

    Ray Train wraps a worker's exception in ``UserExceptionWithTraceback`` (the original
    and its formatted traceback) and a dead worker in ``WorkerHealthCheckFailedError``
    (its ``health_check_failure``, for instance ``ActorDiedError``); ``WorkerGroupError``
    holds them per rank. Returns ``(error, traceback text)``.
    """
    for _ in range(5):  # unwrap a few levels at most
        failures = getattr(exc, "worker_failures", None)
        if failures:
            exc = failures[first_cause(failures)]
            continue
        base = getattr(exc, "_base_exc", None)
        if base is not None:
            return base, getattr(exc, "_traceback_str", "") or ""
        inner = getattr(exc, "health_check_failure", None)
        if inner is not None:
            exc = inner
            continue
        break
    return exc, "".join(traceback.format_exception(exc))


def _died(exc: BaseException) -> bool:
    from ray.exceptions import RayActorError

    for _ in range(5):
        if isinstance(exc, RayActorError):
            return True
        inner = getattr(exc, "health_check_failure", None)
        if inner is None:
            return False
        exc = inner
    return False


def first_cause(failures: dict[int, BaseException]) -> int:
    """The rank whose failure to record among several at once: one whose process died
    (its death breaks the others' collectives, so their errors are symptoms), else the
    lowest."""
    return min(failures, key=lambda r: (not _died(failures[r]), r))


def last_line(exc: BaseException) -> str:
    """``"TypeName: last line of the message"``: the one line a user sees for an error."""
    exc, _ = root_error(exc)
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    name = type(exc).__name__
    if not lines:
        return name
    last = lines[-1].strip()
    return last if last.startswith(f"{name}:") else f"{name}: {last}"


def failure_detail(exc: BaseException) -> dict[str, str]:
    """``{"type", "message", "traceback", "kind"}`` of a worker's failure: the root
    error's type name, its message's last line, the last :data:`TRACEBACK_LINES` lines of
    its traceback (none for a worker process that died: Ray's own frames would be all of
    it; the worker's log has what it printed last), and ``"preemption"`` when Ray marked the dead worker's actor as
    preempted (``RayActorError.preempted``, what Ray Train's separate preemption budget
    counts), else ``"failure"``."""
    from ray.exceptions import RayActorError

    root, text = root_error(exc)
    lines = [line for line in text.rstrip().splitlines() if line.strip()]
    if isinstance(root, RayActorError):  # the process died: Ray's frames say nothing more
        lines = []
    message = last_line(root)
    if len(message) > 240:  # Ray's own messages run on: their first sentence is the news
        first, dot, _ = message.partition(". ")
        message = first + dot.strip() if len(first) < 240 else message[:239] + "…"
    return {
        "type": type(root).__name__,
        "message": message,
        "traceback": "\n".join(lines[-TRACEBACK_LINES:]),
        "kind": "preemption" if getattr(root, "preempted", False) is True else "failure",
    }


class RecorderCallback(UserCallback):
    """Runs in the Ray Train controller; every call to the recorder is fire-and-forget."""

    def __init__(self, recorder: Any):
        self.recorder = recorder

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        path = checkpoint.path if checkpoint is not None else None
        self.recorder.report.remote(metrics, path, time.time())

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        if worker_exceptions:
            rank = first_cause(worker_exceptions)
            exc = worker_exceptions[rank]
            detail = failure_detail(exc)
            self.recorder.worker_failure.remote(
                rank, detail["message"], kind=detail["kind"], detail=detail
            )
