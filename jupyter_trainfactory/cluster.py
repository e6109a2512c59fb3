"""The Ray cluster a job goes to: its description and the checks made before
anything is submitted.

:class:`ClusterInfo` is what the checks read: the Ray and Python versions of the cluster
(the dashboard's ``/api/version`` and ``/api/v0/cluster_metadata``) and every alive node
with its host, total resources and labels (Ray's state API). It is plain data
(``to_dict``/``from_dict``), so the checks are unit-tested against recorded clusters.

:func:`check_job` raises :class:`~.spec.SpecError` with one sentence that says what to
do instead when the job could never run there; busy-but-existing resources are not an
error (the job waits as PENDING).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .raytoken import (  # noqa: F401 (the token API, kept importable from here)
    cluster_headers,
    find_token,
    save_token,
    token_file,
    token_source,
    verify_token,
)
from .spec import PLACEMENTS, JobSpec, SpecError, selector_text

__all__ = [
    "ClusterInfo",
    "Node",
    "Placement",
    "check_job",
    "check_placement",
    "check_storage",
    "check_tracking_uri",
    "check_versions",
    "cluster_headers",
    "describe",
    "eligible_nodes",
    "find_token",
    "label_matches",
    "resolve_address",
    "save_token",
    "summary_text",
    "token_file",
    "token_source",
    "verify_token",
]

#: Storage URIs that every node reaches by itself (pyarrow filesystems Ray Train uses).
REMOTE_STORAGE_SCHEMES = ("s3", "gs", "gcs", "abfs", "abfss", "az", "hdfs", "viewfs", "oss")
#: Filesystems that are shared between hosts when mounted at the same path (psutil fstype).
NETWORK_FILESYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "lustre", "gpfs", "beegfs", "cephfs", "ceph")
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


@dataclass
class Node:
    """One alive Ray node: its id, host address, total resources and labels."""

    node_id: str
    host: str
    resources: dict[str, float]
    labels: dict[str, str] = field(default_factory=dict)
    is_head: bool = False


@dataclass
class ClusterInfo:
    """A Ray cluster as the checks see it (``ray_version``/``python_version`` "" when
    the cluster does not say)."""

    address: str
    ray_version: str
    python_version: str
    nodes: list[Node]

    @property
    def hosts(self) -> set[str]:
        """The distinct host addresses of the nodes (several raylets may share one)."""
        return {n.host for n in self.nodes}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterInfo:
        return cls(
            address=data.get("address", ""),
            ray_version=data.get("ray_version", ""),
            python_version=data.get("python_version", ""),
            nodes=[Node(**n) for n in data.get("nodes", [])],
        )


@dataclass
class Placement:
    """What the checks found for a job: the nodes it may use and how few can hold it."""

    eligible: list[Node]
    slots: dict[str, int]  # node id -> workers of the job's shape it holds when idle
    min_nodes: int  # the fewest nodes that can hold every worker

    @property
    def hosts(self) -> set[str]:
        return {n.host for n in self.eligible if self.slots.get(n.node_id, 0) > 0}


# -- address ---------------------------------------------------------------------


def resolve_address(address: str | None) -> str | None:
    """The Jobs API address to use: ``address``, else ``RAY_ADDRESS`` when it is a
    dashboard URL (``http(s)://``), else None (the embedded local head).

    A ``RAY_ADDRESS`` of another form (``host:6379``, ``auto``, ``ray://``) is the GCS or
    Ray Client address of code running inside a cluster, not a Jobs API: it is ignored.
    """
    if address:
        address = address.strip()
        if not re.match(r"^https?://", address):
            raise SpecError(
                f"--address takes the Ray dashboard's URL (http://HEAD:8265), got {address!r}."
            )
        return address.rstrip("/")
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if re.match(r"^https?://", env):
        return env.rstrip("/")
    return None


# -- describing a cluster --------------------------------------------------------------


def describe(address: str, headers: dict[str, str], nodes: list[Any]) -> ClusterInfo:
    """The :class:`ClusterInfo` of the cluster at ``address`` from its alive ``nodes``
    (``ray.util.state`` NodeState records) and its dashboard's version endpoints."""
    import requests

    ray_version = python_version = ""
    try:
        reply = requests.get(f"{address}/api/v0/cluster_metadata", headers=headers, timeout=10)
        data = reply.json().get("data", {}) if reply.ok else {}
        ray_version = str(data.get("rayVersion") or "")
        python_version = str(data.get("pythonVersion") or "")
    except (requests.RequestException, ValueError):
        pass
    if not ray_version:
        try:
            reply = requests.get(f"{address}/api/version", headers=headers, timeout=10)
            ray_version = str(reply.json().get("ray_version") or "") if reply.ok else ""
        except (requests.RequestException, ValueError):
            pass
    return ClusterInfo(
        address=address,
        ray_version=ray_version,
        python_version=python_version,
        nodes=[
            Node(
                node_id=n.node_id,
                host=n.node_ip,
                resources={k: float(v) for k, v in (n.resources_total or {}).items()},
                labels=dict(n.labels or {}),
                is_head=bool(n.is_head_node),
            )
            for n in nodes
        ],
    )


# -- the checks ------------------------------------------------------------------------


def _minor(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


def check_versions(cluster: ClusterInfo, ray_version: str, python_version: str) -> None:
    """The shipped function is pickled by value (cloudpickle: same Python minor needed)
    and the shipped packages use this Ray's Train API (same Ray major.minor needed).

    Raises SpecError on a mismatch; a version the cluster does not report is not checked.
    """
    if cluster.python_version and _minor(cluster.python_version) != _minor(python_version):
        raise SpecError(
            f"The cluster runs Python {cluster.python_version} and this kernel"
            f" {python_version}; the function is pickled by value and needs the same minor"
            " version: use a kernel (or cluster image) with matching Python."
        )
    if cluster.ray_version and _minor(cluster.ray_version) != _minor(ray_version):
        raise SpecError(
            f"The cluster runs Ray {cluster.ray_version} and this kernel Ray {ray_version};"
            f" install ray=={cluster.ray_version} here (or upgrade the cluster) so that both"
            " speak the same Ray Train API."
        )


def _local_addresses() -> set[str]:
    import psutil

    found = {"127.0.0.1", "::1"}
    for addrs in psutil.net_if_addrs().values():
        found.update(a.address.split("%")[0] for a in addrs if a.address)
    return found


def _is_loopback(host: str) -> bool:
    if host.lower() in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_tracking_uri(
    cluster: ClusterInfo, tracking_uri: str, local_addresses: set[str] | None = None
) -> None:
    """The job's recorder writes to ``tracking_uri`` from inside the cluster: a local
    SQLite/file store or a loopback URI works only when every node is on this machine.

    Raises SpecError naming the URI and what to use instead.
    """
    local = _local_addresses() if local_addresses is None else local_addresses
    elsewhere = sorted(h for h in cluster.hosts if h not in local and not _is_loopback(h))
    if not elsewhere:
        return
    url = urlparse(tracking_uri)
    scheme = url.scheme.lower()
    if scheme in ("", "file") or scheme.startswith("sqlite"):
        what = "a local file store" if scheme in ("", "file") else "a local SQLite database"
    elif url.hostname and _is_loopback(url.hostname):
        what = "a loopback address"
    else:
        return
    raise SpecError(
        f"The tracking URI {tracking_uri} is {what}, which the cluster's nodes on"
        f" {', '.join(elsewhere[:3])} cannot reach; use an MLflow server they reach"
        " (--tracking-uri http://MLFLOW-HOST:5000)."
    )


def _network_mount(path: str) -> bool:
    import psutil

    best, fstype = "", ""
    resolved = str(Path(path).expanduser().resolve())
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint.rstrip("/") or "/"
        inside = resolved == mount or resolved.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) > len(best):
            best, fstype = mount, part.fstype.lower()
    return fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse.")


def check_storage(placement: Placement, storage: str, shared: bool | None = None) -> None:
    """Checkpoints written on one node must be readable on the others: a local path is
    refused when the job's nodes are on more than one host, unless it lies on a network
    filesystem here (NFS, Lustre, ...; ``shared`` overrides that test).

    Raises SpecError naming the hosts and what to use instead.
    """
    hosts = placement.hosts
    if len(hosts) <= 1:
        return
    scheme = urlparse(storage).scheme.lower()
    if scheme in REMOTE_STORAGE_SCHEMES or (len(scheme) > 1 and scheme != "file"):
        return
    path = storage.removeprefix("file://")
    if shared is None:
        shared = _network_mount(path)
    if shared:
        return
    raise SpecError(
        f"The storage path {storage} is local, but the job's nodes are on"
        f" {len(hosts)} hosts ({', '.join(sorted(hosts)[:3])}); use shared storage"
        " (--storage s3://BUCKET/PATH, or a path on NFS mounted at the same place on"
        " every node)."
    )


def label_matches(labels: dict[str, str], selector: dict[str, str]) -> bool:
    """Whether a node's ``labels`` match a Ray label selector: ``value``, ``!value``,
    ``in(a,b)``, ``!in(a,b)`` (Ray's label selector syntax)."""
    for key, expr in selector.items():
        value = labels.get(key)
        negate = expr.startswith("!")
        body = expr[1:] if negate else expr
        match = re.fullmatch(r"in\((.*)\)", body)
        choices = [c.strip() for c in match.group(1).split(",")] if match else [body]
        hit = value is not None and value in choices
        if hit == negate:
            return False
    return True


def _shape_text(need: dict[str, float]) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in need.items())


def _slots(node: Node, need: dict[str, float]) -> int:
    return min(math.floor(node.resources.get(k, 0.0) / v + 1e-9) for k, v in need.items())


def eligible_nodes(cluster: ClusterInfo, spec: JobSpec) -> list[Node]:
    """The nodes whose labels match the job's label selector (every node without one;
    with a per-worker list, the nodes any worker may use)."""
    selectors = spec.label_selector
    if not selectors:
        return list(cluster.nodes)
    selectors = selectors if isinstance(selectors, list) else [selectors]
    return [n for n in cluster.nodes if any(label_matches(n.labels, s) for s in selectors)]


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"


def check_placement(cluster: ClusterInfo, spec: JobSpec) -> Placement:
    """Whether the cluster can ever hold the job's workers as asked (per node, not in
    total: a worker's whole shape must fit on one node), by ``spec.placement`` and on the
    nodes its label selector allows.

    Returns the :class:`Placement`. Raises SpecError naming the missing shape.
    """
    need = spec.worker_resources()
    shape = _shape_text(need)
    nodes = eligible_nodes(cluster, spec)
    selector = selector_text(spec.label_selector)
    where = f"the nodes matching {selector}" if selector else "the cluster"
    if not nodes:
        raise SpecError(
            f"No node of the cluster matches the label selector {selector}; see the nodes'"
            " labels with `jupyter trainfactory cluster` (with --address) or drop"
            " --label-selector."
        )
    slots = {n.node_id: _slots(n, need) for n in nodes}
    if max(slots.values()) == 0:
        missing = [k for k in need if not any(n.resources.get(k, 0) >= need[k] for n in nodes)]
        largest = ", ".join(
            f"{k} {max((n.resources.get(k, 0.0) for n in nodes), default=0):g}" for k in need
        )
        which = f" ({', '.join(missing)} missing)" if missing else ""
        first = f"No node matching {selector}" if selector else "No node of the cluster"
        raise SpecError(
            f"{first} has {shape} for one worker{which}; the largest have {largest}: ask for"
            " less per worker"
            + (
                ", or widen the label selector."
                if selector
                else " or use a cluster with such nodes."
            )
        )
    counts = sorted(slots.values(), reverse=True)
    total = sum(counts)
    strategy = spec.placement
    if strategy == "strict-pack" and counts[0] < spec.workers:
        raise SpecError(
            f"--placement strict-pack needs one node for all {spec.workers} workers of"
            f" {shape}, but the largest node{' matching ' + selector if selector else ''}"
            f" holds {counts[0]}; use --placement pack (as few nodes as possible) or fewer"
            " workers."
        )
    if strategy == "strict-spread":
        usable = sum(1 for c in counts if c > 0)
        if usable < spec.workers:
            raise SpecError(
                f"--placement strict-spread needs {spec.workers} nodes that each hold a"
                f" worker of {shape}, but {where} has {usable}; use --placement spread"
                " or fewer workers."
            )
    elif total < spec.workers:
        raise SpecError(
            f"{where[0].upper()}{where[1:]} can hold at most {_workers(total)} of {shape}, but"
            f" {spec.workers} were asked for; use fewer workers or less per worker"
            + (", or widen the label selector." if selector else ".")
        )
    if strategy == "strict-spread":
        min_nodes = spec.workers
    else:
        min_nodes, held = 0, 0
        for count in counts:
            if held >= spec.workers:
                break
            held += count
            min_nodes += 1
    return Placement(eligible=nodes, slots=slots, min_nodes=min_nodes)


def check_job(
    cluster: ClusterInfo,
    spec: JobSpec,
    tracking_uri: str,
    storage: str | None,
    remote: bool,
    local_addresses: set[str] | None = None,
) -> Placement:
    """Every check of a job against ``cluster`` before submission: versions (``remote``
    clusters only: the embedded head runs this very Python and Ray), placement and
    resources, tracking URI, storage. Returns the Placement; raises SpecError."""
    import ray

    if remote:
        check_versions(cluster, ray.__version__, "{}.{}.{}".format(*sys.version_info[:3]))
    placement = check_placement(cluster, spec)
    check_tracking_uri(cluster, tracking_uri, local_addresses)
    if storage:
        check_storage(placement, storage)
    return placement


def ray_strategy(placement: str) -> str:
    """``pack`` -> ``PACK`` (:data:`~.spec.PLACEMENTS`)."""
    return PLACEMENTS[placement]


def summary_text(cluster: ClusterInfo, ray_version: str, python_version: str) -> str:
    """What ``%train cluster`` prints: versions (and whether they match this kernel's),
    then one line per node with its host, resources and labels."""
    lines = [f"cluster {cluster.address}"]
    try:
        check_versions(cluster, ray_version, python_version)
        verdict = "match this kernel"
    except SpecError as exc:
        verdict = f"MISMATCH: {exc}"
    if not cluster.ray_version or not cluster.python_version:
        verdict = "not reported by the cluster, so not checked"
    lines.append(
        f"  Ray {cluster.ray_version or '?'}, Python {cluster.python_version or '?'}: {verdict}"
    )
    n, h = len(cluster.nodes), len(cluster.hosts)
    lines.append(f"  {n} node{'s' if n != 1 else ''} on {h} host{'s' if h != 1 else ''}")
    skip = ("memory", "object_store_memory")
    for node in sorted(cluster.nodes, key=lambda n: (not n.is_head, n.host, n.node_id)):
        shown = {
            k: v
            for k, v in node.resources.items()
            if k not in skip and not k.startswith(("node:", "accelerator_type:"))
        }
        text = ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items()))
        labels = " ".join(
            f"{k}={v}" for k, v in sorted(node.labels.items()) if k != "ray.io/node-id"
        )
        role = "head" if node.is_head else "node"
        line = f"  {role} {node.node_id[:8]} {node.host}: {text or 'no resources'}"
        lines.append(line + (f"  [{labels}]" if labels else ""))
    return "\n".join(lines)
