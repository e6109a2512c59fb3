"""JobManager: submit, list, inspect and stop training jobs over the Ray Jobs API.

The MLflow run is the record of a job: the job list comes from MLflow (so it
outlives a local Ray head), the live state from the Ray Jobs API.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import io
import json
import logging
import math
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import tracking
from .cluster import (
    ClusterInfo,
    Placement,
    check_job,
    cluster_headers,
    describe,
    resolve_address,
    token_source,
)
from .services import ServiceProcess, Services, ensure_services, state_dir
from .spec import JobSpec, SpecError, current_owner
from .telemetry.cost import money
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
JOB_ID_PATTERN = re.compile(r"^tf-[0-9a-f]{8}$")
TERMINAL_STATES = frozenset({"SUCCEEDED", "FAILED", "STOPPED"})
_RAY_TO_RUN = {"SUCCEEDED": "FINISHED", "FAILED": "FAILED", "STOPPED": "KILLED"}
_PACKAGE_EXCLUDES = ["__pycache__", "*.pyc", "labextension"]
_PAYLOAD_ARTIFACTS = "trainfactory/payload"
#: The payload file of the function that rebuilds a model from a checkpoint directory.
MODEL_FN_FILE = "model_fn.pkl"
CONFIG_FILE = "config.pkl"  # the config as given (job.json holds tracking.json_safe's copy)
_MAX_DIFF_CHARS = 5_000_000
#: Seconds to wait for another cluster's dashboard (the jobs of that cluster in a list), and
#: before asking one that did not answer again.
_PROBE_TIMEOUT_S = 5.0
_UNREACHABLE_RETRY_S = 60.0
#: Lines Ray writes into worker logs to say which job, actor or task the lines belong to.
_RAY_LOG_MARKERS = (":job_id:", ":actor_name:", ":task_name:", ":task_attempt")


class JobNotFound(LookupError):
    """No job with this id is known to the tracking server."""


@dataclass
class JobInfo:
    """What ``status``/``list`` show for a job; times in s since the epoch."""

    job_id: str
    name: str
    state: str
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
            "state": self.state,
            "owner": self.owner,
            "step": "-" if self.step is None else str(self.step),
            "elapsed": "-" if elapsed is None else f"{elapsed:.0f} s",
            "checkpoint": "-" if self.checkpoint_step is None else f"step {self.checkpoint_step}",
            "detail": self.error or self.reason or "",
        }


def _ray_version() -> str:
    import ray

    return ray.__version__


def _function_source(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


def _payload_path(job_id: str) -> Path:
    """Where job ``job_id``'s payload package lives in the state directory."""
    return state_dir() / "jobs" / job_id / f"_tf_payload_{job_id.replace('-', '_')}"


def _payload_dir(
    job_id: str, fn: Callable, model_fn: Callable | None = None, config: Any = None
) -> Path:
    """Write the job's payload as an importable package shipped with runtime_env py_modules.

    The function (and ``model_fn``, kept for ``register``) and the config (``config.pkl``:
    the job gets it exactly as given, tensors, tuple keys and all) are pickled first, so
    an unshippable one fails before a run exists; ``job.json`` is added once the run id
    is known.
    """
    import cloudpickle

    path = _payload_path(job_id)
    path.mkdir(parents=True, exist_ok=True)
    (path / "__init__.py").write_text(f'"""Payload of trainfactory job {job_id}."""\n')
    for name, item in (("function.pkl", fn), (MODEL_FN_FILE, model_fn), (CONFIG_FILE, config)):
        if item is None:
            continue
        if name != CONFIG_FILE:
            _ship_by_value(item)
        try:
            (path / name).write_bytes(cloudpickle.dumps(item))
        except Exception as exc:
            shutil.rmtree(path.parent, ignore_errors=True)
            what = {MODEL_FN_FILE: "model_fn", CONFIG_FILE: "The config"}.get(name, "The function")
            raise SpecError(
                f"{what} cannot be shipped to the cluster (cloudpickle: {exc})."
            ) from exc
    return path


def _log_payload(mlflow_client, run_id: str, payload: Path, meta: dict[str, Any]) -> None:
    """The payload in the run's artifacts (a resume from another machine finds it there),
    with ``meta`` (already redacted: secrets never reach MLflow) as its ``job.json``; the
    pickled config stays out when something in it was redacted."""
    import tempfile

    skip = ["job.json", "__pycache__"] + ([CONFIG_FILE] if meta.get("redacted") else [])
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "payload"
        shutil.copytree(payload, copy, ignore=shutil.ignore_patterns(*skip))
        (copy / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        mlflow_client.log_artifacts(run_id, str(copy), _PAYLOAD_ARTIFACTS)


def _ship_by_value(fn: Callable) -> None:
    """Pickle ``fn``'s module by value when it is a local file the cluster cannot import.

    A training function imported from a file next to the notebook (``from tiny_gpt_train
    import train_func``) would otherwise be pickled as a reference to that module, which
    the workers do not have. Installed packages (site-packages, the standard library) and
    this project's own packages stay references.
    """
    import sysconfig

    import cloudpickle

    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if module is None or not path or module.__name__ == "__main__":
        return
    if module.__name__.split(".")[0] in ("jupyter_trainfactory", "ray_backend"):
        return
    installed = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")}
    resolved = str(Path(path).resolve())
    if any(resolved.startswith(str(Path(p).resolve()) + os.sep) for p in installed):
        return
    cloudpickle.register_pickle_by_value(module)


def _data_tag(data) -> dict[str, Any]:
    """The run tag of one declared input: what ``register`` copies to a model version."""
    return {"digest": data.digest, "digest_of": data.digest_of, "source": data.source}


def job_state(run_status: str, ray_status: str | None, tags: dict[str, str]) -> str:
    """The state shown to users (design: "Job states") from the run status and Ray's status."""
    if run_status == "FINISHED":
        return "SUCCEEDED"
    if run_status == "FAILED":
        return "FAILED"
    if run_status == "KILLED":
        return "STOPPED"
    if ray_status == "PENDING":
        return "PENDING"
    if ray_status in ("SUCCEEDED", "FAILED", "STOPPED"):
        return {"SUCCEEDED": "SUCCEEDED", "FAILED": "FAILED", "STOPPED": "STOPPED"}[ray_status]
    state = tags.get(TAG.STATE, "PENDING")
    # The recorder writes the final state tag just before it closes the run: until the
    # run is closed (or Ray says the driver ended) the job is still finishing.
    return "RUNNING" if state in TERMINAL_STATES else state


def job_info(run, state: str, tracking_uri: str) -> JobInfo:
    """A :class:`JobInfo` from the job's MLflow run and its state."""
    tags = run.data.tags

    def _int(value: str | None) -> int | None:
        try:
            return int(value) if value not in (None, "") else None
        except ValueError:
            return None

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
        step=_int(tags.get(TAG.STEP)),
        started=run.info.start_time / 1000 if run.info.start_time else None,
        ended=None if run.info.status == "RUNNING" else ended,  # a resume reopens the run
        reason=tags.get(TAG.REASON, ""),
        error=tags.get(TAG.ERROR, ""),
        checkpoint_path=tags.get(TAG.CKPT_PATH, ""),
        checkpoint_step=_int(tags.get(TAG.CKPT_STEP)),
        run_url=tracking.run_url(tracking_uri, run),
        restarts=_int(tags.get("trainfactory.faults.restarts")) or 0,
        resumes=_int(tags.get(TAG.RESUMES)) or 0,
        failure=failure if isinstance(failure, dict) else None,
        fault_records=records if isinstance(records, list) else [],
        stall=tags.get(TAG.STALL, ""),
        stall_suggested_s=None if math.isnan(suggested) else suggested,
        cost=_cost_text(run.data.metrics, tags),
    )


def _cost_text(metrics: dict[str, float], tags: dict[str, str]) -> str:
    """``"12.50 USD (1.25 wasted; budget 15; example prices)"`` from the run, "" if none."""
    if "cost/usd" not in metrics:
        return ""
    currency = tags.get("trainfactory.cost.currency", "USD")
    notes = []
    if metrics.get("cost/wasted_usd"):
        notes.append(f"{money(metrics['cost/wasted_usd'])} wasted")
    if tags.get("trainfactory.cost.budget"):
        notes.append(f"budget {tags['trainfactory.cost.budget']}")
    if "cost/projected_usd" in metrics and tags.get(TAG.TARGET_STEPS):
        notes.append(
            f"{money(metrics['cost/projected_usd'])} projected by step {tags[TAG.TARGET_STEPS]}"
        )
    if "example" in tags.get("trainfactory.cost.catalog", ""):
        notes.append("example prices")
    text = f"{money(metrics['cost/usd'])} {currency}"
    return text + (f" ({'; '.join(notes)})" if notes else "")


def _local_head_alive(head: str) -> bool:
    """Whether the embedded Ray head recorded as ``pid:start_time`` still runs."""
    pid, _, created = head.partition(":")
    try:
        return ServiceProcess("ray", int(pid), float(created), "", "").alive()
    except ValueError:
        return False


class JobManager:
    """Submits and tracks jobs on one Ray cluster with one MLflow tracking server.

    Parameters
    ----------
    address : str, optional
        Ray dashboard (Jobs API) URL, ``http://host:8265``. None: ``RAY_ADDRESS`` when it
        is such a URL, else the embedded local head. The cluster's token comes from
        :func:`~.cluster.cluster_headers` (its token file, ``RAY_AUTH_TOKEN``,
        ``RAY_AUTH_TOKEN_PATH``).
    tracking_uri : str, optional
        MLflow tracking URI. None: ``MLFLOW_TRACKING_URI`` if set, else the embedded local
        MLflow server.
    storage : str, optional
        Ray Train storage path for checkpoints. None: ``TRAINFACTORY_STORAGE`` if set, else
        the embedded default (a remote cluster needs one).
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
        self._clients: dict[str, Any] = {}
        self._unreachable: dict[str, tuple[float, str]] = {}  # address -> (when, why)
        self._mlflow = tracking.client(self.tracking_uri)

    def services_alive(self) -> bool:
        """False when an embedded service this manager uses has stopped since."""
        if self._services is None:
            return True
        procs = self._services.processes
        return all(n in procs and procs[n].alive() for n, used in self._embedded.items() if used)

    # -- clients -----------------------------------------------------------------
    def _headers(self, address: str) -> dict[str, str]:
        """The cluster's auth header; the embedded head's token is Ray's own default
        (``RAY_AUTH_TOKEN_PATH`` in this process)."""
        return {} if self.local and address == self.address else cluster_headers(address)

    @property
    def jobs_client(self):
        """The Ray ``JobSubmissionClient`` of this manager's cluster (with its token)."""
        return self._jobs_client_for(self.address)

    def _jobs_client_for(self, address: str):
        """A ``JobSubmissionClient`` for the cluster at ``address`` (cached); raises
        SpecError with one sentence when the cluster does not answer."""
        client = self._clients.get(address)
        if client is not None:
            return client
        failed = self._unreachable.get(address)
        if failed and time.monotonic() - failed[0] < _UNREACHABLE_RETRY_S:
            raise SpecError(failed[1])
        try:  # Ray's client waits without a timeout on an address that does not answer
            import requests

            # this manager's own cluster may be busy (a loaded head); others' jobs only list
            own = address == self.address
            requests.get(f"{address}/api/version", timeout=30.0 if own else _PROBE_TIMEOUT_S)
        except Exception as exc:
            message = self._unreachable_text(address, exc)
            if address != self.address:  # another cluster's jobs: ask again in a minute
                self._unreachable[address] = (time.monotonic(), message)
            raise SpecError(message) from exc
        import ray._private.runtime_env.packaging as packaging
        import ray.dashboard.modules.dashboard_sdk as sdk
        import ray.dashboard.modules.job.sdk as job_sdk
        from ray.job_submission import JobSubmissionClient

        # Ray's upload chatter belongs in the job's logs, not in the notebook.
        for logger in (sdk.logger, job_sdk.logger, packaging.default_logger):
            logger.setLevel(logging.WARNING)
        try:
            client = JobSubmissionClient(address, headers=self._headers(address) or None)
        except Exception as exc:
            raise SpecError(self._unreachable_text(address, exc)) from exc
        self._clients[address] = client
        return client

    def _unreachable_text(self, address: str, exc: BaseException) -> str:
        """One sentence for a cluster that did not answer, or refused the token."""
        import requests

        text = str(exc).strip()
        if "authentication" in text.lower() or "401" in text[:40] or "403" in text[:40]:
            first = (text.splitlines() or [""])[0][:200]
            return (
                f"The Ray cluster at {address} refused the request ({first}); the token came"
                f" from {token_source(address)}: keep the cluster's own with `jupyter"
                f" trainfactory cluster --address {address} --token-file FILE`."
            )
        if isinstance(exc, requests.Timeout):
            first = "no answer in time"
        elif isinstance(exc, requests.ConnectionError):
            reason = re.search(r"\[Errno -?\d+\] ([^'\")\]]+)", text)
            first = f"nothing answers there ({reason.group(1) if reason else 'no connection'})"
        else:
            first = (text.splitlines() or [type(exc).__name__])[0][:300]
        hint = (
            ""
            if self.local and address == self.address
            else "; check the address (the head's dashboard, port 8265 by default) and that"
            " this machine reaches it (KubeRay: kubectl port-forward svc/CLUSTER-head-svc 8265)"
        )
        return f"Cannot reach the Ray cluster at {address}: {first}{hint}."

    def _http_headers(self, address: str) -> dict[str, str]:
        """Headers of a plain HTTP call to ``address``: its token, or for the embedded head
        the token Ray's own loader finds (``RAY_AUTH_TOKEN_PATH`` in this process)."""
        from ray._private.authentication.http_token_authentication import (
            get_auth_headers_if_auth_enabled,
        )

        return self._headers(address) or get_auth_headers_if_auth_enabled({})

    def cluster(self, settle_s: float = 45.0) -> ClusterInfo:
        """This manager's cluster: versions, and every alive node's host, total resources
        and labels (:class:`~.cluster.ClusterInfo`).

        A head started a moment ago lists itself before its resources are registered;
        such a list (every node empty) is read again for up to ``settle_s`` seconds.
        Raises SpecError when the cluster does not answer.
        """
        from ray.util.state import StateApiClient
        from ray.util.state.common import ListApiOptions, StateResource

        deadline = time.monotonic() + settle_s
        headers = self._headers(self.address)
        while True:
            try:
                client = StateApiClient(address=self.address, headers=headers or None)
                nodes = client.list(
                    StateResource.NODES,
                    options=ListApiOptions(filters=[("state", "=", "ALIVE")], detail=True),
                    raise_on_missing_output=False,
                )
            except Exception as exc:  # the head is gone or overloaded: one sentence
                if "authentication" in str(exc).lower():
                    raise SpecError(self._unreachable_text(self.address, exc)) from exc
                where = ""
                if self.local and self._services is not None:
                    where = f"; its log is {self._services.processes['ray'].log}"
                    where += " (`jupyter trainfactory services stop` then retry restarts it)"
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
                raise SpecError(
                    f"The Ray cluster at {self.address} does not answer ({first}){where}."
                ) from exc
            if any(n.resources_total for n in nodes) or time.monotonic() > deadline:
                return describe(self.address, self._http_headers(self.address), nodes)
            time.sleep(0.5)

    def check(self, spec: JobSpec) -> Placement:
        """Every check of ``spec`` against this cluster before submission (see
        :func:`~.cluster.check_job`); returns where it may run. Raises SpecError."""
        self.jobs_client  # noqa: B018 (reachability first: its error is the clearest)
        storage = spec.storage or self.storage
        if storage is None and not self.local:
            raise SpecError(
                "A remote cluster needs --storage, a path all its nodes share"
                " (s3://BUCKET/PATH, or NFS mounted at the same place on every node)."
            )
        return check_job(self.cluster(), spec, self.tracking_uri, storage, remote=not self.local)

    # -- submit ------------------------------------------------------------------
    def submit(
        self,
        fn: Callable[[dict], Any],
        spec: JobSpec,
        inputs: dict[str, Any] | None = None,
        model_fn: Callable[[str], Any] | None = None,
    ) -> Job:
        """Validate, create the MLflow run, and submit ``fn`` as a detached Ray job.

        ``inputs`` (name -> array, local path or URI) are recorded as the run's datasets
        with a digest (``lineage.digest_input``); ``model_fn(checkpoint_dir)`` rebuilds the
        trained model from one of the job's checkpoints for ``register``. The run gets the
        code's versions (notebook and function hashes, git commit, branch, dirty flag and
        diff); values under credential names and passwords in URLs are masked in
        everything sent to MLflow (``redact``).

        Raises
        ------
        SpecError
            Bad input, unreachable cluster or resources the cluster can never provide;
            nothing is submitted and no run is created.
        """
        from . import lineage, redact

        if not callable(fn):
            raise SpecError(f"{spec.function_name!r} is not callable.")
        if model_fn is not None and not callable(model_fn):
            raise SpecError(f"model_fn must be a function, got {type(model_fn).__name__}.")
        spec.validate()
        data = []
        for name, value in (inputs or {}).items():
            if not str(name).isidentifier():
                raise SpecError(f"An input's name must be an identifier, got {name!r}.")
            try:
                data.append(lineage.digest_input(str(name), value))
            except (ValueError, TypeError, OSError) as exc:
                text = str(exc)
                raise SpecError(text[:1].upper() + text[1:]) from None
        placement = self.check(spec)

        job_id = f"tf-{secrets.token_hex(4)}"
        submission_id = f"{job_id}-0"
        source = _function_source(fn)
        code = lineage.code_version(spec.source, source or repr(fn))
        storage = spec.storage or self.storage
        meta = {
            "job_id": job_id,
            "spec": spec.to_dict(),
            "config": tracking.json_safe(spec.config),
            "tracking_uri": self.tracking_uri,
            "storage_path": storage,
            "price_catalog": dataclasses.asdict(spec.catalog()),
            "min_nodes": placement.min_nodes,
            # what the pickled function needs of the job's interpreter (driver checks it)
            "client": {"python": list(sys.version_info[:2]), "ray": _ray_version()},
        }
        tags = {
            TAG.JOB_ID: job_id,
            TAG.SUBMISSION: submission_id,
            TAG.DASHBOARD: self.address,
            TAG.LOCAL_HEAD: self._local_head(),
            TAG.OWNER: spec.owner,
            TAG.SOURCE: spec.source,
            TAG.FUNCTION: spec.function_name,
            TAG.STATE: "PENDING",
            TAG.REASON: "submitted",
            TAG.WORKERS: str(spec.workers),
            "mlflow.user": spec.owner,
            "mlflow.source.name": spec.source or spec.function_name,
            **code.tags(),
            **{f"{TAG.DATA}{d.name}": json.dumps(_data_tag(d)) for d in data},
        }
        if spec.project:
            tags[TAG.PROJECT] = spec.project
        if spec.target_steps:
            tags[TAG.TARGET_STEPS] = str(spec.target_steps)
        shown_meta, redacted = redact.redact_mapping(json.loads(json.dumps(meta, default=repr)))
        if redacted:
            tags[TAG.REDACTED] = json.dumps(redacted)[:5000]
        payload = _payload_dir(job_id, fn, model_fn, spec.config)
        try:
            run = tracking.create_job_run(
                self._mlflow,
                spec.experiment,
                spec.run_name,
                redact.redact_params(tags),
                redact.redact_params(spec.params()),
            )
        except Exception as exc:
            shutil.rmtree(payload.parent, ignore_errors=True)
            raise SpecError(f"Cannot create the MLflow run at {self.tracking_uri}: {exc}") from exc
        meta["run_id"] = shown_meta["run_id"] = run.info.run_id
        shown_meta["redacted"] = redacted
        (payload / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        if source:
            self._mlflow.log_text(run.info.run_id, source, "code/train_function.py")
        if code.git_diff:  # the uncommitted changes, URL credentials masked, at most 5 MB
            diff = redact.mask_url(code.git_diff)
            if len(diff) > _MAX_DIFF_CHARS:
                diff = diff[:_MAX_DIFF_CHARS] + f"\n[cut at {_MAX_DIFF_CHARS} characters]\n"
            self._mlflow.log_text(run.info.run_id, diff, "code/git_diff.patch")
        if data:
            tracking.log_data_inputs(self._mlflow, run.info.run_id, data)
        _log_payload(self._mlflow, run.info.run_id, payload, shown_meta)
        try:
            self._submit(job_id, submission_id, run.info.run_id, spec, payload)
        except Exception as exc:
            self._mlflow.set_tag(run.info.run_id, TAG.STATE, "FAILED")
            self._mlflow.set_tag(run.info.run_id, TAG.ERROR, f"submission failed: {exc}"[:4000])
            self._mlflow.set_terminated(run.info.run_id, "FAILED")
            raise SpecError(f"Ray refused the job: {str(exc).splitlines()[0]}") from exc
        return Job(job_id, run.info.run_id, self)

    def _submit(
        self, job_id: str, submission_id: str, run_id: str, spec: JobSpec, payload: Path
    ) -> None:
        self.jobs_client.submit_job(
            entrypoint=f"{self._python()} -m ray_backend.driver {payload.name}",
            submission_id=submission_id,
            runtime_env=self._runtime_env(spec, payload),
            metadata={
                "trainfactory.job_id": job_id,
                "trainfactory.run_id": run_id,
                "trainfactory.owner": spec.owner,
            },
        )

    def resume(self, job_id: str, max_failures: int | None = None) -> Job:
        """Continue a STOPPED or FAILED job from its latest good checkpoint.

        A new Ray submission (``<job id>-<n>``) of the same function and config, under
        the same job id, MLflow run (reopened: status RUNNING; params are not logged
        again), storage path (Ray Train restores its checkpoint list from there, and
        ``trainfactory.get_checkpoint()`` returns the newest that verifies) and run name.
        ``max_failures`` sets a new failure budget for this submission. The resume is
        recorded in the tags ``trainfactory.resumes`` and ``trainfactory.resume.spec``.

        Raises
        ------
        SpecError
            The job is not STOPPED or FAILED, ran on another cluster, its payload is
            gone, or Ray refused the submission (the run is then closed as it was).
        """
        from mlflow.entities import RunTag

        run = self._run(job_id)
        info = self._info(run)
        if info.state not in ("STOPPED", "FAILED"):
            hint = "launch a new job" if info.state == "SUCCEEDED" else "stop it first"
            raise SpecError(
                f"Job {job_id} is {info.state}; only a STOPPED or FAILED job can be resumed"
                f" ({hint})."
            )
        run = self._mlflow.get_run(run.info.run_id)
        tags = run.data.tags
        if tags.get(TAG.DASHBOARD, self.address) != self.address:
            raise SpecError(
                f"Job {job_id} ran on the cluster at {tags[TAG.DASHBOARD]}; resume it with"
                f" --address {tags[TAG.DASHBOARD]}."
            )
        payload = self._payload(job_id, run.info.run_id)
        meta = json.loads((payload / "job.json").read_text())
        changes: dict[str, Any] = {}
        if max_failures is not None:
            changes["max_failures"] = max_failures
        spec = JobSpec(**{**meta["spec"], **changes})  # validates again (working_dir, ...)
        meta["min_nodes"] = self.check(spec).min_nodes
        count = int(tags.get(TAG.RESUMES) or 0) + 1
        meta.update(spec=spec.to_dict(), resume=count)
        (payload / "job.json").write_text(json.dumps(meta, indent=2, default=repr))
        submission_id = f"{job_id}-{count}"
        previous = {k: tags.get(k, "") for k in (TAG.SUBMISSION, TAG.STATE, TAG.REASON)}
        now = time.time()
        reopen = {
            TAG.SUBMISSION: submission_id,
            TAG.STATE: "PENDING",
            TAG.REASON: f"resumed ({count})",
            TAG.RESUMES: str(count),
            TAG.RESUME_SPEC: json.dumps({"submission": submission_id, "time": now, **changes}),
            TAG.STARTED: f"{now:.3f}",  # goodput counts this submission's time
            TAG.STOP: "",
            TAG.ERROR: "",
            TAG.STALL: "",
            TAG.CHAOS: "",  # a fault injected into an earlier submission stays there
        }
        reopen = tracking.fit_tags(reopen)
        self._mlflow.log_batch(run.info.run_id, tags=[RunTag(k, v) for k, v in reopen.items()])
        self._mlflow.update_run(run.info.run_id, status="RUNNING")
        try:
            self._submit(job_id, submission_id, run.info.run_id, spec, payload)
        except Exception as exc:
            self._mlflow.log_batch(
                run.info.run_id, tags=[RunTag(k, v) for k, v in previous.items()]
            )
            with contextlib.redirect_stdout(io.StringIO()):
                self._mlflow.set_terminated(run.info.run_id, status=run.info.status)
            raise SpecError(f"Ray refused the resume: {str(exc).splitlines()[0]}") from exc
        return Job(job_id, run.info.run_id, self)

    def _payload(self, job_id: str, run_id: str) -> Path:
        """The job's payload directory: here, or downloaded from its run's artifacts."""
        path = _payload_path(job_id)
        if (path / "job.json").is_file() and (path / "function.pkl").is_file():
            return path
        path.mkdir(parents=True, exist_ok=True)
        try:
            fetched = self._mlflow.download_artifacts(run_id, _PAYLOAD_ARTIFACTS, str(path))
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError(
                f"Job {job_id}'s function is neither in {path} nor in its run's artifacts"
                f" ({text}); launch it again."
            ) from exc
        for item in Path(fetched).iterdir():  # <path>/trainfactory/payload/* -> <path>/*
            item.replace(path / item.name)
        shutil.rmtree(path / _PAYLOAD_ARTIFACTS.split("/")[0], ignore_errors=True)
        redacted = json.loads((path / "job.json").read_text()).get("redacted")
        if redacted:
            shutil.rmtree(path.parent, ignore_errors=True)
            raise SpecError(
                f"Job {job_id}'s settings held secrets ({', '.join(redacted)}) that are never"
                " stored in MLflow; resume it from the machine that launched it (its state"
                " directory keeps them), or launch it again."
            )
        return path

    def experiment_ids(self, name: str | None) -> list[str] | None:
        """``[id]`` of experiment ``name``; None for no name (every experiment).

        Raises SpecError when the tracking server has no such experiment."""
        if not name:
            return None
        exp = self._mlflow.get_experiment_by_name(tracking.experiment_name(name))
        if exp is None:
            raise SpecError(f"No experiment {name!r} at {self.tracking_uri}.")
        return [exp.experiment_id]

    def model_fn(self, job_id: str, run_id: str):
        """The ``model_fn`` given at launch (from the payload here or in the run), or None."""
        import cloudpickle

        path = self._payload(job_id, run_id) / MODEL_FN_FILE
        return cloudpickle.loads(path.read_bytes()) if path.is_file() else None

    def chaos(
        self, job_id: str, rank: int | None = None, node: str | None = None, timeout: float = 60.0
    ) -> list[dict[str, Any]]:
        """Kill a running job's worker process (fault injection, as acceptance tests of a
        platform do): the one of ``rank`` (None: the last rank), or with ``node`` (an IP
        or a node id) every worker process of the job on that node.

        The request reaches the job through its run (tag ``trainfactory.chaos``); the
        job's recorder kills the processes with SIGKILL from a Ray task on their node and
        answers in ``trainfactory.chaos.done``. Ray Train then sees a worker failure and
        restarts from the latest checkpoint if ``max_failures`` allows. Returns the
        processes killed: ``[{"rank", "pid", "node"}]``.

        Raises SpecError when the job is not running, the rank or node has no worker of
        the job, or the job does not answer within ``timeout`` s.
        """
        from mlflow.entities import RunTag

        run = self._run(job_id)
        info = self._info(run)
        if info.state not in ("RUNNING", "RESTARTING"):
            raise SpecError(f"Job {job_id} is {info.state}; chaos needs a RUNNING job.")
        if rank is not None and rank < -1:
            raise SpecError(f"--kill-worker takes a rank of 0 or more, got {rank}.")
        request: dict[str, Any] = {"id": secrets.token_hex(4)}
        request.update({"node": node} if node else {"rank": -1 if rank is None else rank})
        self._mlflow.log_batch(run.info.run_id, tags=[RunTag(TAG.CHAOS, json.dumps(request))])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            time.sleep(0.5)
            done = self._mlflow.get_run(run.info.run_id).data.tags.get(TAG.CHAOS_DONE, "")
            answer = json.loads(done) if done else {}
            if answer.get("id") == request["id"]:
                if answer.get("error"):
                    raise SpecError(f"chaos: {answer['error']}.")
                return answer.get("killed", [])
        raise SpecError(f"Job {job_id} did not carry out the chaos request within {timeout:g} s.")

    def _local_head(self) -> str:
        """``pid:start_time`` of the embedded Ray head, "" for other clusters."""
        if not self.local or self._services is None:
            return ""
        head = self._services.processes["ray"]
        return f"{head.pid}:{head.create_time}"

    def _python(self) -> str:
        return sys.executable if self.local else "python"

    def _runtime_env(self, spec: JobSpec, payload: Path) -> dict[str, Any]:
        import jupyter_trainfactory
        import ray_backend

        env_vars = {k: v for k, v in os.environ.items() if k.startswith("RAY_TRAIN_")}
        env_vars.update(spec.env)
        env_vars.setdefault("PYTHONUNBUFFERED", "1")
        env_vars.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
        if self.local and self._services is not None:  # not "auto": another head may run here
            env_vars.setdefault("RAY_ADDRESS", self._services.ray_address)
        runtime_env: dict[str, Any] = {
            "py_modules": [
                str(Path(jupyter_trainfactory.__file__).parent),
                str(Path(ray_backend.__file__).parent),
                str(payload),
            ],
            "excludes": _PACKAGE_EXCLUDES,
            "env_vars": env_vars,
        }
        runtime_env.update(spec.runtime_env_extras())
        return runtime_env

    # -- read --------------------------------------------------------------------
    def _run(self, job_id: str):
        if not JOB_ID_PATTERN.match(job_id or ""):
            raise JobNotFound(f"{job_id!r} is not a job id (they look like tf-1a2b3c4d).")
        run = tracking.find_job_run(self._mlflow, job_id)
        if run is None:
            raise JobNotFound(f"No job {job_id} is recorded at {self.tracking_uri}.")
        return run

    def _ray_status(self, run) -> tuple[str | None, str]:
        """(Ray's job status, Ray's message) for the job's current submission.

        The status is None when the job is gone for good (Ray does not know the
        submission, or the local head that ran it has stopped), and ``"UNKNOWN"`` when
        the job ran on a cluster this manager does not talk to.
        """
        tags = run.data.tags
        address = tags.get(TAG.DASHBOARD, self.address)
        head = tags.get(TAG.LOCAL_HEAD, "")
        if address != self.address and head:  # another state directory's embedded head
            if not _local_head_alive(head):
                return (
                    None,
                    f"the local Ray head that ran it (pid {head.split(':')[0]}) has stopped",
                )
            return "UNKNOWN", f"the job ran on another local Ray head ({address})"
        try:
            client = self._jobs_client_for(address)
        except SpecError as exc:
            if address == self.address:
                raise
            return "UNKNOWN", f"its cluster does not answer: {exc}"
        try:
            info = client.get_job_info(tags.get(TAG.SUBMISSION, ""))
        except Exception as exc:  # 404: the cluster does not know this submission
            return None, str(exc).splitlines()[0] if str(exc) else ""
        status = info.status.value if hasattr(info.status, "value") else info.status
        return str(status), info.message or ""

    def info(self, job_id: str, reconcile: bool = True) -> JobInfo:
        """The job's state (design table "Job states"), reconciling a run its driver left open."""
        run = self._run(job_id)
        return self._info(run, reconcile)

    def _info(self, run, reconcile: bool = True) -> JobInfo:
        tags = run.data.tags
        run_status = run.info.status
        ray_status, message = (None, "")
        if run_status == "RUNNING":
            ray_status, message = self._ray_status(run)
        state = job_state(run_status, ray_status, tags)
        gone = ray_status is None or ray_status in _RAY_TO_RUN
        if reconcile and run_status == "RUNNING" and gone:
            run = self._reconcile(run, ray_status, message)
            state = job_state(run.info.status, None, run.data.tags)
        return job_info(run, state, self.tracking_uri)

    def _reconcile(self, run, ray_status: str | None, message: str):
        """Close a run whose driver is gone with the status matching its Ray job."""
        from mlflow.entities import RunTag

        run_id = run.info.run_id
        if ray_status is None:
            status, state = "FAILED", "FAILED"
            error = f"The job is lost: {message}."
        else:
            status = _RAY_TO_RUN[ray_status]
            state = {"FINISHED": "SUCCEEDED", "FAILED": "FAILED", "KILLED": "STOPPED"}[status]
            error = (message.strip().splitlines() or [""])[-1] if status == "FAILED" else ""
            if status == "FAILED" and not error:
                error = "The job's driver exited without closing its run."
        tags = [RunTag(TAG.STATE, state)]
        if error:
            tags.append(RunTag(TAG.ERROR, error[:4000]))
        if status == "KILLED":
            tags.append(RunTag(TAG.REASON, run.data.tags.get(TAG.STOP, "") or "user"))
        self._mlflow.log_batch(run_id, tags=tags)
        with contextlib.redirect_stdout(io.StringIO()):  # MLflow prints the run URL
            self._mlflow.set_terminated(run_id, status=status)
        return self._mlflow.get_run(run_id)

    def list(self, all_users: bool = False, limit: int = 50) -> list[JobInfo]:
        """Jobs newest first: the current user's, or everyone's with ``all_users``."""
        runs = tracking.search_job_runs(
            self._mlflow, None if all_users else current_owner(), max_results=limit
        )
        return [self._info(run) for run in runs]

    def logs(self, job_id: str, tail: int | None = None, rank: int | None = None) -> str:
        """The job driver's log (Ray's output included), or with ``rank`` that rank's worker
        log (stdout, then stderr); the last ``tail`` lines if given.

        Raises JobNotFound when Ray has no such log (the job's cluster is gone, or the
        rank never started)."""
        run = self._run(job_id)
        if rank is not None:
            where = self._rank_where(run, rank)
            parts = [self._worker_log(where, suffix, tail) for suffix in ("out", "err")]
            return "\n".join(p for p in parts if p.strip())
        text = self._driver_log(run)
        if tail:
            text = "\n".join(text.splitlines()[-tail:])
        return text

    def _driver_log(self, run) -> str:
        try:
            client = self._jobs_client_for(run.data.tags.get(TAG.DASHBOARD) or self.address)
            return client.get_job_logs(run.data.tags[TAG.SUBMISSION])
        except SpecError:
            raise
        except Exception as exc:
            job_id = run.data.tags.get(TAG.JOB_ID, "")
            raise JobNotFound(
                f"Ray has no logs for job {job_id}: {str(exc).splitlines()[0]}"
            ) from exc

    def _rank_where(self, run, rank: int) -> dict[str, Any]:
        """Where ``rank``'s worker runs (or last ran): pid, node_id, node_ip."""
        tags = run.data.tags
        known = sorted(int(k.removeprefix(TAG.RANK)) for k in tags if k.startswith(TAG.RANK))
        if rank not in known:
            ranks = ", ".join(map(str, known)) or "none has started yet"
            raise JobNotFound(f"Job {tags.get(TAG.JOB_ID)} has no rank {rank} (ranks: {ranks}).")
        where = json.loads(tags[f"{TAG.RANK}{rank}"])
        where["address"] = tags.get(TAG.DASHBOARD) or self.address
        return where

    def _log_chunks(
        self, where: dict[str, Any], suffix: str, tail: int, follow: bool = False
    ) -> Iterator[str]:
        """A worker's log file (``suffix`` ``out`` or ``err``) by pid, through the Ray
        dashboard's log API (``/api/v0/logs``, what ``ray logs`` uses), so it works with
        the dashboard URL alone; the cluster's token goes in the header."""
        import requests

        address = where.get("address") or self.address
        headers = self._http_headers(address)
        media = "stream" if follow else "file"
        query = {
            "node_id": where["node_id"],
            "pid": where["pid"],
            "suffix": suffix,
            "lines": tail,
            "media_type": media,
            "timeout": 30,
        }
        with requests.get(
            f"{address.rstrip('/')}/api/v0/logs/{media}",
            params=query,
            headers=headers,
            stream=True,
            timeout=None if follow else 60,
        ) as reply:
            if reply.status_code != 200:
                raise RuntimeError(reply.text.strip().splitlines()[-1] if reply.text else "")
            for chunk in reply.iter_content(chunk_size=None):
                text = chunk.decode("utf-8", errors="replace")
                yield "".join(
                    line
                    for line in text.splitlines(keepends=True)
                    if not line.startswith(_RAY_LOG_MARKERS)
                )

    def _worker_log(self, where: dict[str, Any], suffix: str, tail: int | None) -> str:
        try:
            return "".join(self._log_chunks(where, suffix, tail or -1))
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            if "agent for node" in text.lower():
                text += (
                    " (that node's dashboard agent does not answer: it serves the node's logs;"
                    " several nodes on one machine need their own --dashboard-agent-listen-port)"
                )
            raise JobNotFound(f"Ray has no log of pid {where['pid']}: {text}") from exc

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
        import queue
        import threading

        lines: queue.Queue[str] = queue.Queue()
        followed: set[int] = set()

        def pump(where: dict[str, Any], suffix: str) -> None:
            try:
                for chunk in self._log_chunks(where, suffix, 200, follow=True):
                    lines.put(chunk)
            except Exception:  # the worker is gone; a restart is picked up by the loop
                pass

        seen = 0
        while True:
            run = self._run(job_id)
            state = self._info(run).state
            if rank is None:
                text = self._driver_log(run)  # the run read once per poll
                if len(text) > seen:
                    write(text[seen:].rstrip("\n"))
                    seen = len(text)
            else:
                with contextlib.suppress(JobNotFound):
                    where = self._rank_where(run, rank)
                    if where["pid"] not in followed:
                        if followed:
                            write(f"--- rank {rank} restarted: pid {where['pid']} ---")
                        followed.add(where["pid"])
                        for suffix in ("out", "err"):
                            threading.Thread(target=pump, args=(where, suffix), daemon=True).start()
                # after the end, the last lines: until none came for a second (10 s at most)
                ended = state in TERMINAL_STATES
                deadline = time.monotonic() + (10.0 if ended else poll_s)
                quiet_since = time.monotonic()
                while time.monotonic() < deadline:
                    if ended and time.monotonic() - quiet_since > 1.0:
                        break
                    with contextlib.suppress(queue.Empty):
                        write(lines.get(timeout=0.1).rstrip("\n"))
                        quiet_since = time.monotonic()
            if state in TERMINAL_STATES:
                return state
            if rank is None:
                time.sleep(poll_s)

    def stop(
        self, job_id: str, now: bool = False, grace_s: float = 300.0, timeout: float = 60.0
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
        if grace_s < 0:
            raise SpecError(f"--grace must be at least 0 seconds, got {grace_s:g}.")
        run = self._run(job_id)
        if run.info.status != "RUNNING":
            return self._info(run)
        reason = "user-now" if now else "user"
        from mlflow.entities import RunTag

        self._mlflow.log_batch(
            run.info.run_id,
            tags=[
                RunTag(TAG.STOP, reason),
                RunTag(TAG.STOP_GRACE, f"{grace_s:g}"),
                RunTag(TAG.STOP_TIME, f"{time.time():.3f}"),
            ],
        )
        if not now:
            return self.info(job_id)
        try:
            client = self._jobs_client_for(run.data.tags.get(TAG.DASHBOARD) or self.address)
            client.stop_job(run.data.tags[TAG.SUBMISSION])
        except SpecError:
            raise
        except Exception:  # already gone: reconciliation below closes the run
            pass
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ray_status, _ = self._ray_status(run)
            if ray_status in (None, "UNKNOWN") or ray_status in _RAY_TO_RUN:
                break
            time.sleep(0.5)
        return self.info(job_id)

    def wait(self, job_id: str, timeout: float | None = None, poll_s: float = 1.0) -> str:
        """Block until the job is SUCCEEDED, FAILED or STOPPED; return that state.

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            state = self.info(job_id).state
            if state in TERMINAL_STATES:
                return state
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"Job {job_id} is still {state} after {timeout:g} s.")
            time.sleep(poll_s)


class Job:
    """Handle on one job: ``job.id``, ``job.run_id``, ``job.tracking_uri`` and controls."""

    def __init__(self, job_id: str, run_id: str, manager: JobManager):
        self.id = job_id
        self.run_id = run_id
        self.manager = manager
        self.tracking_uri = manager.tracking_uri
        self._dashboard = None

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

    def resume(self, max_failures: int | None = None) -> str:
        """Continue this STOPPED or FAILED job from its latest good checkpoint (same job
        id and MLflow run); returns its state. See :meth:`JobManager.resume`."""
        self.manager.resume(self.id, max_failures=max_failures)
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

    def chaos(self, rank: int | None = None, node: str | None = None) -> list[dict[str, Any]]:
        """Kill this job's worker of ``rank`` (or every one on ``node``): fault injection.
        See :meth:`JobManager.chaos`."""
        return self.manager.chaos(self.id, rank=rank, node=node)

    def dashboard(self, start: bool = True):
        """The live dashboard widget of this job: the one already shown (still live), or a
        new one when there is none or it was closed."""
        from .dashboard import JobDashboard

        board = self._dashboard
        if board is None or board.comm is None:  # none yet, or closed
            self._dashboard = JobDashboard(self, start=start)
        elif start:
            board.start()
        return self._dashboard
