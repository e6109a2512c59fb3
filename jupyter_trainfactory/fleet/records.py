"""A job's failure log in its MLflow run: what the recorder writes, and reading it back.

Two run tags, both kept over resumes (a resumed submission goes on from the earlier
ones' tags):

- ``trainfactory.faults.records``: the latest failures, oldest first, each a
  ``telemetry.goodput.FailureRecord`` (times in s since the epoch, ``mttr_s``,
  ``steps_lost``) whose ``kind`` is the failure's kind (:mod:`.kinds`), with its
  ``rank`` and ``node`` (the node's label, ``10-0-0-12``); as many as fit in 5,000
  characters (the tag limit of older MLflow servers);
- ``trainfactory.faults.counts``: ``{"kinds": {kind: n}, "nodes": {node: {kind: n}}}``
  over every failure of the job, so counts stay exact when old records drop out.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..tracking import TAG
from .kinds import PREEMPTION, UNCLASSIFIED, classify

__all__ = [
    "COUNTS_TAG",
    "RECORDS_TAG",
    "failure_tags",
    "read_counts",
    "read_records",
    "record_kind",
]

RECORDS_TAG = TAG.FAILURES
COUNTS_TAG = TAG.FAULT_COUNTS
_TAG_LIMIT = 5000


def _label(node_ip: str) -> str:
    return node_ip.replace(".", "-").replace(":", "-")  # as ray_backend.sampler.node_label


def failure_tags(
    failures: Sequence[Any],
    causes: Sequence[Mapping[str, Any]],
    before: Sequence[dict[str, Any]] = (),
    counts_before: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """The two tags for this submission's ``failures`` (``FailureRecord``s, in order) and
    their root ``causes`` (``Attempts.failure_causes()``, one per failure), after the
    earlier submissions' records ``before`` and counts ``counts_before``."""
    rows = []
    counts = {"kinds": {}, "nodes": {}}
    for key in ("kinds", "nodes"):
        counts[key] = json.loads(json.dumps((counts_before or {}).get(key, {})))
    for record, cause in zip(failures, causes, strict=False):
        kind = (
            classify(cause)
            if cause
            else (record.kind if record.kind == PREEMPTION else UNCLASSIFIED)
        )
        node = _label(str(cause.get("node") or "")) if cause else ""
        row = {**dataclasses.asdict(record), "kind": kind, "rank": cause.get("rank"), "node": node}
        rows.append(row)
        counts["kinds"][kind] = counts["kinds"].get(kind, 0) + 1
        if node:
            per_node = counts["nodes"].setdefault(node, {})
            per_node[kind] = per_node.get(kind, 0) + 1
    kept = [*before, *rows]
    text = json.dumps(kept)
    while len(text) > _TAG_LIMIT and kept:
        kept = kept[1:]
        text = json.dumps(kept)
    return {RECORDS_TAG: text, COUNTS_TAG: json.dumps(counts)}


def record_kind(record: Mapping[str, Any]) -> str:
    """A record's kind; ``failure`` (written before kinds were) reads as ``unclassified``."""
    kind = str(record.get("kind") or UNCLASSIFIED)
    return UNCLASSIFIED if kind == "failure" else kind


def read_records(tags: Mapping[str, str]) -> list[dict[str, Any]]:
    """The failure records of a run's tags (``[]`` when none or unreadable)."""
    try:
        records = json.loads(tags.get(RECORDS_TAG) or "[]")
    except ValueError:
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def read_counts(tags: Mapping[str, str]) -> dict[str, Any]:
    """``{"kinds": {kind: n}, "nodes": {node: {kind: n}}}`` of a run's tags. A run
    written before the counts tag existed counts its records instead (their kind
    ``failure`` read as ``unclassified``)."""
    try:
        counts = json.loads(tags.get(COUNTS_TAG) or "null")
    except ValueError:
        counts = None
    if isinstance(counts, dict):
        return {"kinds": dict(counts.get("kinds") or {}), "nodes": dict(counts.get("nodes") or {})}
    out: dict[str, Any] = {"kinds": {}, "nodes": {}}
    for r in read_records(tags):
        kind = record_kind(r)
        out["kinds"][kind] = out["kinds"].get(kind, 0) + 1
        if r.get("node"):
            per = out["nodes"].setdefault(r["node"], {})
            per[kind] = per.get(kind, 0) + 1
    return out
