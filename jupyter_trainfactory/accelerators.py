"""Accelerators: one table from ``--accelerator`` to Ray resources, the torch backend and
the telemetry sampler.

Pure (no Ray import): the client validates a job with it, the driver builds the
``TorchTrainer`` from it and the node samplers pick their device reader from it.

Sources
-------
- Ray resources ``GPU``, ``NPU`` (Huawei Ascend) and ``HPU`` (Intel Gaudi) and the
  variables Ray sets to pin a worker's devices: Ray's accelerator managers
  (``ray/_private/accelerators/{nvidia_gpu,npu,hpu}.py``).
- torch.distributed backends: ``nccl`` for CUDA and ``gloo`` for CPU are what Ray Train
  picks by itself (``ray.train.torch.config._TorchBackend.on_start``); ``hccl`` for
  Ascend (``torch_npu``) and for Gaudi (``habana_frameworks.torch``) is what Ray Train's
  HPU and NPU guides pass as ``TorchConfig(backend="hccl")``.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ACCELERATORS",
    "Accelerator",
    "accelerator",
    "default_accelerator",
    "resources_per_worker",
]


@dataclass(frozen=True)
class Accelerator:
    """How one kind of accelerator is requested, connected and watched.

    Attributes
    ----------
    name : str
        ``--accelerator`` value: ``gpu``, ``npu``, ``hpu`` or ``cpu``.
    resource : str or None
        The Ray resource one unit of ``gpus_per_worker`` reserves (None for ``cpu``).
    backend : str
        torch.distributed backend (``TorchConfig(backend=...)``).
    use_gpu : bool
        ``ScalingConfig.use_gpu``: only for NVIDIA GPUs (Ray Train then sets the CUDA
        device of each worker itself).
    visible_env : str or None
        The variable Ray sets on a worker to the devices it may use.
    vendor : str
        Who makes it, as shown in notes.
    sampler : str or None
        The device reader of the node samplers (``ray_backend.sampler.READERS``); None:
        none implemented yet, the samplers say so and read host CPU and memory only.
    tested : str
        Where this path was run end to end; "" when it never was (docs say "untested").
    """

    name: str
    resource: str | None
    backend: str
    use_gpu: bool
    visible_env: str | None
    vendor: str
    sampler: str | None
    tested: str


#: ``--accelerator`` -> :class:`Accelerator`. Add a vendor here and its reader in
#: ``ray_backend.sampler.READERS``.
ACCELERATORS: dict[str, Accelerator] = {
    "gpu": Accelerator(
        name="gpu",
        resource="GPU",
        backend="nccl",
        use_gpu=True,
        visible_env="CUDA_VISIBLE_DEVICES",
        vendor="NVIDIA",
        sampler="nvml",
        tested="NVIDIA H200 (benchmarks/gpu_check.py)",
    ),
    "npu": Accelerator(
        name="npu",
        resource="NPU",
        backend="hccl",
        use_gpu=False,
        visible_env="ASCEND_RT_VISIBLE_DEVICES",
        vendor="Huawei Ascend",
        sampler=None,
        tested="",
    ),
    "hpu": Accelerator(
        name="hpu",
        resource="HPU",
        backend="hccl",
        use_gpu=False,
        visible_env="HABANA_VISIBLE_MODULES",
        vendor="Intel Gaudi",
        sampler=None,
        tested="",
    ),
    "cpu": Accelerator(
        name="cpu",
        resource=None,
        backend="gloo",
        use_gpu=False,
        visible_env=None,
        vendor="",
        sampler=None,
        tested="CPU (make test)",
    ),
}


def accelerator(name: str) -> Accelerator:
    """The table row of ``name`` (case-insensitive).

    Raises ValueError (one sentence naming the choices) for an unknown name."""
    row = ACCELERATORS.get(str(name).strip().lower())
    if row is None:
        raise ValueError(f"--accelerator takes {', '.join(ACCELERATORS)}, got {name!r}.")
    return row


def default_accelerator(accelerators_per_worker: float) -> str:
    """``gpu`` when a worker asks for accelerators, else ``cpu`` (jobs before this option)."""
    return "gpu" if accelerators_per_worker > 0 else "cpu"


def resources_per_worker(
    cpus: float, accelerators: float, name: str | None, custom: dict[str, float] | None = None
) -> dict[str, float]:
    """Ray resources of one worker: ``{"CPU": cpus, <accelerator's resource>: accelerators,
    **custom}`` (the accelerator only when it has a resource and ``accelerators`` > 0)."""
    resources = {"CPU": float(cpus)}
    resource = accelerator(name or "cpu").resource
    if resource and accelerators:
        resources[resource] = float(accelerators)
    resources.update({k: float(v) for k, v in (custom or {}).items()})
    return resources
