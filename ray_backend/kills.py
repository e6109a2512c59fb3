"""Killing a job's worker processes, one Ray task pinned to each of their nodes (stall restarts, chaos)."""

from __future__ import annotations

import os
from typing import Any

__all__ = ["kill_workers"]


def _kill_pids(pids: list[int]) -> list[int]:
    """SIGKILL these processes of this node (a Ray task pinned to the node); returns the
    pids that were alive and got the signal."""
    import signal

    killed = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def kill_workers(where: dict[int, dict[str, Any]], timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """SIGKILL the workers ``where`` names (rank -> ``pid``, ``node_id``, ``node_ip``).

    Returns ``[{"rank", "pid", "node"}]`` of the processes killed (a process already
    gone is left out). Raises what ``ray.get`` raises when a node does not answer
    within ``timeout_s`` s.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    by_node: dict[str, list[int]] = {}
    for rank, info in where.items():
        by_node.setdefault(info["node_id"], []).append(rank)
    killer = ray.remote(_kill_pids)
    refs = {
        node: killer.options(
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        ).remote([where[r]["pid"] for r in node_ranks])
        for node, node_ranks in by_node.items()
    }
    killed = []
    for node, ref in refs.items():
        dead = set(ray.get(ref, timeout=timeout_s))
        killed += [
            {"rank": r, "pid": where[r]["pid"], "node": where[r]["node_ip"]}
            for r in by_node[node]
            if where[r]["pid"] in dead
        ]
    return killed
