"""The protocol between a job's workers, its driver and its RunRecorder: names and messages.

Both sides import this module: the workers (``ray_backend.session``) build
:class:`WorkerBatch` es and read :class:`StopReply` s; the driver names its actors with
:func:`recorder_name` and :func:`sampler_name` in :data:`RECORDER_NAMESPACE`; the recorder
decodes the batches and the report markers. It imports nothing beyond the standard
library, so the worker API stays importable without Ray, MLflow or torch.

Batches travel as plain dicts (Ray pickles them); the ``TypedDict`` s below say which
keys exist and what they hold, so a key is written once, here.
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

__all__ = [
    "INFO_KINDS",
    "RECORDER_NAMESPACE",
    "RESERVED_KEYS",
    "STOP_SEEN",
    "CheckpointSaved",
    "Counters",
    "InfoKind",
    "Point",
    "StopPoint",
    "StopReply",
    "WorkerBatch",
    "recorder_name",
    "sampler_name",
]

#: Ray namespace of a job's RunRecorder and NodeSamplers.
RECORDER_NAMESPACE = "trainfactory"

#: Added to the metrics of the first report with a checkpoint after a stop request.
STOP_SEEN = "trainfactory_stop_seen"

#: Report keys with a meaning to this tool. ``step``: the report's step (else the
#: report count). ``samples``: samples this rank processed since its previous report.
#: :data:`STOP_SEEN` (``trainfactory_stop_seen``): added by the workers to the first
#: report with a checkpoint after they learnt of a stop request; they wait after it, so it
#: is the last checkpoint of the job.
RESERVED_KEYS = frozenset({"step", "samples", STOP_SEEN})


def recorder_name(job_id: str) -> str:
    """Name of job ``job_id``'s RunRecorder actor in namespace :data:`RECORDER_NAMESPACE`."""
    return f"recorder-{job_id}"


def sampler_name(job_id: str, node_id: str) -> str:
    """Name of job ``job_id``'s NodeSampler on Ray node ``node_id``."""
    return f"sampler-{job_id}-{node_id}"


#: One logged point: ``[key, value, step, wall time in s since the epoch]``.
Point = list


class Counters(TypedDict, total=False):
    """One rank's cumulative counters (the fields of ``telemetry.stats.StepCounters``)."""

    time: float  # when read on the worker, s since the epoch
    steps: int  # trainfactory.step() blocks, else trainfactory.log() calls
    samples: float
    tokens: float
    step_time_s: float  # s inside trainfactory.step()
    data_wait_s: float  # s inside trainfactory.data_wait()
    comm_s: float  # s of collectives: DDP's allreduces, FSDP2's all-gathers and reduce-scatters
    all_gather_s: float  # the all-gathers' part of comm_s
    reduce_scatter_s: float  # the reduce-scatters' part of comm_s
    ingest_rows: float  # rows a Ray Data shard handed to the loop
    step_times: list[float]  # this batch's step durations, s (at most 256)


class StopPoint(TypedDict, total=False):
    """A rank's stop point count, sent once it heard of a stop (for the agreement)."""

    checks: int  # stop points passed (should_stop() calls and reports)
    world_size: int
    final: bool  # the rank finished: it passes no further stop point


class CheckpointSaved(TypedDict, total=False):
    """A checkpoint a rank saved (timed around its ``ray.train.report``)."""

    save_s: float  # s
    bytes: int | None  # its size, None when not a local directory
    time: float  # when the save ended, s since the epoch
    step: int  # the progress it keeps: the report's step, else the last logged step


#: Once-in-a-while facts a worker sends, each under its own key of the batch:
#: ``model`` (n_params, layers, heads, head_dim, seq_len, flops_per_token), ``device``
#: (device_name, cuda_visible_devices), ``worker`` (pid, node_id, node_ip, visible),
#: ``error`` (type, traceback of the exception the training function raised) and
#: ``restore`` (step, path of the checkpoint ``get_checkpoint()`` chose).
InfoKind = Literal["model", "device", "worker", "error", "restore", "started"]
INFO_KINDS: tuple[InfoKind, ...] = ("model", "device", "worker", "error", "restore", "started")


class WorkerBatch(TypedDict, total=False):
    """What a worker's telemetry thread sends to ``RunRecorder.worker_batch(rank, batch)``
    about every 0.5 s (an empty batch every few seconds when nothing changed)."""

    counters: Counters
    points: list[Point]
    checks: int  # stop points passed so far
    stop: StopPoint  # only after the rank heard of a stop, until agreed (or at its end)
    checkpoints: list[CheckpointSaved]
    model: dict[str, Any]
    device: dict[str, Any]
    worker: dict[str, Any]
    error: dict[str, str]
    restore: dict[str, Any]
    started: dict[str, float]  # {"time": s since the epoch}: the worker's first training work
    write: bool  # before a checkpoint: the recorder writes what it holds, then replies


class StopReply(TypedDict, total=False):
    """The recorder's reply to a batch: ``stop`` once a stop was requested, with ``at``,
    the agreed stop point (None until every rank's count is in); ``closed`` once the run
    is closed (the job ends): the batch was not taken; ``written`` (to a batch with
    ``write``): whether everything the recorder held, that batch included, is in MLflow."""

    stop: bool
    at: int | None
    closed: bool
    written: bool
