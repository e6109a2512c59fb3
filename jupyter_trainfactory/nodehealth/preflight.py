"""``--preflight``: the node health check of the nodes a job may use, before it is submitted."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..spec_values import SpecError
from .report import HealthReport

__all__ = ["NODE_ID_LABEL", "avoid_unhealthy", "away_from", "preflight", "refusal"]

#: The label Ray gives every node: its node id.
NODE_ID_LABEL = "ray.io/node-id"


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


def away_from(selector: Any, node_ids: Iterable[str]) -> Any:
    """``selector`` (one ``{label: expression}`` or one per worker; None) with
    ``ray.io/node-id: !in(<node_ids>)`` added to each, so no worker goes to those nodes.
    Raises SpecError when a selector already constrains ``ray.io/node-id``."""
    excluded = f"!in({','.join(sorted(node_ids))})"

    def one(s: dict[str, str] | None) -> dict[str, str]:
        s = dict(s or {})
        if NODE_ID_LABEL in s:
            raise SpecError(
                f"--avoid-unhealthy adds a {NODE_ID_LABEL} label selector and the job's"
                " --label-selector already has one; give one or the other."
            )
        s[NODE_ID_LABEL] = excluded
        return s

    return [one(s) for s in selector] if isinstance(selector, list) else one(selector)


def avoid_unhealthy(
    manager, spec, node_ids: Iterable[str], recheck: Callable[[Any], Any], timeout_s: float = 30.0
):
    """``--avoid-unhealthy``: the health check of ``manager``'s cluster; when a node of
    ``node_ids`` (the placement's eligible nodes) failed, ``spec.label_selector`` is set
    to keep every worker away from the failed ones and ``recheck(spec)`` (the placement
    check) must still find room. Returns ``recheck``'s placement, or None when every
    eligible node passed (nothing changes). Raises SpecError (nothing submitted) when
    the other nodes cannot hold the job."""
    from .node import cluster_health

    report = cluster_health(manager, timeout_s=timeout_s)
    eligible = set(node_ids)
    bad = [n for n in report.unhealthy if n.node_id in eligible]
    if not bad:
        return None
    spec.label_selector = away_from(spec.label_selector, [n.node_id for n in bad])
    try:
        placement = recheck(spec)
    except SpecError as exc:
        raise SpecError(
            f"Preflight: node {bad[0].label} failed {bad[0].reasons[0]}; the other nodes"
            f" cannot hold the job ({exc}); not launched."
        ) from None
    for n in bad:
        logging.getLogger("trainfactory").warning(
            "Preflight: placing the job away from node %s (%s).", n.label, n.reasons[0]
        )
    return placement
