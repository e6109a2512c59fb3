"""The embedded default: a local Ray head and a local MLflow server, started on demand.

Both run as their own processes (new sessions), so a job outlives the kernel that
launched it, and a second kernel or process reuses them. Everything they keep lives
under one state directory (:func:`state_dir`).

Two optional environment variables size the Ray head (read when it is started; unset or
empty keeps Ray's own defaults: every CPU, and an object store of about 30 % of memory):

``TRAINFACTORY_RAY_NUM_CPUS``
    CPUs the head offers (``ray start --num-cpus``), a whole number, at least 1.
``TRAINFACTORY_RAY_OBJECT_STORE_MB``
    Size of the object store in MiB (``ray start --object-store-memory``, passed in
    bytes), a whole number, at least 75 (Ray's minimum).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import hashlib
import json
import os
import secrets
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import platformdirs
import psutil

__all__ = [
    "ServiceError",
    "ServiceProcess",
    "Services",
    "ensure_services",
    "load_services",
    "state_dir",
    "stop_services",
]

STATE_ENV = "TRAINFACTORY_HOME"
NUM_CPUS_ENV = "TRAINFACTORY_RAY_NUM_CPUS"
OBJECT_STORE_ENV = "TRAINFACTORY_RAY_OBJECT_STORE_MB"
#: Ray refuses an object store under 75 MiB (``OBJECT_STORE_MINIMUM_MEMORY_BYTES``).
_MIN_OBJECT_STORE_MB = 75
HOST = "127.0.0.1"
#: Worker processes of the MLflow server: two, so that a report's parallel reads of
#: the fleet's runs (``runreads.search_job_runs_sliced``) are served at once while a
#: job's recorder writes; SQLite in WAL mode lets readers and one writer go together.
MLFLOW_WORKERS = 2
#: Seconds an MLflow server worker may leave uvicorn's health check unanswered before its
#: supervisor kills it (uvicorn's ``--timeout-worker-healthcheck``, 5 s by default). On a
#: small machine under load (a job's workers, its recorder and a notebook on two cores) a
#: busy worker missed the 5 s, was killed, and the request it was serving ended in
#: "Connection reset by peer"; a worker that is really hung is still replaced.
MLFLOW_HEALTHCHECK_TIMEOUT_S = 60
#: Ray refuses Unix socket paths longer than 107 bytes (``sockaddr_un.sun_path``);
#: its session directory adds about 70 bytes below ``--temp-dir``.
_MAX_RAY_TEMP_DIR = 36
_START_TIMEOUT_S = 120.0


class ServiceError(RuntimeError):
    """A local service could not be started, reached or stopped."""


@dataclass
class ServiceProcess:
    """One process this tool started: enough to find it again and to stop only it."""

    name: str
    pid: int
    create_time: float  # psutil's process start time, s since the epoch
    url: str
    log: str

    def alive(self) -> bool:
        """Whether this very process (same pid *and* start time) still runs."""
        try:
            proc = psutil.Process(self.pid)
            return (
                abs(proc.create_time() - self.create_time) < 1e-3
                and proc.status() != psutil.STATUS_ZOMBIE
            )
        except psutil.Error:
            return False


@dataclass
class Services:
    """Addresses of the embedded services.

    Attributes
    ----------
    ray_address : str
        GCS address ``127.0.0.1:PORT`` (for ``ray.init``).
    dashboard_url : str
        Ray dashboard and Jobs API, ``http://127.0.0.1:PORT``.
    tracking_uri : str
        MLflow tracking server, ``http://127.0.0.1:PORT``.
    storage_path : str
        Default Ray Train storage path for checkpoints.
    token_path : str
        This cluster's Ray auth token file (mode 0600).
    """

    home: str
    ray_address: str = ""
    dashboard_url: str = ""
    tracking_uri: str = ""
    storage_path: str = ""
    token_path: str = ""
    processes: dict[str, ServiceProcess] = field(default_factory=dict)

    def client_env(self) -> dict[str, str]:
        """Environment every Ray client of this cluster needs (token authentication)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": self.token_path}

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> Services:
        data = json.loads(text)
        procs = {k: ServiceProcess(**v) for k, v in data.pop("processes", {}).items()}
        return cls(**data, processes=procs)


def state_dir() -> Path:
    """The state directory: ``$TRAINFACTORY_HOME`` or the platform's user data dir."""
    env = os.environ.get(STATE_ENV)
    path = (
        Path(env).expanduser() if env else Path(platformdirs.user_data_dir("jupyter_trainfactory"))
    )
    path.mkdir(parents=True, exist_ok=True)
    return path.resolve()


def _state_file(home: Path) -> Path:
    return home / "services.json"


@contextlib.contextmanager
def _locked(home: Path):
    """Serialise start/stop across kernels and processes sharing one state directory."""
    with open(home / "services.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _http_ok(url: str, token_path: str | None = None, timeout: float = 2.0) -> bool:
    headers = {}
    if token_path:
        headers["Authorization"] = "Bearer " + Path(token_path).read_text().strip()
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=timeout
        ) as resp:  # noqa: S310 (loopback)
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _ray_temp_dir(home: Path) -> Path:
    """A short Ray ``--temp-dir``: inside the state dir when short enough, else under /tmp."""
    candidate = home / "ray"
    if len(str(candidate)) > _MAX_RAY_TEMP_DIR:
        digest = hashlib.sha256(str(home).encode()).hexdigest()[:8]
        candidate = Path("/tmp") / f"tf-ray-{digest}"
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


def _write_token(home: Path) -> Path:
    path = home / "ray_auth_token"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def _tool(name: str) -> str:
    """A console script of the running interpreter's environment (``ray``, ``mlflow``)."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _log_error(path: str) -> str:
    """The last line of a service's log that names an error (else its last line), as
    :func:`sentences.first_line` shortens it: the one clause a start failure's sentence quotes."""
    from .sentences import first_line

    lines = [ln for ln in _log_tail(path, 60).splitlines() if ln.strip()]
    named = [ln for ln in lines if "error" in ln.lower() or "exception" in ln.lower()]
    return first_line((named or lines or ["its log is empty"])[-1], 160)


def _spawn(name: str, argv: list[str], env: dict[str, str], log: Path, url: str) -> ServiceProcess:
    with open(log, "ab") as out:
        proc = subprocess.Popen(  # noqa: S603
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    return ServiceProcess(name, proc.pid, psutil.Process(proc.pid).create_time(), url, str(log))


def _env_int(environ: Mapping[str, str], name: str, minimum: int, what: str) -> int | None:
    """A whole number from ``environ[name]``, None when unset or empty."""
    raw = environ.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ServiceError(
            f"{name} must be a whole number of {what}, at least {minimum} (got {raw!r})."
        )
    return value


def _ray_head_argv(
    home: Path, gcs_port: int, dash_port: int, ports: dict[str, int], environ: Mapping[str, str]
) -> list[str]:
    """The ``ray start --head`` command line, sized by ``TRAINFACTORY_RAY_*`` in ``environ``.

    Raises
    ------
    ServiceError
        When ``TRAINFACTORY_RAY_NUM_CPUS`` or ``TRAINFACTORY_RAY_OBJECT_STORE_MB`` is not
        a whole number or is below its minimum (1 CPU, 75 MiB).
    """
    num_cpus = _env_int(environ, NUM_CPUS_ENV, 1, "CPUs")
    store_mb = _env_int(environ, OBJECT_STORE_ENV, _MIN_OBJECT_STORE_MB, "MiB")
    argv = [
        _tool("ray"),
        "start",
        "--head",
        "--block",
        "--disable-usage-stats",
        f"--node-ip-address={HOST}",
        f"--port={gcs_port}",
        "--dashboard-host",
        HOST,
        f"--dashboard-port={dash_port}",
        "--include-dashboard=true",
        f"--temp-dir={_ray_temp_dir(home)}",
    ]
    argv += [f"{k}={v}" for k, v in ports.items()]
    if num_cpus is not None:
        argv.append(f"--num-cpus={num_cpus}")
    if store_mb is not None:
        argv.append(f"--object-store-memory={store_mb * 1024 * 1024}")
    return argv


def _start_ray(home: Path, token: Path) -> tuple[ServiceProcess, str, str]:
    """Start the Ray head, sized by ``TRAINFACTORY_RAY_*`` (see the module's docstring).

    A bad value raises :class:`ServiceError` before anything is started.
    """
    gcs_port, dash_port = _free_port(), _free_port()
    ports = {
        "--ray-client-server-port": _free_port(),
        "--dashboard-agent-listen-port": _free_port(),
        "--dashboard-agent-grpc-port": _free_port(),
        "--runtime-env-agent-port": _free_port(),
        "--metrics-export-port": _free_port(),
    }
    argv = _ray_head_argv(home, gcs_port, dash_port, ports, os.environ)
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(token),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    env.pop("RAY_ADDRESS", None)
    dashboard = f"http://{HOST}:{dash_port}"
    proc = _spawn("ray", argv, env, home / "ray-head.log", dashboard)
    return proc, f"{HOST}:{gcs_port}", dashboard


def _prepare_sqlite(db: Path) -> None:
    """Create the MLflow database in WAL mode (persistent in the file) so readers never block the writer."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")


def _start_mlflow(home: Path) -> ServiceProcess:
    root = home / "mlflow"
    (root / "artifacts").mkdir(parents=True, exist_ok=True)
    db = root / "mlflow.db"
    _prepare_sqlite(db)
    port = _free_port()
    argv = [
        _tool("mlflow"),
        "server",
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        str(MLFLOW_WORKERS),
        "--uvicorn-opts",
        f"--timeout-worker-healthcheck {MLFLOW_HEALTHCHECK_TIMEOUT_S}",
        "--backend-store-uri",
        f"sqlite:///{db}",
        "--artifacts-destination",
        str(root / "artifacts"),
    ]
    env = {**os.environ, "MLFLOW_LOGGING_LEVEL": "WARNING"}
    return _spawn("mlflow", argv, env, home / "mlflow-server.log", f"http://{HOST}:{port}")


def _wait_ready(proc: ServiceProcess, probe: str, deadline: float, token: str | None) -> None:
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ServiceError(
                f"The {proc.name} service exited during start ({_log_error(proc.log)});"
                f" its log is {proc.log}."
            )
        if _http_ok(probe, token):
            return
        time.sleep(0.5)
    raise ServiceError(
        f"The {proc.name} service did not answer at {probe} within "
        f"{_START_TIMEOUT_S:.0f} s; see {proc.log}."
    )


def load_services(home: Path | None = None) -> Services | None:
    """The recorded services of a state directory, or None. Does not check that they run."""
    home = home or state_dir()
    try:
        return Services.from_json(_state_file(home).read_text())
    except (OSError, ValueError, TypeError):
        return None


def _export(services: Services) -> None:
    """Make every Ray client of this process authenticate to this cluster.

    Ray reads its auth mode and token when it is first imported, so a process that
    imported ``ray`` before the services were known (a training file that starts with
    ``import ray.train``) must refresh Ray's config and token cache after the export.
    """
    os.environ.update(services.client_env())
    if "ray" not in sys.modules:
        return  # Ray will read the variables when it is imported
    try:
        from ray._raylet import (
            AuthenticationMode,
            AuthenticationTokenLoader,
            Config,
            get_authentication_mode,
        )
    except ImportError:  # a Ray without token authentication
        return
    if get_authentication_mode() != AuthenticationMode.TOKEN:
        Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def ensure_services(ray: bool = True, mlflow: bool = True) -> Services:
    """Start, or reuse, the local Ray head and MLflow server.

    Parameters
    ----------
    ray, mlflow : bool
        Which of the two services are needed.

    Returns
    -------
    Services
        Addresses of running services. The Ray token variables are also exported to
        ``os.environ`` so that every Ray client of this process authenticates.

    Raises
    ------
    ServiceError
        When a service exits during start or does not answer within 120 s.
    """
    home = state_dir()
    with _locked(home):
        services = load_services(home) or Services(home=str(home))
        services.home = str(home)
        services.storage_path = str(home / "storage")
        Path(services.storage_path).mkdir(exist_ok=True)
        started: list[tuple[ServiceProcess, str]] = []
        current = services.processes
        if ray and not (current.get("ray") and current["ray"].alive()):
            token = _write_token(home)
            proc, gcs, dashboard = _start_ray(home, token)
            services.ray_address, services.dashboard_url = gcs, dashboard
            services.token_path = str(token)
            current["ray"] = proc
            started.append((proc, f"{dashboard}/api/version"))
        if mlflow and not (current.get("mlflow") and current["mlflow"].alive()):
            proc = _start_mlflow(home)
            services.tracking_uri = proc.url
            current["mlflow"] = proc
            started.append((proc, f"{proc.url}/health"))
        deadline = time.monotonic() + _START_TIMEOUT_S
        try:
            for proc, probe in started:
                _wait_ready(
                    proc, probe, deadline, services.token_path if proc.name == "ray" else None
                )
        except ServiceError:
            for proc, _ in started:
                _terminate(proc)
                current.pop(proc.name, None)
            _state_file(home).write_text(services.to_json())
            raise
        _state_file(home).write_text(services.to_json())
    if ray:  # a remote cluster keeps the user's own Ray auth settings
        _export(services)
    return services


#: How long the processes a service started may outlive it before they are killed (s).
_ORPHAN_GRACE_S = 2.0


def _terminate(proc: ServiceProcess, timeout: float = 30.0) -> bool:
    """SIGTERM this process (checked by pid and start time), SIGKILL after ``timeout`` s;
    then SIGKILL what it had started and left running after :data:`_ORPHAN_GRACE_S` s
    (Ray 2.60's ``RuntimeEnvAgent`` outlives ``ray start --block`` and ignores SIGTERM).
    Only that process's own descendants, as listed before the SIGTERM (psutil checks
    each one's start time, so a reused pid is not touched)."""
    if not proc.alive():
        return False
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    os.kill(proc.pid, signal.SIGTERM)
    try:
        psutil.Process(proc.pid).wait(timeout)
    except psutil.TimeoutExpired:
        if proc.alive():
            os.kill(proc.pid, signal.SIGKILL)
    except psutil.NoSuchProcess:
        pass
    _, left = psutil.wait_procs(family, timeout=_ORPHAN_GRACE_S)
    for child in left:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(left, timeout=_ORPHAN_GRACE_S)
    return True


def stop_services(names: tuple[str, ...] = ("ray", "mlflow")) -> list[str]:
    """Stop the services this tool started (only those, by pid and start time).

    Returns the names of the services that were running and are now stopped.
    """
    home = state_dir()
    stopped: list[str] = []
    with _locked(home):
        services = load_services(home)
        if services is None:
            return stopped
        procs = [(n, p) for n in names if (p := services.processes.pop(n, None)) is not None]
        # side by side: each may take up to its SIGKILL timeout (the Ray head often does)
        with concurrent.futures.ThreadPoolExecutor(max(len(procs), 1)) as pool:
            ended = list(pool.map(lambda item: _terminate(item[1]), procs))
        stopped = [name for (name, _), done in zip(procs, ended, strict=True) if done]
        _state_file(home).write_text(services.to_json())
    return stopped


def describe(services: Services | None = None) -> list[dict[str, str]]:
    """Rows for ``%train services``: name, state, pid, address and UI URL of each service."""
    services = services if services is not None else load_services()
    rows = []
    for name, title in (("ray", "Ray head"), ("mlflow", "MLflow server")):
        proc = services.processes.get(name) if services else None
        running = bool(proc and proc.alive())
        address = ""
        if services and name == "ray":
            address = services.ray_address
        elif services:
            address = services.tracking_uri
        rows.append(
            {
                "service": title,
                "state": "running" if running else "stopped",
                "pid": str(proc.pid) if running else "-",
                "address": address if running else "-",
                "ui": (proc.url if running else "-"),
                "log": proc.log if proc else "-",
            }
        )
    return rows
