"""RunRecorder: the single writer of one job's MLflow run (runs as a Ray actor in the job)."""

from __future__ import annotations

import threading
import time
from typing import Any

from jupyter_trainfactory.tracking import TAG, client, numeric_items, sanitize_key

__all__ = ["RESERVED_KEYS", "RunRecorder"]

#: Report keys with a meaning to this tool. ``step``: the report's step (else the
#: report count). ``samples``: samples this rank processed since its previous report.
RESERVED_KEYS = frozenset({"step", "samples"})
_BATCH = 900  # MLflow log_batch accepts at most 1000 metrics per call


class RunRecorder:
    """Buffers a job's metrics and tags and writes them to its MLflow run in batches.

    Every method only appends to a buffer under a lock; a background thread flushes
    the buffer with ``log_batch`` every ``flush_interval_s`` seconds, so callers (the
    Ray Train controller callback, node samplers) never wait on MLflow.

    Steps follow the design: a report's step is its ``step`` value, else the number
    of reports so far; a step is written once (first write wins).
    """

    def __init__(self, tracking_uri: str, run_id: str, flush_interval_s: float = 0.5):
        self._client = client(tracking_uri)
        self.run_id = run_id
        self._lock = threading.Lock()
        self._metrics: list = []
        self._tags: dict[str, str] = {}
        self._reports = 0
        self._last_step = -1
        self._last_report_time: float | None = None
        self._samples_total = 0.0
        self._running_since: float | None = None
        self._closed = False
        self._interval = flush_interval_s
        self._flusher = threading.Thread(target=self._flush_loop, name="run-recorder", daemon=True)
        self._flusher.start()

    # -- inputs ---------------------------------------------------------------------
    def set_state(self, state: str, reason: str = "") -> None:
        """Record the job's state (``PENDING``, ``RUNNING``, ``RESTARTING``) and its reason."""
        with self._lock:
            if state == "RUNNING" and self._running_since is None:
                self._running_since = time.time()
            self._tags[TAG.STATE] = state
            self._tags[TAG.REASON] = reason

    def report(
        self,
        metrics_per_rank: list[dict[str, Any]],
        checkpoint_path: str | None,
        wall_time: float | None = None,
    ) -> int | None:
        """Record one ``ray.train.report`` round.

        Parameters
        ----------
        metrics_per_rank : list of dict
            ``metrics_per_rank[r]`` is what rank ``r`` reported. Rank 0's numeric values
            are logged; ``samples`` is summed over ranks for ``train/samples_per_s``.
        checkpoint_path : str or None
            Storage path of the checkpoint persisted with this report.
        wall_time : float, optional
            When the round completed, s since the epoch (default: now).

        Returns
        -------
        int or None
            The step written, or None when that step was already written.
        """
        now = wall_time or time.time()
        rank0 = metrics_per_rank[0] if metrics_per_rank else {}
        with self._lock:
            self._reports += 1
            raw_step = rank0.get("step")
            step = int(raw_step) if isinstance(raw_step, (int, float)) else self._reports
            previous = self._last_report_time or self._running_since
            self._last_report_time = now
            if step <= self._last_step:
                return None
            self._last_step = step
            values = numeric_items({k: v for k, v in rank0.items() if k not in RESERVED_KEYS})
            samples = [m.get("samples") for m in metrics_per_rank]
            if all(isinstance(s, (int, float)) for s in samples) and samples:
                batch = float(sum(samples))
                self._samples_total += batch
                values["train/samples"] = self._samples_total
                if previous is not None and now > previous:
                    values["train/samples_per_s"] = batch / (now - previous)
            if checkpoint_path:
                values["checkpoint/step"] = float(step)
                self._tags.update(
                    {
                        TAG.CKPT_PATH: checkpoint_path,
                        TAG.CKPT_STEP: str(step),
                        TAG.CKPT_TIME: f"{now:.3f}",
                    }
                )
            self._tags[TAG.STEP] = str(step)
            self._add(values, step, now)
            return step

    def node_metrics(self, values: dict[str, float], step: int, wall_time: float) -> None:
        """Record one node sample (keys already ``system/<node>/...``); ``step`` = sample index."""
        with self._lock:
            self._add(numeric_items(values), step, wall_time)

    def worker_failure(self, rank: int, error: str) -> None:
        """Record that rank ``rank`` failed with ``error`` (its last line)."""
        with self._lock:
            self._tags[TAG.STATE] = "RESTARTING"
            self._tags[TAG.REASON] = f"rank {rank} failed: {error}"[:4000]

    def finish(self, status: str, state: str, error: str = "", reason: str = "") -> None:
        """Flush everything and close the run.

        ``status`` is the MLflow run status (``FINISHED``, ``FAILED``, ``KILLED``),
        ``state`` the job state shown to users (design: "Job states").
        """
        with self._lock:
            self._tags[TAG.STATE] = state
            self._tags[TAG.REASON] = reason
            if error:
                self._tags[TAG.ERROR] = error[:4000]
            self._closed = True
        self.flush()
        self._client.set_terminated(self.run_id, status=status)

    # -- output ---------------------------------------------------------------------
    def _add(self, values: dict[str, float], step: int, wall_time: float) -> None:
        from mlflow.entities import Metric

        ts = int(wall_time * 1000)
        self._metrics.extend(Metric(sanitize_key(k), v, ts, step) for k, v in values.items())

    def flush(self) -> None:
        """Write everything buffered so far (one ``log_batch`` per 900 metrics)."""
        from mlflow.entities import RunTag

        with self._lock:
            metrics, self._metrics = self._metrics, []
            tags, self._tags = self._tags, {}
        tag_list = [RunTag(k, v) for k, v in tags.items()]
        written = 0
        try:
            for i in range(0, max(len(metrics), 1), _BATCH):
                chunk = metrics[i : i + _BATCH]
                if chunk or (tag_list and i == 0):
                    self._client.log_batch(
                        self.run_id, metrics=chunk, tags=tag_list if i == 0 else []
                    )
                written = i + _BATCH
        except Exception:
            with self._lock:  # nothing is lost: put back what was not written
                self._metrics[:0] = metrics[written:]
                if written == 0:
                    self._tags = {**tags, **self._tags}
            raise

    def _flush_loop(self) -> None:
        while not self._closed:
            time.sleep(self._interval)
            try:
                self.flush()
            except Exception as exc:  # keep recording; MLflow may be briefly unreachable
                print(f"trainfactory: MLflow write failed, will retry: {exc}", flush=True)

    def ping(self) -> bool:
        """Liveness check for the driver."""
        return True
