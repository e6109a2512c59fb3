"""Choosing a checkpoint to register (pure) and refusing bad register arguments."""

import os

import pytest

from jupyter_trainfactory.models import CheckpointModel, pick
from jupyter_trainfactory.spec import SpecError


def ckpt(step, acc=None, exists=True):
    metrics = {"val_accuracy": acc} if acc is not None else {}
    return CheckpointModel(f"m-{step}", step, f"/ckpt/{step}", float(step), metrics, exists)


def test_latest_is_the_newest_kept():
    items = [ckpt(1), ckpt(2), ckpt(3, exists=False)]
    assert pick(items).step == 2


def test_best_by_metric_and_mode():
    items = [ckpt(1, 0.5), ckpt(2, 0.9), ckpt(3, 0.7), ckpt(4, 0.95, exists=False)]
    assert pick(items, "best", "val_accuracy", "max").step == 2  # 4 is gone from storage
    assert pick(items, "best", "val_accuracy", "min").step == 1
    assert pick([ckpt(1, 0.9), ckpt(2, 0.9)], "best", "val_accuracy", "max").step == 2


def test_bad_choices_say_what_to_do():
    with pytest.raises(SpecError, match="no checkpoint in storage to register .all were del"):
        pick([ckpt(1, exists=False)])
    with pytest.raises(SpecError, match="none was reported"):
        pick([])
    with pytest.raises(SpecError, match="needs --metric"):
        pick([ckpt(1, 0.5)], "best")
    with pytest.raises(SpecError, match="needs --mode max or min .is a higher loss better"):
        pick([ckpt(1, 0.5)], "best", "loss")
    with pytest.raises(SpecError, match="use them with --checkpoint best"):
        pick([ckpt(1, 0.5)], "latest", "val_accuracy")
    with pytest.raises(SpecError, match="reported with them: val_accuracy"):
        pick([ckpt(1, 0.5)], "best", "loss", "min")
    with pytest.raises(SpecError, match="latest or best"):
        pick([ckpt(1)], "first")
    with pytest.raises(SpecError, match="max or min"):
        pick([ckpt(1, 0.5)], "best", "val_accuracy", "up")
    with pytest.raises(SpecError, match="is a higher val_accuracy better"):
        pick([ckpt(1, 0.5)], "best", "val_accuracy")


def test_registering_leaves_the_processs_mlflow_uri_as_it_was(monkeypatch, tmp_path):
    # restoring get_tracking_uri()'s default once set MLFLOW_TRACKING_URI to the cwd's
    # mlflow.db for the rest of the process: the panel then read jobs from there
    import mlflow

    from jupyter_trainfactory.models import _mlflow_at

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(None)
    with _mlflow_at(f"sqlite:///{tmp_path}/a.db"):
        assert mlflow.get_tracking_uri() == f"sqlite:///{tmp_path}/a.db"
    assert "MLFLOW_TRACKING_URI" not in os.environ
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mine:5000")  # the user's own
    with _mlflow_at(f"sqlite:///{tmp_path}/a.db"):
        pass
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://mine:5000"
    assert mlflow.get_tracking_uri() == "http://mine:5000"
