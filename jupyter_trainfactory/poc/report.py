"""A proof of concept's report: its checks, its cluster, its text and two side by side."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..tables import format_table
from .checks import FAIL, NA, PASS, PocCheck

__all__ = ["PocReport", "compare_text", "fmt_value"]


def fmt_value(value: float | None, unit: str) -> str:
    """A check's value for a table: 3 significant digits, shares in percent."""
    if value is None:
        return "-"
    if unit == "x":
        return f"{100 * value:.3g} %"
    return f"{value:,.3g}" if abs(value) < 1000 else f"{value:,.0f}"


@dataclass
class PocReport:
    """One proof of concept: its ``run_id`` and ``job_id`` (experiment
    ``trainfactory-poc``), the ``checks``, the ``cluster`` it ran on (nodes, accelerators,
    versions), the ``thresholds`` file's name, the bandwidth ``curves`` and the goodput
    ``timeline`` (for the recovery view); ``html_path`` once written."""

    run_id: str
    job_id: str
    state: str
    checks: list[PocCheck]
    cluster: dict[str, str]
    thresholds: str
    curves: dict[tuple[str, str], list[tuple[int, float]]] = field(default_factory=dict)
    timeline: dict[str, Any] | None = None
    html_path: str = ""

    @property
    def passed(self) -> bool:
        """No check failed and the job succeeded (``measured`` and ``n/a`` do not fail)."""
        return self.state == "SUCCEEDED" and not any(c.status == FAIL for c in self.checks)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.checks:
            out[c.status] = out.get(c.status, 0) + 1
        return out

    def rows(self) -> list[dict[str, str]]:
        """The table: stage, check, value, unit, threshold, result."""
        return [
            {
                "stage": c.stage,
                "check": c.label,
                "value": fmt_value(c.value, c.unit),
                "unit": "" if c.unit == "x" else c.unit,
                "threshold": c.threshold,
                "result": c.status,
            }
            for c in self.checks
        ]

    def verdict(self) -> str:
        n = self.counts()
        word = "PASSED" if self.passed else "FAILED"
        parts = [f"{n.get(s, 0)} {s}" for s in (PASS, FAIL, "measured", NA) if n.get(s)]
        if self.state != "SUCCEEDED":
            parts.append(f"job {self.state}")
        return f"proof of concept {word}: {', '.join(parts)} (thresholds: {self.thresholds})"

    def text(self) -> str:
        """The cluster line, the table and the verdict."""
        cluster = ", ".join(f"{k} {v}" for k, v in self.cluster.items() if v)
        lines = [f"proof of concept {self.job_id} (run {self.run_id}) on {cluster}"]
        lines += [format_table(self.rows()), self.verdict()]
        if self.html_path:
            lines.append(f"report: {self.html_path}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<PocReport {self.job_id}: {self.verdict()}>"

    def metrics(self) -> dict[str, float]:
        """``poc/check/<name>`` for every measured check, ``poc/passed`` (1 or 0)."""
        out = {f"poc/check/{c.name}": c.value for c in self.checks if c.value is not None}
        out["poc/passed"] = 1.0 if self.passed else 0.0
        return out

    def tags(self) -> dict[str, str]:
        """The cluster description and the checks (JSON) as run tags."""
        tags = {f"trainfactory.poc.{k}": v for k, v in self.cluster.items()}
        tags["trainfactory.poc.thresholds"] = self.thresholds
        tags["trainfactory.poc.verdict"] = self.verdict()
        tags["trainfactory.poc.checks"] = json.dumps([c.to_dict() for c in self.checks])[:5000]
        return tags


def compare_text(a: PocReport, b: PocReport) -> str:
    """Two reports side by side: one row per check, A's and B's values and results, and
    B / A for the values both have."""
    by_b = {c.name: c for c in b.checks}
    rows = []
    for ca in a.checks:
        cb = by_b.get(ca.name)
        ratio = ""
        if cb and ca.value and cb.value is not None:
            ratio = f"{cb.value / ca.value:.3g}"
        rows.append(
            {
                "stage": ca.stage,
                "check": ca.label,
                "A": f"{fmt_value(ca.value, ca.unit)} {ca.status}",
                "B": f"{fmt_value(cb.value, cb.unit)} {cb.status}" if cb else "-",
                "B/A": ratio,
            }
        )
    head = [
        f"A: {a.job_id} (run {a.run_id}) on {a.cluster.get('accelerators', '?')}",
        f"B: {b.job_id} (run {b.run_id}) on {b.cluster.get('accelerators', '?')}",
    ]
    return "\n".join([*head, format_table(rows), f"A: {a.verdict()}", f"B: {b.verdict()}"])
