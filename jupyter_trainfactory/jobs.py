"""JobManager: submit, list, inspect and stop training jobs over the Ray Jobs API.

The MLflow run is the record of a job: the job list comes from MLflow (so it outlives a
local Ray head), the live state from the Ray Jobs API. The parts: job states
(:mod:`.jobstate`), the payload (:mod:`.payload`), Ray clients (:mod:`.rayjobs`), what a
run records (:mod:`.submission`), logs (:mod:`.joblogs`), requests to a running job
(stop, chaos) and the wait for its end (:mod:`.jobcontrol`), the handle (:mod:`.job`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import jobcontrol, runreads, submission, tracking
from .cluster import ClusterInfo, Placement, check_job, resolve_address
from .datasets import check_datasets, describe, lineage_tags, pack
from .errors import JobNotFound, TrackingUnreachable
from .fleet.records import planned_stops
from .job import Job
from .joblogs import JobLogs
from .jobstate import (
    JOB_ID_PATTERN,
    RAY_TO_RUN,
    TERMINAL_STATES,
    JobInfo,
    JobState,
    job_info,
    job_state,
    pending_reason,
)
from .payload import (
    DRIVER_MODULE,
    fetch_payload,
    load_model_fn,
    log_payload,
    runtime_env,
    write_payload,
)
from .rayjobs import RayClients
from .services import Services, ensure_services
from .spec import JobSpec, SpecError, current_owner
from .tracking import TAG

__all__ = [
    "JOB_ID_PATTERN",
    "TERMINAL_STATES",
    "Job",
    "JobInfo",
    "JobManager",
    "JobNotFound",
    "job_info",
    "job_state",
]

#: Environment variable with the default storage path (``--storage``) of every door.
STORAGE_ENV = "TRAINFACTORY_STORAGE"


class JobManager:
    """Submits and tracks jobs on one Ray cluster with one MLflow tracking server.

    Parameters
    ----------
    address : str, optional
        Ray dashboard (Jobs API) URL, ``http://host:8265``. None: ``RAY_ADDRESS`` when it
        is such a URL, else the embedded local head. The cluster's token comes from
        :func:`~.raytoken.find_token` (the embedded head's token file, the cluster's token
        file, ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH``).
    tracking_uri : str, optional
        MLflow tracking URI. None: ``MLFLOW_TRACKING_URI`` if set, else the embedded local
        MLflow server.
    storage : str, optional
        Ray Train storage path for checkpoints. None: ``TRAINFACTORY_STORAGE`` if set, else
        the embedded default (a remote cluster needs one).

    Attributes
    ----------
    mlflow_client : mlflow.MlflowClient
        The client of the tracking server, for reading runs the manager records.
    """

    def __init__(
        self,
        address: str | None = None,
        tracking_uri: str | None = None,
        storage: str | None = None,
    ):
        address = resolve_address(address)
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or None
        storage = storage or os.environ.get(STORAGE_ENV) or None
        self.local = address is None
        self._embedded = {"ray": address is None, "mlflow": tracking_uri is None}
        self._services: Services | None = None
        if address is None or tracking_uri is None:
            self._services = ensure_services(ray=address is None, mlflow=tracking_uri is None)
        self.address = address or self._services.dashboard_url
        self.tracking_uri = tracking_uri or self._services.tracking_uri
        self.storage = storage or (self._services.storage_path if self._services else None)
        self.ray = RayClients(self.address, self._services if self.local else None)
        self.mlflow_client = tracking.client(self.tracking_uri)
        self._runs = runreads.JobRuns(self.mlflow_client)
        self._logs = JobLogs(self.ray)

    def services_alive(self) -> bool:
        """False when an embedded service this manager uses has stopped since."""
        if self._services is None:
            return True
        procs = self._services.processes
        return all(n in procs and procs[n].alive() for n, used in self._embedded.items() if used)

    @property
    def jobs_client(self):
        """The Ray ``JobSubmissionClient`` of this manager's cluster (with its token);
        raises ClusterUnreachable when the cluster does not answer."""
        return self.ray.jobs_client(self.address)

    def cluster(self, settle_s: float = 45.0) -> ClusterInfo:
        """This manager's cluster (see :meth:`~.rayjobs.RayClients.cluster`)."""
        return self.ray.cluster(settle_s)

    def check(self, spec: JobSpec) -> Placement:
        """Every check of ``spec`` against this cluster before submission (see
        :func:`~.cluster.check_job`), and with ``spec.preflight`` the health of the nodes
        it may use (:mod:`.nodehealth.preflight`); returns where it may run. Raises
        SpecError."""
        self.jobs_client  # noqa: B018 (reachability first: its error is the clearest)
        storage = spec.storage or self.storage
        if storage is None and not self.local:
            raise SpecError(
                "A remote cluster needs --storage, a path all its nodes share"
                " (s3://BUCKET/PATH, or NFS mounted at the same place on every node)."
            )
        placement = check_job(
            self.cluster(), spec, self.tracking_uri, storage, remote=not self.local
        )
        eligible = [n.node_id for n in placement.eligible]
        if spec.avoid_unhealthy:  # the nodes' health, once the job is known to fit
            from .nodehealth.preflight import avoid_unhealthy

            def recheck(changed: JobSpec) -> Placement:
                return check_job(
                    self.cluster(), changed, self.tracking_uri, storage, remote=not self.local
                )

            placement = avoid_unhealthy(self, spec, eligible, recheck) or placement
        elif spec.preflight:
            from .nodehealth.preflight import preflight

            preflight(self, eligible)
        return placement

    # -- submit ------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[dict], Any],
        spec: JobSpec,
        inputs: dict[str, Any] | None = None,
        model_fn: Callable[[str], Any] | None = None,
        datasets: dict[str, Any] | None = None,
        kind: submission.JobKind | None = None,
    ) -> Job:
        """Validate, create the MLflow run, and submit ``fn`` as a detached Ray job.

        ``kind`` (a sweep's, :mod:`.sweeps`) names another driver module for the job and
        adds its files, tags, params and ``job.json`` entries.

        ``datasets`` (name -> Ray Dataset, or a function of no arguments returning one)
        are built in the job's driver and given to ``TorchTrainer(datasets=...)``; the
        run records each (tags ``trainfactory.dataset.<name>`` and its inputs: source
        files, digest, schema and rows where known without executing,
        :func:`.datasets.describe`).

        ``inputs`` (name -> array, local path or URI) are recorded as the run's datasets
        with a digest (``lineage.digest_input``); ``model_fn(checkpoint_dir)`` rebuilds the
        trained model from one of the job's checkpoints for ``register``. The run gets the
        code's versions (notebook and function hashes, git commit, branch, dirty flag and
        diff); values under credential names and passwords in URLs are masked in
        everything sent to MLflow (``redact``).

        Raises
        ------
        SpecError
            Bad input, unreachable cluster (ClusterUnreachable) or tracking server
            (TrackingUnreachable), or resources the cluster can never provide; nothing is
            submitted and no run is created.
        """
        from . import lineage, redact
        from .payload import function_source

        data, datasets, described, placement = self._checked(
            fn, spec, inputs, model_fn, datasets, kind
        )
        job_id = submission.new_job_id()
        source = function_source(fn)
        code = lineage.code_version(spec.source, source or repr(fn))
        storage = spec.storage or self.storage
        meta = submission.job_meta(job_id, spec, self.tracking_uri, storage, placement.min_nodes)
        tags = submission.opening_tags(
            job_id, spec, self.address, self.ray.local_head(), code.tags(), data
        )
        tags.update(lineage_tags(described))
        if kind is not None:
            meta.update(kind.meta, driver=kind.driver)
            tags.update(kind.tags)
        shown_meta, redacted = redact.redact_mapping(json.loads(json.dumps(meta, default=repr)))
        if redacted:
            tags[TAG.REDACTED] = json.dumps(redacted)[:5000]
        extra = kind.files if kind is not None else None
        payload = write_payload(job_id, fn, model_fn, spec.config, datasets, extra)
        params = redact.redact_params({**spec.params(), **(kind.params if kind else {})})
        run_id = self._open_run(job_id, spec, redact.redact_params(tags), params, payload)
        meta["run_id"] = shown_meta["run_id"] = run_id
        shown_meta["redacted"] = redacted
        (payload / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        self._record_code(run_id, source, code.git_diff, data + described)
        log_payload(self.mlflow_client, run_id, payload, shown_meta)
        return self._first_submission(job_id, run_id, spec, payload)

    def _open_run(
        self, job_id: str, spec: JobSpec, tags: dict[str, str], params: dict, payload: Path
    ) -> str:
        """Create job ``job_id``'s run; returns its id. Raises TrackingUnreachable (the
        payload at ``payload`` removed: nothing is left behind)."""
        try:
            run = tracking.create_job_run(
                self.mlflow_client, spec.experiment, spec.run_name, tags, params
            )
        except Exception as exc:
            shutil.rmtree(payload.parent, ignore_errors=True)
            raise TrackingUnreachable(
                f"Cannot create the MLflow run at {self.tracking_uri}: {exc}"
            ) from exc
        self._runs.remember(job_id, run.info.run_id)
        return run.info.run_id

    def _first_submission(self, job_id: str, run_id: str, spec: JobSpec, payload: Path) -> Job:
        """Submit a new job's first Ray submission; a refusal closes its run FAILED and
        raises SpecError."""
        try:
            self._submit(job_id, f"{job_id}-0", run_id, spec, payload)
        except Exception as exc:
            self.mlflow_client.set_tag(run_id, TAG.STATE, JobState.FAILED.value)
            self.mlflow_client.set_tag(run_id, TAG.ERROR, f"submission failed: {exc}"[:4000])
            self.mlflow_client.set_terminated(run_id, "FAILED")
            raise SpecError(f"Ray refused the job: {str(exc).splitlines()[0]}") from exc
        return Job(job_id, run_id, self)

    def _checked(self, fn, spec: JobSpec, inputs, model_fn, datasets, kind):
        """``submit``'s checks, before anything is written: returns the declared inputs'
        digests, the datasets packed for the payload and their descriptions, and where
        the job may run (:meth:`check`). Raises SpecError."""
        if not callable(fn):
            raise SpecError(f"{spec.function_name!r} is not callable.")
        if model_fn is not None and not callable(model_fn):
            raise SpecError(f"model_fn must be a function, got {type(model_fn).__name__}.")
        spec.validate()
        data = _digest_inputs(inputs or {})
        datasets = check_datasets(datasets, spec.dataset_config)
        described = [describe(name, value) for name, value in datasets.items()]
        packed = pack(datasets)
        placement = self.check(spec)
        if kind is not None:
            kind.check(placement)
        return data, packed, described, placement

    def _record_code(self, run_id: str, source: str, git_diff: str, data: list) -> None:
        """The function's source, the uncommitted changes and the declared inputs."""
        if source:
            self.mlflow_client.log_text(run_id, source, "code/train_function.py")
        if git_diff:  # the uncommitted changes, URL credentials masked, at most 5 MB
            diff = submission.diff_text(git_diff)
            self.mlflow_client.log_text(run_id, diff, "code/git_diff.patch")
        if data:
            tracking.log_data_inputs(self.mlflow_client, run_id, data)

    def _submit(
        self, job_id: str, submission_id: str, run_id: str, spec: JobSpec, payload: Path
    ) -> None:
        python = sys.executable if self.local else "python"
        driver = json.loads((payload / "job.json").read_text()).get("driver", DRIVER_MODULE)
        ray_address = self._services.ray_address if self.local and self._services else None
        self.jobs_client.submit_job(
            entrypoint=f"{python} -m {driver} {payload.name}",
            submission_id=submission_id,
            runtime_env=runtime_env(spec, payload, ray_address),
            metadata={
                TAG.JOB_ID: job_id,
                TAG.RUN_ID: run_id,
                TAG.OWNER: spec.owner,
            },
        )

    def resume(
        self,
        job_id: str,
        max_failures: int | None = None,
        budget: float | None = None,
        notice: Callable[[str], None] = print,
    ) -> Job:
        """Continue a STOPPED or FAILED job from its latest good checkpoint (a sweep:
        Tune's restore of its search, ``ray_backend.sweep_driver``).

        A job that saved no checkpoint has nothing to resume from: its training starts
        over as a new job, with its own run linked to this one (:meth:`_start_over`;
        ``notice`` says so, and the :class:`~.job.Job` returned is the new one). Resumed in
        the same run, the new training's steps would fall on the old one's and be
        dropped, or be spliced onto it (issue 48).

        A new Ray submission (``<job id>-<n>``) of the same function and config, under
        the same job id, MLflow run (reopened: status RUNNING; params are not logged
        again), storage path (Ray Train restores its checkpoint list from there, and
        ``trainfactory.get_checkpoint()`` returns the newest that verifies) and run name.
        ``max_failures`` sets a new failure budget for this submission; ``budget`` a new
        cost budget (the catalog's currency) for the whole job or sweep, what it has
        spent so far included (``cost/usd``). The resume is recorded in the tags
        ``trainfactory.resumes`` and ``trainfactory.resume.spec``.

        Raises
        ------
        SpecError
            The job is not STOPPED or FAILED, ran on another cluster, its payload is
            gone, it was stopped by its budget and ``budget`` does not raise it (it would
            stop again at once), or Ray refused the submission (the run is then closed
            as it was).
        """
        run = self.find_run(job_id)
        info = self.run_info(run)
        if info.state not in (JobState.STOPPED, JobState.FAILED):
            hint = "launch a new job" if info.state == JobState.SUCCEEDED else "stop it first"
            raise SpecError(
                f"Job {job_id} is {info.state}; only a STOPPED or FAILED job can be resumed"
                f" ({hint})."
            )
        run = self.mlflow_client.get_run(run.info.run_id)
        run_id, tags = run.info.run_id, run.data.tags
        if tags.get(TAG.DASHBOARD, self.address) != self.address:
            raise SpecError(
                f"Job {job_id} ran on the cluster at {tags[TAG.DASHBOARD]}; resume it with"
                f" --address {tags[TAG.DASHBOARD]}."
            )
        payload = fetch_payload(self.mlflow_client, job_id, run_id)
        meta = json.loads((payload / "job.json").read_text())
        changes: dict[str, Any] = {}
        if max_failures is not None:
            changes["max_failures"] = max_failures
        if budget is not None:
            changes["budget"] = budget
        spent = run.data.metrics.get("cost/usd", 0.0)
        submission.check_resume_budget(
            job_id, tags.get(TAG.REASON), meta["spec"].get("budget"), budget, spent
        )
        spec = JobSpec.from_dict({**meta["spec"], **changes})
        spec.validate()  # and the local checks again (working_dir, ...)
        meta["min_nodes"] = self.check(spec).min_nodes
        if not tags.get(TAG.CKPT_STEP) and not tags.get(TAG.SWEEP):
            return self._start_over(run, payload, meta, spec, notice)
        count = int(tags.get(TAG.RESUMES) or 0) + 1
        meta.update(spec=spec.to_dict(), resume=count)
        (payload / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        previous = {k: tags.get(k, "") for k in (TAG.SUBMISSION, TAG.STATE, TAG.REASON, TAG.STOPS)}
        stops = planned_stops(run.info.status, tags)  # KILLED: a stop the reopen would hide
        submission_id, reopen = submission.reopen_tags(job_id, count, changes, time.time(), stops)
        tracking.write_tags(self.mlflow_client, run_id, reopen)
        self.mlflow_client.update_run(run_id, status="RUNNING")
        try:
            self._submit(job_id, submission_id, run_id, spec, payload)
        except Exception as exc:
            self.mlflow_client.log_batch(run_id, tags=tracking.run_tags(previous))
            with contextlib.redirect_stdout(io.StringIO()):
                self.mlflow_client.set_terminated(run_id, status=run.info.status)
            raise SpecError(f"Ray refused the resume: {str(exc).splitlines()[0]}") from exc
        return Job(job_id, run_id, self)

    def _start_over(self, run, payload: Path, meta: dict[str, Any], spec: JobSpec, notice) -> Job:
        """Job ``meta["job_id"]`` (its ``run``) saved no checkpoint: submit its function and
        config again as a new job, whose run keeps the old one's code and data tags and
        params and is linked to it both ways (``trainfactory.started_over_from`` and
        ``_as``); returns the new Job. Raises SpecError, TrackingUnreachable."""
        from . import redact
        from .payload import payload_path

        old_id, new_id = meta["job_id"], submission.new_job_id()
        target = payload_path(new_id)
        shutil.copytree(payload, target, ignore=shutil.ignore_patterns("job.json", "__pycache__"))
        tags = submission.start_over_tags(run.data.tags, new_id, old_id)
        run_id = self._open_run(new_id, spec, tags, dict(run.data.params), target)
        meta = {**meta, "job_id": new_id, "run_id": run_id, "spec": spec.to_dict()}
        meta.pop("resume", None)
        (target / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        self._copy_code(run.info.run_id, run_id)
        shown, redacted = redact.redact_mapping(json.loads(json.dumps(meta, default=repr)))
        log_payload(self.mlflow_client, run_id, target, {**shown, "redacted": redacted})
        self.mlflow_client.set_tag(run.info.run_id, TAG.STARTED_OVER_AS, new_id)
        job = self._first_submission(new_id, run_id, spec, target)
        notice(submission.start_over_sentence(old_id, new_id))
        return job

    def _copy_code(self, old_run_id: str, run_id: str) -> None:
        """The old run's ``code/`` artifacts (function source, uncommitted changes) in the
        new run, when it has them."""
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            try:
                local = self.mlflow_client.download_artifacts(old_run_id, "code", tmp)
            except Exception:  # none were recorded (no source, no diff)
                return
            self.mlflow_client.log_artifacts(run_id, local, "code")

    def experiment_ids(self, name: str | None) -> list[str] | None:
        """``[id]`` of experiment ``name``; None for no name (every experiment).

        Raises SpecError when the tracking server has no such experiment."""
        if not name:
            return None
        exp = self.mlflow_client.get_experiment_by_name(tracking.experiment_name(name))
        if exp is None:
            raise SpecError(f"No experiment {name!r} at {self.tracking_uri}.")
        return [exp.experiment_id]

    def model_fn(self, job_id: str, run_id: str):
        """The ``model_fn`` given at launch (from the payload here or in the run), or None."""
        return load_model_fn(fetch_payload(self.mlflow_client, job_id, run_id))

    def chaos(
        self,
        job_id: str,
        rank: int | None = None,
        node: str | None = None,
        timeout: float = 60.0,
        trial: int | None = None,
    ) -> list[dict[str, Any]]:
        """Kill a running job's worker process (fault injection): see
        :func:`.jobcontrol.chaos`."""
        return jobcontrol.chaos(self, job_id, rank, node, timeout, trial)

    # -- read --------------------------------------------------------------------
    def find_run(self, job_id: str):
        """The MLflow run (``mlflow.entities.Run``) of job ``job_id``.

        Raises JobNotFound for a malformed id or a job the tracking server does not know."""
        if not JOB_ID_PATTERN.match(job_id or ""):
            raise JobNotFound(f"{job_id!r} is not a job id (they look like tf-1a2b3c4d).")
        run = self._runs.find(job_id)
        if run is None:
            raise JobNotFound(f"No job {job_id} is recorded at {self.tracking_uri}.")
        return run

    def info(self, job_id: str, reconcile: bool = True) -> JobInfo:
        """The job's state (design table "Job states"), reconciling a run its driver left open."""
        return self.run_info(self.find_run(job_id), reconcile)

    def run_info(self, run, reconcile: bool = True) -> JobInfo:
        """The :class:`JobInfo` of a job's run (from :meth:`find_run` or a search): Ray is
        asked for the state while the run is RUNNING. With ``reconcile``, a run whose
        driver is gone is closed with the status of its Ray job (the one exception to
        "one writer per run"). Raises ClusterUnreachable when this cluster does not answer.
        """
        tags = run.data.tags
        run_status = run.info.status
        ray_status, message = (None, "")
        if run_status == "RUNNING":
            ray_status, message = self.ray.status(tags)
        state = job_state(run_status, ray_status, tags)
        gone = ray_status is None or ray_status in RAY_TO_RUN
        if reconcile and run_status == "RUNNING" and gone:
            run = self._reconcile(run, ray_status, message)
            state = job_state(run.info.status, None, run.data.tags)
        info = job_info(run, state, self.tracking_uri)
        if state == JobState.PENDING:
            info = dataclasses.replace(info, reason=pending_reason(ray_status, info.reason))
        return info

    def _reconcile(self, run, ray_status: str | None, message: str):
        """Close a run whose driver is gone with the status matching its Ray job (a
        sweep's: and its trials' runs still open)."""
        run_id = run.info.run_id
        status, tags = submission.reconcile_tags(ray_status, message, run.data.tags)
        open_runs = [run_id]
        if TAG.SWEEP in run.data.tags:
            open_runs += runreads.open_children(self.mlflow_client, run)
        for open_id in open_runs:
            self.mlflow_client.log_batch(open_id, tags=tracking.run_tags(tags))
            with contextlib.redirect_stdout(io.StringIO()):  # MLflow prints the run URL
                self.mlflow_client.set_terminated(open_id, status=status)
        return self.mlflow_client.get_run(run_id)

    def list(self, all_users: bool = False, limit: int = 50) -> list[JobInfo]:
        """Jobs newest first: the current user's, or everyone's with ``all_users``."""
        runs = runreads.search_job_runs(
            self.mlflow_client, None if all_users else current_owner(), max_results=limit
        )
        return [self.run_info(run) for run in runs]

    def logs(self, job_id: str, tail: int | None = None, rank: int | None = None) -> str:
        """The job driver's log (Ray's output included), or with ``rank`` that rank's worker
        log (stdout, then stderr); the last ``tail`` lines if given.

        Raises JobNotFound when Ray has no such log (the job's cluster is gone, or the
        rank never started)."""
        return self._logs.read(self.find_run(job_id), tail, rank)

    def follow_logs(
        self,
        job_id: str,
        rank: int | None = None,
        write: Callable[[str], Any] = print,
        poll_s: float = 1.0,
    ) -> str:
        """Print the job's log (or ``rank``'s worker log) as it grows, until the job ends;
        returns the final state. Follows a rank's new worker after a restart.
        Interrupt it (Ctrl-C, or the notebook's stop button) to stop following."""

        def read_job() -> tuple[Any, str]:
            run = self.find_run(job_id)
            return run, self.run_info(run).state

        return self._logs.follow(read_job, rank, write, poll_s)

    def stop(
        self, job_id: str, now: bool = False, grace_s: float = 300.0, timeout: float = 60.0
    ) -> JobInfo:
        """Stop a job, gracefully (default) or at once (``now``): see
        :func:`.jobcontrol.stop`."""
        return jobcontrol.stop(self, job_id, now, grace_s, timeout)

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 1.0) -> str:
        """Block until the job ends; return its state: see :func:`.jobcontrol.wait`."""
        return jobcontrol.wait(self, job_id, timeout, poll_s)


def _digest_inputs(inputs: dict[str, Any]) -> list:
    """The ``lineage`` DataInput of each declared input; SpecError for a bad one."""
    from . import lineage

    data = []
    for name, value in inputs.items():
        if not str(name).isidentifier():
            raise SpecError(f"An input's name must be an identifier, got {name!r}.")
        try:
            data.append(lineage.digest_input(str(name), value))
        except (ValueError, TypeError, OSError) as exc:
            text = str(exc)
            raise SpecError(text[:1].upper() + text[1:]) from None
    return data
