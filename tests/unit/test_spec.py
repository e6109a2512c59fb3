"""JobSpec validation and parameter flattening (no services needed)."""

import dataclasses
import inspect
import subprocess
import sys

import pytest

from jupyter_trainfactory.arguments import CommandError, parse
from jupyter_trainfactory.cluster import ClusterInfo, Node, check_placement
from jupyter_trainfactory.commands import format_table
from jupyter_trainfactory.spec import JobSpec, SpecError, flatten, parse_env


def test_defaults_and_params():
    spec = JobSpec("train", workers=3, config={"lr": 0.1, "model": {"layers": 2}})
    assert spec.run_name == "train"
    assert spec.experiment == "trainfactory"
    params = spec.params()
    assert params["workers"] == "3"
    assert params["config.lr"] == 0.1  # values as given: tracking.prepare_params renders them
    assert params["config.model.layers"] == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, "workers must be at least 1"),
        ({"workers": 1.5}, "whole number"),
        ({"workers": "2"}, "must be a number"),
        ({"cpus_per_worker": -1}, "at least 0"),
        ({"cpus_per_worker": 0, "gpus_per_worker": 0}, "needs some CPU or GPU"),
        ({"max_failures": -2}, "at least -1"),
        ({"config": [1, 2]}, "config must be a dict"),
        ({"experiment": " "}, "must not be empty"),
        ({"working_dir": "/does/not/exist"}, "does not exist"),
        ({"env": ["NOEQUALS"]}, "KEY=VALUE"),
        ({"env": ["1BAD=x"]}, "not a valid environment variable"),
        ({"budget": 0}, "budget must be a positive amount"),
        ({"budget": float("inf")}, "budget must be a positive amount"),
        ({"price_catalog": "/no/such/prices.toml"}, "No price catalog at /no/such/prices.toml"),
        ({"peak_tflops": 0}, "peak_tflops must be a positive, finite number"),
        ({"peak_tflops": -5}, "peak_tflops must be a positive, finite number"),
        ({"peak_tflops": float("inf")}, "peak_tflops must be a positive, finite number"),
        ({"keep_checkpoints": 0}, "keep_checkpoints must be at least 1"),
        ({"keep_best": "loss"}, "METRIC:max or METRIC:min"),
        ({"keep_best": "loss:lowest"}, "METRIC:max or METRIC:min"),
        ({"max_preemptions": -3}, "max_preemptions must be at least -1"),
        ({"peak_tflops": "fast"}, "peak_tflops must be a positive, finite number"),
        ({"flops_per_token": -6.0}, "flops_per_token must be a positive, finite number"),
    ],
)
def test_bad_specs_raise_one_sentence(kwargs, message):
    with pytest.raises(SpecError, match=message) as err:
        JobSpec("train", **kwargs)
    assert "\n" not in str(err.value)


def test_parse_env_and_flatten():
    assert parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    assert flatten({"a": {"b": [1, 2]}, "c": "s"}) == {"a.b.0": "1", "a.b.1": "2", "c": "s"}


def _cluster(*shapes: dict[str, float]) -> ClusterInfo:
    nodes = [Node(f"n{i}", f"10.0.0.{i}", dict(shape)) for i, shape in enumerate(shapes)]
    return ClusterInfo("http://head:8265", "2.60.0", "3.11.7", nodes)


def test_resource_check_names_the_shortfall():
    cluster = _cluster({"CPU": 2.0}, {"CPU": 4.0})
    check_placement(cluster, JobSpec("f", workers=6, cpus_per_worker=1))  # fits exactly
    with pytest.raises(SpecError, match=r"No node of the cluster has 1 CPU, 1 GPU .*GPU 0"):
        check_placement(cluster, JobSpec("f", workers=1, gpus_per_worker=1))
    with pytest.raises(SpecError, match="at most 3 workers of 2 CPU, but 4"):
        check_placement(cluster, JobSpec("f", workers=4, cpus_per_worker=2))
    with pytest.raises(SpecError, match="largest have CPU 4"):
        check_placement(cluster, JobSpec("f", workers=1, cpus_per_worker=8))


def test_command_parser():
    ns = parse("launch train --workers 4 --pip numpy scipy --env A=1 --env B=2")
    assert (ns.command, ns.target, ns.workers) == ("launch", "train", 4)
    assert ns.pip == ["numpy", "scipy"] and ns.env == ["A=1", "B=2"]
    ns = parse("launch train --peak-tflops 989.5 --flops-per-token 2e6")
    assert (ns.peak_tflops, ns.flops_per_token) == (989.5, 2e6)
    assert JobSpec("train", peak_tflops=ns.peak_tflops).params()["peak_tflops"] == "989.5"
    for line, message in [
        ("", "Give a subcommand"),
        ("frobnicate", "invalid choice"),
        ("launch", "required: FUNC"),
        ("launch f --bogus 1", "unrecognized arguments"),
        ("launch f --workers two", "invalid int value"),
        ("launch f --workers 0", "at least 1"),
        ("launch f --config '{", "Cannot parse the line"),
        ("launch f --peak-tflops lots", "invalid float value"),
    ]:
        with pytest.raises(CommandError, match=message):
            parse(line)


def test_a_resume_that_its_budget_would_stop_at_once_is_refused():
    from jupyter_trainfactory.submission import check_resume_budget

    ns = parse("resume tf-1 --budget 0.5 --max-failures 2")
    assert (ns.job, ns.budget, ns.max_failures) == ("tf-1", 0.5, 2)
    check_resume_budget("tf-1", "budget", 0.4, 0.5, spent=0.38)  # raised: goes on
    check_resume_budget("tf-1", "user", 0.4, None, spent=0.2)  # the user's stop: unchanged
    check_resume_budget("tf-1", "budget", None, None, spent=0.2)  # no budget to hit
    for args, message in [
        (("budget", 0.4, None), "was stopped by its budget \\(0.4, 0.38 spent\\); resume it"),
        (("budget", 0.4, 0.3), "has spent 0.38; a --budget of 0.3 would stop it at once"),
        (("user", None, 0.38), "has spent 0.38"),
        (("user", None, -1.0), "budget must be a positive amount"),
    ]:
        with pytest.raises(SpecError, match=message):
            check_resume_budget("tf-1", *args, spent=0.38)


def test_format_table():
    text = format_table([{"job": "tf-1", "state": "RUNNING"}, {"job": "tf-22", "state": "-"}])
    assert text.splitlines() == ["JOB    STATE", "tf-1   RUNNING", "tf-22  -"]


def test_cluster_options_parse_into_the_spec():
    from jupyter_trainfactory.arguments import spec_from_args

    ns = parse(
        "launch --resources tf=1 --resources x=0.5 --label-selector zone=a train"
        " --placement strict-spread --accelerator hpu --accelerators-per-worker 2"
    )
    assert ns.target == "train"  # a repeatable option does not swallow the function
    spec = spec_from_args(ns, "train", {}, "")
    assert spec.worker_resources() == {"CPU": 1.0, "HPU": 2.0, "tf": 1.0, "x": 0.5}
    assert (spec.placement, spec.label_selector) == ("strict-spread", {"zone": "a"})
    with pytest.raises(CommandError, match="invalid choice: 'scatter'"):
        parse("launch train --placement scatter")


def _spec_default(spec_field):
    if spec_field.default is not dataclasses.MISSING:
        return spec_field.default
    return spec_field.default_factory()


def test_every_door_has_every_option_of_the_spec():
    """A JobSpec field a user sets is an option of every door: the parser of ``%train
    launch`` and ``jupyter trainfactory launch``, ``spec_from_args`` and ``api.launch``
    (with the spec's default); a field without its door fails here."""
    from jupyter_trainfactory import api
    from jupyter_trainfactory.arguments import build_parser, spec_from_args
    from jupyter_trainfactory.spec import launch_options

    fields = {f.name: f for f in dataclasses.fields(JobSpec)}
    user_set = set(fields) - {"function_name", "owner"}  # from the function; who launches
    # the spec: every such field has its launch option, but the source (each door's own)
    assert {f.name for f, _ in launch_options()} == user_set - {"source"}
    for prog, target in (("%train", "FUNC"), ("jupyter trainfactory", "FILE.py:FUNC")):
        parser = build_parser(prog, target)
        launch = parser._subparsers._group_actions[0].choices["launch"]
        missing = user_set - {"source"} - {a.dest for a in launch._actions}
        assert not missing, f"{prog} launch lacks an option for {sorted(missing)}"
        # what the line leaves unset is the spec's default
        assert spec_from_args(parse("launch train", parser), "train", {}, "") == JobSpec("train")
    parameters = inspect.signature(api.launch).parameters
    missing = user_set - set(parameters)
    assert not missing, f"api.launch lacks a parameter for {sorted(missing)}"
    for name in user_set:
        default, given = _spec_default(fields[name]), parameters[name].default
        empty = isinstance(default, (dict, list)) and not default
        assert given == default or (empty and given is None), f"api.launch's {name}={given!r}"


def test_the_spec_travels_to_the_driver_and_back(tmp_path):
    """``to_dict`` -> ``from_dict`` (the driver's side) gives the same spec, checked
    without the launching machine's files; a bad value is still refused."""
    spec = JobSpec(
        "train",
        workers=3,
        gpus_per_worker=1,
        placement="strict-spread",
        label_selector={"zone": "a"},
        resources={"rack_a": 1},
        keep_best="loss:min",
        working_dir=str(tmp_path),
        stall_timeout=60,
        on_stall="stop",
        budget=5,
        spot=True,
        env={"A": "1"},
    )
    assert JobSpec.from_dict(spec.to_dict()) == spec
    elsewhere = {**spec.to_dict(), "working_dir": "/only/on/the/laptop", "new_field": 1}
    assert JobSpec.from_dict(elsewhere).working_dir == "/only/on/the/laptop"
    with pytest.raises(SpecError, match="workers must be at least 1"):
        JobSpec.from_dict({**spec.to_dict(), "workers": 0})
    assert JobSpec.from_dict({"function_name": "f"}).keep_checkpoints == 2


def test_the_driver_imports_the_spec_without_local_modules():
    """The job's driver (on a cluster node) imports ``spec``: it loads no MLflow, Ray,
    Jupyter or local-only module of this package."""
    code = (
        "import sys, jupyter_trainfactory.spec; "
        "print(' '.join(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('mlflow', 'ray', 'IPython', 'ipywidgets', 'bokeh', 'tornado', 'jupyter_server',"
        " 'requests', 'torch') or m.startswith('jupyter_trainfactory.'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert set(out.stdout.split()) == {
        "jupyter_trainfactory.accelerators",
        "jupyter_trainfactory.spec",
        "jupyter_trainfactory.spec_values",
        "jupyter_trainfactory.tracking",
    }


def test_the_job_polls_reports_quickly_unless_its_user_sets_the_interval(tmp_path, monkeypatch):
    from jupyter_trainfactory.payload import HEALTH_CHECK_ENV, REPORT_POLL_INTERVAL_S, runtime_env

    monkeypatch.delenv(HEALTH_CHECK_ENV, raising=False)
    env = runtime_env(JobSpec("train"), tmp_path)["env_vars"]
    assert env[HEALTH_CHECK_ENV] == str(REPORT_POLL_INTERVAL_S)
    assert float(env[HEALTH_CHECK_ENV]) < 2.0  # Ray's default paces a report up to 2 s
    monkeypatch.setenv(HEALTH_CHECK_ENV, "1.5")  # the kernel's own setting is kept
    assert runtime_env(JobSpec("train"), tmp_path)["env_vars"][HEALTH_CHECK_ENV] == "1.5"
    spec = JobSpec("train", env={HEALTH_CHECK_ENV: "3"})  # and the job's, over both
    assert runtime_env(spec, tmp_path)["env_vars"][HEALTH_CHECK_ENV] == "3"


def test_a_param_call_split_at_its_spaces_is_joined_again():
    line = "sweep f --param lr=loguniform(3e-4, 3e-2) --param h=choice(16, 32, 64) --metric m"
    ns = parse(line)
    assert ns.params == ["lr=loguniform(3e-4, 3e-2)", "h=choice(16, 32, 64)"]
    # nothing else is joined: a name with a parenthesis stays one quoted word
    ns = parse("launch f --experiment 'a (b' --workers 1")
    assert ns.experiment == "a (b" and ns.workers == 1
