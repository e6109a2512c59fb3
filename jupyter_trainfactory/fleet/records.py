"""A job's failure log and planned stops in its MLflow run: what the recorder (and a
resume) writes, and reading it back.

Two run tags of failures, both kept over resumes (a resumed submission goes on from the
earlier ones' tags):

- ``trainfactory.faults.records``: the latest failures, oldest first, each a
  ``telemetry.goodput.FailureRecord`` (times in s since the epoch, ``mttr_s``,
  ``steps_lost``) whose ``kind`` is the failure's kind (:mod:`.kinds`), with its
  ``rank`` and ``node`` (the node's label, ``10-0-0-12``) and ``"drill": true`` for a
  failure injected on purpose (:func:`.kinds.injected`); as many as fit in 5,000
  characters (the tag limit of older MLflow servers);
- ``trainfactory.faults.counts``: ``{"kinds": {kind: n}, "nodes": {node: {kind: n}},
  "drills": {kind: n}}`` over every failure of the job, so counts stay exact when old
  records drop out; ``kinds`` and ``nodes`` count real failures, ``drills`` the injected
  ones by the kind they simulate.

Planned stops: a run closed ``KILLED`` ended with one (``%train stop``, ``--now``, the
panel's Stop, a budget). A resume reopens the run, so it first adds that stop to
``trainfactory.stops`` (:func:`planned_stops`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..tracking import TAG
from .kinds import PREEMPTION, UNCLASSIFIED, classify, injected

__all__ = [
    "COUNTS_TAG",
    "RECORDS_TAG",
    "STOPS_TAG",
    "failure_tags",
    "planned_stops",
    "read_counts",
    "read_records",
    "record_kind",
]

RECORDS_TAG = TAG.FAILURES
COUNTS_TAG = TAG.FAULT_COUNTS
STOPS_TAG = TAG.STOPS
_COUNT_KEYS = ("kinds", "nodes", "drills")
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
    earlier submissions' records ``before`` and counts ``counts_before``. A drill
    (:func:`.kinds.injected`) is marked in its record and counted under ``drills`` only."""
    rows = []
    counts: dict[str, dict] = {}
    for key in _COUNT_KEYS:
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
        if cause and injected(cause):  # a drill: never among the real failures' counts
            row["drill"] = True
            counts["drills"][kind] = counts["drills"].get(kind, 0) + 1
            continue
        counts["kinds"][kind] = counts["kinds"].get(kind, 0) + 1
        if node:
            per_node = counts["nodes"].setdefault(node, {})
            per_node[kind] = per_node.get(kind, 0) + 1
    if not counts["drills"]:
        del counts["drills"]  # written once a job has had one
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
    """``{"kinds": {kind: n}, "nodes": {node: {kind: n}}, "drills": {kind: n}}`` of a
    run's tags. A run written before the counts tag existed counts its records instead
    (their kind ``failure`` read as ``unclassified``)."""
    try:
        counts = json.loads(tags.get(COUNTS_TAG) or "null")
    except ValueError:
        counts = None
    if isinstance(counts, dict):
        return {key: dict(counts.get(key) or {}) for key in _COUNT_KEYS}
    out: dict[str, Any] = {key: {} for key in _COUNT_KEYS}
    for r in read_records(tags):
        kind = record_kind(r)
        if r.get("drill"):
            out["drills"][kind] = out["drills"].get(kind, 0) + 1
            continue
        out["kinds"][kind] = out["kinds"].get(kind, 0) + 1
        if r.get("node"):
            per = out["nodes"].setdefault(r["node"], {})
            per[kind] = per.get(kind, 0) + 1
    return out


def planned_stops(status: str, tags: Mapping[str, str]) -> int:
    """How many planned stops a job's run records: those of earlier submissions
    (``trainfactory.stops``, which a resume writes before it reopens the run) plus one
    when the run is closed ``KILLED`` now (``status``: MLflow's run status)."""
    try:
        before = max(0, int(tags.get(STOPS_TAG) or 0))
    except ValueError:
        before = 0
    return before + (status == "KILLED")
