"""One of two gloo ranks for tests/unit/test_session.py: an FSDP2 model trained 2 steps under
``ray_backend.collectives``' timing; prints ``{"n_params", "counters", "undone"}`` as JSON.

Usage: ``python tests/fsdp2_ranks.py RANK PORT``.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.fsdp

from ray_backend import collectives, session


def main(rank: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    worker = session.WorkerTelemetry(None, rank=rank, world_size=2)
    session._current = worker
    undo = collectives.install(worker, session.watch)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        for layer in model:
            torch.distributed.fsdp.fully_shard(layer)
        torch.distributed.fsdp.fully_shard(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(2):
            model(torch.randn(8, 16)).sum().backward()
            opt.step()
            opt.zero_grad()
    finally:
        undo()
    batch = worker.batch()
    undone = not getattr(dist.all_gather_single, "_tf_timed", False)
    dist.destroy_process_group()
    print(
        json.dumps(
            {
                "n_params": batch["model"]["n_params"],
                "counters": batch["counters"],
                "undone": undone,
            }
        )
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
    sys.stdout.flush()
    # Skip C++ static destructors: rank 0's TCPStore thread, still joinable at exit, made
    # one run in three abort ("terminate called without an active exception") after the
    # result was printed.
    os._exit(0)
