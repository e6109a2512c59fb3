"""Worker side: wraps the user's training function on every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["RECORDER_NAMESPACE", "instrument", "recorder_name"]

RECORDER_NAMESPACE = "trainfactory"


def recorder_name(job_id: str) -> str:
    """Name of job ``job_id``'s RunRecorder actor in namespace ``trainfactory``."""
    return f"recorder-{job_id}"


def instrument(fn: Callable[[dict], Any], job_id: str) -> Callable[[dict], Any]:
    """Wrap ``fn`` so rank 0 tells the recorder when the workers have started.

    The user's function itself runs unchanged (plain Ray Train code).
    """

    def train_loop_per_worker(config: dict) -> Any:
        import ray
        import ray.train

        if ray.train.get_context().get_world_rank() == 0:
            try:
                recorder = ray.get_actor(recorder_name(job_id), namespace=RECORDER_NAMESPACE)
                recorder.set_state.remote("RUNNING", "")
            except ValueError:  # no recorder (job launched without one): nothing to tell
                pass
        return fn(config)

    train_loop_per_worker.__name__ = getattr(fn, "__name__", "train_loop_per_worker")
    return train_loop_per_worker
