"""``%train``: launch and control Ray Train jobs from a notebook (thin: parse -> spec -> manager)."""

from __future__ import annotations

import ast
import os
import re
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class, no_var_expand
from IPython.display import display
from traitlets import Float, Unicode
from traitlets.config import Configurable

from . import api
from .arguments import (
    CommandError,
    HelpShown,
    build_parser,
    config_from_args,
    datasets_from_args,
    help_text,
    parse,
    spec_from_args,
)
from .commands import (
    chaos_text,
    cluster_text,
    costs_text,
    default_job,
    first_line,
    format_status,
    format_table,
    gc_text,
    health_text,
    is_service_error,
    poc_from_args,
    register_from_args,
    register_text,
    reliability_text,
    services_text,
    split_inputs,
    still_running_text,
    stop_text,
    sweep_from_args,
)
from .datasets import check_datasets
from .jobs import JobNotFound
from .services import ServiceError
from .spec import SpecError
from .trainers import is_torch_trainer, trainer_parts

__all__ = ["TrainMagics", "expand_variables"]

_USER_ERRORS = (CommandError, SpecError, JobNotFound, ServiceError, TimeoutError)
_DOLLAR_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


def _dollar_value(path: str, user_ns: dict[str, Any]) -> str:
    """``$name`` or ``$name.attr``: the value as text; attributes are taken while they
    exist, the rest stays text (``$stem.txt``); raises CommandError for an undefined name."""
    head, *attrs = path.split(".")
    if head not in user_ns:
        raise CommandError(
            f"${head} names no notebook variable; define {head!r} first (or write $${head}"
            f" for a literal ${head})."
        )
    value, rest = user_ns[head], ""
    for i, attr in enumerate(attrs):
        if not hasattr(value, attr):
            rest = "." + ".".join(attrs[i:])
            break
        value = getattr(value, attr)
    return f"{value}{rest}"


def _brace_value(inner: str, user_ns: dict[str, Any]) -> str | None:
    """``{expr}``: the value of ``expr`` as text; None when ``inner`` is no expression
    (a dict display such as ``'epochs': 2``), a set display (``a, b``), or fails."""
    text = inner.strip()
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        return None
    if isinstance(tree.body, ast.Tuple) and not text.startswith("("):
        return None
    try:
        return str(eval(compile(tree, "<%train line>", "eval"), user_ns))  # noqa: S307
    except Exception:
        return None


def _group_end(line: str, start: int) -> int | None:
    """The index of the ``}`` closing the ``{`` at ``start`` (nested braces counted)."""
    depth = 0
    for i in range(start, len(line)):
        depth += {"{": 1, "}": -1}.get(line[i], 0)
        if depth == 0:
            return i
    return None


def expand_variables(line: str, user_ns: dict[str, Any], braces: bool = True) -> str:
    """Expand notebook variables in a ``%train`` line, each on its own.

    ``$name`` (and ``$name.attr``) becomes the variable's text, except inside single
    quotes; ``$$`` is a literal ``$``. ``{expr}`` becomes the value of ``expr`` when it is
    a Python expression that evaluates in ``user_ns``; any other brace group, such as the
    dict literal of ``--config "{'epochs': n}"``, stays as written (its ``$name`` expanded)
    for the option to evaluate. ``{{`` and ``}}`` are literal braces.

    Raises
    ------
    CommandError
        a ``$name`` names no variable of ``user_ns``.
    """
    out, i, quote = [], 0, ""
    while i < len(line):
        c = line[i]
        if c == "\\" and quote != "'" and i + 1 < len(line):
            out.append(line[i : i + 2])  # kept for shlex; \$ stays a literal $
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        elif c == "$" and quote != "'":
            if line.startswith("$$", i):
                out.append("$")
                i += 2
                continue
            match = _DOLLAR_NAME.match(line, i + 1)
            if match:
                out.append(_dollar_value(match.group(), user_ns))
                i = match.end()
                continue
        elif braces and line.startswith(("{{", "}}"), i):
            out.append(c)
            i += 2
            continue
        elif braces and c == "{" and (end := _group_end(line, i)) is not None:
            value = _brace_value(line[i + 1 : end], user_ns)
            group = line[i : end + 1]
            out.append(value if value is not None else expand_variables(group, user_ns, False))
            i = end + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


@magics_class
class TrainMagics(Magics, Configurable):
    """The ``%train`` line magic.

    Examples
    --------
    In [1]: %load_ext jupyter_trainfactory
    In [2]: job = %train launch train --workers 2 --config "{'epochs': 5}"
    In [3]: train_ds = ray.data.read_csv("/data/train.csv")
    In [4]: job = %train launch train_func --dataset train=train_ds --dataset-config split=train
    In [5]: job = %train launch trainer --workers 1   # a TorchTrainer; --workers overrides
    In [6]: %train status
    In [7]: %train logs --tail 20
    In [8]: %train stop
    In [9]: %train resume
    In [10]: %train register --name digits --alias champion --model-fn build_model
    In [11]: %train costs --by owner --since 7d
    In [12]: %train reliability --since 30d --by cluster --html report.html
    In [13]: %train health
    In [14]: report = %train poc --quick             # prove the cluster: one job, one report
    """

    address = Unicode("", help="Ray dashboard / Jobs API URL; empty: the local head.").tag(
        config=True
    )
    tracking_uri = Unicode("", help="MLflow tracking URI; empty: the local server.").tag(
        config=True
    )
    storage = Unicode("", help="Ray Train storage path; empty: the local default.").tag(config=True)
    experiment = Unicode("trainfactory", help="Default MLflow experiment.").tag(config=True)
    price_catalog = Unicode(
        "", help="TOML price catalog; empty: prices.toml in the state directory, else examples."
    ).tag(config=True)
    dashboard_interval = Float(2.0, help="Seconds between dashboard polls.").tag(config=True)

    def __init__(self, shell=None, **kwargs):
        Configurable.__init__(self, config=shell.config if shell is not None else None)
        Magics.__init__(self, shell=shell, **kwargs)
        self._parser = build_parser("%train")
        self._last_job: str | None = None
        self._dashboards: dict[str, Any] = {}

    # -- helpers ----------------------------------------------------------------
    def _defaults(self) -> dict[str, Any]:
        return {
            "address": self.address or None,
            "tracking_uri": self.tracking_uri or None,
            "storage": self.storage or None,
            "experiment": self.experiment,
            "price_catalog": self.price_catalog or None,
        }

    def _manager(self, ns):
        d = self._defaults()
        return api.get_manager(
            getattr(ns, "address", None) or d["address"],
            getattr(ns, "tracking_uri", None) or d["tracking_uri"],
            d["storage"],
        )

    def _job_id(self, ns) -> str:
        """The job of a subcommand: the one named, else this kernel's last, else (after a
        kernel restart) the user's only running job, said in one line."""
        if ns.job:
            return ns.job
        if self._last_job is not None:
            return self._last_job
        if ns.command in ("resume", "register"):  # meant for an ended job: no guessing
            raise CommandError(
                f"No job launched from this kernel yet; give a job id, as in"
                f" %train {ns.command} JOB (see %train list)."
            )
        job_id, note = default_job(self._manager(ns).list(), ns.command)
        print(note)
        self._last_job = job_id
        return job_id

    def _source(self) -> str:
        ns = self.shell.user_ns if self.shell is not None else {}
        return os.environ.get("JPY_SESSION_NAME") or str(ns.get("__session__", "")) or ""

    def _show(self, job) -> None:
        old = self._dashboards.pop(job.id, None)
        if old is not None:
            old.close()
        board = job.dashboard()
        board.interval_s = self.dashboard_interval
        self._dashboards[job.id] = board
        display(board)

    # -- the magic ----------------------------------------------------------------
    @no_var_expand  # IPython drops every expansion when one brace group fails: ours is per group
    @line_magic
    def train(self, line: str):
        """Launch and control Ray Train jobs. ``%train help`` lists the subcommands;
        ``$name`` and ``{expr}`` in the line are notebook variables (:func:`expand_variables`)."""
        try:
            user_ns = self.shell.user_ns if self.shell is not None else {}
            ns = parse(expand_variables(line, user_ns), self._parser)
            return getattr(self, f"_cmd_{ns.command}")(ns)
        except HelpShown:  # argparse printed the help of -h
            return None
        except _USER_ERRORS as exc:
            raise UsageError(str(exc)) from None
        except Exception as exc:
            if not is_service_error(exc):
                raise
            raise UsageError(f"A service did not answer: {first_line(exc)}") from None

    def _cmd_help(self, ns) -> None:
        print(help_text(self._parser, ns.topic))

    def _function(self, name: str, what: str):
        user_ns = self.shell.user_ns
        if name not in user_ns:
            raise CommandError(
                f"{name!r} is not defined in this notebook; define the {what} first."
            )
        fn = user_ns[name]
        if not callable(fn):
            raise CommandError(f"{name!r} is a {type(fn).__name__}, not a function.")
        return fn

    def _inputs(self, items: list[str]) -> dict[str, Any]:
        """``--input NAME=DATA``: a notebook variable when DATA names one, else a path or URI."""
        user_ns, inputs = self.shell.user_ns, {}
        for name, value in split_inputs(items).items():
            if value.isidentifier() and value in user_ns:
                inputs[name] = user_ns[value]
            elif value.isidentifier() and not os.path.exists(value):
                raise CommandError(
                    f"--input {name}={value}: no notebook variable or file is named {value!r}."
                )
            else:
                inputs[name] = value
        return inputs

    def _launch_target(self, name: str):
        """FUNC, or a TorchTrainer: ``(function, its name, trainer's TrainerParts or None)``."""
        user_ns = self.shell.user_ns
        if name not in user_ns:
            raise CommandError(
                f"{name!r} is not defined in this notebook; define the training function"
                " (or TorchTrainer) first."
            )
        target = user_ns[name]
        if callable(target) and not is_torch_trainer(target):
            return target, name, None
        parts = trainer_parts(target, name)  # SpecError: neither a function nor a TorchTrainer
        return parts.fn, getattr(parts.fn, "__name__", name), parts

    def _cmd_launch(self, ns):
        user_ns = self.shell.user_ns
        fn, fn_name, trainer = self._launch_target(ns.target)
        model_fn = self._function(ns.model_fn, "model_fn") if ns.model_fn else None
        inputs = self._inputs(ns.inputs)
        config = config_from_args(ns.config, user_ns)
        datasets = datasets_from_args(ns.datasets, user_ns)
        spec = spec_from_args(
            ns,
            fn_name if fn_name.isidentifier() else ns.target,
            config,
            self._source(),
            self._defaults(),
            trainer=trainer.options if trainer else None,
        )
        if trainer is not None:
            datasets = {**trainer.datasets, **datasets}  # --dataset NAME replaces the trainer's
        check_datasets(datasets, spec.dataset_config)  # before any service starts
        manager = self._manager(ns)
        job = manager.submit(fn, spec, inputs=inputs, model_fn=model_fn, datasets=datasets)
        self._last_job = job.id
        note = self._still_running(manager, job.id, spec.run_name)
        if note:
            print(note)
        self._show(job)
        return job

    @staticmethod
    def _still_running(manager, job_id: str, name: str) -> str:
        """The line naming the user's other running jobs of this name ("" if none)."""
        try:
            jobs = manager.list()
        except Exception as exc:  # the job is started: a failed listing only loses the note
            if not (is_service_error(exc) or isinstance(exc, _USER_ERRORS)):
                raise
            return ""
        return still_running_text(jobs, job_id, name)

    def _cmd_status(self, ns) -> None:
        info = self._manager(ns).info(self._job_id(ns))
        print(format_status(info))

    def _cmd_list(self, ns) -> None:
        jobs = self._manager(ns).list(all_users=ns.all)
        rows = [j.as_row() for j in jobs]
        for r in rows:
            r["detail"] = r["detail"][:60]
        print(format_table(rows))

    def _cmd_logs(self, ns) -> None:
        manager, job_id = self._manager(ns), self._job_id(ns)
        if not ns.follow:
            print(manager.logs(job_id, tail=ns.tail, rank=ns.rank))
            return
        try:
            state = manager.follow_logs(job_id, rank=ns.rank, write=lambda t: print(t, flush=True))
            print(f"--- {job_id}: {state} ---")
        except KeyboardInterrupt:  # the notebook's stop button: stop following, quietly
            print(f"--- stopped following {job_id} (the job goes on) ---")

    def _cmd_sweep(self, ns):
        fn = self._function(ns.target, "training function")
        config = config_from_args(ns.config, self.shell.user_ns)
        name = getattr(fn, "__name__", ns.target)
        spec = spec_from_args(ns, name, config, self._source(), self._defaults())
        model_fn = self._function(ns.model_fn, "model_fn") if ns.model_fn else None
        job = sweep_from_args(ns, self._manager(ns), fn, spec, model_fn=model_fn)
        self._last_job = job.id
        self._show(job)
        if ns.wait:
            job.wait()
        return job

    def _cmd_resume(self, ns):
        job = self._manager(ns).resume(
            self._job_id(ns), max_failures=ns.max_failures, budget=ns.budget
        )
        self._last_job = job.id
        self._show(job)
        if ns.wait:
            job.wait()
        return job

    def _cmd_chaos(self, ns) -> None:
        job_id = self._job_id(ns)
        killed = self._manager(ns).chaos(
            job_id, rank=ns.kill_worker, node=ns.kill_node, trial=ns.trial
        )
        print(chaos_text(job_id, killed))

    def _cmd_stop(self, ns) -> None:
        info = self._manager(ns).stop(self._job_id(ns), now=ns.now, grace_s=ns.grace)
        print(stop_text(info, ns.now, ns.grace))

    def _cmd_attach(self, ns):
        job = api.attach(
            self._job_id(ns),
            getattr(ns, "address", None) or self._defaults()["address"],
            getattr(ns, "tracking_uri", None) or self._defaults()["tracking_uri"],
        )
        self._last_job = job.id
        self._show(job)
        return job

    def _cmd_register(self, ns) -> dict:
        model_fn = self._function(ns.model_fn, "model_fn") if ns.model_fn else None
        version = register_from_args(self._manager(ns), self._job_id(ns), ns, model_fn)
        print(register_text(version))
        return version

    def _cmd_costs(self, ns) -> None:
        print(costs_text(self._manager(ns), ns))

    def _cmd_reliability(self, ns):
        text, report = reliability_text(self._manager(ns), ns)
        print(text)
        if report.jobs:
            from IPython.display import display

            from .dashboard.plots import _plot_class
            from .fleet.views import figure

            display(_plot_class()(figure(report)))
        return report

    def _cmd_gc(self, ns) -> None:
        from .models import collect_garbage

        report = collect_garbage(self._manager(ns), ns.experiment, ns.keep, all_users=ns.all)
        print(gc_text(report, ns.keep))

    def _cmd_cluster(self, ns) -> None:
        print(cluster_text(self._manager, ns))

    def _cmd_health(self, ns):
        d = self._defaults()
        manager = api.get_manager(
            ns.address or d["address"],
            ns.tracking_uri or d["tracking_uri"],
            ns.storage or d["storage"],
        )
        text, report = health_text(manager, ns)
        print(text)
        return report

    def _cmd_poc(self, ns):
        from IPython.display import HTML, display

        from .poc.html import report_html

        d = self._defaults()
        fn = self._function(ns.fn, "training function") if ns.fn else None
        fn_config = config_from_args(ns.config, self.shell.user_ns) if ns.config else None
        out = poc_from_args(
            ns,
            ns.address or d["address"],
            ns.tracking_uri or d["tracking_uri"],
            ns.storage or d["storage"],
            on_launch=self._show,
            fn=fn,
            fn_config=fn_config,
        )
        if isinstance(out, str):  # --compare
            print(out)
            return None
        display(HTML(report_html(out)))
        print(f"report: {out.html_path}")
        return out

    def _cmd_services(self, ns) -> None:
        # A cached manager notices stopped services itself (api.get_manager).
        print(services_text(ns.action))
