"""The ``ray.train.report`` rounds of one job (inside its RunRecorder): their steps and points."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jupyter_trainfactory.telemetry.keys import to_float
from jupyter_trainfactory.tracking import TAG
from ray_backend.decisions import Update
from ray_backend.protocol import RESERVED_KEYS, STOP_SEEN

__all__ = ["ReportRound", "Reports"]


@dataclass
class ReportRound:
    """One report round: its ``step``; ``new``: not written before (else nothing is
    written); ``stop_seen``: the workers marked it the last of a stop; ``update``: its
    points and tags; ``checkpoint_values``: rank 0's values for the checkpoint's
    LoggedModel, None without a checkpoint."""

    step: int
    new: bool
    stop_seen: bool
    update: Update = field(default_factory=Update)
    checkpoint_values: dict[str, float | None] | None = None


class Reports:
    """Counts report rounds and gives each its step (design: "Steps").

    A report's step is its ``step`` value, else the number of reports so far; a round at
    a step already written writes nothing (first write wins). ``samples`` of every rank
    give ``train/samples`` and ``train/samples_per_s`` while the workers count no samples
    themselves. Called under the recorder's lock.
    """

    def __init__(self) -> None:
        self.count = 0  # reports so far (continued over restores and resumes)
        self.last_step = -1  # the last step written by a report
        self.checkpoint_step: int | None = None  # the latest reported checkpoint's step
        self.samples_total = 0.0
        self.running_since: float | None = None  # the first RUNNING
        self._last_time: float | None = None

    def take(
        self,
        metrics_per_rank: list[dict[str, Any]],
        checkpoint_path: str | None,
        now: float,
        count_samples: bool,
    ) -> ReportRound:
        """The round of ``metrics_per_rank`` (rank r's report at index r) completed at
        ``now`` with the checkpoint at ``checkpoint_path`` (None: no checkpoint);
        ``count_samples``: the reports' ``samples`` give the ``train/samples*`` points."""
        rank0 = metrics_per_rank[0] if metrics_per_rank else {}
        self.count += 1
        raw_step = rank0.get("step")
        step = int(raw_step) if isinstance(raw_step, (int, float)) else self.count
        previous = self._last_time or self.running_since
        self._last_time = now
        stop_seen = any(m.get(STOP_SEEN) for m in metrics_per_rank)
        if step <= self.last_step:
            return ReportRound(step, False, stop_seen)
        self.last_step = step
        rnd = ReportRound(step, True, stop_seen)
        points = rnd.update.points
        points += [(k, v, step, now) for k, v in rank0.items() if k not in RESERVED_KEYS]
        samples = [m.get("samples") for m in metrics_per_rank]
        if samples and all(isinstance(s, (int, float)) for s in samples):
            batch = float(sum(samples))
            self.samples_total += batch
            if count_samples:
                points.append(("train/samples", self.samples_total, step, now))
                if previous is not None and now > previous:
                    points.append(("train/samples_per_s", batch / (now - previous), step, now))
        if checkpoint_path:
            self.checkpoint_step = step
            points.append(("checkpoint/step", step, step, now))
            rnd.checkpoint_values = {
                k: to_float(v) for k, v in rank0.items() if k not in RESERVED_KEYS
            }
            rnd.update.tags.update(
                {
                    TAG.CKPT_PATH: checkpoint_path,
                    TAG.CKPT_STEP: str(step),
                    TAG.CKPT_TIME: f"{now:.3f}",
                }
            )
        rnd.update.tags[TAG.STEP] = str(step)
        return rnd
