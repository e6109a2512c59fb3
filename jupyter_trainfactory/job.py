"""Job: the handle on one job that ``launch`` and ``attach`` return (its id, run id and
controls; the calls go to its :class:`~.jobs.JobManager`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .jobstate import JobInfo

if TYPE_CHECKING:
    from .jobs import JobManager

__all__ = ["Job"]


class Job:
    """Handle on one job: ``job.id``, ``job.run_id``, ``job.tracking_uri`` and controls."""

    def __init__(self, job_id: str, run_id: str, manager: JobManager):
        self.id = job_id
        self.run_id = run_id
        self.manager = manager
        self.tracking_uri = manager.tracking_uri
        self._dashboard = None
        self._sweep: bool | None = None

    def __repr__(self) -> str:
        return f"Job(id={self.id!r}, run_id={self.run_id!r})"

    def info(self) -> JobInfo:
        return self.manager.info(self.id)

    def status(self) -> str:
        """Current state: PENDING, RUNNING, RESTARTING, SUCCEEDED, FAILED or STOPPED."""
        return self.manager.info(self.id).state

    def wait(self, timeout: float | None = None) -> str:
        """Block until the job ends; return its final state (``TimeoutError`` after ``timeout`` s).

        The job's dashboard, if one is shown, is brought up to date before returning, so a
        notebook saved right after shows the final state and its static summary.
        """
        state = self.manager.wait(self.id, timeout)
        board = self._dashboard
        if board is not None and board.comm is not None:
            # it goes on following the job (a resume shows), at its slower pace
            with contextlib.suppress(Exception):  # tracking server away: the poller said so
                board.poll_once()
        return state

    def stop(self, now: bool = False, grace_s: float = 300.0) -> str:
        """Stop the job after its next checkpoint (``now``: at once); returns its state.

        A graceful stop returns at once (the state is still RUNNING); ``job.wait()``
        then returns STOPPED. See :meth:`JobManager.stop`.
        """
        return self.manager.stop(self.id, now=now, grace_s=grace_s).state

    def logs(self, tail: int | None = None, rank: int | None = None) -> str:
        """The driver's log, or ``rank``'s worker log (see :meth:`JobManager.logs`)."""
        return self.manager.logs(self.id, tail, rank)

    def resume(self, max_failures: int | None = None, budget: float | None = None) -> str:
        """Continue this STOPPED or FAILED job from its latest good checkpoint (same job
        id and MLflow run); returns its state. See :meth:`JobManager.resume`.

        A job that saved no checkpoint starts over as a new job (its own run, linked to
        this one; a line says so): this handle then follows the new job (``id``,
        ``run_id``), and a dashboard shown keeps the old job's record."""
        job = self.manager.resume(self.id, max_failures=max_failures, budget=budget)
        if job.id != self.id:
            self.id, self.run_id = job.id, job.run_id
            return self.status()
        board = self._dashboard
        if board is not None and board.comm is not None:
            board.start()
        return self.status()

    def register(
        self,
        name: str,
        checkpoint: str = "latest",
        metric: str | None = None,
        mode: str | None = None,
        alias: str | None = None,
        model_fn: Callable[[str], Any] | None = None,
    ) -> dict[str, Any]:
        """Register a checkpoint of this job in the MLflow Model Registry
        (:func:`~.models.register`); returns the version's name, number, alias and URI."""
        from .models import register

        return register(self.manager, self.id, name, checkpoint, metric, mode, alias, model_fn)

    def chaos(
        self, rank: int | None = None, node: str | None = None, trial: int | None = None
    ) -> list[dict[str, Any]]:
        """Kill this job's worker of ``rank`` (or every one on ``node``; of a sweep, in
        ``trial``'s workers): fault injection. See :meth:`JobManager.chaos`."""
        return self.manager.chaos(self.id, rank=rank, node=node, trial=trial)

    def is_sweep(self) -> bool:
        """Whether this job is a sweep (its run is a sweep's parent run)."""
        from .tracking import TAG

        if self._sweep is None:
            tags = self.manager.mlflow_client.get_run(self.run_id).data.tags
            self._sweep = TAG.SWEEP in tags
        return self._sweep

    def dashboard(self, start: bool = True):
        """The live dashboard widget of this job: the one already shown (still live), or a
        new one when there is none or it was closed; a sweep's is its leaderboard
        (:class:`~.sweeps.widget.SweepBoard`)."""
        from .dashboard import JobDashboard

        board = self._dashboard
        if self.is_sweep() and (board is None or board.comm is None):
            from .sweeps.widget import SweepBoard

            self._dashboard = SweepBoard(
                self.manager.mlflow_client, self.run_id, start=start, job_id=self.id
            )
        elif board is None or board.comm is None:  # none yet, or closed
            self._dashboard = JobDashboard(self, start=start)
        elif start:
            board.start()
        return self._dashboard
