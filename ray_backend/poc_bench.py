"""The measurements a proof of concept (``%train poc``) takes on a job's workers.

Each function measures one thing on the calling rank and returns plain numbers; the
loop (:mod:`ray_backend.poc_loop`) logs them. Timings on CUDA synchronize the device
before the clock is read, so they count the work, not its launch.

- :func:`matmul_rate`: dense matmul FLOP/s of one accelerator (``2 n^3`` FLOPs per
  ``n x n`` product, the count of the textbook algorithm, as cuBLAS benchmarks use).
- :func:`collective_seconds`: seconds per allreduce, all-gather or reduce-scatter of a
  buffer, the slowest rank's (a collective ends when its last rank does).
- :func:`storage_seconds`: write and read back a checkpoint-sized file on the job's
  storage through pyarrow's filesystems (local paths, NFS, S3, GCS alike).
"""

from __future__ import annotations

import io
import time
import uuid
from typing import Any

__all__ = [
    "collective_seconds",
    "largest_message",
    "matmul_rate",
    "node_groups",
    "storage_seconds",
]


def _sync(device: Any) -> None:
    import torch

    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


def matmul_rate(device: Any, n: int, repeats: int, dtype: Any) -> float:
    """FLOP/s of ``repeats`` products of two ``n x n`` matrices of ``dtype`` on ``device``,
    after two warm-up products: ``2 n^3 repeats / seconds``."""
    import torch

    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        torch.mm(a, b)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        torch.mm(a, b)
    _sync(device)
    return 2.0 * n**3 * repeats / (time.perf_counter() - t0)


def largest_message(device: Any, ceiling_bytes: int) -> int:
    """The largest buffer (bytes) the collectives stage may use: ``ceiling_bytes``, or a
    quarter of the free device memory (CUDA) or of the available host memory (CPU) when
    that is less (all-gather holds the whole buffer and a shard, the timing a copy)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info(device)
    else:
        import psutil

        free = psutil.virtual_memory().available
    return int(min(ceiling_bytes, free // 4))


def _untimed(name: str, older: str):
    """``torch.distributed.<name>`` (or ``<older>``, its older name) as
    PyTorch defines it, not the job's timed wrapper (:mod:`ray_backend.collectives`):
    the stage's own traffic is no training step's communication."""
    import torch.distributed as dist

    fn = getattr(dist, name, None) or getattr(dist, older)
    return getattr(fn, "__wrapped__", fn)


def _operation(collective: str, nbytes: int, world: int, device: Any, group: Any):
    """A no-argument callable running ``collective`` once over a float32 buffer of
    ``nbytes`` (rounded down to whole shards), and the buffer's size in bytes."""
    import torch
    import torch.distributed as dist

    numel = max(world, nbytes // 4 // world * world)
    if collective == "allreduce":
        x = torch.ones(numel, device=device)
        return (lambda: dist.all_reduce(x, group=group)), numel * 4
    if collective == "all_gather":
        shard = torch.ones(numel // world, device=device)
        out = torch.empty(numel, device=device)
        gather = _untimed("all_gather_single", "all_gather_into_tensor")
        return (lambda: gather(out, shard, group=group)), numel * 4
    if collective == "reduce_scatter":
        full = torch.ones(numel, device=device)
        out = torch.empty(numel // world, device=device)
        scatter = _untimed("reduce_scatter_single", "reduce_scatter_tensor")
        return (lambda: scatter(out, full, group=group)), numel * 4
    raise ValueError(f"unknown collective {collective!r}.")


def collective_seconds(
    collective: str, nbytes: int, device: Any, group: Any = None, iters: int = 5, warmup: int = 2
) -> tuple[float, int]:
    """Seconds per ``collective`` over ``group`` (None: every rank) on a buffer of about
    ``nbytes``, averaged over ``iters`` runs after ``warmup``, the slowest rank's; and
    the buffer's exact size in bytes (:mod:`~jupyter_trainfactory.telemetry.bandwidth`
    turns both into algbw and busbw). Every rank of ``group`` must call it."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    run, size = _operation(collective, nbytes, world, device, group)
    for _ in range(warmup):
        run()
    _sync(device)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - t0) / iters], device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX, group=group)
    return float(elapsed.item()), size


def storage_seconds(uri: str, nbytes: int) -> dict[str, float]:
    """Write a ``torch.save`` file of about ``nbytes`` (one float32 tensor) under ``uri``
    (a local path or a pyarrow URI: ``s3://``, ``gs://``), read it back whole, delete it.

    Returns ``save_s`` (serialize + write + close), ``restore_s`` (read + deserialize)
    and ``bytes``. A local write ends in the page cache unless the filesystem is
    synchronous: the figure is what a training loop waits for, not the disk's own rate.
    """
    import pyarrow.fs as pafs
    import torch

    fs, base = pafs.FileSystem.from_uri(uri) if "://" in uri else (pafs.LocalFileSystem(), uri)
    directory = f"{base.rstrip('/')}/poc-{uuid.uuid4().hex[:8]}"
    fs.create_dir(directory, recursive=True)
    path = f"{directory}/checkpoint.pt"
    tensor = torch.rand(max(1, nbytes // 4))
    try:
        t0 = time.perf_counter()
        buffer = io.BytesIO()
        torch.save({"weights": tensor}, buffer)
        with fs.open_output_stream(path) as out:
            out.write(buffer.getbuffer())
        save_s = time.perf_counter() - t0
        size = buffer.tell()
        del buffer
        t0 = time.perf_counter()
        with fs.open_input_stream(path) as src:
            data = src.read()
        torch.load(io.BytesIO(data), weights_only=True)
        restore_s = time.perf_counter() - t0
    finally:
        fs.delete_dir(directory)
    return {"save_s": save_s, "restore_s": restore_s, "bytes": float(size)}


def node_groups(node_ranks: list[int]) -> tuple[Any, list[int]]:
    """One process group per node, every rank taking part in creating each (as
    ``torch.distributed.new_group`` requires); returns the calling rank's node group
    and the world ranks of node 0. ``node_ranks[r]`` is world rank r's node rank."""
    import torch.distributed as dist

    rank = dist.get_rank()
    mine = None
    first: list[int] = []
    for node in sorted(set(node_ranks)):
        ranks = [r for r, n in enumerate(node_ranks) if n == node]
        group = dist.new_group(ranks)
        if not first:
            first = ranks
        if rank in ranks:
            mine = group
    return mine, first
