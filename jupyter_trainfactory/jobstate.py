"""What a job is, as users see it: its states, :class:`JobInfo`, and how both are read from
the job's MLflow run. Pure: no Ray, no client, no I/O (the dashboard, the side panel's
server extension and the model registry code import it)."""

from __future__ import annotations

import enum
import json
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

from . import tracking
from .telemetry.cost import money
from .telemetry.keys import NOT_STEPPED
from .tracking import TAG

__all__ = [
    "JOB_ID_PATTERN",
    "RAY_TO_RUN",
    "DRIVER_STARTING",
    "RESUMED",
    "SETTING_UP",
    "SUBMITTED",
    "TERMINAL_STATES",
    "JobInfo",
    "JobState",
    "cost_text",
    "job_info",
    "job_state",
    "pending_reason",
    "waiting_line",
]

JOB_ID_PATTERN = re.compile(r"^tf-[0-9a-f]{8}$")


class JobState(str, enum.Enum):
    """A job's state (design: "Job states"); a member equals (and prints as) its name."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"

    __str__ = str.__str__
    __format__ = str.__format__


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
#: Ray's terminal job status -> the MLflow run status that matches it.
RAY_TO_RUN = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "STOPPED": "KILLED"}
#: A closed run's status -> the job's state.
_RUN_TO_STATE = {
    "FINISHED": JobState.SUCCEEDED,
    "FAILED": JobState.FAILED,
    "KILLED": JobState.STOPPED,
}


def _state(text: str) -> str:
    """``text`` as a :class:`JobState` when it names one, else as it is."""
    try:
        return JobState(text)
    except ValueError:
        return text


@dataclass
class JobInfo:
    """What ``status``/``list`` show for a job; times in s since the epoch."""

    job_id: str
    name: str
    state: str  # a JobState
    owner: str
    experiment_id: str
    run_id: str
    run_status: str
    submission_id: str
    step: int | None
    started: float | None
    ended: float | None
    reason: str
    error: str
    checkpoint_path: str
    checkpoint_step: int | None
    run_url: str
    restarts: int = 0
    resumes: int = 0
    failure: dict[str, Any] | None = None
    fault_records: list[dict[str, Any]] = field(default_factory=list)
    stall: str = ""
    stall_suggested_s: float | None = None
    cost: str = ""
    waiting: str = ""  # the driver's reason in a few words while PENDING (waiting_line)

    def failure_lines(self) -> list[str]:
        """The root cause of the last failure: rank, node and error, then its traceback's
        last lines (empty when no worker failed)."""
        f = self.failure
        if not f:
            return []
        where = f"rank {f.get('rank', '?')}"
        if f.get("node"):
            where += f" on node {f['node']}"
        if f.get("pid"):
            where += f" (pid {f['pid']})"
        when = time.strftime("%H:%M:%S", time.localtime(f["time"])) if f.get("time") else "?"
        lines = [f"{where} at {when}: {f.get('message') or f.get('type', 'failed')}"]
        if f.get("cause"):
            lines.append(f"cause: {f['cause']}")
        lines += [f"  {line}" for line in (f.get("traceback") or "").splitlines()]
        return lines

    def as_row(self) -> dict[str, str]:
        """Printable fields for tables."""
        elapsed = ((self.ended or time.time()) - self.started) if self.started else None
        return {
            "job": self.job_id,
            "name": self.name,
            "state": str(self.state),
            "owner": self.owner,
            "step": "-" if self.step is None else str(self.step),
            "elapsed": "-" if elapsed is None else f"{elapsed:.0f} s",
            "checkpoint": "-" if self.checkpoint_step is None else f"step {self.checkpoint_step}",
            "detail": self.error or self.reason or "",
        }


#: The reason a PENDING job shows while Ray says its submission is PENDING: Ray is setting
#: up its runtime env (packages, ``py_modules``) and starting its driver process.
SETTING_UP = "setting up the job's environment (Ray runtime env, driver start)"
#: ... and once Ray runs the driver, until the driver's recorder says what it waits for
#: (ray_backend/waiting.py ``workers_reason``: the workers' start or free resources).
DRIVER_STARTING = "starting the job's driver (Ray client, the run's recorder)"
#: The reason tag a submission writes (``submission.py``): a new job's, a resume's prefix.
SUBMITTED = "submitted"
RESUMED = "resumed ("


def pending_reason(ray_status: str | None, reason: str) -> str:
    """What a PENDING job waits for, from Ray's status of its submission (None: not asked)
    and the run's reason tag: :data:`SETTING_UP`, :data:`DRIVER_STARTING` while the tag
    still holds what the submission wrote (``submitted``, ``resumed (n)``), else the tag."""
    if ray_status == "PENDING":
        return SETTING_UP
    if ray_status == "RUNNING" and (reason == SUBMITTED or reason.startswith(RESUMED)):
        return DRIVER_STARTING
    return reason


def waiting_line(reason: str, line: str = "") -> str:
    """A PENDING job's reason (:func:`pending_reason`) in a few words, for a line under the
    state in the side panel (the full reason stays in its tooltip): for the reasons said
    before the driver speaks, their own; then the driver's (``line``, tag
    ``trainfactory.waiting``, from ``ray_backend/waiting.py`` ``workers_wait``: ``0 of 2
    CPU free; held by job tf-0127dacc``); else the reason itself."""
    if reason == SETTING_UP:
        return "setting up the environment"
    if reason in (DRIVER_STARTING, SUBMITTED) or reason.startswith(RESUMED):
        return "starting the driver"
    return line or reason


def job_state(run_status: str, ray_status: str | None, tags: dict[str, str]) -> str:
    """The state shown to users (design: "Job states", a :class:`JobState`) from the run's
    status, Ray's status of the current submission (None: not asked) and the run's tags."""
    if run_status in _RUN_TO_STATE:
        return _RUN_TO_STATE[run_status]
    if ray_status == "PENDING":
        return JobState.PENDING
    if ray_status in RAY_TO_RUN:
        return JobState(ray_status)
    state = _state(tags.get(TAG.STATE, "PENDING"))
    # The recorder writes the final state tag just before it closes the run: until the
    # run is closed (or Ray says the driver ended) the job is still finishing.
    return JobState.RUNNING if state in TERMINAL_STATES else state


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def latest_step(run) -> int | None:
    """The run's step: the furthest training step of any key (``trainfactory.log``,
    ``ray.train.report``, ``train/*``), or the recorder's step tag when that is further;
    None before the first. Points of keys in ``telemetry.keys.NOT_STEPPED`` are ticks."""
    steps = [int(m.step) for m in run.data.to_proto().metrics if not m.key.startswith(NOT_STEPPED)]
    tagged = _int(run.data.tags.get(TAG.STEP))
    return max([*steps, *([tagged] if tagged is not None else [])], default=None)


def job_info(run, state: str, tracking_uri: str) -> JobInfo:
    """A :class:`JobInfo` from the job's MLflow run (an ``mlflow.entities.Run``) and its
    state; ``tracking_uri`` makes the run's UI link."""
    tags = run.data.tags
    try:
        failure = json.loads(tags.get(TAG.FAILURE) or "null")
        records = json.loads(tags.get(TAG.FAILURES) or "[]")
    except ValueError:
        failure, records = None, []
    try:
        suggested = float(tags.get(TAG.STALL_SUGGESTED) or "nan")
    except ValueError:
        suggested = math.nan
    ended = run.info.end_time / 1000 if run.info.end_time else None
    return JobInfo(
        job_id=tags.get(TAG.JOB_ID, ""),
        name=run.info.run_name or "",
        state=state,
        owner=tags.get(TAG.OWNER, ""),
        experiment_id=run.info.experiment_id,
        run_id=run.info.run_id,
        run_status=run.info.status,
        submission_id=tags.get(TAG.SUBMISSION, ""),
        # a sweep's run counts Tune's results, not a training step: its trials have steps
        step=None if TAG.SWEEP in tags else latest_step(run),
        started=run.info.start_time / 1000 if run.info.start_time else None,
        ended=None if run.info.status == "RUNNING" else ended,  # a resume reopens the run
        reason=tags.get(TAG.REASON, ""),
        error=tags.get(TAG.ERROR, ""),
        checkpoint_path=tags.get(TAG.CKPT_PATH, ""),
        checkpoint_step=_int(tags.get(TAG.CKPT_STEP)),
        run_url=tracking.run_url(tracking_uri, run),
        restarts=_int(tags.get(TAG.FAULTS_RESTARTS)) or 0,
        resumes=_int(tags.get(TAG.RESUMES)) or 0,
        failure=failure if isinstance(failure, dict) else None,
        fault_records=records if isinstance(records, list) else [],
        stall=tags.get(TAG.STALL, ""),
        stall_suggested_s=None if math.isnan(suggested) else suggested,
        cost=cost_text(run.data.metrics, tags),
        waiting=tags.get(TAG.WAITING, ""),
    )


def cost_text(metrics: dict[str, float], tags: dict[str, str]) -> str:
    """``"12.50 USD (1.25 wasted; budget 15; example prices)"`` from the run's metrics and
    tags, "" when the run has no cost."""
    if "cost/usd" not in metrics:
        return ""
    currency = tags.get(TAG.COST_CURRENCY, "USD")
    notes = []
    if metrics.get("cost/wasted_usd"):
        notes.append(f"{money(metrics['cost/wasted_usd'])} wasted")
    if tags.get(TAG.COST_BUDGET):
        notes.append(f"budget {tags['trainfactory.cost.budget']}")
    if "cost/projected_usd" in metrics and tags.get(TAG.TARGET_STEPS):
        notes.append(
            f"{money(metrics['cost/projected_usd'])} projected by step {tags[TAG.TARGET_STEPS]}"
        )
    if "example" in tags.get(TAG.COST_CATALOG, ""):
        notes.append("example prices")
    text = f"{money(metrics['cost/usd'])} {currency}"
    return text + (f" ({'; '.join(notes)})" if notes else "")
