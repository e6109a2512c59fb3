"""The ``train`` subcommands, shared by the ``%train`` magic and ``jupyter trainfactory``.

Both doors parse with :func:`build_parser`, build a :class:`~.spec.JobSpec` with
:func:`spec_from_args` and talk to a :class:`~.jobs.JobManager`; they differ only in
how they print and whether they show a widget.
"""

from __future__ import annotations

import argparse
import difflib
import shlex
import time
from typing import Any

from .accelerators import ACCELERATORS
from .chargeback import GROUPS, SORT_KEYS
from .jobstate import TERMINAL_STATES
from .spec import ON_STALL, PLACEMENTS, JobSpec, parse_pairs

__all__ = [
    "CommandError",
    "HelpShown",
    "build_parser",
    "chaos_text",
    "cluster_text",
    "costs_text",
    "default_job",
    "gc_text",
    "register_from_args",
    "register_text",
    "split_inputs",
    "first_line",
    "format_status",
    "format_table",
    "help_text",
    "is_service_error",
    "parse",
    "services_text",
    "spec_from_args",
    "still_running_text",
]


class CommandError(Exception):
    """Bad command-line input; the message is one sentence for the user."""


class HelpShown(Exception):  # noqa: N818 (a signal, not an error)
    """``-h`` / ``help`` printed the help text; nothing else to do."""


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)  # `--worker 2` must not mean --workers
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse would print usage and sys.exit(2)
        sub = self.prog.rsplit(" ", 1)[-1] if " " in self.prog else ""
        raise CommandError(f"{sub}: {message}" if sub and sub != "trainfactory" else message)

    def exit(self, status: int = 0, message: str | None = None):
        if status == 0:
            raise HelpShown()
        raise CommandError(message.strip() if message else "exited")


def _add_target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--address", help="Ray dashboard / Jobs API URL (default: local head)")
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: local server)")


def build_parser(prog: str = "%train", launch_target: str = "FUNC") -> argparse.ArgumentParser:
    """The parser of every subcommand; errors raise :class:`CommandError` (never exit)."""
    parser = _Parser(prog=prog, description="Launch, watch and control Ray Train jobs.")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)

    launch = sub.add_parser("launch", help="start a training job")
    launch.add_argument(
        "target", metavar=launch_target, help="the training function: takes one config dict"
    )
    launch.add_argument("--workers", type=int, default=2, help="Ray Train workers (ranks)")
    launch.add_argument("--cpus-per-worker", type=float, default=1.0)
    launch.add_argument(
        "--gpus-per-worker",
        "--accelerators-per-worker",
        dest="gpus_per_worker",
        type=float,
        default=0.0,
        help="accelerators (GPUs, NPUs or HPUs, by --accelerator) each worker uses",
    )
    launch.add_argument(
        "--accelerator",
        choices=list(ACCELERATORS),
        help="gpu, npu, hpu or cpu (default: gpu with --gpus-per-worker, else cpu)",
    )
    launch.add_argument(
        "--resources",
        action="append",
        default=[],
        metavar="NAME=AMOUNT",
        help="a custom Ray resource each worker reserves (repeat for more)",
    )
    launch.add_argument(
        "--placement",
        choices=list(PLACEMENTS),
        default="pack",
        help="pack (default: fewest nodes), spread, strict-pack (one node) or strict-spread",
    )
    launch.add_argument(
        "--label-selector",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Ray node label the workers' nodes must have: VALUE, !VALUE, in(A,B) (repeat for more)",
    )
    launch.add_argument(
        "--max-failures", type=int, default=0, help="worker-failure restarts (-1: unlimited)"
    )
    launch.add_argument(
        "--max-preemptions", type=int, default=-1, help="preemption restarts (-1: unlimited)"
    )
    launch.add_argument(
        "--keep-checkpoints", type=int, default=2, metavar="N", help="checkpoints kept (>= 1)"
    )
    launch.add_argument(
        "--keep-best", metavar="METRIC:max|min", help="keep the best checkpoints by a metric"
    )
    launch.add_argument("--config", metavar="EXPR", help="Python expression for the config dict")
    launch.add_argument("--experiment", help="MLflow experiment (default: trainfactory)")
    launch.add_argument("--run-name", help="MLflow run name (default: the function's name)")
    launch.add_argument("--working-dir", help="directory shipped to every worker")
    launch.add_argument(
        "--pip",
        nargs="+",
        action="extend",
        default=[],
        metavar="REQ",
        help="pip requirements installed for the job",
    )
    launch.add_argument(
        "--env",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        help="environment variables of the job",
    )
    launch.add_argument("--storage", help="Ray Train storage path (shared by all nodes)")
    launch.add_argument(
        "--peak-tflops",
        type=float,
        metavar="TFLOPS",
        help="peak dense TFLOP/s of one accelerator for MFU (default: looked up by GPU name)",
    )
    launch.add_argument(
        "--flops-per-token",
        type=float,
        metavar="FLOPS",
        help="training FLOPs per token (default: 6N + attention, from the model)",
    )
    launch.add_argument(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="a job with no step or report for this long is stalled (default: off)",
    )
    launch.add_argument(
        "--on-stall",
        choices=ON_STALL,
        default="warn",
        help="on a stall: warn (default), restart from the checkpoint, or stop",
    )
    launch.add_argument(
        "--budget",
        type=float,
        metavar="AMOUNT",
        help="stop gracefully before the cost passes this (price catalog's currency)",
    )
    launch.add_argument(
        "--price-catalog", metavar="PATH", help="TOML prices (default: the example prices)"
    )
    launch.add_argument("--spot", action="store_true", help="workers on spot capacity")
    launch.add_argument("--project", help="chargeback group (team, grant) for costs --by project")
    launch.add_argument(
        "--target-steps",
        type=int,
        metavar="N",
        help="the step the job should reach: the dashboard projects its cost to it",
    )
    launch.add_argument(
        "--input",
        dest="inputs",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=DATA",
        help="declare training data (a path, a URI or a variable) for lineage",
    )
    launch.add_argument(
        "--model-fn",
        metavar="FUNC",
        help="function(checkpoint_dir) -> model, kept for register",
    )
    launch.add_argument("--wait", action="store_true", help="block until the job ends")
    _add_target(launch)

    resume = sub.add_parser(
        "resume", help="continue a stopped or failed job from its latest good checkpoint"
    )
    resume.add_argument("job", nargs="?", metavar="JOB", help="job id (default: the latest)")
    resume.add_argument(
        "--max-failures", type=int, help="a new worker-failure budget for this submission"
    )
    resume.add_argument("--wait", action="store_true", help="block until the job ends")
    _add_target(resume)

    chaos = sub.add_parser("chaos", help="fault injection: kill a running job's worker or node")
    chaos.add_argument("job", nargs="?", metavar="JOB", help="job id (default: the latest)")
    what = chaos.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--kill-worker",
        type=int,
        nargs="?",
        const=-1,
        metavar="RANK",
        help="kill the worker process of this rank (default: the last rank)",
    )
    what.add_argument(
        "--kill-node",
        metavar="NODE",
        help="kill every worker process of the job on this node (IP or node id)",
    )
    _add_target(chaos)

    register = sub.add_parser(
        "register", help="register a job's checkpoint in the MLflow Model Registry"
    )
    register.add_argument("job", nargs="?", metavar="JOB", help="job id (default: the latest)")
    register.add_argument("--name", required=True, help="registered model name")
    register.add_argument(
        "--checkpoint", choices=["latest", "best"], default="latest", help="which checkpoint"
    )
    register.add_argument("--metric", help="with --checkpoint best: the metric to rank by")
    register.add_argument(
        "--mode", choices=["max", "min"], help="with --checkpoint best: is higher better (max)?"
    )
    register.add_argument("--alias", help="alias for the new version (e.g. champion)")
    register.add_argument(
        "--model-fn", metavar="FUNC", help="function(checkpoint_dir) -> model (default: launch's)"
    )
    _add_target(register)

    costs = sub.add_parser("costs", help="cost report over jobs, with totals for chargeback")
    costs.add_argument("--experiment", help="only this experiment's jobs")
    costs.add_argument("--since", metavar="DATE", help="jobs started since (2026-11-01, 7d, 12h)")
    costs.add_argument("--by", choices=GROUPS, help="totals per owner, experiment or project")
    costs.add_argument("--owner", help="only this owner's jobs (default: everyone's)")
    costs.add_argument("--sort", choices=SORT_KEYS, default="started", help="order of the rows")
    costs.add_argument("--csv", metavar="PATH", help="also write the rows to a CSV file")
    _add_target(costs)

    gc = sub.add_parser("gc", help="delete checkpoints of finished jobs beyond --keep")
    gc.add_argument("--experiment", help="only this experiment's jobs")
    gc.add_argument("--keep", type=int, default=1, metavar="N", help="newest kept per job (1)")
    gc.add_argument("--all", action="store_true", help="everyone's jobs, not only yours")
    _add_target(gc)

    for name, text in (
        ("status", "state of a job"),
        ("attach", "dashboard of a job"),
        ("stop", "stop a job after its next checkpoint (--now: at once)"),
    ):
        p = sub.add_parser(name, help=text)
        if name == "stop":
            p.add_argument("--now", action="store_true", help="stop at once, without a checkpoint")
            p.add_argument(
                "--grace",
                type=float,
                default=300.0,
                metavar="SECONDS",
                help="stop hard if no checkpoint comes within this time (default 300)",
            )
        p.add_argument("job", nargs="?", metavar="JOB", help="job id (default: the latest)")
        _add_target(p)
    logs = sub.add_parser("logs", help="a job's driver log")
    logs.add_argument("job", nargs="?", metavar="JOB")
    logs.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    logs.add_argument(
        "--rank", type=int, metavar="R", help="one worker's log instead of the driver's"
    )
    logs.add_argument(
        "--follow", "-f", action="store_true", help="keep printing new lines until the job ends"
    )
    _add_target(logs)
    lst = sub.add_parser("list", help="jobs, newest first")
    lst.add_argument("--all", action="store_true", help="everyone's jobs, not only yours")
    _add_target(lst)
    cluster = sub.add_parser(
        "cluster", help="a cluster's versions, nodes, resources and labels; keep its token"
    )
    cluster.add_argument(
        "--token-file",
        metavar="FILE",
        help="keep this token (a file; - reads it from stdin) for --address's cluster",
    )
    _add_target(cluster)
    services = sub.add_parser("services", help="the local Ray head and MLflow server")
    services.add_argument("action", nargs="?", choices=["show", "start", "stop"], default="show")
    helper = sub.add_parser("help", help="this help, or a subcommand's")
    helper.add_argument("topic", nargs="?", metavar="SUBCOMMAND")
    return parser


def help_text(parser: argparse.ArgumentParser, topic: str | None = None) -> str:
    """The help of the whole command, or of one subcommand (``help launch``)."""
    if topic:
        for action in parser._subparsers._group_actions:  # argparse keeps them here
            if topic in action.choices:
                return action.choices[topic].format_help()
        raise CommandError(f"No subcommand {topic!r}; see the list with help.")
    return parser.format_help()


def parse(
    line: str | list[str], parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """Parse a magic line (or argv); raises :class:`CommandError` with one sentence."""
    parser = parser or build_parser()
    try:
        argv = shlex.split(line) if isinstance(line, str) else list(line)
    except ValueError as exc:
        raise CommandError(f"Cannot parse the line: {exc}.") from exc
    ns, extra = parser.parse_known_args(argv) if argv else (None, [])
    if extra:
        raise CommandError(_unrecognized_text(parser, ns, extra))
    if ns is None or ns.command is None:
        raise CommandError(
            "Give a subcommand: launch, status, list, logs, stop, resume, chaos, attach,"
            " register, costs, gc or services."
        )
    if getattr(ns, "workers", 1) is not None and ns.command == "launch" and ns.workers < 1:
        raise CommandError(f"--workers must be at least 1, got {ns.workers}.")
    return ns


#: Options whose value is a Python expression (a dict literal): unquoted, it splits at spaces.
_LITERAL_OPTIONS = {"config": "--config"}


def _literal_piece(text: str) -> bool:
    """Whether ``text`` looks like a piece of a dict or list literal cut at a space."""
    return any(c in text for c in "{}[]") or text.endswith((":", ","))


def _unrecognized_text(parser: argparse.ArgumentParser, ns, extra: list[str]) -> str:
    """One sentence for arguments no option took: an unquoted literal, a misspelt or
    abbreviated option (with the closest real one), or the leftovers as argparse says."""
    command = getattr(ns, "command", None)
    sub = parser._subparsers._group_actions[0].choices.get(command) if command else None
    where = f"{command}: " if sub is not None else ""
    for dest, option in _LITERAL_OPTIONS.items():
        value = getattr(ns, dest, None)
        if value is None:
            continue
        unbalanced = sum(value.count(c) for c in "{[(") != sum(value.count(c) for c in "}])")
        if unbalanced or any(_literal_piece(arg) for arg in extra):
            return (
                f"{where}the {option} value must be quoted as one argument, as in"
                f" {option} \"{{'lr': 0.01}}\" (unquoted, its spaces split it and left"
                f" over: {' '.join(extra)})."
            )
    options = [o for o in (sub or parser)._option_string_actions if o.startswith("--")]
    for arg in extra:
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            close = [o for o in options if o.startswith(name)]  # an abbreviation
            close = close or difflib.get_close_matches(name, options, n=1, cutoff=0.6)
            if close:
                return (
                    f"{where}{name} is not an option (options are never abbreviated);"
                    f" did you mean {' or '.join(sorted(close))}?"
                )
    return f"{where}unrecognized arguments: {' '.join(extra)}"


def spec_from_args(
    ns: argparse.Namespace,
    function_name: str,
    config: dict[str, Any],
    source: str,
    defaults: dict[str, Any] | None = None,
) -> JobSpec:
    """A validated JobSpec from parsed ``launch`` options (``defaults`` fill unset ones)."""
    defaults = defaults or {}
    return JobSpec(
        function_name=function_name,
        workers=ns.workers,
        cpus_per_worker=ns.cpus_per_worker,
        gpus_per_worker=ns.gpus_per_worker,
        accelerator=ns.accelerator,
        resources=parse_pairs(ns.resources, "--resources"),
        placement=ns.placement,
        label_selector=parse_pairs(ns.label_selector, "--label-selector"),
        max_failures=ns.max_failures,
        max_preemptions=ns.max_preemptions,
        keep_checkpoints=ns.keep_checkpoints,
        keep_best=ns.keep_best,
        config=config,
        experiment=ns.experiment or defaults.get("experiment") or "trainfactory",
        run_name=ns.run_name or "",
        working_dir=ns.working_dir,
        pip=ns.pip,
        env=ns.env,
        address=ns.address or defaults.get("address"),
        tracking_uri=ns.tracking_uri or defaults.get("tracking_uri"),
        storage=ns.storage or defaults.get("storage"),
        source=source,
        peak_tflops=ns.peak_tflops,
        flops_per_token=ns.flops_per_token,
        stall_timeout=ns.stall_timeout,
        on_stall=ns.on_stall,
        budget=ns.budget,
        price_catalog=ns.price_catalog or defaults.get("price_catalog"),
        spot=ns.spot,
        project=ns.project or "",
        target_steps=ns.target_steps,
    )


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
    """What ``register`` prints: the new version and how to load it."""
    alias = f" (alias {version['alias']})" if version["alias"] else ""
    return (
        f"registered {version['name']} version {version['version']}{alias} from the checkpoint"
        f" of step {version['step']}; load it with mlflow.pyfunc.load_model({version['uri']!r})"
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
        lines.append(
            f"{'fault':>10}: {when} {r.get('kind', 'failure')} at step {r.get('step_reached')},"
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


def format_table(rows: list[dict[str, str]]) -> str:
    """Plain-text table with a header row, columns padded to their widest cell."""
    if not rows:
        return "(none)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


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
