"""A sweep's MLflow record, kept by its driver: the parent run (state, best value so far,
trial counts, total cost) and one child run per trial (``mlflow.parentRunId``), each
written by the trial's own RunRecorder.

The Tune callback (:meth:`SweepRecord.callback`) opens a trial's child run and starts its
recorder when Tune starts the trial, and closes it when Tune ends it: ``FINISHED`` when
the trial's function returned, ``KILLED`` with reason ``early-stop`` (and the ASHA rung)
when the scheduler stopped it, ``FAILED`` with the error otherwise. A child run is found
again by its trial id before one is created, so a trial is one run however often the
driver restarts.

A stopped sweep rests: each running trial stops at its next checkpoint and its function
waits (:attr:`SweepRecord.rested`); once every open trial rests, the driver interrupts
Tune as Ctrl+C would, so Tune's experiment state keeps them unfinished and
``Tuner.restore`` (``%train resume SWEEP``) runs them again, each restoring its own
checkpoint. A resumed record reads back the counts, costs and best value of earlier
submissions (:meth:`SweepRecord.read_previous`) and reopens a trial's child run.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from typing import Any

from jupyter_trainfactory.chargeback import FAILURE_CATEGORIES

__all__ = [
    "ASHA_MAX_T",
    "SweepRecord",
    "asha_rung",
    "trial_index",
    "trial_key",
]

#: ASHA's ``max_t`` in reports: high enough never to end a trial itself (a trial that
#: reports more often than this would be stopped there, and recorded as early-stopped).
ASHA_MAX_T = 2**20
#: A trial's cost metrics that its sweep's run sums: what ``%train costs`` shows of a
#: sweep (cost, wasted, accelerator-hours, the failures' parts)
SUMMED_COSTS = (
    "cost/usd",
    "cost/wasted_usd",
    "cost/accelerator_hours",
    *(f"cost/{category}_usd" for category in FAILURE_CATEGORIES),
)
#: Ray Train's errors that wrap a worker's: a failed trial's error is then the recorder's
_TRAIN_WRAPPERS = ("TrainingFailedError", "WorkerGroupError", "ControllerError")

_log = logging.getLogger("trainfactory")


def trial_key(job_id: str, index: int) -> str:
    """A trial's name for its RunRecorder and checkpoints: ``tf-1a2b3c4d-t3``."""
    return f"{job_id}-t{index}"


def trial_index(trial_id: str) -> int:
    """Tune's trial id ``3f0a1_00003`` -> 3 (its position in the search)."""
    return int(trial_id.rsplit("_", 1)[-1])


def asha_rung(iteration: int, grace_period: int, reduction_factor: int) -> int:
    """The ASHA milestone (in reports) at which a trial stopped at ``iteration`` was cut:
    the largest ``grace_period * reduction_factor**k`` not above it (Li et al. 2018,
    Algorithm 2: rung k's milestone is r * eta**k); 0 before the first."""
    rung, milestone = 0, grace_period
    while milestone <= iteration:
        rung, milestone = milestone, milestone * reduction_factor
    return rung


class SweepRecord:
    """The parent run of one sweep and its trials' child runs (one per Tune trial)."""

    def __init__(self, ray, meta: dict[str, Any]):
        from jupyter_trainfactory.sweeps.space import SweepSettings
        from jupyter_trainfactory.tracking import client

        self._ray = ray
        self._meta = meta
        self.settings = SweepSettings.from_dict(meta["sweep"])
        self.client = client(meta["tracking_uri"])
        self.parent = meta["run_id"]
        run = self.client.get_run(self.parent)
        self._experiment_id = run.info.experiment_id
        self._parent_name = run.info.run_name
        self._parent_tags = run.data.tags
        self.children: dict[str, str] = {}  # Tune trial id -> child run id
        self._recorders: dict[str, Any] = {}  # Tune trial id -> its RunRecorder (open)
        # "stopped": trials a stop of the sweep ended, unfinished (a resume runs them on)
        self.counts = {"finished": 0, "stopped_early": 0, "failed": 0, "stopped": 0}
        self.trial_costs: dict[str, dict[str, float]] = {}  # trial id -> SUMMED_COSTS' values
        self.best: tuple[float, str] | None = None  # (value, trial id)
        self.error = ""
        self.early_stopped: dict[str, int] = {}  # trial id -> report ASHA stopped it at
        self.stop_request: tuple[str, float] | None = None  # (reason, grace s) once asked
        self.stop_asked_at: float | None = None  # time.monotonic() of the request
        self.rested: set[str] = set()  # keys of trials stopped at a checkpoint, waiting
        self.resume = int(meta.get("resume", 0))
        from ray_backend.driver import job_spec

        self.budget = job_spec(meta).budget  # the whole sweep's (each trial has none)
        self._opened: dict[str, float] = {}  # Tune trial id -> when its run opened (s)
        self._checkpoints: dict[str, list[float]] = {}  # Tune trial id -> report times
        self._results = 0
        self.lock = threading.Lock()

    # -- the parent ------------------------------------------------------------------
    def start(self) -> None:
        from jupyter_trainfactory.tracking import TAG

        s = self.settings
        self.client.set_tag(self.parent, TAG.STATE, "RUNNING")
        self.client.set_tag(
            self.parent,
            TAG.REASON,
            f"searching: {s.total_trials} trials, {s.concurrent} at a time, {s.metric} {s.mode}",
        )
        self.client.set_tag(self.parent, TAG.STARTED, f"{time.time():.3f}")
        if self.resume:
            self.read_previous()

    def read_previous(self) -> None:
        """A resumed sweep's counts, trial costs and best value so far, as the earlier
        submissions left them on the parent run and its children."""
        from jupyter_trainfactory.runreads import sweep_children
        from jupyter_trainfactory.tracking import TAG

        parent = self.client.get_run(self.parent)
        metrics = parent.data.metrics
        for name in ("finished", "stopped_early", "failed"):  # the stopped ones go on
            self.counts[name] = int(metrics.get(f"sweep/trials_{name}", 0))
        by_index = {}
        for child in sweep_children(self.client, parent):
            trial_id = child.data.tags.get(TAG.TRIAL, "")
            self.children[trial_id] = child.info.run_id
            by_index[child.data.tags.get(TAG.TRIAL_INDEX)] = trial_id
            self._keep_cost(trial_id, child.data.metrics)
        best = json.loads(parent.data.tags.get(TAG.SWEEP_BEST) or "null")
        if best and str(best.get("trial")) in by_index:
            self.best = (float(best["value"]), by_index[str(best["trial"])])

    def _log_parent(self, values: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, step) for k, v in values.items()]
        self.client.log_batch(self.parent, metrics=metrics)

    def _log_counts(self) -> None:
        running = len(self._recorders)
        values = {f"sweep/trials_{k}": v for k, v in self.counts.items()}
        values["sweep/trials_running"] = running
        for key in SUMMED_COSTS:
            values[key] = sum(parts.get(key, 0.0) for parts in self.trial_costs.values())
        self._log_parent(values, sum(self.counts.values()))

    def finish(self, status: str, state: str, error: str = "", timeout_s: float = 60.0) -> None:
        """Close the trials still open (``KILLED``, or ``FAILED`` with the sweep's error:
        the sweep ended under them; their
        recorders flush side by side for ``timeout_s`` s at most: Ray kills a stopped
        job's driver soon after), then the parent run with ``status`` (MLflow) and
        ``state`` (the job's)."""
        from jupyter_trainfactory.tracking import TAG

        with self.lock:
            left, self._recorders = self._recorders, {}
        # a failed sweep fails the trials it ends (with its error); a stopped one stops them
        close = ("FAILED", "FAILED", error) if status == "FAILED" else ("KILLED", "STOPPED", "")
        refs = [
            r.finish.remote(close[0], close[1], error=close[2], reason=None, timeout_s=timeout_s)
            for r in left.values()
        ]
        if refs:
            self._ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for trial_id in left:  # their last cost counts in the sweep's
            self._read_cost(trial_id)
            self._read_best(trial_id)
        self._log_counts()
        reason = "" if state == "SUCCEEDED" else state.lower()
        if state == "SUCCEEDED" and self.best is not None:  # what status shows of it
            index = trial_index(self.best[1])
            reason = f"best {self.settings.metric} {self.best[0]:.4g} (trial {index})"
        if state == "STOPPED" and self.stop_request is not None:
            reason = self.stop_request[0]  # user, user-now, budget
        tags = {TAG.STATE: state, TAG.REASON: reason}
        if error:
            tags[TAG.ERROR] = error[:4000]
        for key, value in tags.items():
            self.client.set_tag(self.parent, key, value)
        self.client.set_terminated(self.parent, status)
        print(
            f"trainfactory: sweep {state.lower()}: {self.counts['finished']} trials finished,"
            f" {self.counts['stopped_early']} stopped early, {self.counts['failed']} failed",
            flush=True,
        )

    def poll_stop(self) -> bool:
        """Read the parent run's stop request (``%train stop SWEEP``); once there is one,
        pass it to every running trial's recorder (each stops after its next checkpoint,
        or its grace period) and start no more trials (:class:`SweepStopper`). Returns
        whether the sweep is stopping."""
        from jupyter_trainfactory.tracking import TAG

        if self.stop_request is None:
            tags = self.client.get_run(self.parent).data.tags
            if not tags.get(TAG.STOP):
                return False
            grace = float(tags.get(TAG.STOP_GRACE) or 300.0)
            self.stop_request = (tags[TAG.STOP], grace)
            self.stop_asked_at = time.monotonic()
            print(f"trainfactory: sweep stop requested ({tags[TAG.STOP]})", flush=True)
        reason, grace = self.stop_request
        with self.lock:
            recorders = list(self._recorders.values())
        for recorder in recorders:  # again for trials started since: asking twice is a no-op
            recorder.request_stop.remote(reason, grace)
        return True

    def over_budget(self, now: float) -> bool:
        """Whether the sweep's ``--budget`` would pass before a stop asked now ends: the
        ended trials' cost plus, per running trial, its cost at the checkpoint after its
        next (:func:`ray_backend.costs.projected_spend`, at the rate its run reports).
        Reads each running trial's run; False without a budget or once stopping."""
        from ray_backend.costs import projected_spend

        if not self.budget or self.stop_request is not None:
            return False
        with self.lock:
            running = {t: self.children.get(t) for t in self._recorders}
            closed = sum(v for t, v in self.costs.items() if t not in running)
            times = {t: [self._opened.get(t, now), *self._checkpoints.get(t, [])] for t in running}
        total = closed
        for trial_id, run_id in running.items():
            metrics = self.client.get_run(run_id).data.metrics if run_id else {}
            total += projected_spend(
                metrics.get("cost/usd", 0.0),
                metrics.get("cost/rate_per_h", 0.0),
                times[trial_id],
                now,
            )
        return total > self.budget

    def stop_for_budget(self) -> None:
        """Ask the sweep to stop (reason ``budget``) as ``%train stop`` does: through the
        parent run, read back by :meth:`poll_stop`."""
        from jupyter_trainfactory.tracking import TAG

        print(
            f"trainfactory: the sweep's budget {self.budget:g} would be passed before its"
            f" trials' next checkpoints ({sum(self.costs.values()):.4f} spent by ended trials);"
            " stopping at them",
            flush=True,
        )
        self.client.set_tag(self.parent, TAG.STOP, "budget")
        self.client.set_tag(self.parent, TAG.STOP_GRACE, "300")

    def rest(self, key: str) -> None:
        """Trial ``key`` stopped at a checkpoint and waits for the sweep to end: close its
        run now (``KILLED``, ``STOPPED`` with the stop's reason), so that its cost ends
        with its workers, not when Tune's loop has wound down."""
        with self.lock:
            self.rested.add(key)
            job = self._meta["job_id"]
            for trial_id in [t for t in self._recorders if trial_key(job, trial_index(t)) == key]:
                self._close(trial_id, "KILLED", "STOPPED", reason=None, error="")

    def at_rest(self) -> bool:
        """Whether the stopping sweep can end now: every open trial rests at a
        checkpoint, or the stop's grace period is over."""
        if self.stop_request is None:
            return False
        with self.lock:
            open_keys = {trial_key(self._meta["job_id"], trial_index(t)) for t in self._recorders}
        waited = time.monotonic() - (self.stop_asked_at or time.monotonic())
        return open_keys <= self.rested or waited > self.stop_request[1]

    # -- the trials ------------------------------------------------------------------
    def _trial_meta(self, key: str, run_id: str, config: dict) -> dict[str, Any]:
        spec = {**self._meta["spec"], "budget": None}  # the budget is the sweep's
        return {**self._meta, "job_id": key, "run_id": run_id, "config": config, "spec": spec}

    def _find_child(self, trial_id: str) -> str | None:
        from jupyter_trainfactory.tracking import TAG

        runs = self.client.search_runs(
            [self._experiment_id],
            filter_string=(
                f"tags.`{TAG.SWEEP_JOB}` = '{self._meta['job_id']}'"
                f" and tags.`{TAG.TRIAL}` = '{trial_id}'"
            ),
            max_results=1,
        )
        return runs[0].info.run_id if runs else None

    def _child_tags(self, trial_id: str, index: int) -> dict[str, str]:
        from jupyter_trainfactory.jobstate import JobState
        from jupyter_trainfactory.tracking import TAG

        keep = (TAG.OWNER, TAG.FUNCTION, TAG.WORKERS, TAG.SUBMISSION, TAG.DASHBOARD, TAG.SOURCE)
        tags = {k: v for k, v in self._parent_tags.items() if k in keep}
        tags.update(
            {k: v for k, v in self._parent_tags.items() if k.startswith("trainfactory.code.")}
        )
        tags.update(
            {
                "mlflow.parentRunId": self.parent,
                "mlflow.user": self._parent_tags.get("mlflow.user", ""),
                TAG.SWEEP_JOB: self._meta["job_id"],
                TAG.TRIAL: trial_id,
                TAG.TRIAL_INDEX: str(index),
                TAG.STATE: JobState.PENDING.value,
                TAG.REASON: "starting the trial",
            }
        )
        return tags

    def open_trial(self, trial) -> None:
        """The trial's child run (found again, or created with the trial's params) and its
        RunRecorder, named by :func:`trial_key` for the trial's function to find."""
        from jupyter_trainfactory.tracking import log_params, prepare_params
        from ray_backend.driver import _start_recorder, job_spec

        trial_id = trial.trial_id
        if trial_id in self._recorders:
            return
        index = trial_index(trial_id)
        key = trial_key(self._meta["job_id"], index)
        config = dict(trial.config)
        run_id = self._find_child(trial_id)
        fresh = run_id is None
        resume = 0
        if fresh:
            run = self.client.create_run(
                self._experiment_id,
                run_name=f"{self._parent_name}-trial-{index}",
                tags=self._child_tags(trial_id, index),
            )
            run_id = run.info.run_id
        else:
            resume = self._reopen(key, run_id)
        meta = {**self._trial_meta(key, run_id, config), "resume": resume}
        spec = job_spec(meta)
        if fresh:
            log_params(self.client, run_id, prepare_params(spec.params()).params)
        self.children[trial_id] = run_id
        self._opened[trial_id] = time.time()
        recorder = _start_recorder(self._ray, meta, spec)
        self._recorders[trial_id] = recorder
        if self.stop_request is not None:  # started while the sweep stops: it rests at once
            recorder.request_stop.remote(*self.stop_request)
        self._log_counts()

    def _reopen(self, key: str, run_id: str) -> int:
        """Reopen a trial's child run that an earlier submission closed (a resumed
        sweep: a stopped trial, or a failed one, which leaves the failed count); returns
        the trial's resume count (0: the run is still open)."""
        from jupyter_trainfactory.fleet.records import planned_stops
        from jupyter_trainfactory.submission import reopen_tags
        from jupyter_trainfactory.tracking import TAG, write_tags

        run = self.client.get_run(run_id)
        if run.info.status == "RUNNING":
            return 0
        if run.info.status == "FAILED":  # a failed sweep's resume tries its failed trials again
            self.counts["failed"] = max(self.counts["failed"] - 1, 0)
        count = int(run.data.tags.get(TAG.RESUMES) or 0) + 1
        stops = planned_stops(run.info.status, run.data.tags)  # the reopen hides a stop
        _, tags = reopen_tags(key, count, {}, time.time(), stops)
        write_tags(self.client, run_id, tags)  # an empty value deletes a stale tag
        self.client.update_run(run_id, status="RUNNING")
        return count

    def result(self, trial, result: dict[str, Any]) -> None:
        """A trial's report: the best value so far on the parent; a report without the
        sweep's metric ends the search with one sentence (:attr:`error`)."""
        metric = self.settings.metric
        if metric not in result:
            from ray.tune.result import AUTO_RESULT_KEYS

            # Tune's own keys, and ReportsToTune's checkpoint_path
            tune_keys = {*AUTO_RESULT_KEYS, "done", "trial_id", "experiment_tag", "checkpoint_path"}
            reported = sorted(k for k in result if k not in tune_keys)
            self.error = (
                f"The function's reports have no {metric!r}; --metric must be one of the"
                f" keys it reports ({', '.join(reported[:12])})."
            )
            return
        if "checkpoint_path" in result:  # ReportsToTune: a report with a checkpoint
            self._checkpoints.setdefault(trial.trial_id, []).append(time.time())
        self._results += 1
        self._offer_best(float(result[metric]), trial.trial_id, result.get("training_iteration"))

    def _offer_best(self, value: float, trial_id: str, iteration: int | None) -> None:
        """``value`` of the sweep's metric from trial ``trial_id`` (at report or step
        ``iteration``): the parent's ``sweep/best`` and ``trainfactory.sweep.best`` when
        it beats the best so far (``mode``); NaN and inf never do."""
        from jupyter_trainfactory.tracking import TAG

        if not math.isfinite(value):
            return
        mode = self.settings.mode
        if self.best is not None and not (
            value < self.best[0] if mode == "min" else value > self.best[0]
        ):
            return
        self.best = (value, trial_id)
        self._log_parent({"sweep/best": value}, self._results)
        best = {
            "trial": trial_index(trial_id),
            "run_id": self.children.get(trial_id, ""),
            "value": value,
            "iteration": iteration,
        }
        self.client.set_tag(self.parent, TAG.SWEEP_BEST, json.dumps(best))

    def _read_best(self, trial_id: str) -> None:
        """The best of the metric as the trial's run holds it (a function that logs it
        with ``trainfactory.log`` and reports nothing to Tune: the leaderboard's best),
        offered to the parent (:meth:`_offer_best`, with the step as ``iteration``)."""
        run_id = self.children.get(trial_id)
        if not run_id:
            return
        try:
            history = self.client.get_metric_history(run_id, self.settings.metric)
        except Exception as exc:  # the tracking server away: the Tune reports' best stays
            _log.warning(
                "trial %s: its best %s was not read: %s", trial_id, self.settings.metric, exc
            )
            return
        finite = [m for m in history if math.isfinite(m.value)]
        if finite:
            sign = 1 if self.settings.mode == "min" else -1
            best = min(finite, key=lambda m: (sign * m.value, m.step))  # the first such step
            self._offer_best(best.value, trial_id, best.step)

    def complete(self, trial) -> None:
        """Tune ended the trial without an error: its function returned (``done``:
        ``FINISHED``), or the scheduler stopped it early."""
        from jupyter_trainfactory.tracking import TAG

        last = trial.last_result or {}
        if self.error:  # the search ended on a bad report: the trial did not finish
            self._close(trial.trial_id, "FAILED", "FAILED", reason="", error=self.error)
            return
        # a trial the sweep's stop reaches rests (closed by rest()); one whose function
        # returned ran to its end, even if a stop came during its last steps
        if trial.trial_id not in self.early_stopped:
            self._close(trial.trial_id, "FINISHED", "SUCCEEDED", reason="", error="")
            return
        s = self.settings
        iteration = self.early_stopped[trial.trial_id]
        rung = asha_rung(iteration, s.grace_period, s.reduction_factor)
        run_id = self.children.get(trial.trial_id)
        if run_id:
            detail = {"iteration": iteration, "rung": rung, s.metric: last.get(s.metric)}
            self.client.set_tag(run_id, TAG.EARLY_STOP, json.dumps(detail))
        self._close(trial.trial_id, "KILLED", "STOPPED", reason="early-stop", error="")

    def failed(self, trial) -> None:
        """Tune ended the trial on an error. A training failure's own error (the rank's
        ``KeyError: 'lr'``) is the trial recorder's: Tune holds only Ray Train's wrapper
        of it, or nothing when its error file is not written yet, and then the recorder
        names it (``RunRecorder.finish``)."""
        error = ""
        try:
            exc = trial.get_pickled_error()
            if exc is not None and type(exc).__name__ not in _TRAIN_WRAPPERS:
                error = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        except Exception:  # the error file may be gone: the recorder has the failure
            pass
        self._close(trial.trial_id, "FAILED", "FAILED", reason="", error=error)

    def all_failed(self) -> str | None:
        """One sentence when every trial that ended failed (none finished or was stopped
        early; the sweep then failed, its first trial's error quoted), else None."""
        c = self.counts
        if c["failed"] == 0 or c["finished"] or c["stopped_early"] or c["stopped"]:
            return None
        from jupyter_trainfactory.tracking import TAG

        first = ""
        for run_id in self.children.values():
            try:
                first = self.client.get_run(run_id).data.tags.get(TAG.ERROR, "")
            except Exception:  # the sentence goes without it
                first = ""
            if first:
                break
        quoted = f"; the first: {first}" if first else ""
        return f"every trial failed ({c['failed']} of {c['failed']}){quoted}"

    def _close(
        self, trial_id: str, status: str, state: str, reason: str | None, error: str
    ) -> None:
        recorder = self._recorders.pop(trial_id, None)
        if recorder is None:
            return
        key = {"FINISHED": "finished", "FAILED": "failed"}.get(status, "stopped_early")
        if reason == "early-stop" or status != "KILLED":
            self.counts[key] += 1
        elif reason is None:
            self.counts["stopped"] += 1
        try:
            self._ray.get(
                recorder.finish.remote(status, state, error=error, reason=reason), timeout=330
            )
        except Exception as exc:  # the run stays as the recorder left it
            _log.warning("trial %s: closing its run failed: %s", trial_id, exc)
        finally:
            self._ray.kill(recorder)
        self._read_cost(trial_id)
        self._read_best(trial_id)
        self._log_counts()

    def _read_cost(self, trial_id: str) -> None:
        run_id = self.children.get(trial_id)
        if not run_id:
            return
        try:
            metrics = self.client.get_run(run_id).data.metrics
        except Exception as exc:  # the tracking server away: the total misses this trial
            _log.warning("trial %s: its cost was not read: %s", trial_id, exc)
            return
        self._keep_cost(trial_id, metrics)

    @property
    def costs(self) -> dict[str, float]:
        """Each trial's cost (USD) as last read from its run."""
        return {t: p["cost/usd"] for t, p in self.trial_costs.items() if "cost/usd" in p}

    def _keep_cost(self, trial_id: str, metrics: dict[str, float]) -> None:
        """A trial's cost and its parts (``SUMMED_COSTS``) from its run's metrics."""
        parts = {k: metrics[k] for k in SUMMED_COSTS if k in metrics}
        if parts:
            self.trial_costs[trial_id] = parts

    # -- Tune's hooks ----------------------------------------------------------------
    def callback(self):
        """A ``ray.tune.Callback`` that calls this record (errors logged, never raised:
        bookkeeping must not end the search). Tune pickles its run config, so the
        callback holds the record's key (:mod:`ray_backend.sweep_hooks`), not the record."""
        from ray_backend.sweep_hooks import SweepCallback, register

        return SweepCallback(register(self._meta["job_id"], self))

    def scheduler(self):
        """The sweep's Tune scheduler: :class:`RecordingASHA` on ``training_iteration``
        (one per ``ray.train.report``), or FIFO."""
        from ray.tune.schedulers import FIFOScheduler

        from ray_backend.sweep_hooks import RecordingASHA, register

        s = self.settings
        if s.scheduler == "fifo":
            return FIFOScheduler()
        return RecordingASHA(
            register(self._meta["job_id"], self),
            time_attr="training_iteration",
            max_t=ASHA_MAX_T,
            grace_period=s.grace_period,
            reduction_factor=s.reduction_factor,
        )

    def stopper(self):
        """A ``ray.tune.Stopper`` that ends the whole search once :attr:`error` is set."""
        from ray_backend.sweep_hooks import SweepStopper, register

        return SweepStopper(register(self._meta["job_id"], self))
