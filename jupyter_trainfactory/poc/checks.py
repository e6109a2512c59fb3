"""The checks of a proof of concept, computed from what its job recorded (pure).

:func:`build_checks` turns a poc run's latest metrics and tags (as
:mod:`ray_backend.poc_loop` and the job's telemetry wrote them) into one
:class:`PocCheck` per figure, judged against :class:`~.thresholds.Thresholds`. Every
figure says what it counts; a figure the run does not have is ``n/a`` with the reason,
a figure without a bound is ``measured``, never ``pass``.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from typing import Any

from ..telemetry.bandwidth import COLLECTIVES
from ..telemetry.flops import lookup_peak
from .thresholds import Thresholds

__all__ = ["CHECKS", "PASS", "FAIL", "MEASURED", "NA", "PocCheck", "bandwidth_curves"]

PASS, FAIL, MEASURED, NA = "pass", "fail", "measured", "n/a"

#: Check name -> (stage, what it is, unit). Thresholds files bound these names.
CHECKS: dict[str, tuple[str, str, str]] = {
    "nodes_healthy": ("node health", "nodes that passed every health check", "nodes"),
    "compute_tflops": ("compute", "dense matmul rate, slowest accelerator", "TFLOP/s"),
    "compute_fraction_of_peak": ("compute", "matmul rate / data-sheet peak", "x"),
    **{
        f"{c}_busbw_gb_per_s": ("collectives", f"{c.replace('_', '-')} bus bandwidth", "GB/s")
        for c in COLLECTIVES
    },
    **{
        f"{c}_inter_busbw_gb_per_s": (
            "collectives",
            f"{c.replace('_', '-')} bus bandwidth across nodes",
            "GB/s",
        )
        for c in COLLECTIVES
    },
    "tokens_per_s_per_accelerator": ("training", "tokens/s per accelerator", "tokens/s"),
    "mfu": ("training", "MFU against the data-sheet peak", "x"),
    "mfu_measured_peak": ("training", "MFU against the measured matmul rate", "x"),
    "data_wait_fraction": ("training", "share of step time waiting on data", "x"),
    "comm_fraction": ("training", "share of step time in allreduce", "x"),
    "checkpoint_save_s": ("checkpoints", "checkpoint save", "s"),
    "checkpoint_save_gb_per_s": ("checkpoints", "checkpoint save rate", "GB/s"),
    "checkpoint_restore_s": ("checkpoints", "checkpoint restore", "s"),
    "checkpoint_restore_gb_per_s": ("checkpoints", "checkpoint restore rate", "GB/s"),
    "recovery_mttr_s": ("recovery", "time from the kill to the first new step (MTTR)", "s"),
    "steps_lost": ("recovery", "steps computed again after the restart", "steps"),
}

_BUS = re.compile(r"^poc/(\w+)/(intra|inter)/(\d+)MiB/busbw_gb_per_s$")


@dataclass(frozen=True)
class PocCheck:
    """One figure: ``name`` (a key of :data:`CHECKS`), ``stage``, ``label``, ``value``
    (None when not measured), ``unit``, ``threshold`` text, ``status`` (``pass``,
    ``fail``, ``measured`` or ``n/a``), and ``detail`` (what it counts, or why n/a)."""

    name: str
    stage: str
    label: str
    value: float | None
    unit: str
    threshold: str
    status: str
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def bandwidth_curves(metrics: dict[str, float]) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """``(collective, scope) -> [(MiB, busbw GB/s), ...]`` sorted by size."""
    curves: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for key, value in metrics.items():
        m = _BUS.match(key)
        if m:
            curves.setdefault((m.group(1), m.group(2)), []).append((int(m.group(3)), value))
    return {k: sorted(v) for k, v in sorted(curves.items())}


def _judge(name: str, value: float | None, detail: str, thresholds: Thresholds | None) -> PocCheck:
    stage, label, unit = CHECKS[name]
    bound = thresholds.bounds.get(name) if thresholds else None
    if value is None:
        status, shown = NA, bound.text(unit) if bound else ""
    elif bound is None:
        status, shown = MEASURED, ""
    else:
        status, shown = (PASS if bound.passes(value) else FAIL), bound.text(unit)
    if bound is not None and bound.source and value is not None:
        detail = f"{detail}; threshold: {bound.source}"
    return PocCheck(name, stage, label, value, unit, shown, status, detail)


def _compute(m: dict[str, float], device: str, accelerator: str) -> dict[str, tuple]:
    rates = {k: v for k, v in m.items() if re.match(r"^rank\d+/poc/compute/tflops$", k)}
    if not rates:
        why = "the compute stage recorded nothing"
        return {"compute_tflops": (None, why), "compute_fraction_of_peak": (None, why)}
    slowest = min(rates.values())
    dtype = "fp32" if accelerator == "cpu" else "bf16"
    out = {
        "compute_tflops": (
            slowest,
            f"{dtype}, the slowest of {len(rates)} ranks (fastest {max(rates.values()):.3g})",
        )
    }
    peak = lookup_peak(device, "bf16") if accelerator != "cpu" else None
    if peak:
        out["compute_fraction_of_peak"] = (
            slowest * 1e12 / peak,
            f"against {peak / 1e12:g} TFLOP/s dense bf16 ({device}, telemetry/flops.py)",
        )
    else:
        out["compute_fraction_of_peak"] = (None, f"no data-sheet peak for {device or 'CPU'}")
    return out


def _collectives(m: dict[str, float]) -> dict[str, tuple]:
    curves = bandwidth_curves(m)
    ranks = int(m.get("poc/collectives/ranks", 0))
    nodes = int(m.get("poc/collectives/nodes", 1))
    out: dict[str, tuple] = {}
    for name in COLLECTIVES:
        for scope in ("intra", "inter"):
            check = f"{name}_busbw_gb_per_s" if scope == "intra" else f"{name}_inter_busbw_gb_per_s"
            curve = curves.get((name, scope))
            if curve:
                mib, bw = curve[-1]
                where = "within a node" if scope == "intra" else "across nodes"
                out[check] = (bw, f"{where}, {ranks} ranks, at {mib} MiB (nccl-tests busbw)")
            elif ranks == 1:
                out[check] = (None, "one rank: a collective over one device moves nothing")
            elif scope == "inter":
                out[check] = (None, "one node: nothing crosses nodes")
            elif ranks > 1 and nodes == ranks:
                out[check] = (None, "one rank per node: nothing within a node to measure")
            else:
                out[check] = (None, "the collectives stage recorded nothing")
    return out


def _training(m: dict[str, float], tags: dict[str, str], slowest_tflops: float | None):
    tps = m.get("train/tokens_per_s_per_gpu", m.get("train/tokens_per_s_per_worker"))
    fpt = (
        float(tags["trainfactory.flops_per_token"])
        if "trainfactory.flops_per_token" in tags
        else None
    )
    out: dict[str, tuple] = {
        "tokens_per_s_per_accelerator": (tps, "reference model, synthetic tokens, latest window"),
        "mfu": (m.get("train/mfu"), tags.get("trainfactory.mfu_note") or "data-sheet peak"),
        "data_wait_fraction": (m.get("train/data_wait_fraction"), "of step time"),
        "comm_fraction": (m.get("train/comm_fraction"), "of step time (gradient allreduce)"),
    }
    if out["mfu"][0] is not None:
        out["mfu"] = (
            out["mfu"][0],
            f"peak {float(tags.get('trainfactory.peak_flops', 0)) / 1e12:g} TFLOP/s",
        )
    if tps and fpt and slowest_tflops:
        out["mfu_measured_peak"] = (
            tps * fpt / (slowest_tflops * 1e12),
            f"{fpt:.3g} FLOPs/token against the compute stage's {slowest_tflops:.3g} TFLOP/s",
        )
    else:
        out["mfu_measured_peak"] = (None, "needs tokens/s, FLOPs per token and a matmul rate")
    return out


def _storage(m: dict[str, float]) -> dict[str, tuple]:
    size = m.get("poc/storage/bytes")
    what = f"{size / 1e6:.3g} MB, torch.save to the job's storage" if size else "not measured"
    return {
        "checkpoint_save_s": (m.get("poc/storage/save_s"), what),
        "checkpoint_save_gb_per_s": (m.get("poc/storage/save_gb_per_s"), what),
        "checkpoint_restore_s": (m.get("poc/storage/restore_s"), what + ", read back"),
        "checkpoint_restore_gb_per_s": (
            m.get("poc/storage/restore_gb_per_s"),
            what + ", read back",
        ),
    }


def _first_failure(tags: dict[str, str]) -> dict[str, Any]:
    """The run's first failure record (``trainfactory.faults.records``), {} if none."""
    try:
        records = json.loads(tags.get("trainfactory.faults.records") or "[]")
    except ValueError:
        return {}
    return records[0] if records and isinstance(records[0], dict) else {}


def _recovery(m: dict[str, float], tags: dict[str, str], kill_step: int | None) -> dict[str, tuple]:
    """MTTR and the steps lost: from the run's failure record (the step the job had
    reached, the step restored), else from ``kill_step`` (the reference workload's)."""
    mttr, restored = m.get("faults/mttr_s"), m.get("faults/restore_step")
    if mttr is None:
        why = "no failure was recorded (the kill did not happen or the job did not recover)"
        return {"recovery_mttr_s": (None, why), "steps_lost": (None, why)}
    record = _first_failure(tags)
    reached = record.get("step_reached", kill_step)
    restored = record.get("restored_step", restored)
    who = f"rank {record['rank']}" if "rank" in record else "a worker"
    if record.get("node"):
        who += f" on {record['node']}"
    at = f" at step {reached:g}" if reached is not None else ""
    lost = record.get("steps_lost")
    if lost is None and reached is not None and restored is not None:
        lost = reached - restored
    return {
        "recovery_mttr_s": (mttr, f"{who} SIGKILLed{at}"),
        "steps_lost": (
            None if lost is None else float(lost),
            f"killed{at}, restored from step {restored:g}"
            if restored is not None
            else "no restore recorded",
        ),
    }


def build_checks(
    metrics: dict[str, float],
    tags: dict[str, str],
    *,
    health: dict[str, Any] | None,
    accelerator: str,
    kill_step: int | None,
    thresholds: Thresholds | None,
) -> list[PocCheck]:
    """Every check of :data:`CHECKS`, in stage order, from a poc run's latest ``metrics``
    and ``tags``, the ``health`` report (``HealthReport.to_dict()``, None when it was
    not run), the job's ``accelerator`` (``"cpu"``, ``"gpu"``...) and ``kill_step`` (the reference
    workload's, None for a user's function: the failure record says where it died)."""
    device = tags.get("trainfactory.device_name", "")
    found: dict[str, tuple] = {}
    if health is None:
        found["nodes_healthy"] = (None, "the node health check did not run")
    else:
        nodes = health.get("nodes", [])
        good = sum(1 for n in nodes if n.get("healthy"))
        bad = "; ".join(f"{n['host']}: {n['reasons'][0]}" for n in nodes if not n.get("healthy"))
        found["nodes_healthy"] = (
            float(good),
            f"{good} of {len(nodes)}" + (f" ({bad})" if bad else ""),
        )
    found.update(_compute(metrics, device, accelerator))
    found.update(_collectives(metrics))
    found.update(_training(metrics, tags, found["compute_tflops"][0]))
    found.update(_storage(metrics))
    found.update(_recovery(metrics, tags, kill_step))
    checks = [_judge(name, *found[name], thresholds) for name in CHECKS]
    if health is not None:  # healthy nodes are judged by the health check itself
        n = checks[0]
        status = PASS if health.get("healthy") else FAIL
        checks[0] = PocCheck(n.name, n.stage, n.label, n.value, n.unit, "all", status, n.detail)
    return checks
