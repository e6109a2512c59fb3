"""Requests to a job through its run, and waiting for its end: the graceful stop, the
stop at once, fault injection (chaos). :class:`~.jobs.JobManager`'s ``stop``, ``chaos``
and ``wait`` are these functions; the job's recorder carries the requests out
(``ray_backend.control``, ``ray_backend.kills``)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from . import runreads, submission, tracking
from .jobstate import RAY_TO_RUN, TERMINAL_STATES, JobInfo, JobState
from .spec import SpecError
from .tracking import TAG

if TYPE_CHECKING:
    from .jobs import JobManager

__all__ = ["chaos", "stop", "wait"]


def stop(
    manager: JobManager,
    job_id: str,
    now: bool = False,
    grace_s: float = 300.0,
    timeout: float = 60.0,
) -> JobInfo:
    """Stop a job: gracefully (default) or at once (``now``).

    Graceful: the request goes to the job through its run (tag
    ``trainfactory.stop_requested`` = ``user``, with ``trainfactory.stop_grace_s``);
    the job's recorder reads it within seconds, ``trainfactory.should_stop()`` turns
    True on every worker, and the driver ends training after the next report that
    carries a checkpoint, or after ``grace_s`` seconds without one. Returns at once.
    ``now``: the Ray job is stopped at once (reason ``user-now``); waits up to
    ``timeout`` s for it to end. Either way the job ends STOPPED, its run KILLED.

    Raises SpecError if ``grace_s`` is negative.
    """
    request = submission.stop_tags(now, grace_s)
    run = manager.find_run(job_id)
    if run.info.status != "RUNNING":
        return manager.run_info(run)
    manager.mlflow_client.log_batch(run.info.run_id, tags=tracking.run_tags(request))
    if not now:
        return manager.info(job_id)
    try:
        client = manager.ray.jobs_client(run.data.tags.get(TAG.DASHBOARD))
        client.stop_job(run.data.tags[TAG.SUBMISSION])
    except SpecError:
        raise
    except Exception:  # already gone: reconciliation below closes the run
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ray_status, _ = manager.ray.status(run.data.tags)
        if ray_status in (None, "UNKNOWN") or ray_status in RAY_TO_RUN:
            break
        time.sleep(0.5)
    return manager.info(job_id)


def chaos(
    manager: JobManager,
    job_id: str,
    rank: int | None = None,
    node: str | None = None,
    timeout: float = 60.0,
    trial: int | None = None,
) -> list[dict[str, Any]]:
    """Kill a running job's worker process (fault injection, as acceptance tests of a
    platform do): the one of ``rank`` (None: the last rank), or with ``node`` (an IP
    or a node id) every worker process of the job on that node.

    The request reaches the job through its run (tag ``trainfactory.chaos``); the
    job's recorder kills the processes with SIGKILL from a Ray task on their node and
    answers in ``trainfactory.chaos.done``. Ray Train then sees a worker failure and
    restarts from the latest checkpoint if ``max_failures`` allows. Returns the
    processes killed: ``[{"rank", "pid", "node"}]``.

    A sweep's ``trial`` (its index): the request goes to that trial's child run, and
    its recorder kills the trial's worker the same way.

    Raises SpecError when the job (or trial) is not running, the rank or node has no
    worker of the job, ``trial`` is given for a job that is not a sweep or names no
    trial of it, or the job does not answer within ``timeout`` s.
    """
    run = manager.find_run(job_id)
    if trial is None:
        state = manager.run_info(run).state
    else:
        run = runreads.trial_run(
            manager.mlflow_client, manager.mlflow_client.get_run(run.info.run_id), trial
        )
        state = run.data.tags.get(TAG.STATE, "")
        job_id = f"{job_id} trial {trial}"
    if state not in (JobState.RUNNING, JobState.RESTARTING):
        raise SpecError(f"Job {job_id} is {state}; chaos needs a RUNNING job.")
    request = submission.chaos_request(rank, node)
    manager.mlflow_client.log_batch(
        run.info.run_id, tags=tracking.run_tags({TAG.CHAOS: json.dumps(request)})
    )
    answer = _chaos_answer(manager.mlflow_client, run.info.run_id, request["id"], timeout)
    if answer is None:
        raise SpecError(f"Job {job_id} did not carry out the chaos request within {timeout:g} s.")
    if answer.get("error"):
        raise SpecError(f"chaos: {answer['error']}.")
    return answer.get("killed", [])


def wait(
    manager: JobManager, job_id: str, timeout: float | None = None, poll_s: float = 1.0
) -> str:
    """Block until the job is SUCCEEDED, FAILED or STOPPED; return that state.

    Raises ``TimeoutError`` after ``timeout`` seconds, saying what the job waits for
    (its reason: Ray's environment set-up, free resources, a restart).
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        info = manager.info(job_id)
        if info.state in TERMINAL_STATES:
            return info.state
        if deadline is not None and time.monotonic() > deadline:
            waits = f" ({info.reason})" if info.reason else ""
            raise TimeoutError(f"Job {job_id} is still {info.state}{waits} after {timeout:g} s.")
        time.sleep(poll_s)


def _chaos_answer(mlflow_client, run_id: str, request_id: str, timeout: float) -> dict | None:
    """The job's answer (``trainfactory.chaos.done``) to chaos request ``request_id``,
    read every 0.5 s; None when none came within ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        time.sleep(0.5)
        done = mlflow_client.get_run(run_id).data.tags.get(TAG.CHAOS_DONE, "")
        answer = json.loads(done) if done else {}
        if answer.get("id") == request_id:
            return answer
    return None
