"""``--preflight``: the node health check of the nodes a job may use, before it is submitted."""

from __future__ import annotations

from collections.abc import Iterable

from ..spec_values import SpecError
from .report import HealthReport

__all__ = ["preflight", "refusal"]


def refusal(report: HealthReport, node_ids: Iterable[str]) -> str | None:
    """The one sentence that refuses a launch whose nodes ``node_ids`` (the placement's
    eligible nodes) include one that failed a check of ``report``; None when every one
    of them passed (a check a device lacks, ``n/a``, is no failure)."""
    eligible = set(node_ids)
    bad = [n for n in report.unhealthy if n.node_id in eligible]
    if not bad:
        return None
    first = bad[0]
    more = f" and {len(bad) - 1} more node(s)" if len(bad) > 1 else ""
    return (
        f"Preflight: node {first.label} failed {first.reasons[0]}{more}; not launched"
        " (`%train health` shows every check)."
    )


def preflight(manager, node_ids: Iterable[str], timeout_s: float = 30.0) -> HealthReport:
    """Run the health check (:func:`~.node.cluster_health`) on ``manager``'s cluster and
    raise SpecError with :func:`refusal`'s sentence when a node the job may use failed.
    Returns the report otherwise."""
    from .node import cluster_health

    report = cluster_health(manager, timeout_s=timeout_s)
    sentence = refusal(report, node_ids)
    if sentence:
        raise SpecError(sentence)
    return report
