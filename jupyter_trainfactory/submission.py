"""What a job's run records when the job is submitted, resumed, closed or asked to stop:
its ``job.json`` description and the run tags of each moment. Pure: these functions return
tags and texts; :class:`~.jobs.JobManager` writes them."""

from __future__ import annotations

import dataclasses
import json
import secrets
import sys
import time
from typing import Any

from . import tracking
from .jobstate import RAY_TO_RUN, RESUMED, SUBMITTED, JobState
from .spec import JobSpec, SpecError
from .spec_values import positive_number
from .tracking import TAG

__all__ = [
    "MAX_DIFF_CHARS",
    "JobKind",
    "chaos_request",
    "check_resume_budget",
    "diff_text",
    "job_meta",
    "new_job_id",
    "opening_tags",
    "reconcile_tags",
    "reopen_tags",
    "start_over_sentence",
    "start_over_tags",
    "stop_tags",
]

MAX_DIFF_CHARS = 5_000_000


@dataclasses.dataclass
class JobKind:
    """What a job other than a plain training job adds at submission (a sweep's:
    :func:`.sweeps.submit.sweep_kind`): its ``driver`` module (``python -m DRIVER``),
    ``job.json`` entries (``meta``), pickled ``files`` (name -> object), run ``tags`` and
    ``params``, and a ``check`` of where the cluster can place it (called with the
    job's :class:`~.cluster.Placement` before anything is written; raises SpecError)."""

    driver: str
    meta: dict[str, Any]
    files: dict[str, Any]
    tags: dict[str, str]
    params: dict[str, str]
    check: Any = lambda placement: None


def new_job_id() -> str:
    """A fresh job id, ``tf-`` and 8 hex digits (:data:`~.jobstate.JOB_ID_PATTERN`)."""
    return f"tf-{secrets.token_hex(4)}"


def _ray_version() -> str:
    import ray

    return ray.__version__


def job_meta(
    job_id: str, spec: JobSpec, tracking_uri: str, storage: str | None, min_nodes: int
) -> dict[str, Any]:
    """The payload's ``job.json`` (before the run id is known): what the driver needs."""
    return {
        "job_id": job_id,
        "spec": spec.to_dict(),
        "config": tracking.json_safe(spec.config),
        "tracking_uri": tracking_uri,
        "storage_path": storage,
        "price_catalog": dataclasses.asdict(spec.catalog()),
        "min_nodes": min_nodes,
        # what the pickled function needs of the job's interpreter (driver checks it)
        "client": {"python": list(sys.version_info[:2]), "ray": _ray_version()},
    }


def _data_tag(data) -> dict[str, Any]:
    """The run tag of one declared input: what ``register`` copies to a model version."""
    return {"digest": data.digest, "digest_of": data.digest_of, "source": data.source}


def opening_tags(
    job_id: str,
    spec: JobSpec,
    dashboard: str,
    local_head: str,
    code_tags: dict[str, str],
    data: list,
) -> dict[str, str]:
    """The tags of a new job's run: ids, owner, source, the code's versions
    (``code_tags``), one ``trainfactory.data.<name>`` per declared input (``data``:
    ``lineage`` DataInputs) and the state PENDING."""
    tags = {
        TAG.JOB_ID: job_id,
        TAG.SUBMISSION: f"{job_id}-0",
        TAG.DASHBOARD: dashboard,
        TAG.LOCAL_HEAD: local_head,
        TAG.OWNER: spec.owner,
        TAG.SOURCE: spec.source,
        TAG.FUNCTION: spec.function_name,
        TAG.STATE: JobState.PENDING.value,
        TAG.REASON: SUBMITTED,
        TAG.WORKERS: str(spec.workers),
        "mlflow.user": spec.owner,
        "mlflow.source.name": spec.source or spec.function_name,
        **code_tags,
        **{f"{TAG.DATA}{d.name}": json.dumps(_data_tag(d)) for d in data},
    }
    if spec.project:
        tags[TAG.PROJECT] = spec.project
    if spec.target_steps:
        tags[TAG.TARGET_STEPS] = str(spec.target_steps)
    return tags


#: The tags a job's run opens with that a start-over's run keeps (its code, data, owner,
#: cluster); by name, then by prefix. The rest describes what the old job did.
_OPENING_KEYS = (
    TAG.DASHBOARD,
    TAG.LOCAL_HEAD,
    TAG.OWNER,
    TAG.SOURCE,
    TAG.FUNCTION,
    TAG.WORKERS,
    TAG.PROJECT,
    TAG.TARGET_STEPS,
    TAG.REDACTED,
    "mlflow.user",
    "mlflow.source.name",
)
_OPENING_PREFIXES = ("mlflow.source.git.", "trainfactory.code.", TAG.DATA, TAG.DATASET)


def start_over_tags(old_tags: dict[str, str], job_id: str, old_job_id: str) -> dict[str, str]:
    """The tags of the run of job ``job_id``, which trains ``old_job_id``'s function again
    from the start (that job saved no checkpoint): the old run's opening tags (code, data,
    owner, cluster), a new job's ids and state, and the link to the old job."""
    kept = {
        k: v for k, v in old_tags.items() if k in _OPENING_KEYS or k.startswith(_OPENING_PREFIXES)
    }
    return {
        **kept,
        TAG.JOB_ID: job_id,
        TAG.SUBMISSION: f"{job_id}-0",
        TAG.STATE: JobState.PENDING.value,
        TAG.REASON: SUBMITTED,
        TAG.STARTED_OVER_FROM: old_job_id,
    }


def start_over_sentence(old_job_id: str, job_id: str) -> str:
    """What a resume of a job without a checkpoint does, said before the user asks it
    (the panel) and when it is done (the kernel, the command line)."""
    return (
        f"Job {old_job_id} saved no checkpoint, so there is nothing to resume from: its"
        f" training starts over from the first step as job {job_id}, with its own MLflow"
        f" run linked to {old_job_id}'s ({TAG.STARTED_OVER_FROM}); {old_job_id}'s record"
        " stays as it is."
    )


def diff_text(git_diff: str) -> str:
    """The uncommitted changes as the run keeps them: URL credentials masked, cut at
    :data:`MAX_DIFF_CHARS` characters."""
    from . import redact

    diff = redact.mask_url(git_diff)
    if len(diff) > MAX_DIFF_CHARS:
        diff = diff[:MAX_DIFF_CHARS] + f"\n[cut at {MAX_DIFF_CHARS} characters]\n"
    return diff


def reopen_tags(
    job_id: str, count: int, changes: dict[str, Any], now: float, stops: int
) -> tuple[str, dict[str, str]]:
    """(submission id, tags) of resume number ``count`` of a job, at ``now`` (s since the
    epoch), with the options it changed (``changes``) and the planned stops it had
    (``stops``, ``fleet.records.planned_stops`` of the closed run: the reopened run no
    longer says it was stopped); the tags fit MLflow's limits."""
    submission_id = f"{job_id}-{count}"
    reopen = {
        TAG.SUBMISSION: submission_id,
        TAG.STATE: JobState.PENDING.value,
        TAG.REASON: f"{RESUMED}{count})",
        TAG.WAITING: "",
        TAG.RESUMES: str(count),
        TAG.STOPS: str(stops),
        TAG.RESUME_SPEC: json.dumps({"submission": submission_id, "time": now, **changes}),
        TAG.STARTED: f"{now:.3f}",  # goodput counts this submission's time
        # cleared (an empty value deletes its tag: tracking.write_tags): what the earlier
        # submission's end said no longer holds; a fault injected into it stays there
        TAG.STOP: "",
        TAG.STOP_TIME: "",
        TAG.STOP_GRACE: "",
        TAG.ERROR: "",
        TAG.STALL: "",
        TAG.CHAOS: "",
    }
    return submission_id, tracking.fit_tags(reopen)


def check_resume_budget(
    job_id: str, reason: str | None, budget: float | None, new: float | None, spent: float
) -> None:
    """Refuse (SpecError) a resume that its cost budget would stop at once: ``new`` (the
    resume's ``--budget``, None: unchanged) not above ``spent`` (the job's ``cost/usd``),
    or a job whose last stop was its ``budget`` (``reason`` ``budget``) resumed without
    a larger one."""
    if new is not None:
        if not positive_number(new):
            raise SpecError(f"budget must be a positive amount, got {new!r}.")
        if new <= spent:
            raise SpecError(
                f"Job {job_id} has spent {spent:.4g}; a --budget of {new:g} would stop it"
                " at once (give more than it has spent)."
            )
    elif reason == "budget" and budget:
        raise SpecError(
            f"Job {job_id} was stopped by its budget ({budget:g}, {spent:.4g} spent);"
            " resume it with a larger --budget."
        )


def reconcile_tags(
    ray_status: str | None, message: str, run_tags: dict[str, str]
) -> tuple[str, dict[str, str]]:
    """(run status, tags) that close a run whose driver is gone: ``ray_status`` is Ray's
    terminal status of the job (None: the job is lost), ``message`` Ray's message."""
    if ray_status is None:
        status, state = "FAILED", JobState.FAILED
        error = f"The job is lost: {message}."
    else:
        status = RAY_TO_RUN[ray_status]
        state = JobState(ray_status)
        error = (message.strip().splitlines() or [""])[-1] if status == "FAILED" else ""
        if status == "FAILED" and not error:
            error = "The job's driver exited without closing its run."
    tags = {TAG.STATE: state.value}
    if error:
        tags[TAG.ERROR] = error[:4000]
    if status == "KILLED":
        tags[TAG.REASON] = run_tags.get(TAG.STOP, "") or "user"
    return status, tags


def stop_tags(now: bool, grace_s: float) -> dict[str, str]:
    """The tags that ask a job to stop: gracefully within ``grace_s`` s, or ``now``.

    Raises SpecError if ``grace_s`` is negative."""
    if grace_s < 0:
        raise SpecError(f"--grace must be at least 0 seconds, got {grace_s:g}.")
    return {
        TAG.STOP: "user-now" if now else "user",
        TAG.STOP_GRACE: f"{grace_s:g}",
        TAG.STOP_TIME: f"{time.time():.3f}",
    }


def chaos_request(rank: int | None, node: str | None) -> dict[str, Any]:
    """The ``trainfactory.chaos`` request: an id, and the node or the rank (-1: the last).

    Raises SpecError for a rank below -1."""
    if rank is not None and rank < -1:
        raise SpecError(f"--kill-worker takes a rank of 0 or more, got {rank}.")
    request: dict[str, Any] = {"id": secrets.token_hex(4)}
    request.update({"node": node} if node else {"rank": -1 if rank is None else rank})
    return request
