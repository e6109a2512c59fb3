"""A real multi-node Ray cluster on this machine, reached as a remote client reaches one.

A head and two worker nodes, each its own raylet started with ``ray start`` (as on
separate hosts; they share this machine's address), with distinct custom resources that
only these tests request: node ``a`` holds two workers of ``{CPU: 1, tf_slot: 1}``, node
``b`` one. Jobs go through the Jobs API at the head's dashboard URL with the cluster's
own token in its per-cluster token file, and record to the session's MLflow server.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle
import psutil
import pytest
import train_fns

from jupyter_trainfactory.cluster import save_token, token_file
from jupyter_trainfactory.jobs import JobManager
from jupyter_trainfactory.services import _free_port, _tool
from jupyter_trainfactory.spec import JobSpec, SpecError
from jupyter_trainfactory.tracking import TAG

pytestmark = pytest.mark.job

SLOT = "tf_slot"  # the custom resource of these tests: no other test asks for it
#: Fast node-death detection (Ray's defaults take about 30 s), for the head's GCS.
HEALTH = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
}


class LocalCluster:
    """``ray start --block`` processes this test owns: stopped by pid, never `ray stop`."""

    def __init__(self, root: Path):
        self.root = root
        self.token = root / "token"
        self.token.write_text(os.urandom(32).hex())
        self.token.chmod(0o600)
        self.procs: dict[str, subprocess.Popen] = {}
        self.gcs = f"127.0.0.1:{_free_port()}"
        self.dashboard = f"http://127.0.0.1:{_free_port()}"
        # raylets find `python` on PATH for job entrypoints: this environment's, as a
        # cluster image's own Python would be
        self.env = {
            **os.environ,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token),
            "RAY_USAGE_STATS_ENABLED": "0",
            **HEALTH,
        }
        self.env.pop("RAY_ADDRESS", None)

    def _ports(self) -> list[str]:
        names = (
            "--node-manager-port",
            "--object-manager-port",
            "--dashboard-agent-listen-port",
            "--dashboard-agent-grpc-port",
            "--runtime-env-agent-port",
            "--metrics-export-port",
        )
        return [f"{name}={_free_port()}" for name in names]

    def start(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.log", "w")  # noqa: SIM115 (kept open by the child)
        self.procs[name] = subprocess.Popen(
            [_tool("ray"), "start", "--block", "--disable-usage-stats", *argv, *self._ports()],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start_all(self) -> None:
        port = self.gcs.rsplit(":", 1)[1]
        self.start(
            "head",
            [
                "--head",
                "--node-ip-address=127.0.0.1",
                f"--port={port}",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
                "--include-dashboard=true",
                f"--ray-client-server-port={_free_port()}",
                "--num-cpus=1",
                f"--temp-dir={self.root / 'ray'}",
            ],
        )
        self.wait_for_nodes(1)
        # one at a time: raylets starting together on one machine race for their file names
        for count, (name, slots) in enumerate((("a", 2), ("b", 1)), start=2):
            self.start(
                name,
                [
                    f"--address={self.gcs}",
                    "--node-ip-address=127.0.0.1",
                    f"--num-cpus={slots}",
                    f"--resources={json.dumps({SLOT: slots, f'tf_node_{name}': 1})}",
                    f"--labels=tf-node={name}",
                ],
            )
            self.wait_for_nodes(count)

    def wait_for_nodes(self, count: int, timeout: float = 120.0) -> None:
        import requests

        deadline = time.monotonic() + timeout
        headers = {"Authorization": f"Bearer {self.token.read_text()}"}
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    log = (self.root / f"{name}.log").read_text()[-3000:]
                    raise RuntimeError(f"ray start for node {name} exited:\n{log}")
            try:
                reply = requests.get(
                    f"{self.dashboard}/nodes?view=summary", headers=headers, timeout=5
                )
                nodes = reply.json()["data"]["summary"] if reply.ok else []
                alive = [n for n in nodes if n.get("raylet", {}).get("state") == "ALIVE"]
                if len(alive) >= count:
                    return
            except (requests.RequestException, ValueError, KeyError):
                pass
            time.sleep(1)
        raise TimeoutError(f"{count} Ray nodes were not alive after {timeout:g} s")

    def log_tails(self, lines: int = 15) -> str:
        """The end of each node's `ray start` output, for a start that failed."""
        out = []
        for name in self.procs:
            path = self.root / f"{name}.log"
            text = path.read_text(errors="replace") if path.exists() else ""
            out.append(f"--- {name} ---\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(out)

    def kill(self, name: str) -> list[int]:
        """SIGKILL node ``name``'s processes (``ray start``, its raylet, workers): a crash."""
        proc = psutil.Process(self.procs[name].pid)
        tree = [proc, *proc.children(recursive=True)]
        for p in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(signal.SIGKILL)
        return [p.pid for p in tree]

    def stop(self) -> None:
        for name in reversed(list(self.procs)):  # workers first, then the head
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # `ray start --block` stops its node
        for proc in self.procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture(scope="module")
def cluster(services):
    # Two tries: on a loaded 2-core machine a raylet can miss Ray's start-up deadline
    # ("The current node timed out during startup"); the second try starts afresh.
    for attempt in (1, 2):
        # a short path: Ray's Unix sockets live under the head's --temp-dir
        root = Path(tempfile.mkdtemp(prefix="tfmn-", dir="/tmp"))
        local = LocalCluster(root)
        try:
            local.start_all()
            break
        except (RuntimeError, TimeoutError) as exc:
            logs = local.log_tails()
            local.stop()
            shutil.rmtree(root, ignore_errors=True)
            if attempt == 2:
                raise RuntimeError(f"{exc}\n{logs}") from exc
            print(f"multinode cluster start failed, starting again: {exc}\n{logs}")
    try:
        save_token(local.dashboard, local.token.read_text())  # as `cluster --token-file` does
        yield local
    finally:
        local.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def remote(cluster, services, tmp_path_factory):
    """A JobManager for the cluster at its dashboard URL, as from another machine."""
    storage = tmp_path_factory.mktemp("mn-storage")
    return JobManager(cluster.dashboard, services.tracking_uri, str(storage))


def _placement(manager: JobManager, run_id: str) -> dict:
    tags = manager.mlflow_client.get_run(run_id).data.tags
    return json.loads(tags.get(TAG.PLACEMENT) or "{}")


def _rank_nodes(manager: JobManager, run_id: str) -> dict[int, str]:
    tags = manager.mlflow_client.get_run(run_id).data.tags
    return {
        int(k.removeprefix(TAG.RANK)): json.loads(v)["node_id"]
        for k, v in tags.items()
        if k.startswith(TAG.RANK)
    }


def test_the_cluster_is_described_per_node(remote, cluster):
    # the user keeps the cluster's token with the CLI, which then describes the cluster
    cli = [str(Path(sys.executable).parent / "jupyter"), "trainfactory"]
    token_file(cluster.dashboard).unlink()
    refused = subprocess.run(
        [*cli, "cluster", "--address", cluster.dashboard, "--token-file", "-"],
        input="0" * 64,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 2 and "refused this token" in refused.stderr
    assert "nothing was kept" in refused.stderr and not token_file(cluster.dashboard).exists()
    shown = subprocess.run(
        [*cli, "cluster", "--address", cluster.dashboard, "--token-file", "-"],
        input=cluster.token.read_text(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    path = token_file(cluster.dashboard)
    assert f"token kept in {path}" in shown.stdout and path.stat().st_mode & 0o777 == 0o600
    assert "match this kernel" in shown.stdout and "3 nodes on 1 host\n" in shown.stdout
    assert "2 CPU, 1 tf_node_a, 2 tf_slot  [tf-node=a]" in shown.stdout
    info = remote.cluster()
    assert len(info.nodes) == 3 and len(info.hosts) == 1  # three raylets, one machine
    assert info.ray_version and info.python_version.startswith("3.")
    slots = sorted(n.resources.get(SLOT, 0) for n in info.nodes)
    assert slots == [0, 1, 2]
    assert {n.labels.get("tf-node") for n in info.nodes} == {None, "a", "b"}


@pytest.mark.timeout(300)
def test_spread_runs_the_ranks_on_two_nodes(remote):
    spec = JobSpec(
        "short_loop",
        workers=2,
        resources={SLOT: 1},
        placement="spread",
        experiment="multinode",
        config={"steps": 60, "sleep": 0.1},
    )
    job = remote.submit(train_fns.short_loop, spec)
    assert remote.wait(job.id, timeout=240) == "SUCCEEDED", remote.logs(job.id, tail=40)
    nodes = _rank_nodes(remote, job.run_id)
    assert sorted(nodes) == [0, 1] and nodes[0] != nodes[1]  # one rank per node
    placement = _placement(remote, job.run_id)
    assert placement["strategy"] == "spread" and len(placement["nodes"]) == 2
    assert sorted(r for ranks in placement["nodes"].values() for r in ranks) == [0, 1]
    # one sampler per node that hosted a worker, its metrics under that node's label
    metrics = remote.mlflow_client.get_run(job.run_id).data.metrics
    sampled = {k.split("/")[1] for k in metrics if k.endswith("/cpu_utilization")}
    assert sampled == set(placement["nodes"]), (sampled, placement, remote.logs(job.id))
    # the run says where it ran; the job is visible and controllable from a second manager
    other = JobManager(remote.address, remote.tracking_uri, remote.storage)
    assert other.info(job.id).state == "SUCCEEDED"
    assert "placement spread: 2 workers on 2 nodes" in other.logs(job.id)


@pytest.mark.timeout(120)
def test_pack_onto_one_node_and_strict_pack_refused_before_submission(remote):
    before = len(remote.list(all_users=True, limit=500))
    spec = JobSpec("short_loop", workers=3, resources={SLOT: 1}, placement="strict-pack")
    with pytest.raises(SpecError, match="strict-pack needs one node for all 3 workers") as err:
        remote.submit(train_fns.short_loop, spec)
    assert "\n" not in str(err.value)
    spec = JobSpec("short_loop", workers=1, resources={"tf_node_c": 1})
    with pytest.raises(SpecError, match=r"\(tf_node_c missing\)"):
        remote.submit(train_fns.short_loop, spec)
    spec = JobSpec("short_loop", workers=1, resources={SLOT: 1}, label_selector={"tf-node": "c"})
    with pytest.raises(SpecError, match="No node of the cluster matches the label selector"):
        remote.submit(train_fns.short_loop, spec)
    assert len(remote.list(all_users=True, limit=500)) == before  # nothing was submitted


@pytest.mark.timeout(300)
def test_a_label_selector_places_the_job_on_its_node(remote):
    spec = JobSpec(
        "short_loop",
        workers=1,
        resources={SLOT: 1},
        label_selector={"tf-node": "b"},
        experiment="multinode",
        config={"steps": 5},
    )
    job = remote.submit(train_fns.short_loop, spec)
    assert remote.wait(job.id, timeout=240) == "SUCCEEDED", remote.logs(job.id, tail=40)
    node_b = [n for n in remote.cluster().nodes if n.labels.get("tf-node") == "b"][0]
    assert _rank_nodes(remote, job.run_id) == {0: node_b.node_id}


@pytest.mark.timeout(300)
def test_avoid_unhealthy_places_the_job_away_from_a_failing_node(remote, monkeypatch):
    """Node ``a`` is reported unhealthy (its real health report, one check failed): the
    job runs on node ``b``; with node ``b`` failing too, it is refused, nothing submitted."""
    from jupyter_trainfactory.nodehealth import node as nodehealth
    from jupyter_trainfactory.nodehealth.check import FAIL, Check

    real = nodehealth.cluster_health
    nodes = {n.labels.get("tf-node"): n.node_id for n in remote.cluster().nodes}
    failing = {nodes["a"]}

    def health_with_failures(manager, timeout_s=30.0):
        report = real(manager, timeout_s=timeout_s)
        for n in report.nodes:
            if n.node_id in failing:
                n.checks.append(("gpu0", Check("ecc_uncorrected", FAIL, "2 uncorrected errors.")))
        return report

    monkeypatch.setattr(nodehealth, "cluster_health", health_with_failures)
    spec = JobSpec(
        "short_loop",
        workers=1,
        resources={SLOT: 1},
        avoid_unhealthy=True,
        experiment="multinode",
        config={"steps": 3},
    )
    job = remote.submit(train_fns.short_loop, spec)
    assert remote.wait(job.id, timeout=240) == "SUCCEEDED", remote.logs(job.id, tail=40)
    assert _rank_nodes(remote, job.run_id) == {0: nodes["b"]}
    failing.add(nodes["b"])
    before = len(remote.list(all_users=True))
    with pytest.raises(SpecError, match="cannot hold the job"):
        remote.submit(train_fns.short_loop, dataclasses.replace(spec, label_selector={}))
    assert len(remote.list(all_users=True)) == before


@pytest.mark.timeout(300)
def test_a_remote_job_is_seen_and_stopped_from_elsewhere(remote, manager):
    """Another notebook (the default manager of this machine, no --address) and the CLI
    find the job in MLflow and reach its cluster through the run's dashboard URL."""
    spec = JobSpec("long_loop", workers=1, resources={SLOT: 1}, experiment="multinode")
    job = remote.submit(train_fns.long_loop, spec)
    deadline = time.monotonic() + 120
    while manager.info(job.id).state != "RUNNING":
        assert time.monotonic() < deadline, remote.logs(job.id, tail=40)
        time.sleep(1)
    cli = [str(Path(sys.executable).parent / "jupyter"), "trainfactory"]
    shown = subprocess.run([*cli, "status", job.id], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "RUNNING" in shown.stdout, shown.stderr
    stopped = subprocess.run(
        [*cli, "stop", job.id, "--now"], capture_output=True, text=True, timeout=180
    )
    assert stopped.returncode == 0, stopped.stderr
    assert remote.wait(job.id, timeout=120) == "STOPPED"
    assert manager.info(job.id).reason == "user-now"


@pytest.mark.timeout(420)
def test_poc_with_the_users_function_loses_a_nodes_workers(remote, cluster, capsys):
    """``%train poc --fn`` on two nodes (``--placement spread``): the user's loop is the
    training stage, and 5 steps after its first checkpoint the kernel kills every worker
    of the last rank's node (``%train chaos --kill-node``, by the placement tag's label);
    the recovery's figures come from the run's failure record."""
    from conftest import ipython_shell

    cloudpickle.register_pickle_by_value(train_fns)  # the cluster cannot import tests/
    shell = ipython_shell()
    shell.run_line_magic("load_ext", "jupyter_trainfactory")
    shell.user_ns["my_loop"] = train_fns.fault_loop
    config = {"steps": 250, "every": 10, "sleep": 0.2, "fail_step": None, "marker": "-"}
    line = (
        f'poc --quick --fn my_loop --config "{config}" --placement spread'
        f" --resources {SLOT}=1 --address {cluster.dashboard} --storage {remote.storage}"
    )
    report = shell.run_line_magic("train", line)
    out = capsys.readouterr().out
    assert report.state == "SUCCEEDED", report.text()
    checks = {c.name: c for c in report.checks}
    for name in ("compute_tflops", "allreduce_inter_busbw_gb_per_s", "recovery_mttr_s"):
        assert checks[name].status != "n/a" and checks[name].value > 0, (name, report.text())
    # the workers ran on nodes a and b: the last rank's node held that worker alone. (The
    # placement tag now tells the restarted group's, which Ray's best-effort SPREAD may
    # pack onto node a's two slots while node b's is still being freed.)
    killed = re.search(r"recovery: killed node \S+'s workers: (.+)$", out, re.MULTILINE)
    assert killed and re.fullmatch(r"rank 1 on \S+", killed.group(1)), out  # its one worker
    # the raylets share this machine's address, but to Ray they are two nodes: the
    # collectives ran across them (one rank per node: nothing within one to measure)
    assert checks["allreduce_busbw_gb_per_s"].status == "n/a", report.text()
    run = remote.mlflow_client.get_run(report.run_id)
    (record, *_) = json.loads(run.data.tags["trainfactory.faults.records"])
    # a node's workers killed at once: recorded as the node lost, not one worker's crash
    assert record["rank"] == 1 and record["kind"] == "node_loss", record
    assert record.get("drill") is True, record  # a chaos kill: a drill, counted apart
    assert record["restored_step"] % 10 == 0 and record["step_reached"] >= 15
    assert checks["steps_lost"].value == record["step_reached"] - record["restored_step"]
    assert "fault_loop" in run.info.run_name
    loss = remote.mlflow_client.get_metric_history(report.run_id, "loss")
    assert sorted(p.step for p in loss) == list(range(1, 251))  # its own steps, each once


@pytest.mark.timeout(420)
def test_a_killed_node_is_recovered_from_on_the_remaining_capacity(remote, cluster, tmp_path):
    """Runs last in this module: node b does not come back."""
    spec = JobSpec(
        "fault_loop",
        workers=2,
        resources={SLOT: 1},
        placement="spread",
        max_failures=1,
        experiment="multinode",
        config={"steps": 150, "every": 5, "sleep": 0.1, "fail_step": None, "marker": "-"},
    )
    job = remote.submit(train_fns.fault_loop, spec)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        info = remote.info(job.id)
        if info.checkpoint_step and len(_placement(remote, job.run_id).get("nodes", {})) == 2:
            break
        assert info.state in ("PENDING", "RUNNING"), remote.logs(job.id, tail=40)
        time.sleep(1)
    else:
        pytest.fail(f"no checkpoint on two nodes: {remote.logs(job.id, tail=40)}")
    node_b = [n for n in remote.cluster().nodes if n.labels.get("tf-node") == "b"][0]
    assert node_b.node_id in _rank_nodes(remote, job.run_id).values()
    cluster.kill("b")
    assert remote.wait(job.id, timeout=360) == "SUCCEEDED", remote.logs(job.id, tail=60)
    info = remote.info(job.id)
    assert info.restarts == 1
    # both ranks now run on node a, the capacity left
    assert set(_rank_nodes(remote, job.run_id).values()) == {
        n.node_id for n in remote.cluster().nodes if n.labels.get("tf-node") == "a"
    }
