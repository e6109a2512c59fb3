"""TrainingJobsManager: the side panel's one state object; plain-dict models of jobs and services.

Every Ray or MLflow call runs in a thread executor (the MLflow and Ray clients block), with a
time limit, and reads are cached for ``ttl_s`` seconds so that many open browser tabs cost
the tracking server no more than one.
"""

from __future__ import annotations

import asyncio
import fnmatch
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import runreads, tracking
from .. import services as svc
from ..jobs import JobManager
from ..jobstate import TERMINAL_STATES, JobInfo, JobState, waiting_line
from ..raytoken import cluster_headers
from ..spec import current_owner

#: A job as the panel shows it (see :meth:`TrainingJobsManager.job_model`).
JobModel = dict[str, Any]
#: The services header (see :meth:`TrainingJobsManager.services_model`).
ServicesModel = dict[str, Any]
#: The reliability line (see :meth:`TrainingJobsManager.reliability`).
ReliabilityModel = dict[str, Any]

#: Points of the throughput and utilization sparklines kept per job (one per fresh read).
HISTORY_POINTS = 60
#: How long (s) a reliability summary is reused: it reads every run of its period.
RELIABILITY_TTL_S = 30.0
#: How long (s) reading a reliability summary may take before it is a 503.
RELIABILITY_TIMEOUT_S = 120.0


class ServiceUnavailable(RuntimeError):
    """Ray or MLflow cannot be reached (or the embedded services are not running)."""


class TrainingJobsManager:
    """Jobs and services for the side panel.

    Parameters
    ----------
    base_url : str
        The Jupyter server's base URL (``/`` or ``/user/alice/``); links go through its proxy.
    address, tracking_uri : str, optional
        A Ray dashboard URL and MLflow tracking URI; None: the embedded local services.
    ttl_s : float
        How long (s) a Ray/MLflow answer is reused.
    timeout_s : float
        How long (s) one read or action may take before it is a 503.
    """

    def __init__(
        self,
        base_url: str = "/",
        address: str | None = None,
        tracking_uri: str | None = None,
        ttl_s: float = 2.0,
        timeout_s: float = 30.0,
    ):
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.address = address
        self.tracking_uri = tracking_uri
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self._executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="trainfactory-panel")
        self._cache: dict[Any, tuple[float, asyncio.Future]] = {}
        self._history: dict[str, deque] = {}
        self._experiments: dict[str, str] = {}

    # -- plumbing ------------------------------------------------------------------
    async def _run(self, fn: Callable[[], Any], timeout_s: float | None = None) -> Any:
        """``fn()`` in the executor; ServiceUnavailable after ``timeout_s`` (default ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return await asyncio.wait_for(loop.run_in_executor(self._executor, fn), limit)
        except asyncio.TimeoutError:
            raise ServiceUnavailable(
                f"Ray or MLflow did not answer within {limit:g} s "
                f"(tracking server {self.tracking_uri or 'embedded'})."
            ) from None

    async def _cached(
        self,
        key: Any,
        fn: Callable[[], Any],
        ttl_s: float | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """``fn()``'s answer, shared by every caller within ``ttl_s`` (default the
        manager's; errors are not kept); ``timeout_s`` as :meth:`_run`'s."""
        now = time.monotonic()
        ttl = self.ttl_s if ttl_s is None else ttl_s
        hit = self._cache.get(key)
        if hit is not None and (not hit[1].done() or now - hit[0] < ttl):
            return await asyncio.shield(hit[1])
        future = asyncio.ensure_future(self._run(fn, timeout_s))
        self._cache[key] = (now, future)
        try:
            return await asyncio.shield(future)
        except BaseException:
            if self._cache.get(key, (0, None))[1] is future:
                del self._cache[key]
            raise

    def _forget(self) -> None:
        self._cache.clear()

    def _job_manager(self) -> JobManager:
        """The JobManager of the configured target; never starts the embedded services."""
        from ..api import get_manager

        if self.address is None or self.tracking_uri is None:
            running = self._running_services()
            missing = [n for n in ("ray", "mlflow") if not given_or_running(n, running, self)]
            if missing:
                names = " and ".join(
                    {"ray": "Ray head", "mlflow": "MLflow server"}[n] for n in missing
                )
                raise ServiceUnavailable(
                    f"The local {names} is not running (state directory {svc.state_dir()}); "
                    "start the services from the panel's header or with "
                    "`jupyter trainfactory services start`."
                )
        return get_manager(self.address, self.tracking_uri)

    @staticmethod
    def _running_services() -> set[str]:
        services = svc.load_services()
        if services is None:
            return set()
        return {n for n, p in services.processes.items() if p.alive()}

    # -- models ----------------------------------------------------------------------
    def _experiment_name(self, jm: JobManager, experiment_id: str) -> str:
        if experiment_id not in self._experiments:
            try:
                self._experiments[experiment_id] = jm.mlflow_client.get_experiment(
                    experiment_id
                ).name
            except Exception:
                return experiment_id
        return self._experiments[experiment_id]

    def job_model(
        self,
        info: JobInfo,
        metrics: dict[str, float],
        experiment: str,
        trials: list[dict[str, Any]] | None = None,
        trials_total: int | None = None,
    ) -> JobModel:
        """The panel's view of one job.

        Keys: ``id``, ``name``, ``owner``, ``experiment``, ``state``, ``step``,
        ``throughput`` (samples/s or tokens/s, ``throughput_unit``), ``utilization`` (%,
        ``utilization_kind`` ``GPU`` or ``CPU``), ``cost_usd`` and ``cost`` (text),
        ``ettr`` (0..1), ``checkpoint_step``, ``restarts``, ``resumes``, ``started`` and
        ``ended`` (s since the epoch), ``run_url`` (direct), ``run_link`` (through this
        server's proxy), ``detail`` (error, stop or waiting reason), ``waiting`` (a PENDING
        job's reason in a few words, :func:`~jupyter_trainfactory.jobstate.waiting_line`;
        empty otherwise), ``history`` (recent
        ``[t, throughput, utilization]`` points), ``trials`` (a sweep's trial rows,
        :func:`~jupyter_trainfactory.sweeps.leaderboard.panel_trials`; None for a job) and
        ``trials_total`` (the trials the sweep will run; a sweep's ``step`` is None: its
        trials have steps). Values not recorded are None.
        """
        throughput, unit = _throughput(metrics)
        utilization, kind = _utilization(metrics)
        history = self._history.setdefault(info.job_id, deque(maxlen=HISTORY_POINTS))
        now = time.time()
        live = info.state not in TERMINAL_STATES
        fresh = not history or now - history[-1][0] >= 1.0
        if live and fresh and (throughput is not None or utilization is not None):
            history.append([round(now, 3), throughput, utilization])
        return {
            "id": info.job_id,
            "name": info.name,
            "owner": info.owner,
            "experiment": experiment,
            "state": info.state,
            "step": info.step,  # None for a sweep (jobstate.job_info): its trials have steps
            "throughput": throughput,
            "throughput_unit": unit,
            "utilization": utilization,
            "utilization_kind": kind,
            "cost_usd": metrics.get("cost/usd"),
            "cost": info.cost,
            "ettr": metrics.get("goodput/ettr"),
            "checkpoint_step": info.checkpoint_step,
            "restarts": info.restarts,
            "resumes": info.resumes,
            "started": info.started,
            "ended": info.ended,
            "run_url": info.run_url,
            "run_link": (
                f"{self.base_url}trainfactory/proxy/mlflow/#/experiments/"
                f"{info.experiment_id}/runs/{info.run_id}?{tracking.UI_QUERY}"
            ),
            "detail": info.error or info.reason or info.stall,
            "waiting": (
                waiting_line(info.reason, info.waiting) if info.state == JobState.PENDING else ""
            ),
            "history": [list(p) for p in history],
            "trials": trials,
            "trials_total": trials_total,
        }

    def _read_jobs(self, all_users: bool, limit: int) -> list[JobModel]:

        jm = self._job_manager()
        try:
            runs = runreads.search_job_runs(
                jm.mlflow_client, None if all_users else current_owner(), max_results=limit
            )
        except Exception as exc:
            raise ServiceUnavailable(_outage("MLflow", jm.tracking_uri, exc)) from exc
        return [
            self.job_model(
                jm.run_info(run),
                runreads.current_metrics(run),
                self._experiment_name(jm, run.info.experiment_id),
                *_trials(jm, run),
            )
            for run in runs
        ]

    def _read_job(self, job_id: str) -> JobModel:
        jm = self._job_manager()
        run = jm.find_run(job_id)  # JobNotFound for an unknown id
        return self.job_model(
            jm.run_info(run),
            runreads.current_metrics(run),
            self._experiment_name(jm, run.info.experiment_id),
            *_trials(jm, run),
        )

    # -- the REST verbs -------------------------------------------------------------
    async def list_jobs(self, all_users: bool = False, limit: int = 100) -> list[JobModel]:
        """Jobs newest first: the current user's, or everyone's with ``all_users``."""
        return await self._cached(
            ("jobs", all_users, limit), lambda: self._read_jobs(all_users, limit)
        )

    async def get_job(self, job_id: str) -> JobModel:
        """One job; raises JobNotFound for an unknown id."""
        return await self._cached(("job", job_id), lambda: self._read_job(job_id))

    async def stop_job(self, job_id: str, now: bool = False) -> JobModel:
        """Stop a job after its next checkpoint (``now``: at once); the job's model after."""

        def stop() -> JobModel:
            self._job_manager().stop(job_id, now=now)
            return self._read_job(job_id)

        self._forget()
        try:
            return await self._run(stop, timeout_s=self.timeout_s + (60 if now else 0))
        finally:
            self._forget()

    async def resume_job(self, job_id: str) -> JobModel:
        """Resume a STOPPED or FAILED job from its latest checkpoint; SpecError otherwise.
        A job that saved no checkpoint starts over as a new job: the model is the new
        job's, with ``started_over_from`` (the panel asked first and says so)."""

        def resume() -> JobModel:
            job = self._job_manager().resume(job_id, notice=lambda line: None)
            return self._read_job(job.id)

        self._forget()
        try:
            return await self._run(resume, timeout_s=self.timeout_s + 60)
        finally:
            self._forget()

    async def reliability(self, since_text: str, since: float | None) -> ReliabilityModel:
        """The fleet's reliability summary of the jobs (everyone's) started since ``since``
        (s since the epoch; None: all of them), ``since_text`` as the user wrote it:
        ``{"since_text", **ReliabilityReport.summary()}``. Shared for
        :data:`RELIABILITY_TTL_S` per ``since_text``; ServiceUnavailable without services."""

        def read() -> ReliabilityModel:
            from ..fleet.report import reliability_report

            report = reliability_report(self._job_manager(), since=since)
            return {"since_text": since_text, **report.summary()}

        return await self._cached(
            ("reliability", since_text), read, RELIABILITY_TTL_S, RELIABILITY_TIMEOUT_S
        )

    def services_model(self) -> ServicesModel:
        """Services state and links: ``services`` (rows of ``services.describe`` with a
        ``link`` through this server), ``running`` (all needed services up), ``embedded``."""
        rows = []
        if self.address is None or self.tracking_uri is None:
            rows = svc.describe()
            for row in rows:
                name = "ray" if row["service"].startswith("Ray") else "mlflow"
                row["name"] = name
                row["link"] = f"{self.base_url}trainfactory/proxy/{name}/"
        for name, url in (("ray", self.address), ("mlflow", self.tracking_uri)):
            if url is not None:
                rows = [r for r in rows if r.get("name") != name]
                title = "Ray cluster" if name == "ray" else "MLflow server"
                rows.append(
                    {
                        "service": title,
                        "name": name,
                        "state": "remote",
                        "address": url,
                        "ui": url,
                        "link": f"{self.base_url}trainfactory/proxy/{name}/",
                    }
                )
        return {
            "services": rows,
            "running": all(r["state"] in ("running", "remote") for r in rows),
            "embedded": self.address is None or self.tracking_uri is None,
            "state_dir": str(svc.state_dir()),
        }

    async def services(self) -> ServicesModel:
        return await self._cached("services", self.services_model)

    async def start_services(self) -> ServicesModel:
        """Start (or reuse) the embedded Ray head and MLflow server; up to 180 s."""

        def start() -> ServicesModel:
            svc.ensure_services(ray=self.address is None, mlflow=self.tracking_uri is None)
            return self.services_model()

        self._forget()
        try:
            return await self._run(start, timeout_s=180)
        finally:
            self._forget()

    def service_target(self, name: str) -> tuple[str, dict[str, str]]:
        """Base URL of service ``name`` (``ray`` or ``mlflow``) and the headers it needs.

        The Ray dashboard's header carries the token :func:`~..raytoken.find_token` finds
        (where ``jupyter trainfactory cluster --token-file`` keeps it, among others).
        Raises ServiceUnavailable when it is not configured or not running."""
        url = self.address if name == "ray" else self.tracking_uri
        headers: dict[str, str] = {}
        services = svc.load_services()
        if url is None:
            proc = services.processes.get(name) if services else None
            if proc is None or not proc.alive():
                raise ServiceUnavailable(f"The local {name} service is not running.")
            url = services.dashboard_url if name == "ray" else services.tracking_uri
        if name == "ray":  # the one token lookup: the embedded head's file, or the cluster's
            embedded = services.token_path if self.address is None and services else ""
            headers = cluster_headers(url.rstrip("/"), embedded)
        return url.rstrip("/"), headers

    def warm_up(self) -> None:
        """Import the MLflow and Ray clients in the background, so the panel's first
        answer does not wait for them (several seconds on a busy machine)."""

        def imports() -> None:
            import mlflow.tracking  # noqa: F401
            import ray.job_submission  # noqa: F401

        self._executor.submit(imports)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def given_or_running(name: str, running: set[str], manager: TrainingJobsManager) -> bool:
    """Whether service ``name`` is configured remotely or runs locally."""
    given = manager.address if name == "ray" else manager.tracking_uri
    return given is not None or name in running


def _trials(jm: JobManager, run) -> tuple[list[dict[str, Any]] | None, int | None]:
    """A sweep's trial rows for the panel (one search for its children) and the trials it
    runs in all; ``(None, None)`` for a job."""
    if tracking.TAG.SWEEP not in run.data.tags:
        return None, None
    from ..sweeps.leaderboard import panel_trials, planned_trials

    rows = panel_trials(run, runreads.sweep_children(jm.mlflow_client, run))
    return rows, max(planned_trials(run), len(rows))


def _outage(what: str, where: str, exc: BaseException) -> str:
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
    return f"Cannot reach {what} at {where}: {first}"


def _throughput(metrics: dict[str, float]) -> tuple[float | None, str]:
    """Latest tokens/s if the job reports tokens, else samples/s."""
    for key, unit in (("train/tokens_per_s", "tokens/s"), ("train/samples_per_s", "samples/s")):
        if key in metrics:
            return metrics[key], unit
    return None, ""


def _utilization(metrics: dict[str, float]) -> tuple[float | None, str]:
    """Mean GPU utilization (%) over the job's GPUs, else mean CPU utilization over its nodes."""
    if "system/cluster/gpu_utilization_mean" in metrics:
        return metrics["system/cluster/gpu_utilization_mean"], "GPU"
    cpu = [v for k, v in metrics.items() if fnmatch.fnmatch(k, "system/*/cpu_utilization")]
    if cpu:
        return sum(cpu) / len(cpu), "CPU"
    return None, ""
