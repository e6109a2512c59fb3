"""What the benchmarks share: the embedded services for the length of a run, and one
line per measured figure (median, min-max spread, n)."""

from __future__ import annotations

import contextlib
import statistics
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@contextlib.contextmanager
def embedded_services() -> Iterator[object]:
    """The embedded Ray head and MLflow server (``services.Services``), started if needed;
    on exit, stops only those this context started (a running cluster is left as it was)."""
    from jupyter_trainfactory import services as svc

    before = svc.load_services()
    running = {n for n, p in (before.processes.items() if before else []) if p.alive()}
    services = svc.ensure_services()
    try:
        yield services
    finally:
        mine = tuple(n for n in ("ray", "mlflow") if n not in running)
        if mine:
            svc.stop_services(mine)


def spread(label: str, values: list[float], unit: str, digits: int = 2) -> str:
    """``label  median X unit  (min, max, n)`` for a list of measurements."""
    med = statistics.median(values)
    return (
        f"{label:38s} median {med:.{digits}f} {unit}"
        f"  (min {min(values):.{digits}f}, max {max(values):.{digits}f}, n={len(values)})"
    )
