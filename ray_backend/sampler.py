"""NodeSampler: one actor per node, samples host and GPU metrics and sends them to the recorder."""

from __future__ import annotations

import threading
import time
from typing import Any

from jupyter_trainfactory.telemetry.system import gpu_sample, host_sample, nvml_handles

__all__ = ["NodeSampler", "node_label"]


def node_label(node_ip: str) -> str:
    """Metric-key form of a node address: ``10.0.0.12`` -> ``10-0-0-12``."""
    return node_ip.replace(".", "-").replace(":", "-")


class NodeSampler:
    """Samples this node every ``interval_s`` seconds into ``system/<node>/...`` metrics.

    Keys: ``system/<node>/cpu_utilization`` (%), ``system/<node>/memory_used_mb`` (MB), and
    per GPU ``system/<node>/gpu<i>/utilization`` (%), ``.../memory_used_mb``, ``.../power_w``.
    The metric step is the sample index since the sampler started.
    """

    def __init__(self, recorder: Any, node_ip: str, interval_s: float = 1.0):
        import psutil

        self._psutil = psutil
        try:
            import pynvml
        except ImportError:
            pynvml = None
        self._pynvml = pynvml
        self._handles = nvml_handles(pynvml) if pynvml else []
        self._recorder = recorder
        self._prefix = f"system/{node_label(node_ip)}"
        self._interval = interval_s
        self._stop = threading.Event()
        host_sample(psutil)  # prime cpu_percent: its first reading is always 0.0
        self._thread = threading.Thread(target=self._loop, name="node-sampler", daemon=True)
        self._thread.start()

    def sample(self) -> dict[str, float]:
        """One sample of this node, keyed for MLflow."""
        values = {f"{self._prefix}/{k}": v for k, v in host_sample(self._psutil).items()}
        for i, handle in enumerate(self._handles):
            for key, value in gpu_sample(self._pynvml, handle).items():
                values[f"{self._prefix}/gpu{i}/{key}"] = value
        return values

    def gpu_count(self) -> int:
        return len(self._handles)

    def _loop(self) -> None:
        index = 0
        while not self._stop.wait(self._interval):
            self._recorder.node_metrics.remote(self.sample(), index, time.time())
            index += 1

    def stop(self) -> None:
        self._stop.set()
