"""Train a tiny character-level GPT on the Python standard library's own source code.

The corpus is real text that ships with every Python installation: the ``.py`` files next to
``os.py``, read in sorted order (test directories excluded) until about 1.5 MB of text is
collected. The model is a small decoder-only transformer (token + position embeddings, pre-LN
blocks with causal self-attention and an MLP, final LayerNorm, a tied output head).

``train_func(config)`` is a Ray Train per-worker function: launch it on 2 CPU workers (DDP over
gloo), for example from a notebook::

    from jupyter_trainfactory import launch
    from tiny_gpt_train import DEFAULT_CONFIG, train_func

    job = launch(train_func, workers=2, config=DEFAULT_CONFIG, experiment="tiny-gpt")

Run this file directly (``python examples/tiny_gpt_train.py``) for a single-process run on one
CPU thread: the Ray Train and trainfactory calls are then replaced by small local stand-ins, and
everything else (data, model, evaluation, training loop) is the very same code.

As a yardstick, every evaluation also reports the unigram entropy of the validation text: the
loss of the best model that ignores context (one that knows the validation text's own character
frequencies). A validation loss clearly below it means the model has learned to use context.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
from collections import Counter
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

# With 2 workers on one CPU thread each, this gets the validation loss (~1.4 nats/char) far below
# the unigram entropy of the validation text (~3.1 nats/char on CPython 3.11) in 75 s, with an
# evaluation every ~13 s (6 reports).
DEFAULT_CONFIG = {
    "max_chars": 1_500_000,  # corpus size (characters)
    "vocab_size": 100,  # at most this many ids, including the unknown-character id 0
    "seq_len": 64,  # context length T
    "d_model": 96,  # embedding width D
    "n_layers": 3,  # transformer blocks L
    "n_heads": 4,  # attention heads H (head size D // H)
    "batch_size": 32,  # windows per worker and step B
    "lr": 3e-3,  # peak AdamW learning rate
    "weight_decay": 0.1,
    "warmup_steps": 30,  # linear warmup, then cosine decay to lr / 10
    "max_steps": 100_000,  # stop after this many steps ...
    "time_budget_s": 75.0,  # ... or after this many seconds, whichever comes first
    "eval_interval": 150,  # evaluate, checkpoint and report every this many steps
    "eval_windows": 128,  # fixed validation windows per evaluation
    "seed": 0,
    "threads": 1,  # torch CPU threads per worker
}

# Directory names skipped when collecting the standard library's source files.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def load_corpus(max_chars: int = 1_500_000) -> str:
    """The first ``max_chars`` characters of the standard library's ``.py`` files.

    Files are taken in sorted order of their path relative to the standard library directory, so
    the text is the same on every call (and every worker) for a given Python installation.
    """
    root = os.path.dirname(os.__file__)
    paths = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS]  # prune test directories
        rel = os.path.relpath(dirpath, root)
        paths += [os.path.normpath(os.path.join(rel, f)) for f in filenames if f.endswith(".py")]
    parts, total = [], 0
    for rel in sorted(paths):
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
            parts.append(f.read())
        total += len(parts[-1])
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


def unigram_entropy_nats(text: str) -> float:
    """Entropy of the character distribution of ``text``, in nats per character."""
    n = len(text)
    return -sum(c / n * math.log(c / n) for c in Counter(text).values())


class CharVocab:
    """Characters to ids: the ``size - 1`` most frequent characters of the text it is built
    from get ids 1.., every other character maps to the unknown id 0."""

    UNK = 0

    def __init__(self, text: str, size: int = 100):
        counts = Counter(text)
        # Most frequent first; ties broken by the character itself, so the order is deterministic.
        chars = sorted(counts, key=lambda ch: (-counts[ch], ch))[: size - 1]
        self.stoi = {ch: i + 1 for i, ch in enumerate(chars)}
        self.itos = ["\ufffd", *chars]  # id 0 reads back as the replacement character

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, text: str) -> torch.Tensor:
        return torch.tensor([self.stoi.get(ch, self.UNK) for ch in text], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] for i in ids)

    def normalize(self, text: str) -> str:
        """``text`` with every unknown character replaced by one character that is not in the
        vocabulary, so that its character statistics are those of its ids."""
        unk = next(chr(c) for c in range(sys.maxunicode) if chr(c) not in self.stoi)
        return "".join(ch if ch in self.stoi else unk for ch in text)


def make_data(config: dict) -> SimpleNamespace:
    """Corpus -> vocabulary (built on the training part) -> 90/10 contiguous train/val ids."""
    text = load_corpus(config["max_chars"])
    split = int(0.9 * len(text))
    vocab = CharVocab(text[:split], config["vocab_size"])
    val_text = vocab.normalize(text[split:])
    return SimpleNamespace(
        vocab=vocab,
        train=vocab.encode(text[:split]),
        val=vocab.encode(val_text),
        val_entropy=unigram_entropy_nats(val_text),  # the context-free baseline, in nats/char
    )


def get_batch(data: torch.Tensor, batch_size: int, seq_len: int, gen: torch.Generator):
    """``batch_size`` random windows: inputs ``x`` and next-character targets ``y`` (B, T)."""
    starts = torch.randint(len(data) - seq_len - 1, (batch_size,), generator=gen)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    chunk = data[idx]
    return chunk[:, :-1], chunk[:, 1:]


def val_windows(data: torch.Tensor, n_windows: int, seq_len: int):
    """A fixed set of ``n_windows`` evenly spaced validation windows ``(x, y)``."""
    starts = torch.linspace(0, len(data) - seq_len - 1, n_windows).long()
    chunk = data[starts[:, None] + torch.arange(seq_len + 1)]
    return chunk[:, :-1], chunk[:, 1:]


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)  # queries, keys and values in one matmul
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        # (B, T, 3D) -> three (B, H, T, D/H) tensors
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, D // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int = 96,
        n_layers: int = 3,
        n_heads: int = 4,
        tie_weights: bool = True,
    ):
        super().__init__()
        self.seq_len = seq_len
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        if tie_weights:  # the output head reuses the input embedding matrix
            self.head.weight = self.tok_emb.weight
        # GPT-2 style init: N(0, 0.02), residual output projections scaled down by depth.
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                residual_out = name.endswith(("attn.proj.weight", "mlp.2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layers) if residual_out else 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        """Logits (B, T, V); with ``targets``, also the mean cross-entropy in nats."""
        T = idx.shape[1]
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(T, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def make_optimizer(model: nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on biases, LayerNorms)."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.dim() >= 2]
    no_decay = [p for p in params if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay}]
    return torch.optim.AdamW(groups, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))


def lr_at(step: int, progress: float, config: dict) -> float:
    """Linear warmup over ``warmup_steps``, then cosine decay to lr/10 as ``progress`` -> 1."""
    peak = config["lr"]
    if step < config["warmup_steps"]:
        return peak * (step + 1) / config["warmup_steps"]
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0))))


@torch.no_grad()
def evaluate(model: nn.Module, windows, rank: int = 0, world_size: int = 1) -> float:
    """Mean cross-entropy (nats per character) over the fixed validation windows.

    Each rank scores its own share of the windows; the sums are then added up across ranks, so
    the result is the same on every rank and for any number of workers.
    """
    model.eval()
    x, y = windows[0][rank::world_size], windows[1][rank::world_size]
    logits = model(x)
    total = torch.tensor(
        [F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item(), y.numel()],
        dtype=torch.float64,
    )
    if world_size > 1:
        torch.distributed.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def _max_across_ranks(value: float) -> float:
    """The largest ``value`` over all ranks (all ranks must agree on when to stop and on the
    learning rate, or DDP's gradient all-reduce would hang or the replicas would drift)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    t = torch.tensor([value], dtype=torch.float64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
    return t.item()


# --------------------------------------------------------------------------------------------
# Training: the Ray Train per-worker function
# --------------------------------------------------------------------------------------------

# The Ray Train / trainfactory stand-ins for a standalone run; None means use the real ones.
_STANDALONE_APIS = None


def _apis():
    """``(ray.train, ray.train.torch, jupyter_trainfactory.train)``, or the local stand-ins."""
    if _STANDALONE_APIS is not None:
        return _STANDALONE_APIS
    import ray.train
    import ray.train.torch

    import jupyter_trainfactory.train as trainfactory

    return ray.train, ray.train.torch, trainfactory


def train_func(config: dict) -> None:
    """Train the tiny GPT; one call per Ray Train worker (DDP over gloo on CPU)."""
    train, train_torch, trainfactory = _apis()
    config = {**DEFAULT_CONFIG, **(config or {})}
    torch.set_num_threads(config["threads"])
    ctx = train.get_context()
    rank, world_size = ctx.get_world_rank(), ctx.get_world_size()

    # Data: every worker reads the same corpus; windows for training differ per rank.
    data = make_data(config)
    B, T = config["batch_size"], config["seq_len"]
    windows = val_windows(data.val, config["eval_windows"], T)
    gen = torch.Generator().manual_seed(config["seed"] * 1000 + rank)

    # Model: the same initial weights everywhere (DDP also broadcasts rank 0's at wrap time).
    torch.manual_seed(config["seed"])
    L, H, D = config["n_layers"], config["n_heads"], config["d_model"]
    model = train_torch.prepare_model(GPT(len(data.vocab), T, D, L, H))
    trainfactory.watch(model, layers=L, heads=H, head_dim=D // H, seq_len=T)
    raw_model = getattr(model, "module", model)  # without the DDP wrapper, for eval and saving
    opt = make_optimizer(model, config["lr"], config["weight_decay"])

    start = time.perf_counter()
    recent_losses = []
    for global_step in range(1, config["max_steps"] + 1):
        # Fraction of the run done (by steps or by time, whichever is further), agreed by ranks.
        elapsed = _max_across_ranks(time.perf_counter() - start)
        progress = max(global_step / config["max_steps"], elapsed / config["time_budget_s"])
        lr = lr_at(global_step - 1, progress, config)
        for group in opt.param_groups:
            group["lr"] = lr

        with trainfactory.data_wait():
            x, y = get_batch(data.train, B, T, gen)
        with trainfactory.step(samples=B, tokens=B * T):
            _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
        recent_losses.append(loss.item())
        trainfactory.log({"loss": recent_losses[-1], "lr": lr}, step=global_step)

        last = progress >= 1.0 or global_step == config["max_steps"]
        if global_step % config["eval_interval"] == 0 or last:
            val_loss = evaluate(raw_model, windows, rank, world_size)
            metrics = {
                "val_loss": val_loss,
                "unigram_entropy": data.val_entropy,
                "train_loss": sum(recent_losses) / len(recent_losses),
                "step": global_step,
            }
            recent_losses = []
            # Rank 0 writes the checkpoint; every rank calls report (the others with None).
            with tempfile.TemporaryDirectory() as tmp:
                checkpoint = None
                if rank == 0:
                    state = {
                        "model": raw_model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "step": global_step,
                        "config": config,
                        "itos": data.vocab.itos,
                    }
                    torch.save(state, os.path.join(tmp, "checkpoint.pt"))
                    checkpoint = train.Checkpoint.from_directory(tmp)
                train.report(metrics, checkpoint=checkpoint)
        if last:
            break


# --------------------------------------------------------------------------------------------
# Standalone run: local stand-ins for Ray Train and trainfactory
# --------------------------------------------------------------------------------------------


class _LocalRun:
    """Single-process stand-ins: no DDP, no checkpoint storage; ``step`` times the training
    steps and ``report`` prints one line per evaluation."""

    def __init__(self):
        self.start = time.perf_counter()
        self.train_s = 0.0  # time inside training steps
        self.tokens = 0
        self.n_params = 0

    # ray.train
    def get_context(self):
        return SimpleNamespace(get_world_rank=lambda: 0, get_world_size=lambda: 1)

    class Checkpoint:
        @staticmethod
        def from_directory(path):
            return path

    def report(self, metrics: dict, checkpoint=None) -> None:
        elapsed = time.perf_counter() - self.start
        print(
            f"step {metrics['step']:5d}  train {metrics['train_loss']:.3f}  "
            f"val {metrics['val_loss']:.3f}  unigram H {metrics['unigram_entropy']:.3f}  "
            f"{elapsed:6.1f} s  {self.tokens / self.train_s:7.0f} tok/s",
            flush=True,
        )

    # ray.train.torch
    def prepare_model(self, model: nn.Module) -> nn.Module:
        return model

    # jupyter_trainfactory.train
    def watch(self, model: nn.Module, **attention) -> None:
        self.n_params = sum(p.numel() for p in model.parameters())
        print(f"{self.n_params:,} parameters, {attention}", flush=True)

    def data_wait(self):
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def step(self, samples: int, tokens: int):
        t0 = time.perf_counter()
        yield
        self.train_s += time.perf_counter() - t0
        self.tokens += tokens

    def log(self, metrics: dict, step: int) -> None:
        pass


def main(config: dict | None = None) -> None:
    global _STANDALONE_APIS
    local = _LocalRun()
    _STANDALONE_APIS = (local, local, local)
    try:
        train_func(config or {})
    finally:
        _STANDALONE_APIS = None


if __name__ == "__main__":
    # Optional overrides on the command line, e.g. ``time_budget_s=30 d_model=128``.
    overrides = dict(arg.split("=", 1) for arg in sys.argv[1:])
    main({k: type(DEFAULT_CONFIG[k])(v) for k, v in overrides.items()})
