"""Worker side: instruments the user's training function and implements ``trainfactory.log``.

Every Ray Train worker of a job runs the user's function through :func:`instrument`,
which, without any change to the user's code,

- tells the job's RunRecorder that the workers started (rank 0),
- wraps ``ray.train.torch.prepare_model`` so the prepared model is :func:`watch` ed
  (trainable parameters counted, gradient allreduces timed by a DDP comm hook),
- wraps ``ray.train.report`` so a report that carries a checkpoint is timed (seconds,
  bytes, MB/s),
- wraps ``ray.train.get_dataset_shard`` so the wait for each batch of a Ray Data shard
  counts as data wait and its rows as ingest (``ingest.TimedShard``),
- times FSDP2's all-gathers and reduce-scatters and watches the model ``fully_shard``
  returns (``collectives``),
- starts a background thread that ships buffered telemetry to the recorder about every
  0.5 s with fire-and-forget actor calls, so ``log``, ``step`` and ``data_wait`` cost the
  training loop a lock and a list append.

Only the attribute-call style is wrapped (``ray.train.report(...)``,
``ray.train.torch.prepare_model(...)``); a name imported with ``from ray.train import
report`` before the job starts keeps the unwrapped function. This module imports neither
Ray nor torch at import time.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ray_backend.ingest import timed_get_dataset_shard, timed_iter
from ray_backend.protocol import (
    RECORDER_NAMESPACE,
    STOP_SEEN,
    recorder_name,
    sampler_name,
)
from ray_backend.worker_telemetry import WorkerTelemetry

__all__ = [
    "RECORDER_NAMESPACE",
    "STOP_SEEN",
    "WorkerTelemetry",
    "current",
    "data_wait",
    "get_checkpoint",
    "save_checkpoint",
    "should_stop",
    "instrument",
    "log",
    "recorder_name",
    "sampler_name",
    "step",
    "watch",
]

_log = logging.getLogger("trainfactory")


#: How long a worker waits after that report for the driver to end the job.
STOP_WAIT_S = 120.0
#: Seconds rank 0 waits for the loop's first step before it reads the versions anyway (a
#: long first step, a model load: the run still gets them while the job runs).
VERSIONS_WAIT_S = 10.0
#: Lines of a failing rank's traceback kept for ``%train status`` and the dashboard.
TRACEBACK_LINES = 12


_current: WorkerTelemetry | None = None
_no_job_warned = False


def current() -> WorkerTelemetry | None:
    """This worker's telemetry, or None outside a trainfactory job."""
    return _current


def _active() -> WorkerTelemetry | None:
    global _no_job_warned
    if _current is None and not _no_job_warned:
        _no_job_warned = True
        _log.warning("trainfactory: not inside a trainfactory job; telemetry calls do nothing.")
    return _current


# -- public worker API (re-exported as jupyter_trainfactory.train) -------------------
def log(
    metrics: dict[str, Any],
    step: int | None = None,
    *,
    samples: float | None = None,
    tokens: float | None = None,
    rank_zero_only: bool = True,
) -> None:
    """Record ``metrics`` without blocking; callable every step.

    Parameters
    ----------
    metrics : dict of str to number
        Scalar values (Python, numpy or 0-d torch numbers; NaN and inf are counted and
        flagged by the recorder, never written raw). Non-numbers are skipped with one
        warning per key.
    step : int, optional
        The x-axis value; default: steps completed so far on this worker. Each key's
        steps must increase: a point at a step already written for that key is dropped.
    samples, tokens : float, optional
        Samples and tokens this rank processed since its previous call, for
        ``train/samples_per_s`` and ``train/tokens_per_s`` (count them here or in
        :func:`step`, not both).
    rank_zero_only : bool
        Log only rank 0's values (default). False logs every rank's, as ``rank<r>/<key>``.
    """
    worker = _active()
    if worker is not None:
        worker.log(metrics, step, samples, tokens, rank_zero_only)


class _Timed:
    """A context that hands its block's wall time (s) to the subclass's
    ``_record(worker, seconds)``."""

    __slots__ = ("_t0",)

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: Any) -> None:
        worker = _active()
        if worker is not None:
            self._record(worker, time.perf_counter() - self._t0)


class step(_Timed):
    """``with trainfactory.step(samples=B, tokens=B * T): ...`` times one training step.

    The block's wall time (s) feeds ``train/step_time_s`` and its p50/p95; ``samples``
    and ``tokens`` (this rank's, for this step) feed throughput and MFU.
    """

    __slots__ = ("_samples", "_tokens")

    def __init__(self, samples: float | None = None, tokens: float | None = None):
        self._samples = samples
        self._tokens = tokens

    def _record(self, worker: WorkerTelemetry, seconds: float) -> None:
        worker.add_step(seconds, self._samples, self._tokens)


class _DataWait(_Timed):
    __slots__ = ()

    def _record(self, worker: WorkerTelemetry, seconds: float) -> None:
        worker.add_data_wait(seconds)


def _add_data_wait(seconds: float) -> None:
    worker = _active()
    if worker is not None:
        worker.add_data_wait(seconds)


def _timed_iter(iterable: Iterable) -> Iterator:
    return timed_iter(iterable, _add_data_wait)


def data_wait(iterable: Iterable | None = None):
    """Time spent waiting for data, for ``train/data_wait_fraction``.

    ``with trainfactory.data_wait(): batch = next(it)`` times the block;
    ``for batch in trainfactory.data_wait(loader):`` times each ``next()`` of ``loader``.
    """
    return _DataWait() if iterable is None else _timed_iter(iterable)


def should_stop() -> bool:
    """True from the step where the job stops after a stop request; call it every step
    (or every k steps) on every rank, at the same place in the loop.

    A graceful stop (``%train stop``, the panel, ``--budget``, ``--on-stall stop``) makes
    every rank see True at the same call, whatever their speeds: after the request, each
    rank waits at its next call (or report) until the job's recorder has agreed the stop
    point, one past the rank furthest ahead (about a second), so a loop that then saves
    a checkpoint and returns cannot deadlock in a collective. Without a request it costs
    a lock and a counter. A loop that never calls it is ended by the driver after its
    next report that carries a checkpoint.

    Returns
    -------
    bool
        False outside a trainfactory job.
    """
    worker = _current
    return worker is not None and worker.check(wait_s=STOP_WAIT_S)


def save_checkpoint(metrics: dict[str, Any], directory: str | None = None, **kwargs: Any) -> None:
    """Report ``metrics`` with the checkpoint in ``directory`` (None: metrics only).

    Call it on every rank (``ray.train.report`` is a barrier); usually rank 0 passes the
    directory it wrote and the others None. A manifest of the directory's files (sizes
    and SHA-256) is written into it first, so :func:`get_checkpoint` can tell a complete
    checkpoint from a damaged one. ``kwargs`` go to ``ray.train.report``.
    """
    import ray.train

    checkpoint = ray.train.Checkpoint.from_directory(directory) if directory else None
    ray.train.report(metrics, checkpoint=checkpoint, **kwargs)


def get_checkpoint():
    """The newest reported checkpoint whose manifest verifies, or None.

    Looks at ``ray.train.get_all_reported_checkpoints()`` newest first; a checkpoint that
    is incomplete or damaged (a file missing, truncated or changed) is skipped with a
    warning in the job log. A checkpoint without a manifest (saved by code that bypassed
    ``ray.train.report``) is accepted as it is, with a warning.
    """
    import ray.train

    from ray_backend.checkpoints import verify

    try:
        reported = ray.train.get_all_reported_checkpoints(timeout_s=60)
    except Exception:  # older Ray, or not available: the latest one, unverified
        reported = []
    candidates = [r.checkpoint for r in reported if r.checkpoint is not None][::-1]
    if not candidates:
        latest = ray.train.get_checkpoint()
        candidates = [latest] if latest is not None else []
    steps = {id(r.checkpoint): (r.metrics or {}).get("step") for r in reported if r.checkpoint}
    for checkpoint in candidates:
        with checkpoint.as_directory() as local:
            problem = verify(local)
        if problem == "it has no manifest":
            print(f"trainfactory: checkpoint {checkpoint.path} has no manifest; using it.")
            problem = None
        if problem is None:
            step = steps.get(id(checkpoint))
            if _current is not None:  # tell the recorder which step training resumes from
                _current.set_info("restore", {"step": step, "path": checkpoint.path})
            return checkpoint
        print(f"trainfactory: skipping checkpoint {checkpoint.path}: {problem}.", flush=True)
    return None


def _unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def _timing_hook(telemetry: WorkerTelemetry, inner: Callable | None):
    """A DDP comm hook that runs ``inner`` (default: allreduce + average) and times it.

    On CPU (gloo) the time is the host wall time from launch to the future's completion.
    On CUDA (NCCL) the host sees only the launch, so CUDA events are recorded on the
    current stream before the launch and in the completion callback, and resolved later
    by the shipping thread.
    """
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    hook = inner or allreduce_hook

    def timed(state, bucket):
        buffer = bucket.buffer()
        if buffer.is_cuda:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            fut = hook(state, bucket)

            def done(f):
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                telemetry.add_comm_events(start, end)
                return f.value()

            return fut.then(done)
        t0 = time.perf_counter()
        fut = hook(state, bucket)

        def done_cpu(f):
            telemetry.add_comm(time.perf_counter() - t0)
            return f.value()

        return fut.then(done_cpu)

    return timed


def watch(
    model: Any,
    *,
    layers: int | None = None,
    heads: int | None = None,
    head_dim: int | None = None,
    seq_len: int | None = None,
    flops_per_token: float | None = None,
) -> Any:
    """Count ``model``'s trainable parameters and time its gradient allreduces; returns it.

    Models prepared by ``ray.train.torch.prepare_model`` are watched automatically; call
    this for a model Ray did not prepare, or to give the shape MFU needs: with ``layers``,
    ``heads``, ``head_dim`` and ``seq_len`` the attention term ``12 * L * H * Q * T`` is
    added to ``6 * N`` FLOPs per token (PaLM, appendix B); ``flops_per_token`` overrides
    both. Watching a model twice adds no second hook. For a DistributedDataParallel
    model, the timing comm hook wraps the default allreduce; a hook the user registers
    later (``model.register_comm_hook``) is wrapped instead, so it still works.
    """
    worker = _active()
    if worker is None:
        return model
    inner = _unwrap(model)
    info: dict[str, Any] = {}
    with contextlib.suppress(Exception):  # not a torch module: no parameter count
        info["n_params"] = int(sum(p.numel() for p in inner.parameters() if p.requires_grad))
    for name, value in (
        ("layers", layers),
        ("heads", heads),
        ("head_dim", head_dim),
        ("seq_len", seq_len),
        ("flops_per_token", flops_per_token),
    ):
        if value is not None:
            info[name] = value
    worker.set_info("model", info)
    _hook_ddp(model, worker)
    _hook_first_forward(inner, worker)
    return model


def _hook_first_forward(module: Any, worker: WorkerTelemetry) -> None:
    """Tell ``worker`` when ``module``'s first forward begins (training has started:
    :meth:`WorkerTelemetry.started`); the hook removes itself after that call."""
    register = getattr(module, "register_forward_pre_hook", None)
    if register is None or getattr(module, "_tf_first_forward", False):
        return
    module._tf_first_forward = True
    handle = None

    def first_forward(mod, args):
        worker.started(time.time())
        if handle is not None:
            handle.remove()

    with contextlib.suppress(Exception):  # not a torch module
        handle = register(first_forward)


def _hook_ddp(model: Any, worker: WorkerTelemetry) -> None:
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return
    if not isinstance(model, DistributedDataParallel) or getattr(model, "_tf_watched", False):
        return
    model._tf_watched = True
    original_register = model.register_comm_hook
    state = {"registered": False}

    def register_comm_hook(hook_state, hook):  # the user's own hook, timed
        state["registered"] = True
        return original_register(hook_state, _timing_hook(worker, hook))

    model.register_comm_hook = register_comm_hook
    original_forward = model.forward

    def forward(*args, **kwargs):
        if not state["registered"]:  # first forward without a user hook: time the default
            state["registered"] = True
            original_register(None, _timing_hook(worker, None))
            model.forward = original_forward
        return original_forward(*args, **kwargs)

    model.forward = forward


def _dir_bytes(path: str) -> int | None:
    try:
        total = 0
        for root, _, files in os.walk(path):
            for name in files:
                total += os.path.getsize(os.path.join(root, name))
        return total
    except OSError:
        return None


#: How long a worker waits for the recorder to take its steps before a checkpoint.
CONFIRM_WAIT_S = 60.0


def _hold_unless_recorded(worker: WorkerTelemetry) -> None:
    """Before a checkpoint goes to Ray: every step this worker logged up to it is in the
    recorder, or the checkpoint never commits.

    A restore from a checkpoint whose steps the run lacks loses them for good: they are
    never run again. After ``stop --now`` the workers ran on for about a second and
    reported a checkpoint that Ray Train kept, while the recorder, killed with the driver
    3 s after its SIGTERM, took the steps before it along (issue 48: steps 98-111 missing
    after the resume). So the worker waits until the recorder has written them to MLflow
    (a few ms per checkpoint); when the record is closed or the recorder gone (the job
    ends), the checkpoint is not reported and the worker waits to be ended with its job.
    Without an answer in :data:`CONFIRM_WAIT_S` s, or with the tracking server away (the
    recorder keeps the points), the report goes on, said in the log: training never waits
    on the tracking server.
    """
    confirmed = worker.confirm(timeout=CONFIRM_WAIT_S)
    if confirmed is None:
        print(
            "trainfactory: the steps before this checkpoint are not confirmed in MLflow"
            f" (no answer in {CONFIRM_WAIT_S:.0f} s, or the tracking server is away);"
            " reporting it anyway.",
            flush=True,
        )
    if confirmed is False:
        print(
            "trainfactory: the job's record is closed (the job is ending); this checkpoint"
            " is not reported, so no resume restores steps the run does not hold.",
            flush=True,
        )
        while True:  # ended with the job: its driver is exiting
            time.sleep(60)


def _patch_ray(worker: WorkerTelemetry) -> Callable[[], None]:
    """Wrap ``ray.train.report``, ``ray.train.torch.prepare_model`` and the Lightning and
    Hugging Face ``prepare_trainer`` (``ray_backend.integrations``); returns the undo."""
    import ray.train

    originals: list[tuple[Any, str, Any]] = []
    report = ray.train.report

    def timed_report(metrics, checkpoint=None, *args, **kwargs):
        worker.progressed.set()
        # a stop point like should_stop(): every rank marks the same report
        stop_seen = worker.check(wait_s=STOP_WAIT_S)
        if stop_seen:  # tells the recorder: the first report at the agreed stop point
            metrics = {**metrics, STOP_SEEN: 1}
            worker.drain()  # every step logged so far reaches the run before the job ends
        if not worker.steps:
            # a loop that counts no steps (plain Ray Train code): its reports are its
            # steps, and its counters (data wait, collectives, ingest) go out before the
            # report, so the recorder derives them at this step (an actor call, no wait)
            worker.flush()
        if checkpoint is None:
            return report(metrics, checkpoint, *args, **kwargs)
        _hold_unless_recorded(worker)
        nbytes = None
        if os.path.isdir(checkpoint.path):  # a local directory: give it a manifest
            from ray_backend.checkpoints import MANIFEST, write_manifest

            if not os.path.exists(os.path.join(checkpoint.path, MANIFEST)):
                write_manifest(checkpoint.path)
            nbytes = _dir_bytes(checkpoint.path)
        t0 = time.perf_counter()
        result = report(metrics, checkpoint, *args, **kwargs)
        step = metrics.get("step")
        step = step if isinstance(step, (int, float)) and not isinstance(step, bool) else None
        worker.add_checkpoint(time.perf_counter() - t0, nbytes, step)
        if stop_seen:
            # No step after this checkpoint: what the run records and what a resume
            # restores stay the same. The driver ends the job within seconds.
            worker.flush()
            print("trainfactory: stop requested; checkpoint saved, training ends.", flush=True)
            time.sleep(STOP_WAIT_S)
        return result

    timed_report.__wrapped__ = report
    originals.append((ray.train, "report", report))
    ray.train.report = timed_report
    # a Ray Data shard's batches count as data wait (ray_backend.ingest)
    shard = ray.train.get_dataset_shard
    originals.append((ray.train, "get_dataset_shard", shard))
    ray.train.get_dataset_shard = timed_get_dataset_shard(
        shard, worker.add_data_wait, worker.add_ingest_rows
    )
    try:
        import ray.train.torch as rtt

        prepare = rtt.prepare_model

        def prepare_model(*args, **kwargs):
            return watch(prepare(*args, **kwargs))

        prepare_model.__wrapped__ = prepare
        originals.append((rtt, "prepare_model", prepare))
        rtt.prepare_model = prepare_model
    except ImportError:  # no torch on this worker
        pass

    from ray_backend import collectives, integrations

    undo_integrations = integrations.install(worker, watch)  # Lightning and Hugging Face
    undo_collectives = collectives.install(worker, watch)  # FSDP2's all-gather, reduce-scatter

    def undo() -> None:
        undo_collectives()
        undo_integrations()
        for module, name, value in originals:
            setattr(module, name, value)

    return undo


#: The variables Ray sets to a worker's accelerators (``accelerators.ACCELERATORS``).
_VISIBLE_ENVS = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES", "HABANA_VISIBLE_MODULES")


def _device_info() -> dict[str, Any]:
    info: dict[str, Any] = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    try:
        import torch

        if torch.cuda.is_available():
            info["device_name"] = torch.cuda.get_device_name(torch.cuda.current_device())
    except Exception:
        pass
    return info


def user_traceback(exc: BaseException) -> str:
    """The last :data:`TRACEBACK_LINES` lines of ``exc``'s traceback, without this
    module's own frames (the user's code is what matters)."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != __file__]
    lines = ["Traceback (most recent call last):"]
    lines += "".join(traceback.format_list(frames)).rstrip("\n").splitlines()
    lines += "".join(traceback.format_exception_only(exc)).rstrip("\n").splitlines()
    return "\n".join(line for line in lines[-TRACEBACK_LINES:] if line.strip())


def instrument(fn: Callable[[dict], Any], job_id: str) -> Callable[[dict], Any]:
    """Wrap ``fn`` with the job's worker-side telemetry; ``fn`` itself runs unchanged."""

    def train_loop_per_worker(config: dict) -> Any:
        # Imported, not referenced: cloudpickle ships this closure by value with a copy
        # of the globals it uses, so module state must be reached through the module.
        from ray_backend.session import run_instrumented

        return run_instrumented(fn, job_id, config)

    train_loop_per_worker.__name__ = getattr(fn, "__name__", "train_loop_per_worker")
    return train_loop_per_worker


def run_instrumented(fn: Callable[[dict], Any], job_id: str, config: dict) -> Any:
    """Run ``fn(config)`` on this Ray Train worker with the job's telemetry around it."""
    global _current
    import ray
    import ray.train

    context = ray.train.get_context()
    rank = context.get_world_rank()
    try:
        recorder = ray.get_actor(recorder_name(job_id), namespace=RECORDER_NAMESPACE)
    except ValueError:  # no recorder (job launched without one): nothing to tell
        recorder = None
    telemetry = WorkerTelemetry(
        recorder.worker_batch.remote if recorder is not None else None,
        rank=rank,
        world_size=context.get_world_size(),
    )
    _current = telemetry
    device = _device_info()
    telemetry.set_info("device", device)
    node_id = ray.get_runtime_context().get_node_id()
    # where this rank runs: for root causes, `logs --rank` and `chaos --kill-worker`
    # (the driver starts this node's sampler for the devices in `visible`)
    telemetry.set_info(
        "worker",
        {
            "pid": os.getpid(),
            "node_id": node_id,
            "node_ip": ray.util.get_node_ip_address(),
            "visible": {k: os.environ[k] for k in _VISIBLE_ENVS if k in os.environ},
        },
    )
    versions = None
    if rank == 0 and recorder is not None:
        recorder.set_state.remote("RUNNING", "")
        # the versions as the workers see them (the notebook's may differ): read beside
        # the loop once it has made its first step (about 1 s of this process's CPU on a
        # 2-CPU node, which would otherwise hold up DDP's setup and the first step)
        versions = threading.Thread(
            target=_send_environment,
            args=(recorder, telemetry.progressed),
            name="trainfactory-versions",
            daemon=True,
        )
        versions.start()
    undo = _patch_ray(telemetry)
    telemetry.start()
    try:
        return fn(config)
    except BaseException as exc:
        # Ray Train hands the controller the bare exception, without its traceback:
        # the recorder gets it from here for the failure's root cause
        telemetry.set_info("error", {"type": type(exc).__name__, "traceback": user_traceback(exc)})
        raise
    finally:
        undo()
        if versions is not None:  # sent before the run can close
            telemetry.progressed.set()
            versions.join(timeout=60)
        telemetry.close()
        _current = None


def _send_environment(recorder, progressed: threading.Event) -> None:
    """Send the recorder this process's versions (``lineage.environment``, ``pip_freeze``)
    once ``progressed`` is set (the first step, ``log()`` or report, or the loop's end) or
    :data:`VERSIONS_WAIT_S` have passed, whichever comes first."""
    from jupyter_trainfactory import lineage

    progressed.wait(VERSIONS_WAIT_S)
    try:
        recorder.set_environment.remote(lineage.environment(), lineage.pip_freeze())
    except Exception:  # the versions are a record, never a reason to fail a job
        logging.getLogger("trainfactory").warning("could not read the versions", exc_info=True)
