"""Running the checks on every node: the node side and the kernel side.

The kernel never calls ``ray.init``: it reaches the cluster through the Ray Jobs API
(:class:`~jupyter_trainfactory.rayjobs.RayClients`). So the checks run as one short Ray
job, ``python -m jupyter_trainfactory.nodehealth.node``, whose driver starts one Ray task per
alive node (``NodeAffinitySchedulingStrategy(node_id, soft=False)``, ``num_cpus=0`` so it
runs even on a cluster whose CPUs are all taken) and prints the results as one JSON line
after :data:`MARKER`; the kernel submits it, waits, and reads that line from the job's log.

Node side: :func:`node_health` (imports pynvml and psutil lazily, on the node).
Kernel side: :func:`run_health`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
import uuid
from typing import Any

__all__ = ["MARKER", "TASK_TIMEOUT_S", "main", "node_health", "parse_output", "run_health"]

#: The log line of the job's result: ``MARKER`` then the JSON of :func:`check_all_nodes`.
MARKER = "TRAINFACTORY_HEALTH_JSON "
#: Seconds each node's task may take (NVML and psutil reads take well under one).
TASK_TIMEOUT_S = 30.0
#: Seconds, beyond the task timeout, for Ray to start the job (runtime_env upload).
JOB_START_S = 90.0


def _temp_dir() -> str | None:
    """This node's Ray temp dir (``--temp-dir``), None when Ray does not say."""
    try:
        import ray._private.worker as worker

        return worker.global_worker.node.get_temp_dir_path()
    except Exception:
        return None


def node_health(storage: str | None) -> dict[str, Any]:
    """The checks of the node this runs on, as plain data: ``{"node_id", "host" (the
    node's IP, as ``cluster.Node.host``), "hostname", "gpu": gpu.gpu_checks(...),
    "host": [Check-dict, ...]}``. Never raises on a missing pynvml or psutil."""
    import socket

    import ray

    from .gpu import gpu_checks
    from .host import host_checks

    try:
        import pynvml
    except ImportError:
        pynvml = None
    try:
        import psutil
    except ImportError:
        psutil = None
    return {
        "node_id": ray.get_runtime_context().get_node_id(),
        "host": ray.util.get_node_ip_address(),
        "hostname": socket.gethostname(),
        "gpu": gpu_checks(pynvml),
        "host_checks": [c.to_dict() for c in host_checks(psutil, _temp_dir(), storage)],
    }


def check_all_nodes(storage: str | None, timeout_s: float = TASK_TIMEOUT_S) -> dict[str, Any]:
    """Inside the job: :func:`node_health` as one task per alive node, pinned to it.

    Returns ``{"nodes": [node_health dicts], "missing": {node id: reason}}``; a node
    whose task does not finish in ``timeout_s`` seconds, or fails, is in ``missing``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(node_health)
    refs = {
        n["NodeID"]: task.options(
            num_cpus=0,
            max_retries=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
        ).remote(storage)
        for n in ray.nodes()
        if n.get("Alive")
    }
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
    nodes, missing = [], {}
    for node_id, ref in refs.items():
        if ref not in ready:
            missing[node_id] = f"its check did not finish in {timeout_s:g} s"
            ray.cancel(ref, force=True)
            continue
        try:
            nodes.append(ray.get(ref))
        except Exception as exc:
            missing[node_id] = f"its check failed: {str(exc).strip().splitlines()[-1][:200]}"
    return {"nodes": nodes, "missing": missing}


def main(argv: list[str] | None = None) -> int:
    """The job's entrypoint: ``python -m jupyter_trainfactory.nodehealth.node [STORAGE
    [TIMEOUT_S]]``; prints :data:`MARKER` and the JSON result."""
    import logging

    import ray

    argv = sys.argv[1:] if argv is None else argv
    storage = argv[0] if argv and argv[0] != "-" else None
    timeout_s = float(argv[1]) if len(argv) > 1 else TASK_TIMEOUT_S
    # run as __main__, this module's functions would be pickled by value: use the package's
    from jupyter_trainfactory.nodehealth import node

    ray.init(logging_level=logging.WARNING, log_to_driver=False)
    print(MARKER + json.dumps(node.check_all_nodes(storage, timeout_s)), flush=True)
    return 0


def parse_output(logs: str) -> dict[str, Any] | None:
    """The result the job printed (its last :data:`MARKER` line), None if none."""
    for line in reversed(logs.splitlines()):
        if line.startswith(MARKER):
            try:
                return json.loads(line[len(MARKER) :])
            except ValueError:
                return None
    return None


def cluster_health(manager, timeout_s: float = TASK_TIMEOUT_S):
    """Every alive node's :class:`~.report.HealthReport` on ``manager``'s cluster: the
    health job (:func:`run_health`, its errors) read against what Ray advertises."""
    from .report import build_report

    return build_report(manager.cluster(settle_s=5.0), run_health(manager, timeout_s=timeout_s))


def run_health(manager, timeout_s: float = TASK_TIMEOUT_S) -> dict[str, Any]:
    """Kernel side: submit the health job to ``manager``'s cluster through its Jobs API
    client and return what :func:`check_all_nodes` found there.

    Raises
    ------
    SpecError
        The cluster does not answer (ClusterUnreachable), refuses the job, or the job
        fails or does not finish within ``timeout_s`` + :data:`JOB_START_S` seconds (it
        is then stopped); the sentence names the job's submission id and log tail.
    """
    from ..payload import _PACKAGE_EXCLUDES
    from ..spec import SpecError

    client = manager.jobs_client
    env_vars = {"PYTHONUNBUFFERED": "1"}
    if manager.ray.local:  # the embedded head's GCS; not "auto": another head may run here
        env_vars["RAY_ADDRESS"] = manager.ray.services.ray_address
    python = sys.executable if manager.local else "python"
    storage = shlex.quote(manager.storage or "-")
    submission = f"trainfactory-health-{uuid.uuid4().hex[:8]}"
    try:
        client.submit_job(
            entrypoint=f"{python} -m jupyter_trainfactory.nodehealth.node {storage} {timeout_s:g}",
            submission_id=submission,
            runtime_env={
                "py_modules": [os.path.dirname(os.path.dirname(os.path.abspath(__file__)))],
                "excludes": _PACKAGE_EXCLUDES,
                "env_vars": env_vars,
            },
            metadata={"trainfactory.kind": "health"},
        )
    except Exception as exc:
        raise SpecError(f"Ray refused the health job: {str(exc).splitlines()[0]}") from exc
    deadline = time.monotonic() + timeout_s + JOB_START_S
    status = ""
    while time.monotonic() < deadline:
        status = str(getattr(client.get_job_status(submission), "value", ""))
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            break
        time.sleep(0.5)
    logs = client.get_job_logs(submission)
    result = parse_output(logs)
    if result is not None:
        return result
    if status not in ("SUCCEEDED", "FAILED", "STOPPED"):
        client.stop_job(submission)
        why = f"did not finish in {timeout_s + JOB_START_S:g} s"
    else:
        why = f"ended {status} without a result"
    tail = " | ".join(logs.strip().splitlines()[-3:])[:300]
    raise SpecError(f"The health job {submission} {why}" + (f" (log: {tail})." if tail else "."))


if __name__ == "__main__":
    sys.exit(main())
