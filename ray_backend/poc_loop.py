"""The proof-of-concept job (``%train poc``): one Ray Train job whose workers measure
the cluster, stage by stage, then train a reference model through a worker kill.

On the first attempt (no checkpoint yet) every rank runs, in order:

1. **compute**: its dense matmul rate (bf16 on GPUs, fp32 on CPUs), logged per rank
   as ``rank<r>/poc/compute/tflops``;
2. **collectives**: allreduce, all-gather and reduce-scatter over doubling buffer sizes,
   over the node's ranks (``intra``) and, on more than one node, over every rank
   (``inter``): ``poc/<collective>/<scope>/<size>MiB/{time_ms,algbw_gb_per_s,busbw_gb_per_s}``;
3. **storage**: rank 0 writes and reads back a checkpoint-sized file on the job's
   storage: ``poc/storage/{save_s,restore_s,bytes,save_gb_per_s,restore_gb_per_s}``.

Then all attempts train the reference workload, a small decoder-only transformer on
synthetic tokens (the throughput is measured, not the learning), with
``trainfactory.step`` and ``watch`` so tokens/s, MFU and the step split come from the
job's own telemetry; a checkpoint every ``every`` steps. On the first attempt the last
rank kills its own process with SIGKILL at ``kill_step`` (as a crashed worker dies: no
handler runs), and on more than one node every rank of the last rank's node does (a
node's workers lost at once), so the job's failure handling restarts them from the
checkpoint before, and the run's ``faults/mttr_s`` and ``faults/restore_step`` are the
recovery figures. The kill is a drill: each dying rank first tells the job's recorder
(:func:`_announce_drill`), so the failure is recorded as injected, as a ``%train chaos``
kill is, and counted apart from real failures (``fleet.kinds``). With a user's function
(``poc --fn``) that function trains instead, with ``config["fn_config"]``, and the
kernel kills the workers (``%train chaos``) once it has checkpointed (``poc.run``).
``poc/stages_done`` counts the stages finished (1 to 3, 4 when training ends).
"""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable
from typing import Any

from jupyter_trainfactory.fleet.kinds import BY_CHAOS_NODE, BY_CHAOS_WORKER
from jupyter_trainfactory.telemetry.bandwidth import COLLECTIVES, algbw, busbw

from . import poc_bench

__all__ = ["poc_loop"]

MIB = 1 << 20


def _log(metrics: dict[str, float], step: int, every_rank: bool = False) -> None:
    import jupyter_trainfactory.train as trainfactory

    trainfactory.log(metrics, step=step, rank_zero_only=not every_rank)


def _compute(config: dict[str, Any], device: Any) -> None:
    import torch

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    rate = poc_bench.matmul_rate(device, config["matmul_n"], config["matmul_repeats"], dtype)
    _log({"poc/compute/tflops": rate / 1e12}, 0, every_rank=True)


def _sizes(config: dict[str, Any], device: Any) -> list[int]:
    """Buffer sizes (bytes): 1 MiB doubling to the largest that fits under ``max_mib``."""
    top = poc_bench.largest_message(device, int(config["max_mib"] * MIB))
    sizes, size = [], MIB
    while size <= top:
        sizes.append(size)
        size *= 2
    return sizes or [top]


def _collectives(config: dict[str, Any], device: Any) -> None:
    import ray.train
    import torch.distributed as dist

    ctx = ray.train.get_context()
    world = ctx.get_world_size()
    if world < 2:
        _log({"poc/collectives/ranks": 1.0}, 0)
        return
    node_ranks = _rank_nodes(world)
    group, _ = poc_bench.node_groups(node_ranks)
    scopes = [("intra", group)]
    if len(set(node_ranks)) > 1:
        scopes.append(("inter", None))
    out = {"poc/collectives/ranks": float(world), "poc/collectives/nodes": len(set(node_ranks))}
    for scope, g in scopes:
        n = dist.get_world_size(g)
        if n < 2:  # one rank on this node: nothing within it to measure
            continue
        for size in _sizes(config, device):
            for name in COLLECTIVES:
                seconds, nbytes = poc_bench.collective_seconds(
                    name, size, device, g, iters=config["iters"], warmup=1
                )
                key = f"poc/{name}/{scope}/{size // MIB}MiB"
                out[f"{key}/time_ms"] = seconds * 1e3
                out[f"{key}/algbw_gb_per_s"] = algbw(nbytes, seconds)
                out[f"{key}/busbw_gb_per_s"] = busbw(name, nbytes, seconds, n)
    _log(out, 0)


def _storage(config: dict[str, Any], nbytes: int) -> None:
    import ray.train

    if ray.train.get_context().get_world_rank() != 0:
        return
    got = poc_bench.storage_seconds(config["storage"], nbytes)
    gb = got["bytes"] / 1e9
    got["save_gb_per_s"] = gb / got["save_s"]
    got["restore_gb_per_s"] = gb / got["restore_s"]
    _log({f"poc/storage/{k}": v for k, v in got.items()}, 0)


def _model(shape: dict[str, int]):
    import torch
    from torch import nn

    class TinyGPT(nn.Module):
        """Token and position embeddings, pre-LN causal transformer blocks, tied head."""

        def __init__(self, vocab: int, d_model: int, layers: int, heads: int, seq_len: int):
            super().__init__()
            self.tokens = nn.Embedding(vocab, d_model)
            self.positions = nn.Embedding(seq_len, d_model)
            block = nn.TransformerEncoderLayer(
                d_model, heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d_model)
            self.mask = nn.Transformer.generate_square_subsequent_mask(seq_len)

        def forward(self, ids):
            t = ids.shape[1]
            x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
            x = self.blocks(x, mask=self.mask[:t, :t].to(ids.device), is_causal=True)
            return self.norm(x) @ self.tokens.weight.T

    keys = ("vocab", "d_model", "layers", "heads", "seq_len")
    return TinyGPT(*(shape[k] for k in keys))


def _train(config: dict[str, Any], device: Any, first_attempt: bool) -> None:
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F

    import jupyter_trainfactory.train as trainfactory

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    shape, batch = config["model"], config["batch"]
    model = ray.train.torch.prepare_model(_model(shape))
    trainfactory.watch(
        model,
        layers=shape["layers"],
        heads=shape["heads"],
        head_dim=shape["d_model"] // shape["heads"],
        seq_len=shape["seq_len"],
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = 0
    checkpoint = trainfactory.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    gen = torch.Generator().manual_seed(1000 * rank + start)
    t = shape["seq_len"]
    drill = _dies(rank, world) if first_attempt else None
    for step in range(start + 1, config["steps"] + 1):
        with trainfactory.step(samples=batch, tokens=batch * t):
            with trainfactory.data_wait():
                ids = torch.randint(0, shape["vocab"], (batch, t + 1), generator=gen).to(device)
            logits = model(ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        trainfactory.log({"loss": float(loss)}, step=step)
        if drill and step == config["kill_step"]:
            # the checkpoint before is committed once Ray Train's controller has polled
            # every rank's report of it (every 0.1 s here): a kill right after it could
            # land first and lose twice the steps (seen: 9, not 5, on a loaded machine)
            time.sleep(KILL_DELAY_S)
            _announce_drill(drill, step)
            os.kill(os.getpid(), signal.SIGKILL)
        if step % config["every"] == 0 or step == config["steps"]:
            with tempfile.TemporaryDirectory() as tmp:
                directory = None
                if rank == 0:
                    state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": step}
                    torch.save(state, os.path.join(tmp, "state.pt"))
                    directory = tmp
                trainfactory.save_checkpoint({"step": step, "loss": float(loss)}, directory)


#: Seconds the dying rank waits at the kill step, so the checkpoint before is committed
#: (20 of the controller's 0.1 s polls, ``payload.REPORT_POLL_INTERVAL_S``).
KILL_DELAY_S = 2.0
#: Seconds the dying rank waits at most for the recorder to take its announcement.
ANNOUNCE_TIMEOUT_S = 10.0


def _announce_drill(by: str, step: int) -> None:
    """Tell the job's recorder that this rank is about to kill itself as the poc's drill,
    and wait (up to :data:`ANNOUNCE_TIMEOUT_S`) until it has the word: the worker's
    ``error`` report (``protocol.INFO_KINDS``) with ``by`` (``fleet.kinds.BY_CHAOS_*``,
    what a ``%train chaos`` kill's root cause carries) and ``cause``, which the recorder
    adds to the failure's root cause. Outside a job nothing is told."""
    from ray_backend.session import current

    worker = current()
    if worker is None:
        return
    cause = f"killed by the poc's recovery drill at step {step}"
    worker.set_info("error", {"by": by, "cause": cause})
    worker.drain(timeout=ANNOUNCE_TIMEOUT_S)


def _rank_nodes(world: int) -> list[str]:
    """Each world rank's Ray node id (a collective: every rank calls it). Not Ray Train's
    node rank, which counts hosts by IP address: raylets that share one are still nodes
    to Ray's scheduler, and a node lost is one raylet's workers."""
    import ray
    import torch.distributed as dist

    nodes: list[Any] = [None] * world
    dist.all_gather_object(nodes, ray.get_runtime_context().get_node_id())
    return nodes


def _dies(rank: int, world: int) -> str | None:
    """Whether this rank kills itself at the kill step, as what drill: the last rank
    (``fleet.kinds.BY_CHAOS_WORKER``), or on more than one node every rank on the last
    rank's node (``BY_CHAOS_NODE``); None for a rank that lives (a collective: every
    rank calls it)."""
    if world < 2:
        return BY_CHAOS_WORKER if rank == world - 1 else None
    nodes = _rank_nodes(world)
    if len(set(nodes)) == 1:
        return BY_CHAOS_WORKER if rank == world - 1 else None
    return BY_CHAOS_NODE if nodes[rank] == nodes[-1] else None


def _state_bytes(config: dict[str, Any]) -> int:
    """The reference model's checkpoint size (weights and AdamW's two moments, float32),
    unless ``checkpoint_mb`` says another."""
    if config.get("checkpoint_mb"):
        return int(config["checkpoint_mb"] * 1e6)
    n = sum(p.numel() for p in _model(config["model"]).parameters())
    return 3 * 4 * n


def poc_loop(config: dict[str, Any], train_fn: Callable[[dict], Any] | None = None) -> None:
    """The per-worker function of a proof-of-concept job; ``config`` as
    :func:`jupyter_trainfactory.poc.run.job_config` builds it. ``train_fn`` (the user's
    training function) replaces the reference workload: it is called with
    ``config["fn_config"]`` on every attempt, after the stages of the first."""
    import ray.train
    import ray.train.torch
    import torch

    torch.set_num_threads(config.get("threads", 1))
    device = ray.train.torch.get_device()
    first_attempt = ray.train.get_checkpoint() is None
    if first_attempt:
        _compute(config, device)
        _log({"poc/stages_done": 1.0}, 1)
        _collectives(config, device)
        _log({"poc/stages_done": 2.0}, 2)
        _storage(config, _state_bytes(config))
        _log({"poc/stages_done": 3.0}, 3)
    if train_fn is None:
        _train(config, device, first_attempt)
    else:
        train_fn(config.get("fn_config") or {})
    _log({"poc/stages_done": 4.0}, 4)
