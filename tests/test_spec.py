"""JobSpec validation and parameter flattening (no services needed)."""

import pytest

from jupyter_trainfactory.cluster import ClusterInfo, Node, check_placement
from jupyter_trainfactory.commands import CommandError, format_table, parse
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


def test_format_table():
    text = format_table([{"job": "tf-1", "state": "RUNNING"}, {"job": "tf-22", "state": "-"}])
    assert text.splitlines() == ["JOB    STATE", "tf-1   RUNNING", "tf-22  -"]


def test_cluster_options_parse_into_the_spec():
    from jupyter_trainfactory.commands import spec_from_args

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
