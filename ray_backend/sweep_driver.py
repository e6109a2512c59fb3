"""Sweep entrypoint: ``python -m ray_backend.sweep_driver PAYLOAD_MODULE``.

A sweep is one detached Ray job whose driver runs a Ray Tune ``Tuner``; each trial is a
driver function that builds and fits the job's ``TorchTrainer`` with the trial's config
(the pattern of Ray Train V2's "Hyperparameter Tuning with Ray Tune" guide), its reports
forwarded to Tune by ``TuneReportCallback``. Every trial is a full trainfactory run: its
own RunRecorder (created here, so an early stop that ends the trial's actor does not end
the record) writing an MLflow child run of the sweep's run (:mod:`ray_backend.sweep_record`).

A graceful stop (``%train stop SWEEP``) rests the sweep: each running trial stops at its
next checkpoint and waits; then the driver interrupts Tune with SIGUSR1, Tune's own
Ctrl+C (it saves the experiment with those trials unfinished). A resume
(``meta["resume"]`` > 0) continues with ``Tuner.restore``: unfinished and failed trials
run again (each ``TorchTrainer``, same name and storage, restores its newest checkpoint)
and the search goes on to its trial budget.
Exit code 0 when the search ran to its end or rested, 1 when it failed, 130 when Ray
stopped it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from ray.train import UserCallback

from ray_backend.driver import (
    NodeSamplers,
    _GracefulStop,
    _run_fit,
    _Stopped,
    _wait_for_fit,
    build_trainer,
    exit_driver,
    job_spec,
    load_payload,
)

__all__ = ["build_tuner", "main", "trial_function"]

#: What a trial's driver function reserves: no CPU (its workers hold the trial's CPUs
#: and GPUs, so K trials of W one-CPU workers fit K*W CPUs) but 1 MiB of Ray's memory
#: resource, since Tune refuses an empty bundle.
TRIAL_DRIVER_RESOURCES = {"CPU": 0, "memory": 2**20}
#: How often the driver reads the sweep's stop request (s).
STOP_POLL_S = 2.0
#: How long a trial waits for the RunRecorder the sweep's callback starts for it (s).
RECORDER_WAIT_S = 120.0
#: The signal that ends Tune's loop as Ctrl+C does, state saved (``ray.tune.tune``).
INTERRUPT = signal.SIGUSR1


def _recorder(key: str, timeout_s: float = RECORDER_WAIT_S):
    import ray

    from ray_backend.protocol import RECORDER_NAMESPACE, recorder_name

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            actor = ray.get_actor(recorder_name(key), namespace=RECORDER_NAMESPACE)
            ray.get(actor.ping.remote(), timeout=60)
            return actor
        except ValueError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"trial {key}: its run recorder did not start") from None
            time.sleep(0.2)


class ReportsToTune(UserCallback):
    """A Ray Train ``UserCallback`` that hands rank 0's metrics of each report (and the
    checkpoint's path) to the trial's function through a Ray queue; the function reports
    them to Tune from its own thread (:func:`trial_function`).

    Ray's ``TuneReportCallback`` reports from Tune's main thread instead, which hangs the
    trial when the training function returns right after its last report (Ray 2.60: the
    main thread's ``put`` of that report waits on the result queue it alone drains,
    behind the function's end-of-trial result)."""

    def __init__(self, queue):
        self.queue = queue

    def after_report(self, run_context, metrics, checkpoint):
        item = dict(metrics[0])
        if checkpoint is not None:
            item["checkpoint_path"] = checkpoint.path
        self.queue.put(item)


def _forward(queue) -> None:
    """Report to Tune what the trial's workers reported since the last call."""
    from ray import tune

    while not queue.empty():
        tune.report(queue.get())


def _rest(resting, key: str) -> None:
    """A trial stopped by the sweep's stop: tell the driver (``resting``, a Ray queue) and
    wait, unfinished, for Tune to end the experiment (the driver's interrupt)."""
    resting.put(key)
    while True:
        time.sleep(60)


def trial_function(meta: dict[str, Any], fn: Any, resting):
    """Tune's trainable for this sweep: one trial = one ``TorchTrainer.fit()`` of ``fn``
    with the trial's config, recorded by the trial's RunRecorder (found by name), its
    reports passed on to Tune and its node samplers polled meanwhile. A trial the sweep's
    stop reaches rests (:func:`_rest`) instead of returning. Raises the training's error
    (the trial fails)."""

    def run_trial(config: dict) -> None:
        import ray
        from ray import tune
        from ray.util.queue import Queue

        from ray_backend.sweep_record import trial_index, trial_key

        key = trial_key(meta["job_id"], trial_index(tune.get_context().get_trial_id()))
        recorder = _recorder(key)
        if ray.get(recorder.stop_status.remote(), timeout=60) is not None:
            _rest(resting, key)  # the sweep stops: this trial starts on its resume
        trial_meta = {**meta, "job_id": key, "config": config}
        queue = Queue(actor_options={"num_cpus": 0})
        trainer = build_trainer(trial_meta, fn, recorder, callbacks=[ReportsToTune(queue)])
        samplers = NodeSamplers(ray, recorder, trial_meta)
        box: dict[str, Any] = {}
        done = threading.Event()
        threading.Thread(target=_run_fit, args=(trainer, box, done), daemon=True).start()
        try:
            _wait_for_fit(recorder, done, samplers, poll_s=0.5, tick=lambda: _forward(queue))
            _forward(queue)  # the last reports, before the function returns
        except _GracefulStop:  # the sweep's stop, after a checkpoint: the trial rests
            _forward(queue)
            samplers.stop()
            _rest(resting, key)
        finally:
            samplers.stop()
        if "error" in box:
            raise box["error"]
        error = getattr(box.get("result"), "error", None)
        if error is not None:
            raise error

    run_trial.__name__ = getattr(fn, "__name__", "trial")
    return run_trial


def _search(settings):
    if settings.search == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        return OptunaSearch()
    return None  # Tune's BasicVariantGenerator: random samples, and every grid value


def experiment_path(meta: dict[str, Any]) -> str:
    """Where Tune keeps the sweep's experiment state: ``<storage path>/<job id>``."""
    return f"{str(meta['storage_path']).rstrip('/')}/{meta['job_id']}"


def build_tuner(meta: dict[str, Any], fn: Any, space: dict[str, Any], record, resting):
    """The sweep's ``Tuner``: the trial function at :data:`TRIAL_DRIVER_RESOURCES`,
    ``param_space`` the job's config with the search space over it, the settings' trials,
    concurrency, metric and search, and ``record``'s (a
    :class:`~ray_backend.sweep_record.SweepRecord`) scheduler, callback and stopper. For a
    resume, ``Tuner.restore`` of the saved experiment (its pickled hooks find ``record``
    by the sweep's key), when Tune saved one."""
    from ray import tune

    from jupyter_trainfactory.sweeps.space import SweepSettings
    from ray_backend.sweep_hooks import register

    settings = SweepSettings.from_dict(meta["sweep"])
    base = dict(meta.get("config") or {})
    trainable = tune.with_resources(trial_function(meta, fn, resting), TRIAL_DRIVER_RESOURCES)
    path = experiment_path(meta)
    if record.resume and tune.Tuner.can_restore(path):
        register(meta["job_id"], record)
        print(f"trainfactory: sweep resumed from Tune's state at {path}", flush=True)
        return tune.Tuner.restore(
            path,
            trainable,
            resume_unfinished=True,
            resume_errored=True,  # a failed sweep's resume tries its failed trials again
            param_space={**base, **space},
        )
    return tune.Tuner(
        trainable,
        param_space={**base, **space},
        tune_config=tune.TuneConfig(
            metric=settings.metric,
            mode=settings.mode,
            num_samples=settings.trials,
            max_concurrent_trials=settings.concurrent,
            scheduler=record.scheduler(),
            search_alg=_search(settings),
        ),
        run_config=tune.RunConfig(
            name=meta["job_id"],
            storage_path=meta["storage_path"],
            callbacks=[record.callback()],
            stop=record.stopper(),
            verbose=1,
        ),
    )


def _watch_stop(record, resting, done: threading.Event) -> None:
    """Every :data:`STOP_POLL_S` s, check the sweep's budget (over it: a stop, reason
    ``budget``) and read its stop request; once every open trial rests (or the stop's
    grace is over), interrupt Tune (:data:`INTERRUPT`)."""
    while not done.wait(STOP_POLL_S):
        try:
            if record.over_budget(time.time()):
                record.stop_for_budget()
            if not record.poll_stop():
                continue
        except Exception as exc:  # the tracking server away: ask again later
            print(f"trainfactory: reading the stop request: {exc}", flush=True)
            continue
        while not resting.empty():
            record.rest(resting.get())
        if record.at_rest():
            print("trainfactory: every running trial rests at a checkpoint", flush=True)
            os.kill(os.getpid(), INTERRUPT)
            return


def main(argv: list[str] | None = None) -> int:
    """Run the sweep of the payload module ``argv[0]``; returns the exit code."""
    import cloudpickle

    from jupyter_trainfactory.sweeps.space import SPACE_FILE
    from ray_backend.sweep_record import SweepRecord

    argv = sys.argv[1:] if argv is None else argv
    try:
        meta, fn = load_payload(argv[0])
        job_spec(meta)
    except Exception as exc:
        print(f"trainfactory: {exc}", file=sys.stderr, flush=True)
        return 1
    import importlib
    from pathlib import Path

    base = Path(importlib.import_module(argv[0]).__file__).parent
    space = cloudpickle.loads((base / SPACE_FILE).read_bytes())

    import ray

    def _on_signal(signum, frame):
        raise _Stopped(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, _on_signal)
    # Tune's controller checks that each result has the metric and stops the whole
    # search with a traceback; the record says it in one sentence instead.
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    ray.init(logging_level=logging.WARNING, log_to_driver=True)
    from ray.util.queue import Queue

    record = SweepRecord(ray, meta)
    record.start()
    resting = Queue(actor_options={"num_cpus": 0})
    tuner = build_tuner(meta, fn, space, record, resting)
    done = threading.Event()
    threading.Thread(target=_watch_stop, args=(record, resting, done), daemon=True).start()
    error: BaseException | str | None = None
    try:
        tuner.fit()  # in the main thread: Tune's interrupt handler is set only there
    except _Stopped:
        print("trainfactory: sweep stopped", flush=True)
        record.finish("KILLED", "STOPPED", timeout_s=2.0)  # the reconciler closes the rest
        return 130
    except Exception as exc:
        error = exc
    finally:
        done.set()
    error = error or record.error or record.all_failed()
    if error:
        logging.getLogger("trainfactory").error("sweep failed: %s", error)
        record.finish("FAILED", "FAILED", error=str(error))
        return 1
    if record.stop_request is not None:
        record.finish("KILLED", "STOPPED")
        return 0
    record.finish("FINISHED", "SUCCEEDED")
    return 0


if __name__ == "__main__":
    exit_driver(main())
