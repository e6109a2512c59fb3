"""Resume state: what earlier submissions of a job wrote to its run, for its RunRecorder to go on from."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jupyter_trainfactory.fleet.records import read_counts, read_records
from jupyter_trainfactory.telemetry.keys import NOT_STEPPED as _NOT_STEPPED
from jupyter_trainfactory.tracking import TAG

__all__ = ["Previous", "read_previous", "with_previous"]

_TICKED = ("system/", "goodput/", "energy/", "cost/")


@dataclass
class Previous:
    """What the run holds from earlier submissions (a resume).

    ``last_steps``: every stepped key's last step (so a step is still written once);
    ``before``: goodput, badput, ``energy/gpu_kwh`` and ``faults/mttr_s`` totals (added to
    this submission's; the time between submissions, when the job held no resources, is
    not counted); ``cost``: the ``cost/*`` metrics; ``ticks``: the derive clock's last
    step; ``faults``, ``restarts``: failures and restarts so far; ``samples``: the last
    ``train/samples``; ``report_step``: the last report's step; ``checkpoint_step``: the
    last reported checkpoint's; ``train_offset``, ``train_before``: the last ``train/*``
    step and the ``train/samples`` and ``train/tokens`` totals; ``saves``: checkpoint saves;
    ``failure_records``, ``failure_counts``: the failure log (``fleet.records``).
    """

    last_steps: dict[str, int] = field(default_factory=dict)
    before: dict[str, float] = field(default_factory=dict)
    cost: dict[str, float] = field(default_factory=dict)
    ticks: int = 0
    faults: int = 0
    restarts: int = 0
    samples: float | None = None
    report_step: int = 0
    checkpoint_step: int | None = None
    train_offset: int = 0
    train_before: dict[str, float] = field(default_factory=dict)
    saves: int = 0
    failure_records: list[dict[str, Any]] = field(default_factory=list)
    failure_counts: dict[str, Any] = field(default_factory=dict)

    @property
    def reports(self) -> int:
        """Reports count on from the checkpoint the resume restores (else the last report)."""
        return self.checkpoint_step if self.checkpoint_step is not None else self.report_step


def read_previous(run: Any) -> Previous:
    """:class:`Previous` of an MLflow ``Run`` (its latest metrics and its tags)."""
    tags = run.data.tags
    latest = {m.key: m for m in run.data.to_proto().metrics}
    before = {
        k: m.value
        for k, m in latest.items()
        if k.startswith(("goodput/", "badput/")) or k == "energy/gpu_kwh"
    }
    before.update({k: latest[k].value for k in ("faults/mttr_s",) if k in latest})
    step = tags.get(TAG.STEP)
    ckpt = tags.get(TAG.CKPT_STEP)
    return Previous(
        last_steps={k: int(m.step) for k, m in latest.items() if not k.startswith(_NOT_STEPPED)},
        before=before,
        cost={k: m.value for k, m in latest.items() if k.startswith("cost/")},
        ticks=max([int(m.step) for k, m in latest.items() if k.startswith(_TICKED)] + [0]),
        faults=int(latest["faults/count"].value) if "faults/count" in latest else 0,
        restarts=int(latest["faults/restarts"].value) if "faults/restarts" in latest else 0,
        samples=latest["train/samples"].value if "train/samples" in latest else None,
        report_step=int(step) if step and step.isdigit() else 0,
        checkpoint_step=int(ckpt) if ckpt and ckpt.isdigit() else None,
        train_offset=max([int(m.step) for k, m in latest.items() if k.startswith("train/")] + [0]),
        train_before={k: latest[k].value for k in ("train/samples", "train/tokens") if k in latest},
        saves=int(latest["checkpoint/save_s"].step) if "checkpoint/save_s" in latest else 0,
        failure_records=read_records(tags),
        failure_counts=read_counts(tags),
    )


def with_previous(values: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    """This submission's goodput metrics ``values`` plus those of earlier submissions."""
    if not before:
        return values
    out = dict(values)
    for key, value in before.items():
        if key.startswith("badput/") or key in ("goodput/goodput_s", "goodput/wall_s"):
            out[key] = out.get(key, 0.0) + value
    if out.get("goodput/wall_s"):
        out["goodput/ettr"] = out["goodput/goodput_s"] / out["goodput/wall_s"]
    if "faults/mttr_s" in before and "faults/mttr_s" not in values:
        out["faults/mttr_s"] = before["faults/mttr_s"]
    return out
