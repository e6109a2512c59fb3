"""Job entrypoint: ``python -m ray_backend.driver PAYLOAD_MODULE``.

Loads the shipped job (spec + cloudpickled function), starts the job's RunRecorder and
NodeSamplers, builds a ``TorchTrainer`` and runs it, then closes the MLflow run with
the matching status. Exit code 0 on success, 1 on a training failure, 130 when stopped.
"""

from __future__ import annotations

import importlib
import json
import logging
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["load_payload", "main"]


class _Stopped(BaseException):
    """Raised in the driver's main thread when Ray stops the job (SIGTERM/SIGINT)."""


def load_payload(module_name: str) -> tuple[dict[str, Any], Any]:
    """The job's metadata (spec, ids, URIs) and its training function."""
    import cloudpickle

    base = Path(importlib.import_module(module_name).__file__).parent
    meta = json.loads((base / "job.json").read_text())
    fn = cloudpickle.loads((base / "function.pkl").read_bytes())
    return meta, fn


def _resources_text(spec: dict[str, Any]) -> str:
    parts = [f"{spec['cpus_per_worker']:g} CPU"]
    if spec["gpus_per_worker"]:
        parts.append(f"{spec['gpus_per_worker']:g} GPU")
    n = spec["workers"]
    return f"{n} worker{'s' if n != 1 else ''} x ({', '.join(parts)})"


def _start_samplers(ray, recorder, job_id: str) -> list[Any]:
    """One NodeSampler per alive node, named so that the node's workers can find it."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ray_backend.sampler import NodeSampler
    from ray_backend.session import RECORDER_NAMESPACE, sampler_name

    actor = ray.remote(NodeSampler)
    samplers = []
    for node in ray.nodes():
        if not node.get("Alive"):
            continue
        strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        samplers.append(
            actor.options(
                num_cpus=0,
                scheduling_strategy=strategy,
                name=sampler_name(job_id, node["NodeID"]),
                namespace=RECORDER_NAMESPACE,
            ).remote(recorder, node["NodeManagerAddress"])
        )
    return samplers


def _checkpoint_config(config_class, spec: dict[str, Any]):
    """Retention: the newest ``keep_checkpoints``, or the best by ``keep_best``."""
    keep_best = spec.get("keep_best")
    if keep_best:
        metric, _, order = keep_best.rpartition(":")
        return config_class(
            num_to_keep=spec.get("keep_checkpoints", 2),
            checkpoint_score_attribute=metric,
            checkpoint_score_order=order,
        )
    return config_class(num_to_keep=spec.get("keep_checkpoints", 2))


def build_trainer(meta: dict[str, Any], fn: Any, recorder: Any):
    """The ``TorchTrainer`` for this job (gloo on CPU, NCCL on GPU, chosen by Ray)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from ray_backend.callbacks import RecorderCallback
    from ray_backend.session import instrument

    spec = meta["spec"]
    resources = {"CPU": float(spec["cpus_per_worker"])}
    if spec["gpus_per_worker"]:
        resources["GPU"] = float(spec["gpus_per_worker"])
    return TorchTrainer(
        instrument(fn, meta["job_id"]),
        train_loop_config=meta["config"],
        scaling_config=ScalingConfig(
            num_workers=spec["workers"],
            use_gpu=bool(spec["gpus_per_worker"]),
            resources_per_worker=resources,
        ),
        run_config=RunConfig(
            name=meta["job_id"],
            storage_path=meta["storage_path"],
            failure_config=FailureConfig(
                max_failures=spec["max_failures"],
                max_preemption_failures=spec.get("max_preemptions", -1),
            ),
            checkpoint_config=_checkpoint_config(CheckpointConfig, spec),
            callbacks=[RecorderCallback(recorder)],
        ),
    )


def _cost_meter(meta: dict[str, Any]):
    """The job's CostMeter, from the price catalog shipped with it (None: none shipped)."""
    from jupyter_trainfactory.telemetry.cost import PriceCatalog
    from ray_backend.costs import CostMeter

    if not meta.get("price_catalog"):
        return None
    spec = meta["spec"]
    return CostMeter(
        PriceCatalog.from_dict(meta["price_catalog"]),
        workers=spec["workers"],
        gpus_per_worker=float(spec["gpus_per_worker"]),
        cpus_per_worker=float(spec["cpus_per_worker"]),
        keep_checkpoints=spec.get("keep_checkpoints", 2),
        spot=bool(spec.get("spot")),
        budget=spec.get("budget"),
    )


class _GracefulStop(Exception):
    """A requested stop is due (a checkpoint came after it, or its grace period ended)."""


def _run_fit(trainer, box: dict[str, Any], done: threading.Event) -> None:
    try:
        box["result"] = trainer.fit()
    except BaseException as exc:  # handed to the main thread
        box["error"] = exc
    finally:
        done.set()


def _wait_for_fit(recorder, done: threading.Event, poll_s: float = 1.0) -> None:
    """Wait for ``fit()`` (run in a thread); raise ``_GracefulStop`` when a stop is due.

    The main thread stays in Python, so Ray's own job stop (SIGTERM) still reaches the
    ``_Stopped`` handler at once.
    """
    import ray

    while not done.wait(poll_s):
        try:
            status = ray.get(recorder.stop_status.remote(), timeout=30)
        except ray.exceptions.GetTimeoutError:
            continue
        if status and status["due"]:
            after = ", after a checkpoint" if status["checkpointed"] else ""
            print(f"trainfactory: stopping ({status['reason']}{after})", flush=True)
            raise _GracefulStop(status["reason"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    meta, fn = load_payload(argv[0])

    import ray

    from ray_backend.callbacks import last_line
    from ray_backend.recorder import RunRecorder
    from ray_backend.session import RECORDER_NAMESPACE, recorder_name

    def _on_signal(signum, frame):
        raise _Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_signal)
    ray.init(logging_level=logging.WARNING, log_to_driver=True)
    recorder = (
        ray.remote(RunRecorder)
        .options(
            name=recorder_name(meta["job_id"]),
            namespace=RECORDER_NAMESPACE,
            num_cpus=0,
            lifetime=None,
        )
        .remote(
            meta["tracking_uri"],
            meta["run_id"],
            gpus_per_worker=float(meta["spec"]["gpus_per_worker"]),
            peak_tflops=meta["spec"].get("peak_tflops"),
            flops_per_token=meta["spec"].get("flops_per_token"),
            stall_timeout_s=meta["spec"].get("stall_timeout"),
            on_stall=meta["spec"].get("on_stall", "warn"),
            resume=int(meta.get("resume", 0)),
            cost=_cost_meter(meta),
            workers=int(meta["spec"]["workers"]),
            target_steps=meta["spec"].get("target_steps"),
        )
    )
    ray.get(recorder.ping.remote())
    recorder.set_state.remote("PENDING", f"waiting for resources: {_resources_text(meta['spec'])}")
    samplers = _start_samplers(ray, recorder, meta["job_id"])
    started = time.time()
    box: dict[str, Any] = {}
    done = threading.Event()
    trainer = build_trainer(meta, fn, recorder)
    threading.Thread(target=_run_fit, args=(trainer, box, done), daemon=True).start()
    try:
        _wait_for_fit(recorder, done)
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
        ray.get(recorder.finish.remote("FAILED", "FAILED", error=last_line(exc)), timeout=330)
        return 1
    finally:
        for sampler in samplers:
            sampler.stop.remote()
    print(f"trainfactory: training finished in {time.time() - started:.1f} s", flush=True)
    stop = ray.get(recorder.stop_status.remote(), timeout=30)
    if stop is not None:  # the loop obeyed should_stop() and returned: a stopped job
        ray.get(recorder.finish.remote("KILLED", "STOPPED", reason=None), timeout=330)
        return 0
    ray.get(recorder.finish.remote("FINISHED", "SUCCEEDED"), timeout=330)
    return 0


if __name__ == "__main__":
    sys.exit(main())
