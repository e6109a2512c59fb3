"""Worker side: the collectives FSDP2 issues, timed, and its sharded model watched.

PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``) gathers each parameter group
before its forward and backward with ``torch.distributed.all_gather_single`` and
reduces its gradients with ``reduce_scatter_single`` (``torch/distributed/fsdp/
_fully_shard/_fsdp_collectives.py``: ``DefaultAllGather``, ``DefaultReduceScatter``).
:func:`install` wraps those two functions of ``torch.distributed`` in a job's worker, so
that their time in flight counts as the worker's communication (``train/comm_s``,
``train/comm_fraction``) and per kind (``train/all_gather_s``, ``train/reduce_scatter_s``),
and wraps ``torch.distributed.fsdp.fully_shard`` so the sharded model is watched: its
parameters are DTensors whose ``numel()`` is the unsharded size, so MFU's ``6 N`` counts
the whole model, not one rank's shard.

The time of one collective is the host's wall time from its launch to its completion:
the call itself when synchronous; otherwise until its ``Work``'s future completes (gloo
completes it in its own thread). On CUDA the host sees only the launch, so CUDA events
are recorded on the current stream before the launch and when the work completes, and
resolved later by the worker's shipping thread (the DDP comm hook does the same). FSDP2
overlaps these collectives with compute, so the figures are time in flight, an upper
bound on the exposed communication. This module imports neither Ray nor torch at import
time.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable
from typing import Any

from ray_backend.import_hooks import when_imported

__all__ = ["KINDS", "install", "timed_collective"]

#: ``torch.distributed`` function -> the kind its time is counted as.
KINDS = {"all_gather_single": "all_gather", "reduce_scatter_single": "reduce_scatter"}


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    if args:
        return args[0]
    return kwargs.get("output_tensor", kwargs.get("output"))


def timed_collective(original: Callable, kind: str, telemetry: Any) -> Callable:
    """``original`` (a ``torch.distributed`` collective) timed into ``telemetry``
    (``WorkerTelemetry.add_comm`` / ``add_comm_events``) as ``kind``; its result and
    its errors are the original's."""

    @functools.wraps(original)
    def collective(*args: Any, **kwargs: Any) -> Any:
        if getattr(_first_tensor(args, kwargs), "is_cuda", False):
            return _on_cuda(original, kind, telemetry, args, kwargs)
        t0 = time.perf_counter()
        work = original(*args, **kwargs)
        if work is None:  # synchronous: done when the call returns
            telemetry.add_comm(time.perf_counter() - t0, kind)
            return work
        try:
            future = work.get_future()
        except Exception:  # a backend without futures: not timed
            return work
        future.add_done_callback(lambda _: telemetry.add_comm(time.perf_counter() - t0, kind))
        return work

    collective._tf_timed = True
    return collective


def _on_cuda(original: Callable, kind: str, telemetry: Any, args: tuple, kwargs: dict) -> Any:
    import torch

    start = torch.cuda.Event(enable_timing=True)
    start.record()
    work = original(*args, **kwargs)
    if work is None:  # synchronous: the current stream waits for the collective
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        telemetry.add_comm_events(start, end, kind)
        return work

    def done(future: Any) -> Any:
        end = torch.cuda.Event(enable_timing=True)
        end.record()  # on the work's stream: after the collective
        telemetry.add_comm_events(start, end, kind)
        return future.value()

    with contextlib.suppress(Exception):  # a backend without futures: not timed
        work.get_future().then(done)
    return work


def _watching_fully_shard(original: Callable, watch: Callable[[Any], Any]) -> Callable:
    """``fully_shard`` that watches the module it returns when it holds at least as many
    parameters as any sharded before (the root, sharded last, holds them all)."""
    most = {"n": -1}

    @functools.wraps(original)
    def fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
        sharded = original(module, *args, **kwargs)
        try:
            n = sum(p.numel() for p in sharded.parameters() if p.requires_grad)
        except Exception:  # a list of modules, or no parameters: nothing to count
            return sharded
        if n >= most["n"]:
            most["n"] = n
            watch(sharded)
        return sharded

    return fully_shard


#: The module whose ``fully_shard`` is watched, wrapped once the loop imports it.
FSDP = "torch.distributed.fsdp"


def install(telemetry: Any, watch: Callable[[Any], Any]) -> Callable[[], None]:
    """Time ``torch.distributed``'s FSDP2 collectives into ``telemetry`` and watch what
    ``torch.distributed.fsdp.fully_shard`` returns (wrapped when the loop imports it);
    returns the undo. Does nothing on a worker without ``torch.distributed``."""
    originals: list[tuple[Any, str, Any]] = []
    try:
        import torch.distributed as dist
    except ImportError:
        return lambda: None
    for name, kind in KINDS.items():
        original = getattr(dist, name, None)
        if original is None or getattr(original, "_tf_timed", False):
            continue
        originals.append((dist, name, original))
        setattr(dist, name, timed_collective(original, kind, telemetry))

    def hook(fsdp: Any) -> None:
        if hasattr(fsdp, "fully_shard"):
            originals.append((fsdp, "fully_shard", fsdp.fully_shard))
            fsdp.fully_shard = _watching_fully_shard(fsdp.fully_shard, watch)

    # when the loop imports it: importing it here cost every job 2.5-3.7 s per worker
    unhook = when_imported((FSDP,), hook)

    def undo() -> None:
        unhook()
        for module, name, value in originals:
            setattr(module, name, value)

    return undo
