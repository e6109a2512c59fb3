"""A job with any config runs and gets it unchanged, and MLflow records what fits of it
(the limits themselves are unit-tested in tests/unit/test_params.py)."""

import json
import pickle

import numpy as np
import pytest
import torch

from jupyter_trainfactory import tracking
from jupyter_trainfactory.tracking import TAG

LONG_A = "k" * 299 + "a"  # 300 characters: over MLflow's limit for a param key


@pytest.mark.job
@pytest.mark.timeout(240)
def test_a_job_with_any_config_runs_and_gets_it_unchanged(manager, mlflow_client, tmp_path):
    import cloudpickle
    import train_fns

    from jupyter_trainfactory import launch

    cloudpickle.register_pickle_by_value(train_fns)
    config = {
        "timing(s)/gen": 1.5,
        "timing_s_/gen": 2.5,
        LONG_A: "long key",
        7: "int key",
        (1, 2): "tuple key",
        "big": "x" * 100_000,
        "array": np.arange(12.0).reshape(3, 4),
        "tensor": torch.arange(6).reshape(2, 3),
        "many": {f"p{i}": i for i in range(10_000)},
        "out": str(tmp_path / "received.pkl"),
    }
    job = launch(train_fns.config_loop, workers=1, config=config, experiment="tests")
    try:
        assert job.wait(timeout=200) == "SUCCEEDED"
    finally:
        if job.status() not in ("SUCCEEDED", "FAILED", "STOPPED"):
            job.stop(now=True)
    got = pickle.loads((tmp_path / "received.pkl").read_bytes())
    assert list(got) == list(config)
    assert np.array_equal(got.pop("array"), config["array"])
    assert torch.equal(got.pop("tensor"), config["tensor"])
    assert got == {k: v for k, v in config.items() if k not in ("array", "tensor")}

    run = mlflow_client.get_run(job.run_id)
    params, tags = run.data.params, run.data.tags
    assert params["config.timing_s_/gen"] == "1.5" and params["config.timing_s_/gen_"] == "2.5"
    assert params["config.7"] == "int key" and params["config._1_ 2_"] == "tuple key"
    assert (
        params["config.big"].startswith("x" * 5000) and "100,000 characters" in params["config.big"]
    )
    assert params["config.array"].startswith("<numpy.ndarray shape=(3, 4) dtype=float64")
    assert len(params) == tracking.MAX_PARAMS
    renamed = json.loads(tags[TAG.RENAMED_PARAMS])
    assert renamed["config.timing(s)/gen"] == "config.timing_s_/gen"
    assert len(renamed[f"config.{LONG_A}"]) == 250
    assert tags[TAG.PARAMS_OMITTED].startswith("9")
    exp = mlflow_client.get_experiment(run.info.experiment_id)
    assert exp.tags[tracking.EXPERIMENT_KIND_TAG] == "custom_model_development"
