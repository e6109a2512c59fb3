"""NodeSampler: one actor per node, samples host and GPU metrics and sends them to the recorder."""

from __future__ import annotations

import threading
import time
from typing import Any

from jupyter_trainfactory.telemetry.system import (
    gpu_sample,
    host_sample,
    init_nvml,
    nvml_shutdown,
    visible_gpus,
)

__all__ = ["NodeSampler", "node_label"]


def node_label(node_ip: str) -> str:
    """Metric-key form of a node address: ``10.0.0.12`` -> ``10-0-0-12``."""
    return node_ip.replace(".", "-").replace(":", "-")


class NodeSampler:
    """Samples this node every ``interval_s`` seconds into ``system/<node>/...`` metrics.

    Keys: ``system/<node>/cpu_utilization`` (%), ``system/<node>/memory_used_mb`` (MB), and
    per GPU ``system/<node>/<gpu label>/<name>`` with the names and units of
    :func:`~jupyter_trainfactory.telemetry.system.gpu_sample` (``utilization`` %,
    ``memory_used_mb``, ``power_w``, ``temperature_c``, ``sm_clock_mhz``); values NVML
    cannot read are left out, never sent as 0. Totals that do not change (memory) go to
    the recorder once, with the device list.

    Only the GPUs the job's workers see are sampled: each worker calls
    :meth:`watch_devices` with its ``CUDA_VISIBLE_DEVICES``; until one does, the node's
    GPUs are not sampled. Without NVML the sampler sends one note to the recorder and
    samples CPU and host memory only. The metric step is the sample index.
    """

    def __init__(self, recorder: Any, node_ip: str, interval_s: float = 1.0):
        import psutil

        self._psutil = psutil
        try:
            import pynvml
        except ImportError:
            pynvml = None
        self._pynvml = pynvml
        self._node = node_label(node_ip)
        self._note = init_nvml(pynvml)
        self._devices: list[Any] = []
        self._recorder = recorder
        self._prefix = f"system/{self._node}"
        self._interval = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self._note:
            recorder.gpu_info.remote(self._node, [], self._note)
        host_sample(psutil)  # prime cpu_percent: its first reading is always 0.0
        self._thread = threading.Thread(target=self._loop, name="node-sampler", daemon=True)
        self._thread.start()

    def watch_devices(self, cuda_visible_devices: str | None) -> list[str]:
        """Add the GPUs a worker with this ``CUDA_VISIBLE_DEVICES`` sees; returns all labels."""
        if self._note:
            return []
        with self._lock:
            known = {d.uuid for d in self._devices}
            new = [
                d for d in visible_gpus(self._pynvml, cuda_visible_devices) if d.uuid not in known
            ]
            if new:
                self._devices.extend(new)
                self._recorder.gpu_info.remote(
                    self._node,
                    [
                        {
                            "label": d.label,
                            "uuid": d.uuid,
                            "name": d.name,
                            "mig": d.mig,
                            "memory_total_mb": gpu_sample(self._pynvml, d.handle).get(
                                "memory_total_mb"
                            ),
                        }
                        for d in self._devices
                    ],
                    None,
                )
            return [d.label for d in self._devices]

    def sample(self) -> dict[str, float]:
        """One sample of this node, keyed for MLflow."""
        host = host_sample(self._psutil)
        values = {f"{self._prefix}/{k}": v for k, v in host.items() if k != "memory_total_mb"}
        with self._lock:
            devices = list(self._devices)
        for device in devices:
            for key, value in gpu_sample(self._pynvml, device.handle).items():
                if value is not None and key != "memory_total_mb":
                    values[f"{self._prefix}/{device.label}/{key}"] = value
        return values

    def gpu_count(self) -> int:
        return len(self._devices)

    def _loop(self) -> None:
        index = 0
        while not self._stop.wait(self._interval):
            self._recorder.node_metrics.remote(self.sample(), index, time.time())
            index += 1

    def stop(self) -> None:
        self._stop.set()
        if not self._note:
            nvml_shutdown(self._pynvml)
