"""Job entrypoint: ``python -m ray_backend.driver PAYLOAD_MODULE``.

Loads the shipped job (spec + cloudpickled function), starts the job's RunRecorder and
NodeSamplers, builds a ``TorchTrainer`` and runs it, then closes the MLflow run with
the matching status. Exit code 0 on success, 1 on a training failure, 130 when stopped.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ray_backend.waiting import (
    PendingReason,
    current_wait,
    release_groups,
    resources_text,
    worker_resources,
    workers_reason,
)

__all__ = [
    "build_trainer",
    "current_wait",
    "exit_driver",
    "job_spec",
    "load_payload",
    "main",
    "release_groups",
    "workers_reason",
]


class _Stopped(BaseException):
    """Raised in the driver's main thread when Ray stops the job (SIGTERM/SIGINT)."""


def load_payload(module_name: str) -> tuple[dict[str, Any], Any]:
    """The job's metadata (spec, ids, URIs) and its training function; ``meta["config"]``
    is the config exactly as given (``config.pkl``) and ``meta["datasets"]`` the Ray Data
    datasets, not built yet (``datasets.pkl``), when the payload has them."""
    base = Path(importlib.import_module(module_name).__file__).parent
    meta = json.loads((base / "job.json").read_text())
    check_interpreter(meta.get("client"))
    import cloudpickle

    fn = cloudpickle.loads((base / "function.pkl").read_bytes())
    if (base / "config.pkl").is_file():
        meta["config"] = cloudpickle.loads((base / "config.pkl").read_bytes())
    if (base / "datasets.pkl").is_file():  # name -> Dataset or function (ingest builds them)
        meta["datasets"] = cloudpickle.loads((base / "datasets.pkl").read_bytes())
    return meta, fn


def job_spec(meta: dict[str, Any]):
    """The job's :class:`~jupyter_trainfactory.spec.JobSpec`, rebuilt from the payload's
    ``meta["spec"]`` (``JobSpec.to_dict``) with its pure checks only, its ``config`` the
    one given (``meta["config"]``) when the payload has it. Raises SpecError."""
    from jupyter_trainfactory.spec import JobSpec

    spec = JobSpec.from_dict(meta["spec"])
    if "config" in meta:
        spec.config = meta["config"]
    return spec


class InterpreterMismatch(RuntimeError):
    """The entrypoint's ``python`` cannot run the shipped job (no Ray, other versions)."""


def check_interpreter(client: dict[str, Any] | None) -> None:
    """Raise InterpreterMismatch (one sentence) when this interpreter is not one the job's
    pickled function can run in: Ray importable, the same Python minor version and Ray
    major.minor as the kernel that launched it (``client``; None: not checked).

    The entrypoint is the cluster's ``python`` on the nodes' PATH; a cluster started from
    a virtual environment that is not first on PATH gets another interpreter."""
    if not client:
        return
    here = sys.executable
    want_python = ".".join(map(str, client.get("python", [])))
    have_python = "{}.{}".format(*sys.version_info[:2])
    try:
        import ray
    except ImportError:
        have_ray = "no Ray"
    else:
        have_ray = f"Ray {ray.__version__}"
    want_ray = str(client.get("ray", ""))
    same_ray = have_ray.split(" ")[-1].split(".")[:2] == want_ray.split(".")[:2]
    if have_python == want_python and same_ray:
        return
    raise InterpreterMismatch(
        f"The job's python ({here}: Python {have_python}, {have_ray}) cannot run a function"
        f" from Python {want_python} with Ray {want_ray}; put the Python that runs Ray"
        " first on the nodes' PATH (the entrypoint runs `python`)."
    )


def _ranks_text(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


#: Seconds after a node's first rank appeared that its sampler starts even before the
#: job's first step (a long setup, a model load: its utilization is still sampled).
SAMPLER_WAIT_S = 10.0


class NodeSamplers:
    """One NodeSampler per node that hosts the job's workers, started as they appear.

    :meth:`poll` (every second, from the driver's main loop) reads where the ranks run
    from the recorder, starts the sampler of each new node (pinned to it, named
    ``sampler_name(job, node)``) and hands it the devices its workers see, and once every
    rank is placed records the job's placement (tag ``trainfactory.placement``) and
    warns when a ``pack`` request ended on more nodes than needed. A node's label is its
    address (``10-0-0-12``), with a node id prefix when several nodes share the address.

    A node's sampler starts once the job has made its first step, or
    :data:`SAMPLER_WAIT_S` after the node's first rank appeared: its process start
    would otherwise compete with the workers' setup for the node's CPUs (measured: DDP
    setup 1-1.5 s longer on a 2-CPU node, ``benchmarks/launch_latency.py``).
    """

    def __init__(self, ray, recorder, meta: dict[str, Any]):
        from jupyter_trainfactory.accelerators import accelerator

        spec = job_spec(meta)
        self._ray = ray
        self._recorder = recorder
        self._job_id = meta["job_id"]
        self._workers = spec.workers
        self._strategy = spec.placement
        self._min_nodes = int(meta.get("min_nodes") or 1)
        self._accelerator = accelerator(spec.accelerator)
        self._actors: dict[str, Any] = {}
        self._labels: dict[str, str] = {}
        self._watched: set[tuple[str, str | None]] = set()
        self._placement: dict[str, list[int]] | None = None
        self._seen: dict[str, float] = {}  # node id -> when its first rank appeared
        self._stopped = False

    def _label(self, node_id: str, node_ip: str) -> str:
        from ray_backend.sampler import node_label

        if node_id not in self._labels:
            same = [
                n
                for n in self._ray.nodes()
                if n.get("Alive") and n["NodeManagerAddress"] == node_ip
            ]
            label = node_label(node_ip)
            self._labels[node_id] = label if len(same) <= 1 else f"{label}-{node_id[:6]}"
        return self._labels[node_id]

    def poll(self, now: float | None = None, force: bool = False) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from ray_backend.protocol import RECORDER_NAMESPACE, sampler_name
        from ray_backend.sampler import NodeSampler

        now = time.monotonic() if now is None else now
        ranks = self._ray.get(self._recorder.ranks.remote(), timeout=30)
        stepped = any(info.get("step", 0) > 0 for info in ranks.values())
        for info in ranks.values():
            node_id = info["node_id"]
            seen = self._seen.setdefault(node_id, now)
            if not (force or stepped or now - seen >= SAMPLER_WAIT_S):
                continue  # the node's workers are still setting up: keep their CPUs
            if node_id not in self._actors:
                self._actors[node_id] = (
                    self._ray.remote(NodeSampler)
                    .options(
                        num_cpus=0,
                        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
                        name=sampler_name(self._job_id, node_id),
                        namespace=RECORDER_NAMESPACE,
                    )
                    .remote(
                        self._recorder,
                        self._label(node_id, info["node_ip"]),
                        accelerator=self._accelerator.name,
                    )
                )
            env = self._accelerator.visible_env
            visible = (info.get("visible") or {}).get(env) if env else None
            if env and (node_id, visible) not in self._watched:
                self._watched.add((node_id, visible))
                self._actors[node_id].watch_devices.remote(visible)
        if len(ranks) == self._workers:
            nodes: dict[str, list[int]] = {}
            for rank, info in sorted(ranks.items()):
                label = self._label(info["node_id"], info["node_ip"])
                nodes.setdefault(label, []).append(int(rank))
            if nodes != self._placement:
                self._placement = nodes
                self._record(nodes)

    def _record(self, nodes: dict[str, list[int]]) -> None:
        from jupyter_trainfactory.tracking import TAG

        where = "; ".join(f"{label}: {_ranks_text(r)}" for label, r in sorted(nodes.items()))
        n = len(nodes)
        print(
            f"trainfactory: placement {self._strategy}: {self._workers} worker"
            f"{'s' if self._workers != 1 else ''} on {n} node{'s' if n != 1 else ''} ({where})",
            flush=True,
        )
        warning = ""
        if self._strategy == "pack" and n > self._min_nodes:
            warning = (
                f"pack placed the workers on {n} nodes, though {self._min_nodes} can hold"
                f" them (the rest were busy): cross-node allreduce is slower; --placement"
                f" strict-pack waits for free nodes instead"
            )
            print(f"trainfactory: warning: {warning}", flush=True)
        placement = {
            "strategy": self._strategy,
            "min_nodes": self._min_nodes,
            "nodes": nodes,
            "ranks": {str(r): label for label, ranks in nodes.items() for r in ranks},
        }
        self._recorder.set_tags.remote(
            {TAG.PLACEMENT: json.dumps(placement), TAG.PLACEMENT_WARNING: warning}
        )

    def stop(self) -> None:
        """Start the samplers of nodes seen late (a job shorter than the first poll), then
        stop every sampler; each sends one last sample before it returns (15 s at most)."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.poll(force=True)
        except Exception as exc:
            print(f"trainfactory: node samplers: {exc}", flush=True)
        refs = [actor.stop.remote() for actor in self._actors.values()]
        if refs:  # a sampler whose node is gone is ready at once, with its error
            self._ray.wait(refs, num_returns=len(refs), timeout=15)


def _checkpoint_config(config_class, spec):
    """Retention: the newest ``keep_checkpoints``, or the best by ``keep_best``."""
    best = spec.keep_best_order()
    if best:
        return config_class(
            num_to_keep=spec.keep_checkpoints,
            checkpoint_score_attribute=best[0],
            checkpoint_score_order=best[1],
        )
    return config_class(num_to_keep=spec.keep_checkpoints)


def build_trainer(meta: dict[str, Any], fn: Any, recorder: Any, callbacks: tuple = ()):
    """The ``TorchTrainer`` for this job: resources, backend and placement from the
    accelerator table (``jupyter_trainfactory.accelerators``) and the spec, ``callbacks``
    after the recorder's (a sweep trial's ``TuneReportCallback``), and the
    job's Ray Data datasets, built here (``ingest.build_datasets``: the lineage of those
    a function built goes to the recorder). Raises RuntimeError when a dataset fails."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from jupyter_trainfactory.accelerators import accelerator
    from jupyter_trainfactory.spec import PLACEMENTS
    from ray_backend.callbacks import RecorderCallback
    from ray_backend.ingest import build_datasets, data_config
    from ray_backend.session import instrument

    spec = job_spec(meta)
    row = accelerator(spec.accelerator)
    datasets, lineage = build_datasets(meta.get("datasets"))
    if lineage:
        recorder.set_tags.remote(lineage)
    ingest = {"datasets": datasets, "dataset_config": data_config(spec.dataset_config)}
    return TorchTrainer(
        instrument(fn, meta["job_id"]),
        train_loop_config=spec.config,
        **(ingest if datasets else {}),
        torch_config=TorchConfig(backend=row.backend),
        scaling_config=ScalingConfig(
            num_workers=spec.workers,
            use_gpu=row.use_gpu,
            resources_per_worker=worker_resources(spec),
            placement_strategy=PLACEMENTS[spec.placement],
            label_selector=spec.label_selector or None,
        ),
        run_config=RunConfig(
            name=meta["job_id"],
            storage_path=meta["storage_path"],
            failure_config=FailureConfig(
                max_failures=spec.max_failures,
                max_preemption_failures=spec.max_preemptions,
            ),
            checkpoint_config=_checkpoint_config(CheckpointConfig, spec),
            callbacks=[RecorderCallback(recorder), *callbacks],
        ),
    )


def _cost_meter(meta: dict[str, Any]):
    """The job's CostMeter, from the price catalog shipped with it (None: none shipped)."""
    from jupyter_trainfactory.telemetry.cost import PriceCatalog
    from ray_backend.costs import CostMeter

    if not meta.get("price_catalog"):
        return None
    spec = job_spec(meta)
    return CostMeter(
        PriceCatalog.from_dict(meta["price_catalog"]),
        workers=spec.workers,
        gpus_per_worker=float(spec.gpus_per_worker),
        cpus_per_worker=float(spec.cpus_per_worker),
        keep_checkpoints=spec.keep_checkpoints,
        spot=spec.spot,
        budget=spec.budget,
    )


#: Name of the thread that runs ``fit()`` (:func:`exit_driver` looks for it).
FIT_THREAD = "trainfactory-fit"


class _GracefulStop(Exception):
    """A requested stop is due (a checkpoint came after it, or its grace period ended)."""


def _run_fit(trainer, box: dict[str, Any], done: threading.Event) -> None:
    try:
        box["result"] = trainer.fit()
    except BaseException as exc:  # handed to the main thread
        box["error"] = exc
    finally:
        done.set()


def _wait_for_fit(
    recorder,
    done: threading.Event,
    samplers: NodeSamplers | None = None,
    poll_s: float = 1.0,
    tick=None,
) -> None:
    """Wait for ``fit()`` (run in a thread); raise ``_GracefulStop`` when a stop is due.
    ``tick()`` (a sweep trial's: its reports to Tune) runs every ``poll_s`` s.

    The main thread stays in Python, so Ray's own job stop (SIGTERM) still reaches the
    ``_Stopped`` handler at once.
    """
    import ray

    while not done.wait(poll_s):
        if tick is not None:
            tick()
        if samplers is not None:
            try:
                samplers.poll()
            except Exception as exc:  # telemetry must never end the job
                print(f"trainfactory: node samplers: {exc}", flush=True)
        try:
            status = ray.get(recorder.stop_status.remote(), timeout=30)
        except ray.exceptions.GetTimeoutError:
            continue
        if status and status["due"]:
            after = ", after a checkpoint" if status["checkpointed"] else ""
            print(f"trainfactory: stopping ({status['reason']}{after})", flush=True)
            raise _GracefulStop(status["reason"])


def _start_recorder(ray, meta: dict[str, Any], spec):
    """The job's RunRecorder actor, on the driver's node (a worker node that dies must not
    take the record along); its process starts meanwhile (``ping`` waits for it)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ray_backend.protocol import RECORDER_NAMESPACE, recorder_name
    from ray_backend.recorder import RunRecorder

    recorder = (
        ray.remote(RunRecorder)
        .options(
            name=recorder_name(meta["job_id"]),
            namespace=RECORDER_NAMESPACE,
            num_cpus=0,
            lifetime=None,
            scheduling_strategy=NodeAffinitySchedulingStrategy(
                ray.get_runtime_context().get_node_id(), soft=False
            ),
        )
        .remote(
            meta["tracking_uri"],
            meta["run_id"],
            gpus_per_worker=float(spec.gpus_per_worker),
            peak_tflops=spec.peak_tflops,
            flops_per_token=spec.flops_per_token,
            stall_timeout_s=spec.stall_timeout,
            on_stall=spec.on_stall,
            resume=int(meta.get("resume", 0)),
            cost=_cost_meter(meta),
            workers=spec.workers,
            target_steps=spec.target_steps,
        )
    )
    return recorder


def _train(ray, meta: dict[str, Any], fn: Any, recorder, pending=None) -> int:
    """Run ``fit()`` (in a thread, the node samplers and ``pending``, a
    :class:`~ray_backend.waiting.PendingReason`, polled meanwhile) and close the run with the matching status;
    returns the exit code (0, 1 on a failure, 130 when Ray stopped the job)."""
    from ray_backend.callbacks import last_line

    samplers = NodeSamplers(ray, recorder, meta)
    started = time.time()
    box: dict[str, Any] = {}
    done = threading.Event()
    try:
        # Ray Train and torch import (5 s on a 2-CPU node) while the recorder's process
        # starts; a dataset that fails to build fails the job here, its run closed
        trainer = build_trainer(meta, fn, recorder)
        # fit() starts its controller while the recorder finishes starting (its calls
        # wait in the actor's queue): waiting for it first cost 2-3 s of every launch
        threading.Thread(
            target=_run_fit, args=(trainer, box, done), name=FIT_THREAD, daemon=True
        ).start()
        ray.get(recorder.ping.remote())  # a recorder that cannot start fails the job
        _wait_for_fit(recorder, done, samplers, tick=pending)
        if "error" in box:
            raise box["error"]
        error = getattr(box.get("result"), "error", None)
        if error is not None:
            raise error
    except (_Stopped, _GracefulStop) as stop:
        print("trainfactory: job stopped", flush=True)
        ray.get(recorder.finish.remote("KILLED", "STOPPED", reason=None, timeout_s=20), timeout=30)
        # Exiting ends the job's Ray Train controller and workers with the driver.
        return 0 if isinstance(stop, _GracefulStop) else 130
    except Exception as exc:
        logging.getLogger("trainfactory").exception("training failed")
        samplers.stop()  # their last samples reach the run before it closes
        ray.get(recorder.finish.remote("FAILED", "FAILED", error=last_line(exc)), timeout=330)
        return 1
    finally:
        samplers.stop()
    print(f"trainfactory: training finished in {time.time() - started:.1f} s", flush=True)
    stop = ray.get(recorder.stop_status.remote(), timeout=30)
    if stop is not None:  # the loop obeyed should_stop() and returned: a stopped job
        ray.get(recorder.finish.remote("KILLED", "STOPPED", reason=None), timeout=330)
        return 0
    ray.get(recorder.finish.remote("FINISHED", "SUCCEEDED"), timeout=330)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the job of the payload module ``argv[0]``; returns the exit code."""
    from jupyter_trainfactory.spec_values import SpecError

    argv = sys.argv[1:] if argv is None else argv
    try:
        meta, fn = load_payload(argv[0])
        spec = job_spec(meta)
    except (InterpreterMismatch, SpecError) as exc:
        print(f"trainfactory: {exc}", file=sys.stderr, flush=True)
        return 1

    import ray

    from jupyter_trainfactory.redact import mask_url

    def _on_signal(signum, frame):
        raise _Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_signal)
    ray.init(logging_level=logging.WARNING, log_to_driver=True)
    recorder = _start_recorder(ray, meta, spec)
    resources = resources_text(spec)
    print(
        f"trainfactory: job {meta['job_id']}: {resources}; run {meta['run_id']}"
        f" at {mask_url(meta['tracking_uri'])}",
        flush=True,
    )
    recorder.set_state.remote("PENDING", *current_wait(ray, spec))
    return _train(ray, meta, fn, recorder, PendingReason(ray, recorder, spec))


def exit_driver(code: int) -> None:
    """End the driver process with ``code``.

    After a stop the run is closed but ``fit()`` still runs in its daemon thread, blocked
    in a ``ray.get`` on the Train controller. A normal exit then races that thread: Ray's
    exit handler shuts the core worker down under it, and the process ends with code 1
    ("The core worker has already been shutdown ... The process will exit"), which Ray
    Jobs reports as a FAILED job though the stop went as asked. Measured with a driver
    whose thread waits in ``ray.get``: 6 of 12 ``sys.exit(0)`` ended with code 1, 0 of 12
    with this function (seen once in CI, ``tests/jobs/test_stop.py``; Ray's side:
    ray-project/ray#47864). With that thread alive the driver flushes its output and
    leaves by ``os._exit``; Ray ends the controller, workers and recorder the driver owns
    as on any driver exit. Without it, a normal ``sys.exit``. Either way the job's
    placement groups are released first (:func:`~ray_backend.waiting.release_groups`)."""
    release_groups()
    if any(t.name == FIT_THREAD and t.is_alive() for t in threading.enumerate()):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_driver(main())
