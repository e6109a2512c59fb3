"""The ``train`` subcommands' arguments: one parser for the ``%train`` magic and the
``jupyter trainfactory`` command, and the JobSpec of a parsed ``launch``.

``launch``'s job options are generated from the JobSpec fields (:func:`~.spec.launch_options`),
so a new field with its option is a new option of both doors; errors raise
:class:`CommandError` (one sentence), never ``SystemExit``.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
from typing import Any

from .chargeback import GROUPS, SORT_KEYS
from .fleet.report import GROUPS as RELIABILITY_GROUPS
from .spec import JobSpec, cli_default, launch_options
from .trainers import merge_options

__all__ = [
    "CommandError",
    "HelpShown",
    "build_parser",
    "config_from_args",
    "datasets_from_args",
    "help_text",
    "parse",
    "spec_from_args",
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


def _add_spec_options(
    parser: argparse.ArgumentParser, shared: bool, only: tuple[str, ...] = ()
) -> None:
    """The JobSpec's options: those of ``launch`` (``shared=False``; ``only`` these fields
    when given), or those every subcommand has (``--address``, ``--tracking-uri``)."""
    for spec_field, option in launch_options():
        if option.shared == shared and (not only or spec_field.name in only):
            parser.add_argument(
                *option.flags,
                dest=spec_field.name,
                default=cli_default(spec_field, option),
                **option.kwargs,
            )


def _add_target(parser: argparse.ArgumentParser) -> None:
    _add_spec_options(parser, shared=True)


def build_parser(prog: str = "%train", launch_target: str = "FUNC") -> argparse.ArgumentParser:
    """The parser of every subcommand; errors raise :class:`CommandError` (never exit).

    ``launch_target`` is the metavar of launch's function (``FUNC`` in a notebook,
    ``FILE.py:FUNC`` on the command line)."""
    parser = _Parser(prog=prog, description="Launch, watch and control Ray Train jobs.")
    sub = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    _add_launch(sub, launch_target)
    _add_resume(sub)
    _add_chaos(sub)
    _add_register(sub)
    _add_reports(sub)
    _add_job_views(sub)
    _add_cluster(sub)
    _add_poc(sub)
    _add_sweep(sub, launch_target)
    return parser


def _add_launch(sub, launch_target: str) -> None:
    launch = sub.add_parser("launch", help="start a training job")
    launch.add_argument(
        "target",
        metavar=launch_target,
        help="the training function (takes one config dict), or a ray.train.torch.TorchTrainer"
        " whose loop, configs and datasets the job takes (options given override them)",
    )
    _add_spec_options(launch, shared=False)
    launch.add_argument(
        "--dataset",
        dest="datasets",
        action="append",
        default=[],
        metavar="NAME=EXPR",
        help="a Ray Data dataset for ray.train.get_dataset_shard(NAME): EXPR is a Python"
        " expression giving a Dataset or a function of no arguments returning one, built"
        " in the job's driver (quote it: --dataset train=\"ray.data.read_csv('d.csv')\")",
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


def _add_resume(sub) -> None:
    resume = sub.add_parser(
        "resume", help="continue a stopped or failed job from its latest good checkpoint"
    )
    resume.add_argument("job", nargs="?", metavar="JOB", help="job id (default: the latest)")
    resume.add_argument(
        "--max-failures", type=int, help="a new worker-failure budget for this submission"
    )
    resume.add_argument(
        "--budget",
        type=float,
        metavar="AMOUNT",
        help="a new cost budget for the whole job or sweep, what it spent included",
    )
    resume.add_argument("--wait", action="store_true", help="block until the job ends")
    _add_target(resume)


def _add_chaos(sub) -> None:
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
        help="kill every worker process of the job on this node (IP, node id, or its label"
        " in the dashboard's node table)",
    )
    chaos.add_argument(
        "--trial",
        type=int,
        metavar="N",
        help="a sweep's trial N (its index in the leaderboard): the kill is in its workers",
    )
    _add_target(chaos)


def _add_register(sub) -> None:
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


def _add_reports(sub) -> None:
    """``costs`` and ``gc``: reports over many jobs."""
    costs = sub.add_parser("costs", help="cost report over jobs, with totals for chargeback")
    costs.add_argument("--experiment", help="only this experiment's jobs")
    costs.add_argument("--since", metavar="DATE", help="jobs started since (2026-11-01, 7d, 12h)")
    costs.add_argument("--by", choices=GROUPS, help="totals per owner, experiment or project")
    costs.add_argument("--owner", help="only this owner's jobs (default: everyone's)")
    costs.add_argument("--sort", choices=SORT_KEYS, default="started", help="order of the rows")
    costs.add_argument("--csv", metavar="PATH", help="also write the rows to a CSV file")
    _add_target(costs)

    rel = sub.add_parser(
        "reliability", help="failure rate, MTBF, MTTR and ETTR over everyone's jobs"
    )
    rel.add_argument("--since", metavar="DATE", default="30d", help="jobs started since (30d)")
    rel.add_argument("--until", metavar="DATE", help="jobs started before (default: now)")
    rel.add_argument("--experiment", help="only this experiment's jobs")
    rel.add_argument("--by", choices=RELIABILITY_GROUPS, help="one row per value")
    rel.add_argument("--csv", metavar="PATH", help="also write one row per job to a CSV file")
    rel.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    _add_target(rel)

    gc = sub.add_parser("gc", help="delete checkpoints of finished jobs beyond --keep")
    gc.add_argument("--experiment", help="only this experiment's jobs")
    gc.add_argument("--keep", type=int, default=1, metavar="N", help="newest kept per job (1)")
    gc.add_argument("--all", action="store_true", help="everyone's jobs, not only yours")
    _add_target(gc)


def _add_job_views(sub) -> None:
    """``status``, ``attach``, ``stop``, ``logs`` and ``list``."""
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


def _add_cluster(sub) -> None:
    """``cluster``, ``health``, ``services`` and ``help``."""
    cluster = sub.add_parser(
        "cluster", help="a cluster's versions, nodes, resources and labels; keep its token"
    )
    health = sub.add_parser(
        "health", help="check every node (GPUs by NVML, memory, disk) before a job uses it"
    )
    health.add_argument(
        "--storage", metavar="PATH", help="the job storage path to check (default: the target's)"
    )
    health.add_argument(
        "--timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="how long each node's checks may take (default 30)",
    )
    _add_target(health)
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


def _add_poc(sub) -> None:
    poc = sub.add_parser(
        "poc", help="prove a cluster: compute, collectives, training, checkpoints, recovery"
    )
    poc.add_argument("--workers", type=int, default=2, metavar="N", help="workers (default 2)")
    poc.add_argument(
        "--gpus-per-worker", type=float, default=0.0, metavar="G", help="GPUs per worker (0: CPU)"
    )
    poc.add_argument(
        "--cpus-per-worker", type=float, default=1.0, metavar="C", help="CPUs per worker (1)"
    )
    poc.add_argument(
        "--storage", metavar="PATH", help="job storage to measure (default: the target's)"
    )
    poc.add_argument(
        "--thresholds", metavar="FILE", help="a TOML file of bounds (default: shipped)"
    )
    poc.add_argument("--quick", action="store_true", help="every stage small: under 3 minutes")
    poc.add_argument(
        "--checkpoint-mb", type=float, metavar="MB", help="checkpoint size (default: the model's)"
    )
    poc.add_argument("--html", metavar="PATH", help="also write the HTML report here")
    poc.add_argument(
        "--fn",
        metavar="FUNC",
        help="your training function for the training and recovery stages (default: a"
        " reference transformer); it is killed 5 steps after its first checkpoint",
    )
    poc.add_argument("--config", metavar="DICT", help="--fn's config, as launch --config")
    _add_spec_options(poc, shared=False, only=("resources", "placement"))  # as launch's
    poc.add_argument(
        "--compare", nargs=2, metavar=("RUN_A", "RUN_B"), help="two poc reports side by side"
    )
    _add_target(poc)


def _add_sweep(sub, launch_target: str) -> None:
    sweep = sub.add_parser("sweep", help="search hyperparameters with Ray Tune, one job per trial")
    sweep.add_argument("target", metavar=launch_target, help="the training function")
    sweep.add_argument(
        "--param",
        dest="params",
        action="append",
        default=[],
        metavar="NAME=SPACE",
        help="a config key and its Ray Tune search space: lr=loguniform(1e-4,1e-1),"
        " hidden=choice(32,64,128), seed=grid(1,2); repeat for each",
    )
    sweep.add_argument("--trials", type=int, default=8, metavar="N", help="trials (default 8)")
    sweep.add_argument(
        "--concurrent", type=int, default=2, metavar="K", help="trials at once (default 2)"
    )
    sweep.add_argument("--metric", metavar="KEY", help="the reported key to optimize")
    sweep.add_argument("--mode", default="min", choices=("min", "max"), help="min (default) or max")
    sweep.add_argument(
        "--scheduler",
        default="asha",
        metavar="asha|fifo",
        help="asha (default) stops bad trials early",
    )
    sweep.add_argument(
        "--search", default="random", metavar="random|grid|optuna", help="how trials are chosen"
    )
    sweep.add_argument(
        "--grace-period", type=int, default=1, metavar="R", help="ASHA: reports before a cut (1)"
    )
    sweep.add_argument(
        "--reduction-factor",
        type=int,
        default=2,
        metavar="ETA",
        help="ASHA: keep 1/ETA per rung (2)",
    )
    _add_spec_options(sweep, shared=False)
    sweep.add_argument(
        "--model-fn", metavar="FUNC", help="function(checkpoint_dir) -> model, kept for register"
    )
    sweep.add_argument("--wait", action="store_true", help="block until the sweep ends")
    _add_target(sweep)


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
        argv = _join_calls(shlex.split(line)) if isinstance(line, str) else list(line)
    except ValueError as exc:
        raise CommandError(f"Cannot parse the line: {exc}.") from exc
    ns, extra = parser.parse_known_args(argv) if argv else (None, [])
    if extra:
        raise CommandError(_unrecognized_text(parser, ns, extra))
    if ns is None or ns.command is None:
        raise CommandError(
            "Give a subcommand: launch, status, list, logs, stop, resume, chaos, attach,"
            " register, costs, reliability, gc, cluster, health, poc, sweep or services."
        )
    launching = ns.command in ("launch", "sweep")
    if getattr(ns, "workers", 1) is not None and launching and ns.workers < 1:
        raise CommandError(f"--workers must be at least 1, got {ns.workers}.")
    return ns


_CALL = re.compile(r"^[\w.]+=[\w.]+\(")


def _join_calls(argv: list[str]) -> list[str]:
    """A magic line's words with a call that spaces split joined again: ``--param
    lr=loguniform(3e-4,`` ``3e-2)`` is one ``lr=loguniform(3e-4, 3e-2)``, as a user writes
    Python. A ``NAME=FUNCTION(`` word that opens more parentheses than it closes takes
    the next words until they balance (or the line ends); no other word is touched."""
    out: list[str] = []
    depth = 0
    for word in argv:
        inside = depth > 0
        if inside:
            out[-1] = f"{out[-1]} {word}"
        else:
            out.append(word)
        if inside or _CALL.match(word):
            depth = max(depth + word.count("(") - word.count(")"), 0)
    return out


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


def config_from_args(text: str | None, namespace: dict[str, Any]) -> dict[str, Any]:
    """The dict ``--config`` gives: ``text`` evaluated in ``namespace`` (the notebook's, or
    the function's module on the command line); ``{}`` without one. Raises CommandError
    (one sentence) when it fails or gives something other than a dict."""
    if not text:
        return {}
    try:
        config = eval(text, namespace)  # noqa: S307 (the user's own expression)
    except Exception as exc:
        raise CommandError(f"--config {text!r} failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(config, dict):
        raise CommandError(f"--config must give a dict, got {type(config).__name__}.")
    return config


def datasets_from_args(items: list[str], namespace: dict[str, Any]) -> dict[str, Any]:
    """The datasets ``--dataset NAME=EXPR`` gives: each EXPR evaluated in ``namespace``
    (the notebook's, or the function's module on the command line), in order; ``{}``
    without one. Raises CommandError (one sentence) for an item without ``NAME=``, a name
    given twice, or an EXPR that fails; what it gives is checked at submission
    (``datasets.check_datasets``)."""
    datasets: dict[str, Any] = {}
    for item in items or []:
        name, sep, text = str(item).partition("=")
        name = name.strip()
        if not sep or not name.isidentifier() or not text.strip():
            raise CommandError(f"--dataset takes NAME=EXPR, got {item!r}.")
        if name in datasets:
            raise CommandError(f"--dataset {name} is given twice.")
        try:
            datasets[name] = eval(text, namespace)  # noqa: S307 (the user's own expression)
        except Exception as exc:
            detail = (str(exc).strip().splitlines() or [""])[0]
            raise CommandError(
                f"--dataset {name}={text} failed: {type(exc).__name__}: {detail}"
            ) from None
    return datasets


def spec_from_args(
    ns: argparse.Namespace,
    function_name: str,
    config: dict[str, Any],
    source: str,
    defaults: dict[str, Any] | None = None,
    trainer: dict[str, Any] | None = None,
) -> JobSpec:
    """A validated JobSpec from parsed ``launch`` options.

    ``config`` is the evaluated ``--config``; ``defaults`` (``{"experiment": ...}``) fill
    the session options the line leaves unset, and an option still unset (None) takes
    the JobSpec's default. ``trainer`` (``trainers.TrainerParts.options``) fills the
    options the line leaves at their default (``trainers.merge_options``). Raises
    SpecError (one sentence)."""
    defaults = defaults or {}
    values: dict[str, Any] = {}
    for spec_field, option in launch_options():
        value = getattr(ns, spec_field.name)
        if option.session:
            value = value or defaults.get(spec_field.name) or None
        if value is not None:
            values[spec_field.name] = value
    values["config"] = config
    if trainer:
        unset = {f.name: cli_default(f, o) for f, o in launch_options()}
        values = merge_options(trainer, values, {**unset, "config": {}})
    return JobSpec(function_name=function_name, source=source, **values)
