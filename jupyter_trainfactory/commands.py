"""What the ``train`` subcommands print, shared by the ``%train`` magic and ``jupyter trainfactory``.

Both doors parse with :func:`~.arguments.build_parser`, build a :class:`~.spec.JobSpec`
with :func:`~.arguments.spec_from_args` and talk to a :class:`~.jobs.JobManager`; the
texts here are what they print, so they differ only in how they print and whether they
show a widget.
"""

from __future__ import annotations

import argparse
import time

from .arguments import CommandError
from .jobstate import TERMINAL_STATES
from .redact import mask_url
from .tables import format_table

__all__ = [
    "CommandError",
    "chaos_text",
    "cluster_text",
    "costs_text",
    "reliability_text",
    "default_job",
    "gc_text",
    "health_text",
    "poc_from_args",
    "sweep_from_args",
    "register_from_args",
    "register_text",
    "split_inputs",
    "first_line",
    "format_status",
    "format_table",
    "is_service_error",
    "services_text",
    "still_running_text",
]


def split_inputs(items: list[str]) -> dict[str, str]:
    """``["train=data/train", ...]`` -> ``{"train": "data/train"}``; raises CommandError."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier() or not value:
            raise CommandError(f"--input takes NAME=DATA (a path, URI or variable), got {item!r}.")
        out[name] = value
    return out


def _job_text(info) -> str:
    step = "" if info.step is None else f", step {info.step}"
    return f"{info.job_id} ({info.name}, {info.state}{step})"


def default_job(jobs: list, command: str, prog: str = "%train") -> tuple[str, str]:
    """The job a bare ``command`` means when this kernel launched none (after a restart).

    ``jobs`` are the user's :class:`~.jobs.JobInfo`, newest first (``JobManager.list``).
    Returns the id of the one job still going (PENDING, RUNNING or RESTARTING) and the
    line that says it was picked; raises :class:`CommandError` naming the candidates when
    several are going, and pointing to ``list`` when none is.
    """
    live = [j for j in jobs if j.state not in TERMINAL_STATES]
    if len(live) == 1:
        return live[0].job_id, (
            f"No job launched from this kernel yet: using {_job_text(live[0])},"
            " your only running job."
        )
    if not live:
        raise CommandError(
            "No job launched from this kernel yet and none of yours is running;"
            f" give a job id (see {prog} list)."
        )
    shown = ", ".join(_job_text(j) for j in live[:5]) + (", ..." if len(live) > 5 else "")
    raise CommandError(
        f"No job launched from this kernel yet and {len(live)} of yours are running:"
        f" {shown}; give one, as in {prog} {command} {live[0].job_id}."
    )


def still_running_text(jobs: list, job_id: str, name: str, prog: str = "%train") -> str:
    """The line a launch prints when other jobs of the same name (the same function, by
    default) still run: which, and how to stop them; "" when none does.

    ``jobs`` are :class:`~.jobs.JobInfo` (``JobManager.list``); ``job_id`` is the new job.
    """
    others = [
        j for j in jobs if j.name == name and j.job_id != job_id and j.state not in TERMINAL_STATES
    ]
    if not others:
        return ""
    if len(others) == 1:
        return (
            f"Still running from {name!r} as well: {_job_text(others[0])};"
            f" stop it with {prog} stop {others[0].job_id}."
        )
    return (
        f"Still running from {name!r} as well: {', '.join(_job_text(j) for j in others)};"
        f" stop each with {prog} stop JOB."
    )


def cluster_text(manager_for, ns, stdin=None) -> str:
    """``cluster``: keep the token given with ``--token-file`` for ``--address``, then
    describe the cluster (:func:`~.cluster.summary_text`). ``manager_for(ns)`` gives the
    JobManager of the target."""
    import sys

    import ray

    from .cluster import resolve_address, save_token, summary_text, verify_token

    saved = ""
    if ns.token_file:
        address = resolve_address(ns.address)
        if address is None:
            raise CommandError("--token-file needs --address http://HEAD:8265 (the cluster's).")
        if ns.token_file == "-":
            token = (stdin or sys.stdin).read()
        else:
            try:
                token = open(ns.token_file).read()  # noqa: SIM115
            except OSError as exc:
                raise CommandError(f"Cannot read {ns.token_file}: {exc.strerror}.") from None
        if not token.strip():
            raise CommandError("The token is empty; pass the cluster's token.")
        verify_token(address, token)  # a token the cluster refuses is not kept
        saved = f"token kept in {save_token(address, token)}\n"
    manager = manager_for(ns)
    python = "{}.{}.{}".format(*sys.version_info[:3])
    return saved + summary_text(manager.cluster(settle_s=5.0), ray.__version__, python)


def health_text(manager, ns) -> tuple[str, object]:
    """Run ``health``: every node's checks (:func:`~.nodehealth.node.run_health`) and the
    report's table and verdicts; returns the text and the
    :class:`~.nodehealth.report.HealthReport`."""
    from .nodehealth.node import cluster_health

    report = cluster_health(manager, timeout_s=ns.timeout)
    return report.text(), report


def costs_text(manager, ns) -> str:
    """Run ``costs``: the report, and the CSV file when ``--csv`` was given."""
    from . import chargeback

    rows = chargeback.cost_rows(
        manager, ns.experiment, chargeback.parse_since(ns.since), owner=ns.owner
    )
    rows = chargeback.sort_rows(rows, ns.sort)
    text = chargeback.report_text(rows, ns.by)
    if ns.csv:
        path = chargeback.write_csv(rows, ns.csv)
        text += f"\n{len(rows)} row{'s' if len(rows) != 1 else ''} written to {path}"
    return text


def reliability_text(manager, ns, now: float | None = None) -> tuple[str, object]:
    """Run ``reliability``: the report's text (and the files ``--csv`` / ``--html`` name)
    and the report itself."""
    from .chargeback import parse_since
    from .fleet.report import reliability_report
    from .fleet.views import report_text, write_csv, write_html

    report = reliability_report(
        manager,
        since=parse_since(ns.since),
        until=parse_since(ns.until, "--until"),
        experiment=ns.experiment,
        by=ns.by,
        now=now,
    )
    text = report_text(report)
    if ns.csv:
        text += f"\n{len(report.jobs)} job rows written to {write_csv(report, ns.csv)}"
    if ns.html:
        text += f"\nHTML report written to {write_html(report, ns.html)}"
    return text, report


def _steps(steps: list[int]) -> str:
    return f"step{'s' if len(steps) != 1 else ''} {', '.join(map(str, steps))}"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:.0f} bytes"


def gc_text(report: list[dict], keep: int) -> str:
    """What ``gc`` prints: per job the checkpoints deleted and kept, then the space freed."""
    if not report:
        return (
            f"Nothing to delete: no finished job keeps more than the newest {keep}"
            " checkpoint(s) besides registered ones (those are always kept)."
        )
    lines = [
        f"{r['job']}: deleted the checkpoints of {_steps(r['deleted'])}; kept {_steps(r['kept'])}"
        for r in report
    ]
    lines.append(f"freed {_bytes(sum(r['bytes_freed'] for r in report))}")
    return "\n".join(lines)


def register_from_args(manager, job_id: str, ns: argparse.Namespace, model_fn) -> dict:
    """Run ``register`` with its parsed options (:func:`~.models.register`)."""
    from .models import register

    return register(manager, job_id, ns.name, ns.checkpoint, ns.metric, ns.mode, ns.alias, model_fn)


def register_text(version: dict) -> str:
    """What ``register`` prints: the new version and how to load it (MLflow pointed at
    the registry's server first: the registry is there, not in MLflow's default
    ``./mlruns`` or ``mlflow.db``)."""
    alias = f" (alias {version['alias']})" if version["alias"] else ""
    uri = mask_url(version.get("tracking_uri") or "")
    point = f"import mlflow; mlflow.set_tracking_uri({uri!r}); " if uri else "import mlflow; "
    return (
        f"registered {version['name']} version {version['version']}{alias} from the checkpoint"
        f" of step {version['step']}; load it with"
        f" {point}mlflow.pyfunc.load_model({version['uri']!r})"
    )


def stop_text(info, now: bool, grace_s: float) -> str:
    """What ``stop`` prints: the state, or that the job stops after its next checkpoint."""
    if now or info.state in ("SUCCEEDED", "FAILED", "STOPPED"):
        return f"{info.job_id}: {info.state}"
    return (
        f"{info.job_id}: stop requested; the job stops after its next checkpoint"
        f" (at most {grace_s:g} s from now; `stop --now` stops at once)."
    )


def format_status(info) -> str:
    """``%train status`` text of a :class:`~.jobs.JobInfo`: one ``field: value`` a line,
    then the root cause of the last worker failure (rank, node, error, traceback tail)."""
    row = {**info.as_row(), "mlflow": info.run_url or info.run_id}
    if info.restarts:
        row["restarts"] = str(info.restarts)
    if info.resumes:
        row["resumes"] = str(info.resumes)
    if info.stall:
        row["stall"] = info.stall
    if info.cost:
        row["cost"] = info.cost
    lines = [f"{k:>10}: {v}" for k, v in row.items() if v]
    for r in info.fault_records:  # this submission's failures, oldest first
        when = time.strftime("%H:%M:%S", time.localtime(r.get("time", 0)))
        mttr = "not recovered yet" if r.get("mttr_s") is None else f"MTTR {r['mttr_s']:.1f} s"
        phases = [f"detected after {r['detected'] - r['time']:.1f} s"] if r.get("detected") else []
        if r.get("restored"):
            phases.append(f"stepping again after {r['restored'] - r['time']:.1f} s")
        kind = r.get("kind", "failure") + (" (a drill: injected)" if r.get("drill") else "")
        lines.append(
            f"{'fault':>10}: {when} {kind} at step {r.get('step_reached')},"
            f" restored from step {r.get('restored_step')} ({r.get('steps_lost')} steps lost),"
            f" {', '.join([*phases, mttr])}"
        )
    failure = info.failure_lines()
    if failure:
        lines.append(f"{'failure':>10}: {failure[0]}")
        lines += [f"{'':>10}  {line}" for line in failure[1:]]
    return "\n".join(lines)


def chaos_text(job_id: str, killed: list[dict]) -> str:
    """What ``chaos`` prints: the worker processes it killed."""
    if not killed:
        return f"{job_id}: no worker process was alive to kill."
    done = ", ".join(f"rank {k['rank']} (pid {k['pid']} on {k['node']})" for k in killed)
    return f"{job_id}: killed {done}; Ray Train restarts the workers if --max-failures allows."


def first_line(exc: BaseException) -> str:
    """The first line of an error's message (its type name when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def is_service_error(exc: BaseException) -> bool:
    """MLflow or HTTP errors talking to the tracking server or the Ray dashboard."""
    from mlflow.exceptions import MlflowException
    from requests.exceptions import RequestException

    return isinstance(exc, (MlflowException, RequestException, ConnectionError))


def services_text(action: str) -> str:
    """Do ``services show|start|stop`` on the embedded services; return what to print."""
    from .services import describe, ensure_services, stop_services

    if action == "stop":
        stopped = stop_services()
        return "stopped: " + (", ".join(stopped) if stopped else "nothing was running")
    if action == "start":
        ensure_services()
    return format_table(describe())


def poc_from_args(
    ns, address, tracking_uri, storage, progress=print, on_launch=None, fn=None, fn_config=None
):
    """``poc``: with ``--compare A B`` the two reports side by side (a str); else run the
    proof of concept (:func:`~.api.poc`) with ``fn`` (``--fn``, resolved by the caller)
    called with ``fn_config`` (``--config``) and return its PocReport."""
    from . import api
    from .poc.report import compare_text
    from .poc.run import load_report

    if ns.compare:
        manager = api.get_manager(address, tracking_uri)
        return compare_text(*(load_report(manager, r) for r in ns.compare))
    return api.poc(
        ns.workers,
        ns.gpus_per_worker,
        cpus_per_worker=ns.cpus_per_worker,
        resources=ns.resources,
        placement=ns.placement,
        address=address,
        tracking_uri=tracking_uri,
        storage=storage,
        thresholds=ns.thresholds,
        quick=ns.quick,
        checkpoint_mb=ns.checkpoint_mb,
        html=ns.html,
        fn=fn,
        fn_config=fn_config,
        progress=progress,
        on_launch=on_launch,
    )


def sweep_from_args(ns, manager, fn, spec, notice=print, model_fn=None):
    """``sweep``: the settings from the parsed line, then :func:`~.sweeps.submit_sweep`
    of ``fn`` with ``spec`` (``launch``'s options, from :func:`~.arguments.spec_from_args`);
    returns the sweep's Job. Raises SpecError."""
    from .sweeps import SweepSettings, submit_sweep

    settings = SweepSettings(
        metric=ns.metric or "",
        mode=ns.mode,
        trials=ns.trials,
        concurrent=ns.concurrent,
        scheduler=ns.scheduler,
        search=ns.search,
        grace_period=ns.grace_period,
        reduction_factor=ns.reduction_factor,
    )
    return submit_sweep(manager, fn, spec, ns.params, settings, notice=notice, model_fn=model_fn)
