"""Each reported checkpoint of a job as an MLflow LoggedModel linked to its run (in its RunRecorder)."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from jupyter_trainfactory.tracking import TAG

__all__ = ["CheckpointModels"]

#: Models written per round of requests (one ``log_outputs`` and one ``log_batch`` each).
MODELS_PER_ROUND = 50


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
        written_at: Callable[[str, int, float, float], tuple[float, int] | None],
        key: Callable[[str], str],
    ) -> None:
        """Queue the checkpoint at ``path`` reported at ``step`` and ``when`` (s since the
        epoch) with ``values`` (raw key -> number); ``written_at(key, step, value, when)``
        gives the run's own point at that step (value, ms), so the model's copy of a point
        is the run's one point (MLflow keeps each key's step once), or None for a point an
        earlier submission wrote (left out: its time is not known); ``key`` maps a raw key
        to its MLflow key. Called under the recorder's lock."""
        points = {
            key(k): written_at(key(k), step, v, when)
            for k, v in values.items()
            if v is not None and math.isfinite(v)
        }
        # a point the run got from an earlier submission stays its own: left out here
        metrics = {k: p for k, p in points.items() if p is not None}
        self._pending.append([step, path, when, metrics])

    def pending(self) -> int:
        """Checkpoints whose LoggedModel is not written yet."""
        return len(self._pending)

    def write(self, client: Any, run_id: str, budget_s: float | None = None) -> None:
        """Create, link and finalize the queued models, oldest first, in rounds of up to
        ``MODELS_PER_ROUND``: a model costs two requests (create, finalize), a round one
        ``log_outputs`` and one ``log_batch`` for all its models (the single-model way
        took four per model, and a job checkpointing every second fell minutes behind).

        With ``budget_s``, no new model is created once that many seconds have passed,
        so a flush goes back to the run's points and the stop poll; what is left waits for
        the next call. Raises when the tracking server refuses; what is left is tried
        again at the next call (a model already created is not created again)."""
        deadline = None if budget_s is None else time.monotonic() + budget_s
        while self._pending:
            self._link(client, run_id, self._created(client, run_id, deadline))
            if deadline is not None and time.monotonic() > deadline:
                return

    def _created(self, client: Any, run_id: str, deadline: float | None) -> list[list]:
        """The next round's queued entries, each with its LoggedModel (created here when
        it has none; none is created past ``deadline``)."""
        if self._run_info is None:
            run = client.get_run(run_id)
            self._run_info = (run.info.experiment_id, run.data.tags.get(TAG.JOB_ID, ""))
        experiment_id, job_id = self._run_info
        batch = []
        # by index, not by iterating: the recorder appends while this thread writes
        queued = [self._pending[i] for i in range(min(len(self._pending), MODELS_PER_ROUND))]
        for entry in queued:
            if len(entry) == 4:
                if batch and deadline is not None and time.monotonic() > deadline:
                    break
                step, path, when, _ = entry
                entry.append(
                    client.create_logged_model(
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
                )
            batch.append(entry)
        return batch

    def _link(self, client: Any, run_id: str, batch: list[list]) -> None:
        """Make ``batch``'s models the run's outputs at their steps, give them their
        metrics and finalize them; each leaves the queue once finalized."""
        from mlflow.entities import LoggedModelOutput, LoggedModelStatus, Metric

        client.log_outputs(run_id, [LoggedModelOutput(e[4].model_id, e[0]) for e in batch])
        points = [
            Metric(k, v, ts, step, model_id=model.model_id)
            for step, _, _, metrics, model in batch
            for k, (v, ts) in metrics.items()
        ]
        for i in range(0, len(points), self._max_batch):
            client.log_batch(run_id, metrics=points[i : i + self._max_batch])
        for entry in batch:
            client.finalize_logged_model(entry[4].model_id, LoggedModelStatus.READY)
            self._pending.popleft()
