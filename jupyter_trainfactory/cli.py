"""``jupyter trainfactory <subcommand>``: the same subcommands and options as ``%train``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

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
    stop_text,
    sweep_from_args,
)
from .jobs import JobNotFound
from .services import ServiceError
from .spec import SpecError

__all__ = ["load_function", "main"]

PROG = "jupyter trainfactory"


def load_function(target: str, what: str = "launch"):
    """``path/to/file.py:func`` -> the function, its module shipped by value to the cluster;
    ``what`` (the option or command that takes it) names it in the error."""
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise CommandError(f"{what} takes path/to/file.py:function, got {target!r}.")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise CommandError(f"No such file: {path_text}.")
    module_name = f"_trainfactory_user_{abs(hash(str(path)))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CommandError(f"Importing {path_text} failed: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if fn is None:
        raise CommandError(f"{path_text} defines no {name!r}.")
    if not callable(fn):
        raise CommandError(f"{path_text}:{name} is a {type(fn).__name__}, not a function.")
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)  # the cluster cannot import this file
    return fn, str(path)


def _target(ns) -> dict[str, Any]:
    return {
        "address": getattr(ns, "address", None),
        "tracking_uri": getattr(ns, "tracking_uri", None),
    }


def _job(ns) -> str:
    if not ns.job:
        raise CommandError(f"{ns.command} needs a job id (see `{PROG} list`).")
    return ns.job


def _help(ns) -> int:
    print(help_text(build_parser(PROG, "FILE.py:FUNC"), ns.topic))
    return 0


def _launch(ns) -> int:
    fn, source = load_function(ns.target)
    namespace = vars(sys.modules[fn.__module__])
    config = config_from_args(ns.config, namespace)
    datasets = datasets_from_args(ns.datasets, namespace)
    spec = spec_from_args(ns, fn.__name__, config, source)
    model_fn = load_function(ns.model_fn)[0] if ns.model_fn else None
    job = api.get_manager(ns.address, ns.tracking_uri, ns.storage).submit(
        fn, spec, inputs=split_inputs(ns.inputs), model_fn=model_fn, datasets=datasets
    )
    info = job.info()
    print(f"job {job.id} submitted; MLflow run: {info.run_url or job.run_id}")
    if ns.wait:
        state = job.wait()
        detail = job.info().error if state == "FAILED" else ""
        print(f"job {job.id}: {state}" + (f" ({detail})" if detail else ""))
        return 0 if state == "SUCCEEDED" else 1
    return 0


def _sweep(ns) -> int:
    from .sweeps.leaderboard import leaderboard_text

    fn, source = load_function(ns.target)
    config = config_from_args(ns.config, vars(sys.modules[fn.__module__]))
    spec = spec_from_args(ns, fn.__name__, config, source)
    manager = api.get_manager(ns.address, ns.tracking_uri, ns.storage)
    model_fn = load_function(ns.model_fn)[0] if ns.model_fn else None
    job = sweep_from_args(ns, manager, fn, spec, model_fn=model_fn)
    info = job.info()
    print(f"sweep {job.id} submitted; MLflow run: {info.run_url or job.run_id}")
    if ns.wait:
        state = job.wait()
        print(leaderboard_text(manager.mlflow_client, job.run_id))
        return 0 if state == "SUCCEEDED" else 1
    return 0


def _list(ns) -> int:
    print(format_table([j.as_row() for j in api.get_manager(**_target(ns)).list(all_users=ns.all)]))
    return 0


def _status(ns) -> int:
    print(format_status(api.get_manager(**_target(ns)).info(_job(ns))))
    return 0


def _logs(ns) -> int:
    job_id, manager = _job(ns), api.get_manager(**_target(ns))
    if not ns.follow:
        print(manager.logs(job_id, tail=ns.tail, rank=ns.rank))
        return 0
    try:
        state = manager.follow_logs(job_id, rank=ns.rank, write=lambda t: print(t, flush=True))
    except KeyboardInterrupt:
        return 130
    print(f"--- {job_id}: {state} ---")
    return 0


def _resume(ns) -> int:
    job = api.get_manager(**_target(ns)).resume(
        _job(ns), max_failures=ns.max_failures, budget=ns.budget
    )
    if job.id == _job(ns):  # else it started over as a new job, and resume said so
        print(f"job {job.id} resumed (submission {job.info().submission_id})")
    if ns.wait:
        state = job.wait()
        print(f"job {job.id}: {state}")
        return 0 if state == "SUCCEEDED" else 1
    return 0


def _chaos(ns) -> int:
    job_id = _job(ns)
    killed = api.get_manager(**_target(ns)).chaos(
        job_id, rank=ns.kill_worker, node=ns.kill_node, trial=ns.trial
    )
    print(chaos_text(job_id, killed))
    return 0


def _stop(ns) -> int:
    info = api.get_manager(**_target(ns)).stop(_job(ns), now=ns.now, grace_s=ns.grace)
    print(stop_text(info, ns.now, ns.grace))
    return 0


def _register(ns) -> int:
    job_id = _job(ns)
    model_fn = load_function(ns.model_fn)[0] if ns.model_fn else None
    print(register_text(register_from_args(api.get_manager(**_target(ns)), job_id, ns, model_fn)))
    return 0


def _costs(ns) -> int:
    print(costs_text(api.get_manager(**_target(ns)), ns))
    return 0


def _reliability(ns) -> int:
    print(reliability_text(api.get_manager(**_target(ns)), ns)[0])
    return 0


def _gc(ns) -> int:
    from .models import collect_garbage

    report = collect_garbage(api.get_manager(**_target(ns)), ns.experiment, ns.keep, ns.all)
    print(gc_text(report, ns.keep))
    return 0


def _health(ns) -> int:
    text, report = health_text(api.get_manager(ns.address, ns.tracking_uri, ns.storage), ns)
    print(text)
    return 0 if report.healthy else 1


def _poc(ns) -> int:
    fn = load_function(ns.fn, "poc --fn")[0] if ns.fn else None
    namespace = vars(sys.modules[fn.__module__]) if fn is not None else {}
    fn_config = config_from_args(ns.config, namespace) if ns.config else None
    out = poc_from_args(
        ns,
        ns.address,
        ns.tracking_uri,
        ns.storage,
        lambda line: print(line, flush=True),
        fn=fn,
        fn_config=fn_config,
    )
    print(out if isinstance(out, str) else out.text())
    return 0 if isinstance(out, str) or out.passed else 1


def _services(ns) -> int:
    print(services_text(ns.action))
    return 0


def _cluster(ns) -> int:
    print(cluster_text(lambda n: api.get_manager(**_target(ns)), ns))
    return 0


#: subcommand -> what runs it; each returns the exit code.
_COMMANDS = {
    "help": _help,
    "launch": _launch,
    "list": _list,
    "status": _status,
    "attach": _status,
    "logs": _logs,
    "resume": _resume,
    "chaos": _chaos,
    "stop": _stop,
    "register": _register,
    "costs": _costs,
    "reliability": _reliability,
    "gc": _gc,
    "services": _services,
    "cluster": _cluster,
    "health": _health,
    "poc": _poc,
    "sweep": _sweep,
}


def _run(ns) -> int:
    return _COMMANDS[ns.command](ns)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``jupyter-trainfactory``; exit code 2 with one line on bad input."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        ns = parse(argv or ["help"], build_parser(PROG, "FILE.py:FUNC"))
        return _run(ns)
    except HelpShown:  # argparse printed the help of -h
        return 0
    except BrokenPipeError:  # `... | head` closed the pipe: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CommandError, SpecError, JobNotFound, ServiceError, TimeoutError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if not is_service_error(exc):
            raise
        print(f"{PROG}: error: a service did not answer: {first_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
