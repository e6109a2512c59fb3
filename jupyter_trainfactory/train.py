"""The worker API: what a training function calls inside a trainfactory job.

``import jupyter_trainfactory.train as trainfactory`` imports no Jupyter package, Ray or
torch, so it works on any Ray worker. Outside a trainfactory job every call does nothing
(one warning), so the same function also runs under plain Ray Train.

- ``trainfactory.log(metrics, step=None, *, samples=None, tokens=None, rank_zero_only=True)``
- ``with trainfactory.step(samples=B, tokens=B * T): ...``
- ``with trainfactory.data_wait(): ...`` or ``for batch in trainfactory.data_wait(loader): ...``
- ``trainfactory.watch(model, layers=L, heads=H, head_dim=Q, seq_len=T)``
- ``trainfactory.save_checkpoint(metrics, directory)`` and ``trainfactory.get_checkpoint()``:
  checkpoints with a manifest (sizes, SHA-256); the newest one that verifies is restored
- ``trainfactory.should_stop()``: True once ``%train stop JOB`` asked the job to stop, at
  the same call on every rank (call it on every rank at the same place in the loop, every
  step or every k steps): after a stop request each rank waits at its next call (or
  report) until the job agrees the stop point, one past the rank furthest ahead, so a
  loop that then saves and returns cannot deadlock in a DDP collective
"""

from ray_backend.session import (
    data_wait,
    get_checkpoint,
    log,
    save_checkpoint,
    should_stop,
    step,
    watch,
)

__all__ = [
    "data_wait",
    "get_checkpoint",
    "log",
    "save_checkpoint",
    "should_stop",
    "step",
    "watch",
]
