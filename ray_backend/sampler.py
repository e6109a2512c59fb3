"""NodeSampler: one actor per node, samples host and GPU metrics and sends them to the recorder."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from jupyter_trainfactory.telemetry.system import (
    gpu_sample,
    host_sample,
    init_nvml,
    nvml_shutdown,
    visible_gpus,
)

__all__ = ["READERS", "NodeSampler", "NvmlReader", "node_label"]


def node_label(node_ip: str) -> str:
    """Metric-key form of a node address: ``10.0.0.12`` -> ``10-0-0-12``."""
    return node_ip.replace(".", "-").replace(":", "-")


class NvmlReader:
    """NVIDIA GPUs through NVML (nvidia-ml-py): the device reader ``"nvml"``.

    A device reader has ``note`` (None, or one sentence saying why it reads nothing),
    ``visible(env_value) -> devices`` (the devices a worker with this visible-devices
    variable uses; each with ``label``, ``uuid``, ``name``, ``mig``), ``sample(device)
    -> {name: value}`` (the names and units of
    :func:`~jupyter_trainfactory.telemetry.system.gpu_sample`) and ``close()``.
    """

    def __init__(self):
        try:
            import pynvml
        except ImportError:
            pynvml = None
        self._pynvml = pynvml
        self.note = init_nvml(pynvml)

    def visible(self, env_value: str | None) -> list[Any]:
        return visible_gpus(self._pynvml, env_value)

    def sample(self, device: Any) -> dict[str, float | None]:
        return gpu_sample(self._pynvml, device.handle)

    def close(self) -> None:
        if not self.note:
            nvml_shutdown(self._pynvml)


#: Device readers by the name in :data:`jupyter_trainfactory.accelerators.ACCELERATORS`
#: (``sampler``). A vendor's reader is added here; until then its jobs say "unavailable".
READERS: dict[str, Callable[[], Any]] = {"nvml": NvmlReader}


def _reader(accelerator: str) -> tuple[Any, str | None]:
    """(device reader or None, note) for the job's accelerator."""
    from jupyter_trainfactory.accelerators import accelerator as row_of

    row = row_of(accelerator)
    if row.sampler in READERS:
        reader = READERS[row.sampler]()
        return (None, reader.note) if reader.note else (reader, None)
    if row.resource is None:  # a CPU job: host metrics are all there is
        return None, None
    return None, (
        f"{row.vendor} {row.resource} telemetry is unavailable: no sampler is implemented"
        " for it yet; sampling CPU and host memory only."
    )


class NodeSampler:
    """Samples this node every ``interval_s`` seconds into ``system/<node>/...`` metrics.

    Keys: ``system/<node>/cpu_utilization`` (%), ``system/<node>/memory_used_mb`` (MB), and
    per GPU ``system/<node>/<gpu label>/<name>`` with the names and units of
    :func:`~jupyter_trainfactory.telemetry.system.gpu_sample` (``utilization`` %,
    ``memory_used_mb``, ``power_w``, ``temperature_c``, ``sm_clock_mhz``); values NVML
    cannot read are left out, never sent as 0. Totals that do not change (memory) go to
    the recorder once, with the device list.

    Only the devices the job's workers see are sampled: the driver calls
    :meth:`watch_devices` with each worker's visible-devices variable
    (``CUDA_VISIBLE_DEVICES``); until it does, the node's devices are not sampled. The
    device reader comes from the job's ``accelerator`` (:data:`READERS`); without one
    (NVML missing, or a vendor without a reader yet) the sampler sends one note to the
    recorder and samples CPU and host memory only. The metric step is the sample index.
    """

    def __init__(self, recorder: Any, node: str, interval_s: float = 1.0, accelerator: str = "gpu"):
        import psutil

        self._psutil = psutil
        self._node = node_label(node)
        self._reader, self._note = _reader(accelerator)
        self._devices: list[Any] = []
        self._recorder = recorder
        self._prefix = f"system/{self._node}"
        self._interval = interval_s
        self._index = 0  # the metric step: the sample index
        self._lock = threading.Lock()
        self._stop = threading.Event()
        if self._note:
            recorder.gpu_info.remote(self._node, [], self._note)
        host_sample(psutil)  # prime cpu_percent: its first reading is always 0.0
        self._thread = threading.Thread(target=self._loop, name="node-sampler", daemon=True)
        self._thread.start()

    def watch_devices(self, visible_devices: str | None) -> list[str]:
        """Add the devices a worker with this visible-devices value (``CUDA_VISIBLE_DEVICES``
        for NVIDIA) sees; returns all labels."""
        if self._reader is None:
            return []
        with self._lock:
            known = {d.uuid for d in self._devices}
            new = [d for d in self._reader.visible(visible_devices) if d.uuid not in known]
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
                            "memory_total_mb": self._reader.sample(d).get("memory_total_mb"),
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
            for key, value in self._reader.sample(device).items():
                if value is not None and key != "memory_total_mb":
                    values[f"{self._prefix}/{device.label}/{key}"] = value
        return values

    def gpu_count(self) -> int:
        return len(self._devices)

    def _loop(self) -> None:
        # the first sample soon: a sampler starts once its node's workers already run
        wait = min(self._interval, 0.5)
        while not self._stop.wait(wait):
            wait = self._interval
            self._send()

    def _send(self) -> Any:
        with self._lock:
            index = self._index
            self._index += 1
        return self._recorder.node_metrics.remote(self.sample(), index, time.time())

    def stop(self) -> None:
        """Stop sampling after one last sample, which the recorder has when this returns
        (a job shorter than the sampling interval still has its node's numbers)."""
        self._stop.set()
        self._thread.join(timeout=5)
        last = self._send()
        if self._reader is not None:
            self._reader.close()
        try:
            import ray

            if isinstance(last, ray.ObjectRef):
                ray.get(last, timeout=10)
        except Exception:  # the recorder is gone: nothing left to tell
            pass
