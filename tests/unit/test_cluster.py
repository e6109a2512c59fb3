"""Checks before submission against recorded cluster descriptions (no cluster needed), the
accelerator table, and the token and address a remote cluster is reached with."""

import json
from pathlib import Path

import pytest

from jupyter_trainfactory.accelerators import ACCELERATORS, accelerator
from jupyter_trainfactory.cluster import (
    ClusterInfo,
    Node,
    check_job,
    check_placement,
    check_storage,
    check_tracking_uri,
    check_versions,
    cluster_headers,
    label_matches,
    resolve_address,
    token_file,
)
from jupyter_trainfactory.spec import JobSpec, SpecError

DATA = Path(__file__).parents[1] / "data" / "clusters"
HERE = {"127.0.0.1", "::1", "192.0.2.2"}  # this machine's addresses, as the checks see them


def recorded(name: str) -> ClusterInfo:
    return ClusterInfo.from_dict(json.loads((DATA / f"{name}.json").read_text()))


@pytest.fixture
def gpu_cluster():
    return recorded("three_hosts_gpu")


@pytest.fixture
def one_host():
    return recorded("one_host_three_raylets")


def gpu_job(workers=8, **kw):
    return JobSpec("train", workers=workers, cpus_per_worker=8, gpus_per_worker=1, **kw)


# -- tracking URI and storage: the remote-only refusals --------------------------------


@pytest.mark.parametrize(
    "uri, what",
    [
        ("http://127.0.0.1:5000", "loopback"),
        ("http://localhost:5000", "loopback"),
        ("http://[::1]:5000", "loopback"),
        ("sqlite:///home/me/mlflow.db", "local SQLite"),
        ("file:///home/me/mlruns", "local file store"),
        ("/home/me/mlruns", "local file store"),
    ],
)
def test_a_tracking_uri_other_hosts_cannot_reach_is_refused(gpu_cluster, uri, what):
    with pytest.raises(SpecError, match=f"{what}.*10.42.*--tracking-uri http://MLFLOW-HOST") as e:
        check_tracking_uri(gpu_cluster, uri, local_addresses=HERE)
    assert "\n" not in str(e.value)


def test_a_tracking_uri_is_fine_when_the_cluster_reaches_it(gpu_cluster, one_host):
    check_tracking_uri(gpu_cluster, "http://mlflow.ml.svc:5000", local_addresses=HERE)
    check_tracking_uri(gpu_cluster, "https://dbc-1234.cloud.databricks.com", local_addresses=HERE)
    # every node on this machine: its loopback server and SQLite file are reachable
    check_tracking_uri(one_host, "http://127.0.0.1:5000", local_addresses=HERE)
    check_tracking_uri(one_host, "sqlite:///tmp/mlflow.db", local_addresses=HERE)


def test_local_storage_is_refused_when_the_job_spans_hosts(gpu_cluster):
    placement = check_placement(gpu_cluster, gpu_job(workers=16))
    assert placement.hosts == {"10.42.1.7", "10.42.2.9"}  # the head has no GPU
    with pytest.raises(SpecError, match=r"local, but the job's nodes are on 2 hosts.*s3://"):
        check_storage(placement, "/mnt/checkpoints", shared=False)
    with pytest.raises(SpecError, match="local"):
        check_storage(placement, "file:///mnt/checkpoints", shared=False)
    for shared in ("s3://bucket/ckpt", "gs://bucket/ckpt", "abfss://c@acct.dfs.core.windows.net/x"):
        check_storage(placement, shared)
    check_storage(placement, "/mnt/nfs/checkpoints", shared=True)  # NFS mounted everywhere


def test_local_storage_is_fine_when_the_job_stays_on_one_host(gpu_cluster, one_host):
    # a label selector keeps the job on one host: nothing to share
    placement = check_placement(
        gpu_cluster, gpu_job(label_selector={"ray.io/availability-zone": "rack-a"})
    )
    assert placement.hosts == {"10.42.1.7"}
    check_storage(placement, "/mnt/local-ssd/ckpt", shared=False)
    # several raylets on one machine (this machine's test cluster) share its disk
    placement = check_placement(one_host, JobSpec("train", workers=3, resources={"tf_slot": 1}))
    assert len(placement.eligible) == 3 and len(placement.hosts) == 1
    check_storage(placement, "/tmp/ckpt", shared=False)


def test_check_job_runs_every_check_and_reports_min_nodes(gpu_cluster):
    placement = check_job(
        gpu_cluster,
        gpu_job(workers=12),
        "http://mlflow.ml.svc:5000",
        "s3://bucket/ckpt",
        remote=False,
        local_addresses=HERE,
    )
    assert placement.min_nodes == 2 and placement.slots[gpu_cluster.nodes[1].node_id] == 8
    with pytest.raises(SpecError, match="loopback"):
        check_job(gpu_cluster, gpu_job(), "http://localhost:5000", "s3://b/c", False, HERE)


# -- resources per node, placement strategies, labels ----------------------------------


def test_resources_are_checked_per_node_and_name_the_missing_shape(gpu_cluster):
    # 16 GPUs in total, but no node has 2 x 8 GPUs... fits 8 per node: 2 workers of 8 GPUs fit
    check_placement(gpu_cluster, JobSpec("t", workers=2, cpus_per_worker=8, gpus_per_worker=8))
    with pytest.raises(SpecError, match=r"No node of the cluster has 8 CPU, 9 GPU .*GPU 8"):
        check_placement(gpu_cluster, JobSpec("t", workers=1, cpus_per_worker=8, gpus_per_worker=9))
    with pytest.raises(SpecError, match=r"\(NPU missing\)"):
        check_placement(gpu_cluster, JobSpec("t", gpus_per_worker=1, accelerator="npu"))
    with pytest.raises(SpecError, match=r"\(rack_c missing\)"):
        check_placement(gpu_cluster, JobSpec("t", resources={"rack_c": 1}))
    with pytest.raises(SpecError, match="at most 16 workers of 8 CPU, 1 GPU, but 17"):
        check_placement(gpu_cluster, gpu_job(workers=17))


def test_strict_pack_and_strict_spread_are_refused_when_no_nodes_can_hold_them(gpu_cluster):
    check_placement(gpu_cluster, gpu_job(workers=8, placement="strict-pack"))
    with pytest.raises(SpecError, match="strict-pack needs one node for all 9 workers.*holds 8"):
        check_placement(gpu_cluster, gpu_job(workers=9, placement="strict-pack"))
    assert (
        check_placement(gpu_cluster, gpu_job(workers=2, placement="strict-spread")).min_nodes == 2
    )
    with pytest.raises(SpecError, match="strict-spread needs 3 nodes.*has 2"):
        check_placement(gpu_cluster, gpu_job(workers=3, placement="strict-spread"))
    # pack and spread take what exists; pack's fewest nodes for 9 workers is 2
    assert check_placement(gpu_cluster, gpu_job(workers=9)).min_nodes == 2
    assert check_placement(gpu_cluster, gpu_job(workers=9, placement="spread")).min_nodes == 2


def test_label_selectors_narrow_the_nodes(gpu_cluster):
    with pytest.raises(
        SpecError,
        match="The nodes matching ray.io/availability-zone=rack-b can hold at most 8 workers.*or widen the label selector",
    ):
        check_placement(
            gpu_cluster, gpu_job(workers=9, label_selector={"ray.io/availability-zone": "rack-b"})
        )
    with pytest.raises(SpecError, match="No node of the cluster matches the label selector"):
        check_placement(gpu_cluster, gpu_job(label_selector={"ray.io/accelerator-type": "B200"}))
    spec = gpu_job(workers=16, label_selector={"ray.io/accelerator-type": "in(H100,H200)"})
    assert len(check_placement(gpu_cluster, spec).hosts) == 2
    # one selector per worker (Ray Train's per-worker list)
    per_worker = [{"ray.io/availability-zone": "rack-a"}, {"ray.io/availability-zone": "rack-b"}]
    assert (
        len(check_placement(gpu_cluster, gpu_job(workers=2, label_selector=per_worker)).hosts) == 2
    )


def test_a_selector_that_excludes_the_resource_says_so(gpu_cluster):
    spec = gpu_job(workers=1, label_selector={"ray.io/node-group": "headgroup"})
    with pytest.raises(
        SpecError, match=r"No node matching ray.io/node-group=headgroup has 8 CPU, 1 GPU .*widen"
    ):
        check_placement(gpu_cluster, spec)


def test_label_expressions():
    labels = {"zone": "a", "gpu": "H100"}
    assert label_matches(labels, {"zone": "a"}) and not label_matches(labels, {"zone": "b"})
    assert label_matches(labels, {"zone": "!b"}) and not label_matches(labels, {"zone": "!a"})
    assert label_matches(labels, {"gpu": "in(A100,H100)"})
    assert not label_matches(labels, {"gpu": "!in(A100,H100)"})
    assert not label_matches(labels, {"rack": "r1"}) and label_matches(labels, {"rack": "!r1"})


# -- versions ---------------------------------------------------------------------------


def test_versions_must_match_where_the_function_needs_it(gpu_cluster):
    check_versions(gpu_cluster, "2.60.1", "3.11.2")  # patch releases differ: fine
    with pytest.raises(SpecError, match=r"Python 3.11.7 and this kernel 3.12.1.*same minor"):
        check_versions(gpu_cluster, "2.60.0", "3.12.1")
    with pytest.raises(SpecError, match=r"Ray 2.60.0 and this kernel Ray 2.59.0.*ray==2.60.0"):
        check_versions(gpu_cluster, "2.59.0", "3.11.7")
    unknown = ClusterInfo("http://h:8265", "", "", gpu_cluster.nodes)
    check_versions(unknown, "2.50.0", "3.10.0")  # a cluster that does not say is not checked


# -- spec, accelerators -----------------------------------------------------------------


def test_the_accelerator_table():
    assert {k: (a.resource, a.backend, a.use_gpu) for k, a in ACCELERATORS.items()} == {
        "gpu": ("GPU", "nccl", True),
        "npu": ("NPU", "hccl", False),
        "hpu": ("HPU", "hccl", False),
        "cpu": (None, "gloo", False),
    }
    assert accelerator("GPU").sampler == "nvml"
    assert [n for n, a in ACCELERATORS.items() if not a.tested] == ["npu", "hpu"]
    with pytest.raises(ValueError, match="--accelerator takes gpu, npu, hpu, cpu, got 'tpu'"):
        accelerator("tpu")


def test_spec_maps_the_accelerator_to_ray_resources():
    assert JobSpec("t").accelerator == "cpu"
    assert JobSpec("t", gpus_per_worker=1).worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    spec = JobSpec("t", gpus_per_worker=2, accelerator="hpu", resources={"rack_a": 0.5})
    assert spec.worker_resources() == {"CPU": 1.0, "HPU": 2.0, "rack_a": 0.5}
    assert spec.params()["accelerator"] == "hpu" and spec.params()["placement"] == "pack"
    with pytest.raises(SpecError, match="--accelerator npu needs --gpus-per-worker N, the NPUs"):
        JobSpec("t", accelerator="npu")
    with pytest.raises(SpecError, match="--accelerator cpu takes no accelerators"):
        JobSpec("t", accelerator="cpu", gpus_per_worker=1)
    with pytest.raises(SpecError, match="custom resources; GPUs come from --gpus-per-worker"):
        JobSpec("t", resources={"GPU": 1})
    with pytest.raises(SpecError, match="memory resource is not reserved per worker"):
        JobSpec("t", resources={"memory": 1})
    with pytest.raises(
        SpecError, match=r"--resources foo takes an amount of 0 or more, like foo=1"
    ):
        JobSpec("t", resources={"foo": "-1"})
    with pytest.raises(SpecError, match=r"like foo=1; got 'abc'"):
        JobSpec("t", resources={"foo": "abc"})
    with pytest.raises(SpecError, match="--placement takes pack, spread, strict-pack"):
        JobSpec("t", placement="scatter")
    assert JobSpec("t", placement="STRICT_PACK").placement == "strict-pack"
    with pytest.raises(SpecError, match="one entry per worker \\(2\\), got 1"):
        JobSpec("t", workers=2, label_selector=[{"zone": "a"}])
    with pytest.raises(SpecError, match="needs a value"):
        JobSpec("t", label_selector={"zone": ""})


def test_the_driver_builds_the_trainer_from_the_table():
    from ray_backend.driver import build_trainer

    spec = JobSpec(
        "t",
        workers=2,
        gpus_per_worker=1,
        accelerator="npu",
        placement="strict-spread",
        label_selector={"zone": "a"},
        resources={"rack_a": 1},
    )
    meta = {"job_id": "tf-00000000", "spec": spec.to_dict(), "config": {}, "storage_path": "/tmp"}
    trainer = build_trainer(meta, lambda config: None, recorder=None)
    scaling = trainer.scaling_config
    assert scaling.resources_per_worker == {"CPU": 1.0, "NPU": 1.0, "rack_a": 1.0}
    assert (scaling.use_gpu, scaling.placement_strategy) == (False, "STRICT_SPREAD")
    assert scaling.label_selector == {"zone": "a"}
    assert trainer.backend_config.backend == "hccl"
    cpu = JobSpec("t", workers=1)
    trainer = build_trainer({**meta, "spec": cpu.to_dict()}, lambda config: None, recorder=None)
    assert trainer.scaling_config.placement_strategy == "PACK"
    assert trainer.backend_config.backend == "gloo"
    gpu = JobSpec("t", workers=1, gpus_per_worker=1)
    trainer = build_trainer({**meta, "spec": gpu.to_dict()}, lambda config: None, recorder=None)
    assert trainer.backend_config.backend == "nccl" and trainer.scaling_config.use_gpu


def test_a_vendor_without_a_sampler_says_so():
    from ray_backend.sampler import NodeSampler

    calls, samples = [], []

    class Recorder:
        class gpu_info:  # noqa: N801 (an actor method's shape: .remote(...))
            @staticmethod
            def remote(*args):
                calls.append(args)

        class node_metrics:  # noqa: N801
            @staticmethod
            def remote(values, step, wall_time):
                samples.append((step, sorted(values)))

    sampler = NodeSampler(Recorder(), "10.0.0.1", interval_s=3600, accelerator="hpu")
    try:
        assert sampler.watch_devices("0,1") == []
        assert "system/10-0-0-1/cpu_utilization" in sampler.sample()
    finally:
        sampler.stop()
    # stopping sends one last sample: a job shorter than the interval has its node's numbers
    assert samples == [(0, ["system/10-0-0-1/cpu_utilization", "system/10-0-0-1/memory_used_mb"])]
    assert calls == [
        (
            "10-0-0-1",
            [],
            "Intel Gaudi HPU telemetry is unavailable: no sampler is implemented for it yet;"
            " sampling CPU and host memory only.",
        )
    ]


# -- address and token --------------------------------------------------------------------


def test_the_address_comes_from_the_option_or_ray_address(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "http://head.example:8265/")
    assert resolve_address(None) == "http://head.example:8265"
    assert resolve_address("https://ray.example.org") == "https://ray.example.org"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a GCS address: code inside a cluster
    assert resolve_address(None) is None
    with pytest.raises(SpecError, match=r"--address takes the Ray dashboard's URL"):
        resolve_address("10.0.0.1:6379")


def test_the_token_of_a_cluster(monkeypatch, tmp_path):
    monkeypatch.setenv("TRAINFACTORY_HOME", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    address = "http://head.example:8265"
    assert cluster_headers(address) == {}
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert cluster_headers(address) == {"authorization": "Bearer from-env"}
    path = token_file(address)
    assert path == tmp_path / "clusters" / "head.example_8265.token"
    path.parent.mkdir()
    path.write_text("per-cluster\n")
    assert cluster_headers(address) == {"authorization": "Bearer per-cluster"}  # the file wins
    assert cluster_headers("http://other:8265") == {"authorization": "Bearer from-env"}
    monkeypatch.delenv("RAY_AUTH_TOKEN")
    (tmp_path / "t").write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "t"))
    assert cluster_headers("http://other:8265") == {"authorization": "Bearer from-path"}


def test_a_cluster_description_round_trips(gpu_cluster):
    assert ClusterInfo.from_dict(gpu_cluster.to_dict()) == gpu_cluster
    assert gpu_cluster.hosts == {"10.42.0.12", "10.42.1.7", "10.42.2.9"}
    assert isinstance(gpu_cluster.nodes[0], Node) and gpu_cluster.nodes[0].is_head


A, B = "a1" * 28, "b2" * 28  # Ray node ids: 28 bytes in hex


def test_a_pack_request_that_ended_spread_is_warned_about(capsys):
    """The driver's NodeSamplers record where the ranks run and warn when ``pack`` used
    more nodes than the cluster needed (Ray's PACK is best effort)."""
    from ray_backend.driver import SAMPLER_WAIT_S, NodeSamplers

    class Call:
        def __init__(self, fn):
            self.remote = fn

    class Actor:
        def __init__(self, *args, **kwargs):
            self.watch_devices = Call(lambda visible: None)

    class Ray:  # the few calls NodeSamplers makes, answered here
        def __init__(self, ranks):
            self.ranks = ranks

        def nodes(self):
            return [
                {"Alive": True, "NodeManagerAddress": "10.0.0.1", "NodeID": A},
                {"Alive": True, "NodeManagerAddress": "10.0.0.2", "NodeID": B},
            ]

        def get(self, value, timeout=None):
            return value

        def remote(self, cls):
            ray = self

            class Options:
                def options(self, **kw):
                    return self

                def remote(self, *args, **kwargs):
                    ray.started.append(args[1])
                    return Actor()

            return Options()

    tags = {}
    recorder = type("R", (), {})()
    ranks = {
        0: {"node_id": A, "node_ip": "10.0.0.1", "visible": {}},
        1: {"node_id": B, "node_ip": "10.0.0.2", "visible": {}},
    }
    recorder.ranks = Call(lambda: ranks)
    recorder.set_tags = Call(tags.update)
    ray = Ray(ranks)
    ray.started = []
    spec = JobSpec("t", workers=2).to_dict()
    samplers = NodeSamplers(ray, recorder, {"job_id": "tf-1", "spec": spec, "min_nodes": 1})
    samplers.poll()
    assert ray.started == []  # before the first step: the workers' setup keeps the CPUs
    ranks[1]["step"] = 1
    samplers.poll()
    assert sorted(ray.started) == ["10-0-0-1", "10-0-0-2"]  # one sampler per worker node
    placement = json.loads(tags["trainfactory.placement"])
    assert placement["nodes"] == {"10-0-0-1": [0], "10-0-0-2": [1]}
    assert placement["ranks"] == {"0": "10-0-0-1", "1": "10-0-0-2"}
    assert tags["trainfactory.placement.warning"].startswith(
        "pack placed the workers on 2 nodes, though 1 can hold them"
    )
    assert "trainfactory: warning: pack placed" in capsys.readouterr().out
    # spread asked for it: no warning
    tags.clear()
    spec = JobSpec("t", workers=2, placement="spread").to_dict()
    ranks[1]["step"] = 0
    ray.started.clear()
    samplers = NodeSamplers(ray, recorder, {"job_id": "tf-2", "spec": spec, "min_nodes": 1})
    samplers.poll(now=100.0)
    assert tags["trainfactory.placement.warning"] == ""
    samplers.poll(now=100.0 + SAMPLER_WAIT_S - 1)
    assert ray.started == []
    samplers.poll(now=100.0 + SAMPLER_WAIT_S)  # no step yet, but a long setup is sampled
    assert sorted(ray.started) == ["10-0-0-1", "10-0-0-2"]


def test_the_cluster_summary(gpu_cluster):
    from jupyter_trainfactory.cluster import summary_text

    text = summary_text(gpu_cluster, "2.60.0", "3.11.7")
    assert "Ray 2.60.0, Python 3.11.7: match this kernel" in text
    assert "3 nodes on 3 hosts" in text
    assert "node b2e1d4c3 10.42.1.7: 96 CPU, 8 GPU  [ray.io/accelerator-type=H100" in text
    assert text.splitlines()[3].startswith("  head a1f0c3d2 10.42.0.12: 8 CPU")
    assert "MISMATCH: The cluster runs Python 3.11.7" in summary_text(
        gpu_cluster, "2.60.0", "3.12.0"
    )


def test_the_driver_refuses_an_interpreter_that_cannot_run_the_function():
    import sys

    import ray

    from ray_backend.driver import InterpreterMismatch, check_interpreter

    here = list(sys.version_info[:2])
    check_interpreter({"python": here, "ray": ray.__version__})
    check_interpreter(None)  # a job from before this check
    with pytest.raises(InterpreterMismatch, match=r"Python 3.9 with Ray 2.60.0; put the Python"):
        check_interpreter({"python": [3, 9], "ray": "2.60.0"})
    with pytest.raises(InterpreterMismatch, match=rf"{sys.executable}: Python .*Ray 1.13.0"):
        check_interpreter({"python": here, "ray": "1.13.0"})


@pytest.mark.parametrize("fit_running", [True, False])
def test_a_driver_left_with_fit_running_skips_the_interpreter_shutdown(fit_running):
    # After a stop, fit() still waits in its thread; the interpreter's shutdown would
    # race it (a SIGSEGV seen as a FAILED Ray job), so the driver leaves by os._exit.
    import subprocess
    import sys

    script = f"""
import atexit, threading, time
from ray_backend.driver import FIT_THREAD, exit_driver
atexit.register(lambda: print("interpreter shutdown"))
if {fit_running}:
    threading.Thread(target=time.sleep, args=(600,), name=FIT_THREAD, daemon=True).start()
print("run closed", end="")  # unflushed: still written
exit_driver(7)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 7, done.stderr
    expected = "run closed" if fit_running else "run closedinterpreter shutdown\n"
    assert done.stdout == expected


def test_an_address_where_nothing_answers_is_one_sentence(tmp_path):
    from jupyter_trainfactory.jobs import JobManager

    manager = JobManager("http://127.0.0.1:1", "http://mlflow.example:5000", str(tmp_path))
    with pytest.raises(SpecError) as err:
        manager.check(JobSpec("t"))
    text = str(err.value)
    assert text.startswith("Cannot reach the Ray cluster at http://127.0.0.1:1: nothing answers")
    assert "Connection refused" in text and "kubectl port-forward" in text and "\n" not in text


def test_a_pending_driver_says_whether_it_waits_for_resources_or_starts_the_workers():
    from ray_backend.driver import workers_reason

    spec = JobSpec("train", workers=2, cpus_per_worker=2, gpus_per_worker=1)
    shape = "2 workers x (2 CPU, 1 GPU), placement pack"
    assert workers_reason(spec, {"CPU": 8.0, "GPU": 2.0}) == f"starting the workers: {shape}"
    assert workers_reason(spec, {"CPU": 8.0, "GPU": 1.0}) == (
        f"waiting for resources: {shape}; free now 1 of 2 GPU"
    )
    assert workers_reason(spec, {}) == (
        f"waiting for resources: {shape}; free now 0 of 4 CPU, 0 of 2 GPU"
    )


def test_a_pending_job_says_what_it_waits_for_at_each_stage_of_its_start():
    from jupyter_trainfactory.jobstate import DRIVER_STARTING, SETTING_UP, pending_reason

    assert pending_reason("PENDING", "submitted") == SETTING_UP  # Ray prepares the env
    assert pending_reason("RUNNING", "submitted") == DRIVER_STARTING  # the driver starts
    assert pending_reason("RUNNING", "resumed (2)") == DRIVER_STARTING
    waiting = "waiting for resources: 1 worker x (1 CPU), placement pack; free now 0 of 1 CPU"
    assert pending_reason("RUNNING", waiting) == waiting  # the driver's own word
    assert pending_reason(None, "submitted") == "submitted"  # Ray not asked: the tag
