"""Each reported checkpoint of a job as an MLflow LoggedModel linked to its run (in its RunRecorder)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

from jupyter_trainfactory.tracking import TAG

__all__ = ["CheckpointModels"]


class CheckpointModels:
    """Checkpoints still to become LoggedModels (``model_type="checkpoint"``), written by
    :meth:`write` at each flush.

    A model is linked to the run (``source_run_id``), its step and the metrics reported
    with it; the weights stay in the job's storage (tag ``trainfactory.checkpoint.path``)
    until ``%train register`` logs them as an MLflow model. Each is also the run's output
    at its step (``log_outputs``): the run page of the MLflow UI lists a run's models from
    its outputs, not from ``source_run_id``.
    """

    def __init__(self, max_batch_metrics: int):
        self._max_batch = max_batch_metrics
        self._pending: deque = deque()  # [step, path, time, {key: (value, ms)}, model?]
        self._run_info: tuple[str, str] | None = None  # (experiment id, job id)

    def add(
        self,
        step: int,
        path: str,
        when: float,
        values: dict[str, float | None],
        written_at: Callable[[str, int, float, float], tuple[float, int]],
        key: Callable[[str], str],
    ) -> None:
        """Queue the checkpoint at ``path`` reported at ``step`` and ``when`` (s since the
        epoch) with ``values`` (raw key -> number); ``written_at(key, step, value, when)``
        gives the run's own point at that step (value, ms), so the model's copy of a point
        is the run's one point (MLflow keeps each key's step once); ``key`` maps a raw key
        to its MLflow key. Called under the recorder's lock."""
        metrics = {
            key(k): written_at(key(k), step, v, when)
            for k, v in values.items()
            if v is not None and math.isfinite(v)
        }
        self._pending.append([step, path, when, metrics])

    def write(self, client: Any, run_id: str) -> None:
        """Create, link and finalize every queued model. Raises when the tracking server
        refuses; what is left is tried again at the next call (a model already created
        is not created again)."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric

        while self._pending:
            step, path, when, metrics, *created = self._pending[0]
            if self._run_info is None:
                run = client.get_run(run_id)
                self._run_info = (run.info.experiment_id, run.data.tags.get(TAG.JOB_ID, ""))
            experiment_id, job_id = self._run_info
            model = created[0] if created else None
            if model is None:
                model = client.create_logged_model(
                    experiment_id,
                    name=f"checkpoint-step-{step}",
                    source_run_id=run_id,
                    model_type="checkpoint",
                    tags={
                        TAG.JOB_ID: job_id,
                        TAG.CKPT_PATH: path,
                        TAG.CKPT_STEP: str(step),
                        TAG.CKPT_TIME: f"{when:.3f}",
                    },
                )
                self._pending[0] = [step, path, when, metrics, model]
            client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step)])
            points = [
                Metric(k, v, ts, step, model_id=model.model_id) for k, (v, ts) in metrics.items()
            ]
            if points:
                client.log_batch(run_id, metrics=points[: self._max_batch])
            client.finalize_logged_model(model.model_id, LoggedModelStatus.READY)
            self._pending.popleft()
