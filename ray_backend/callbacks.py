"""Ray Train ``UserCallback`` that forwards reports and failures to the job's RunRecorder."""

from __future__ import annotations

import time
from typing import Any

from ray.train import UserCallback

__all__ = ["RecorderCallback", "last_line"]


def last_line(exc: BaseException) -> str:
    """``"TypeName: last line of the message"``: the one line a user sees for an error."""
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1].strip()}" if lines else type(exc).__name__


class RecorderCallback(UserCallback):
    """Runs in the Ray Train controller; every call to the recorder is fire-and-forget."""

    def __init__(self, recorder: Any):
        self.recorder = recorder

    def after_report(self, run_context, metrics: list[dict[str, Any]], checkpoint) -> None:
        path = checkpoint.path if checkpoint is not None else None
        self.recorder.report.remote(metrics, path, time.time())

    def after_exception(self, run_context, worker_exceptions: dict[int, Exception]) -> None:
        for rank, exc in sorted(worker_exceptions.items())[:1]:
            self.recorder.worker_failure.remote(rank, last_line(exc))
