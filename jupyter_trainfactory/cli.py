"""``jupyter trainfactory <subcommand>``: the same subcommands and options as ``%train``."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from . import api
from .commands import (
    CommandError,
    HelpShown,
    build_parser,
    chaos_text,
    cluster_text,
    costs_text,
    first_line,
    format_status,
    format_table,
    gc_text,
    help_text,
    is_service_error,
    parse,
    register_from_args,
    register_text,
    services_text,
    spec_from_args,
    split_inputs,
    stop_text,
)
from .jobs import JobNotFound
from .services import ServiceError
from .spec import SpecError

__all__ = ["load_function", "main"]

PROG = "jupyter trainfactory"


def load_function(target: str):
    """``path/to/file.py:func`` -> the function, its module shipped by value to the cluster."""
    path_text, sep, name = target.rpartition(":")
    if not sep or not path_text or not name:
        raise CommandError(f"launch takes path/to/file.py:function, got {target!r}.")
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


def _run(ns) -> int:
    target = {
        "address": getattr(ns, "address", None),
        "tracking_uri": getattr(ns, "tracking_uri", None),
    }
    if ns.command == "help":
        print(help_text(build_parser(PROG, "FILE.py:FUNC"), ns.topic))
    elif ns.command == "launch":
        fn, source = load_function(ns.target)
        config: Any = {}
        if ns.config:
            try:
                config = eval(ns.config, vars(sys.modules[fn.__module__]))  # noqa: S307
            except Exception as exc:
                raise CommandError(
                    f"--config {ns.config!r} failed: {type(exc).__name__}: {exc}"
                ) from None
            if not isinstance(config, dict):
                raise CommandError(f"--config must give a dict, got {type(config).__name__}.")
        spec = spec_from_args(ns, fn.__name__, config, source)
        model_fn = load_function(ns.model_fn)[0] if ns.model_fn else None
        job = api.get_manager(target["address"], target["tracking_uri"], ns.storage).submit(
            fn, spec, inputs=split_inputs(ns.inputs), model_fn=model_fn
        )
        info = job.info()
        print(f"job {job.id} submitted; MLflow run: {info.run_url or job.run_id}")
        if ns.wait:
            state = job.wait()
            detail = job.info().error if state == "FAILED" else ""
            print(f"job {job.id}: {state}" + (f" ({detail})" if detail else ""))
            return 0 if state == "SUCCEEDED" else 1
    elif ns.command == "list":
        print(format_table([j.as_row() for j in api.get_manager(**target).list(all_users=ns.all)]))
    elif ns.command in ("status", "attach"):
        if not ns.job:
            raise CommandError(f"{ns.command} needs a job id (see `{PROG} list`).")
        info = api.get_manager(**target).info(ns.job)
        print(format_status(info))
    elif ns.command == "logs":
        if not ns.job:
            raise CommandError(f"logs needs a job id (see `{PROG} list`).")
        manager = api.get_manager(**target)
        if ns.follow:
            try:
                state = manager.follow_logs(
                    ns.job, rank=ns.rank, write=lambda t: print(t, flush=True)
                )
            except KeyboardInterrupt:
                return 130
            print(f"--- {ns.job}: {state} ---")
        else:
            print(manager.logs(ns.job, tail=ns.tail, rank=ns.rank))
    elif ns.command == "resume":
        if not ns.job:
            raise CommandError(f"resume needs a job id (see `{PROG} list`).")
        job = api.get_manager(**target).resume(ns.job, max_failures=ns.max_failures)
        print(f"job {job.id} resumed (submission {job.info().submission_id})")
        if ns.wait:
            state = job.wait()
            print(f"job {job.id}: {state}")
            return 0 if state == "SUCCEEDED" else 1
    elif ns.command == "chaos":
        if not ns.job:
            raise CommandError(f"chaos needs a job id (see `{PROG} list`).")
        killed = api.get_manager(**target).chaos(ns.job, rank=ns.kill_worker, node=ns.kill_node)
        print(chaos_text(ns.job, killed))
    elif ns.command == "stop":
        if not ns.job:
            raise CommandError(f"stop needs a job id (see `{PROG} list`).")
        info = api.get_manager(**target).stop(ns.job, now=ns.now, grace_s=ns.grace)
        print(stop_text(info, ns.now, ns.grace))
    elif ns.command == "register":
        if not ns.job:
            raise CommandError(f"register needs a job id (see `{PROG} list`).")
        model_fn = load_function(ns.model_fn)[0] if ns.model_fn else None
        print(register_text(register_from_args(api.get_manager(**target), ns.job, ns, model_fn)))
    elif ns.command == "costs":
        print(costs_text(api.get_manager(**target), ns))
    elif ns.command == "gc":
        from .models import collect_garbage

        report = collect_garbage(api.get_manager(**target), ns.experiment, ns.keep, ns.all)
        print(gc_text(report, ns.keep))
    elif ns.command == "services":
        print(services_text(ns.action))
    elif ns.command == "cluster":
        print(cluster_text(lambda n: api.get_manager(**target), ns))
    return 0


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
