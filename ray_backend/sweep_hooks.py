"""Ray Tune's hooks of a sweep (callback, scheduler, stopper), each handing what Tune
tells it to the driver's :class:`~ray_backend.sweep_record.SweepRecord`.

Tune pickles its run config and scheduler with the experiment's state, so each hook holds
its sweep's key and finds the record in :data:`_RECORDS` (a record holds locks and
clients, which do not pickle)."""

from __future__ import annotations

import logging
from typing import Any

from ray import tune
from ray.tune.schedulers import ASHAScheduler

__all__ = ["RecordingASHA", "SweepCallback", "SweepStopper", "register"]

_log = logging.getLogger("trainfactory")

#: The driver's SweepRecord by sweep job id (the hooks' way back to it).
_RECORDS: dict[str, Any] = {}


def register(key: str, record) -> str:
    """Make ``record`` the one the hooks of sweep ``key`` call; returns ``key``."""
    _RECORDS[key] = record
    return key


def _guarded(key: str, name: str, *args) -> None:
    record = _RECORDS.get(key)
    if record is None:
        return
    with record.lock:
        try:
            getattr(record, name)(*args)
        except Exception:
            _log.exception("sweep record: %s", name)


class SweepCallback(tune.Callback):
    """Tune's hooks, handed to the sweep's SweepRecord (found by key in :data:`_RECORDS`)."""

    def __init__(self, key: str):
        self.key = key

    def on_trial_start(self, iteration, trials, trial, **info):
        _guarded(self.key, "open_trial", trial)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        _guarded(self.key, "result", trial, result)

    def on_trial_complete(self, iteration, trials, trial, **info):
        _guarded(self.key, "complete", trial)

    def on_trial_error(self, iteration, trials, trial, **info):
        _guarded(self.key, "failed", trial)


class RecordingASHA(ASHAScheduler):
    """Ray Tune's ASHA that tells the sweep's record which trials it stopped and at which
    report (Tune marks a stopped trial's last result ``done`` as a finished one's)."""

    def __init__(self, key: str, **kwargs):
        super().__init__(**kwargs)
        self.key = key

    def on_trial_result(self, tune_controller, trial, result):
        decision = super().on_trial_result(tune_controller, trial, result)
        record = _RECORDS.get(self.key)
        if decision == self.STOP and record is not None:
            record.early_stopped[trial.trial_id] = int(result.get("training_iteration") or 0)
        return decision


class SweepStopper(tune.Stopper):
    """Ends the whole search once the sweep's record has an :attr:`SweepRecord.error`
    (a stop request does not: Tune would mark the running trials finished; the driver
    interrupts Tune instead, so that a resume continues them)."""

    def __init__(self, key: str):
        self.key = key

    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        record = _RECORDS.get(self.key)
        return bool(record is not None and record.error)
