"""Hyperparameter sweeps: Ray Tune over a training function, each trial a Ray Train job
recorded as an MLflow child run of the sweep's run (``%train sweep``, ``trainfactory.sweep``)."""

from .space import SweepSettings, parse_space
from .submit import submit_sweep

__all__ = ["SweepSettings", "parse_space", "submit_sweep"]
