"""The cross-node decisions of a health check, and its table.

From what every node found (:func:`~.node.check_all_nodes`) and what Ray advertises for
it (:class:`~jupyter_trainfactory.cluster.ClusterInfo`): the GPU count and model each
node advertises against what NVML sees there, the CPUs Ray advertises against the
host's, driver version consistency across nodes, and the verdict per node (healthy, or
unhealthy with the reasons). Pure: tested on recorded results.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..tables import format_table
from .check import FAIL, OK, Check

__all__ = ["HealthReport", "NodeHealth", "build_report"]


@dataclass
class NodeHealth:
    """One node: ``node_id``, ``host`` (IP), ``label`` (``"<id[:8]> <host>"``, as
    ``%train cluster`` names nodes) and its checks as ``(scope, Check)``, scope being
    ``"node"``, ``"host"`` or a GPU label (``"gpu0"``)."""

    node_id: str
    host: str
    checks: list[tuple[str, Check]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.node_id[:8]} {self.host}".strip()

    @property
    def reasons(self) -> list[str]:
        """The failed checks, one ``"<scope> <check>: <detail>"`` each."""
        return [f"{s} {c.name}: {c.detail}" for s, c in self.checks if c.status == FAIL]

    @property
    def healthy(self) -> bool:
        """No check failed (``n/a`` is not a failure, nor a pass)."""
        return not self.reasons


@dataclass
class HealthReport:
    """Every node's health (``nodes``), with the cluster's address."""

    address: str
    nodes: list[NodeHealth]

    @property
    def healthy(self) -> bool:
        return all(n.healthy for n in self.nodes)

    def __repr__(self) -> str:
        bad = len(self.unhealthy)
        return f"<HealthReport of {self.address}: {len(self.nodes)} nodes, {bad} unhealthy>"

    @property
    def unhealthy(self) -> list[NodeHealth]:
        return [n for n in self.nodes if not n.healthy]

    def rows(self) -> list[dict[str, str]]:
        """One row per node per check: node, scope, check, status, detail."""
        return [
            {"node": n.label, "scope": s, "check": c.name, "status": c.status, "detail": c.detail}
            for n in self.nodes
            for s, c in n.checks
        ]

    def text(self) -> str:
        """The table, then one verdict line per node."""
        lines = [f"node health of {self.address}", format_table(self.rows())]
        for n in self.nodes:
            if n.healthy:
                lines.append(f"{n.label}: healthy")
            else:
                lines.append(f"{n.label}: UNHEALTHY: {'; '.join(n.reasons)}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "address": self.address,
            "healthy": self.healthy,
            "nodes": [
                {
                    "node_id": n.node_id,
                    "host": n.host,
                    "healthy": n.healthy,
                    "reasons": n.reasons,
                    "checks": [{"scope": s, **c.to_dict()} for s, c in n.checks],
                }
                for n in self.nodes
            ],
        }


def _norm(text: str) -> str:
    return re.sub(r"[^A-Z0-9]", "", text.upper())


def _advertised_type(node: Any) -> str:
    """Ray's accelerator type of a node (``accelerator_type:H100`` resource or the
    ``ray.io/accelerator-type`` label), "" when it advertises none."""
    if node is None:
        return ""
    for key in node.resources:
        if key.startswith("accelerator_type:"):
            return key.split(":", 1)[1]
    return node.labels.get("ray.io/accelerator-type", "")


def _gpu_count(found: dict[str, Any], node: Any) -> Check:
    ray_gpus = node.resources.get("GPU", 0.0) if node is not None else 0.0
    seen = found["gpu"].get("gpu_count")
    if seen is None:
        if ray_gpus > 0:
            return Check(
                "gpu_count", FAIL, f"Ray advertises {ray_gpus:g} GPUs but NVML is not readable."
            )
        return Check.na("gpu_count", "no GPU advertised and NVML")
    if seen != ray_gpus:
        return Check("gpu_count", FAIL, f"NVML sees {seen} GPUs, Ray advertises {ray_gpus:g}.")
    return Check("gpu_count", OK, f"NVML sees {seen} GPUs, as Ray advertises.")


def _gpu_model(found: dict[str, Any], node: Any) -> Check:
    names = [g.get("name", "") for g in found["gpu"].get("gpus", [])]
    if not names:
        return Check.na("gpu_model", "GPU model")
    wanted = _advertised_type(node)
    if not wanted:
        return Check.na("gpu_model", f"{names[0]}; Ray's accelerator type")
    other = sorted({n for n in names if _norm(wanted) not in _norm(n)})
    if other:
        return Check("gpu_model", FAIL, f"Ray advertises {wanted}, NVML names {', '.join(other)}.")
    return Check("gpu_model", OK, f"{len(names)} x {names[0]}, as Ray advertises ({wanted}).")


def _cpus(found: dict[str, Any], node: Any) -> Check:
    ray_cpus = node.resources.get("CPU") if node is not None else None
    host = next((c for c in found.get("host_checks", []) if c["name"] == "cpus"), None)
    logical = re.match(r"(\d+) logical", host["detail"]) if host else None
    if ray_cpus is None or logical is None:
        return Check.na("cpus_advertised", "CPUs advertised by Ray")
    n = int(logical.group(1))
    if ray_cpus > n:
        return Check(
            "cpus_advertised", FAIL, f"Ray advertises {ray_cpus:g} CPUs, the host has {n}."
        )
    return Check("cpus_advertised", OK, f"Ray advertises {ray_cpus:g} of {n} logical CPUs.")


def _driver_checks(found: list[dict[str, Any]]) -> dict[str, Check]:
    """node id -> driver consistency: the most common version is the reference; a node
    with another fails (all fail when no version is the most common)."""
    drivers = {f["node_id"]: f["gpu"].get("driver") for f in found if f["gpu"].get("driver")}
    out = {f["node_id"]: Check.na("driver_consistency", "driver version") for f in found}
    counts = Counter(drivers.values()).most_common()
    if len(counts) <= 1:
        for node_id, version in drivers.items():
            out[node_id] = Check(
                "driver_consistency", OK, f"driver {version} on all {len(drivers)} GPU nodes."
            )
        return out
    tie = counts[0][1] == counts[1][1]
    spread = ", ".join(f"{v} on {c}" for v, c in counts)
    for node_id, version in drivers.items():
        bad = tie or version != counts[0][0]
        detail = f"driver {version}; the GPU nodes run {spread}."
        out[node_id] = Check("driver_consistency", FAIL if bad else OK, detail)
    return out


def build_report(cluster: Any, result: dict[str, Any]) -> HealthReport:
    """The :class:`HealthReport` of ``result`` (:func:`~.node.check_all_nodes`) on
    ``cluster`` (a ClusterInfo: its nodes' resources and labels, as Ray advertises)."""
    by_id = {n.node_id: n for n in cluster.nodes}
    found = list(result.get("nodes", []))
    drivers = _driver_checks(found)
    nodes = []
    for f in sorted(found, key=lambda f: (f.get("host", ""), f["node_id"])):
        advertised = by_id.get(f["node_id"])
        checks: list[tuple[str, Check]] = [("node", Check.from_dict(f["gpu"]["nvml"]))]
        checks.append(("node", Check.from_dict(f["gpu"]["driver_check"])))
        checks += [("node", c(f, advertised)) for c in (_gpu_count, _gpu_model, _cpus)]
        checks.append(("node", drivers[f["node_id"]]))
        checks += [("host", Check.from_dict(c)) for c in f.get("host_checks", [])]
        for gpu in f["gpu"].get("gpus", []):
            checks += [(gpu["label"], Check.from_dict(c)) for c in gpu["checks"]]
        nodes.append(NodeHealth(f["node_id"], f.get("host", ""), checks))
    for node_id, why in sorted(result.get("missing", {}).items()):
        host = by_id[node_id].host if node_id in by_id else ""
        nodes.append(NodeHealth(node_id, host, [("node", Check("reachable", FAIL, f"{why}."))]))
    return HealthReport(getattr(cluster, "address", ""), nodes)
