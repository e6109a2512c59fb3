"""A sweep's search space text, settings and sizing: pure, no cluster."""

from __future__ import annotations

import pytest
from ray import tune
from ray.tune.search.sample import Categorical, Float, Integer

from jupyter_trainfactory.spec_values import SpecError
from jupyter_trainfactory.sweeps.space import (
    SweepSettings,
    domain_text,
    parse_param,
    parse_space,
)
from jupyter_trainfactory.sweeps.submit import trials_that_fit
from ray_backend.sweep_record import asha_rung, trial_index, trial_key


def test_text_becomes_tunes_own_domains():
    name, lr = parse_param("lr=loguniform(1e-4,1e-1)")
    assert name == "lr" and isinstance(lr, Float)
    assert (lr.lower, lr.upper) == (1e-4, 1e-1)
    _, hidden = parse_param("hidden = tune.choice(32, 64, 128)")
    assert isinstance(hidden, Categorical) and hidden.categories == [32, 64, 128]
    _, same = parse_param("hidden=choice([32, 64])")
    assert same.categories == [32, 64]
    assert parse_param("seed=grid(1,2,3)")[1] == {"grid_search": [1, 2, 3]}
    assert isinstance(parse_param("layers=randint(1,4)")[1], Integer)
    assert isinstance(parse_param("act=choice('relu','gelu')")[1], Categorical)


def test_objects_and_text_mix_and_read_back():
    space = parse_space({"lr": tune.loguniform(1e-3, 1e-1), "hidden": "choice(32,64)"})
    assert set(space) == {"lr", "hidden"}
    assert domain_text(space["lr"]) == "loguniform(0.001, 0.1)"
    assert domain_text(space["hidden"]) == "choice([32, 64])"
    assert domain_text(parse_param("x=uniform(0,1)")[1]) == "uniform(0, 1)"
    assert domain_text(parse_param("x=quniform(0,1,0.25)")[1]) == "quniform(0, 1, 0.25)"
    assert domain_text(parse_param("s=grid(1,2)")[1]) == "grid([1, 2])"
    assert parse_space(["lr=uniform(0,1)", "b=choice(1,2)"]).keys() == {"lr", "b"}


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("lr", "must be NAME=FUNCTION"),
        ("lr=0.1", "choice(0.1)"),
        ("lr=loguniform(1e-4", "is not a search space"),
        ("lr=exp(1)", "exp() is not one of"),
        ("lr=uniform(1)", "uniform() takes 2 arguments, got 1"),
        ("lr=uniform(a, 1)", "must be numbers or strings"),
        ("lr=loguniform(0, 1)", "Ray Tune refuses it"),
        ("lr=__import__('os').system('x')", "is not one of"),
    ],
)
def test_bad_text_gets_one_sentence(item, says):
    with pytest.raises(SpecError) as err:
        parse_param(item)
    assert says in str(err.value)
    assert "\n" not in str(err.value)


def test_a_space_needs_entries_and_known_values():
    with pytest.raises(SpecError, match="at least one --param"):
        parse_space([])
    with pytest.raises(SpecError, match="given twice"):
        parse_space(["lr=uniform(0,1)", "lr=uniform(0,2)"])
    with pytest.raises(SpecError, match="is a list"):
        parse_space({"lr": [1, 2]})


def test_settings_checked_and_recorded_as_params():
    settings = SweepSettings(metric="val_loss", trials=4, concurrent=2)
    settings.space_text = {"lr": "loguniform(0.0001, 0.1)"}
    settings.validate()
    params = settings.params()
    assert params["sweep.metric"] == "val_loss"
    assert params["sweep.trials"] == "4"
    assert params["sweep.space.lr"] == "loguniform(0.0001, 0.1)"
    assert SweepSettings.from_dict(settings.to_dict()) == settings
    bad = [
        (dict(metric=""), "needs --metric"),
        (dict(metric="m", mode="up"), "--mode 'up'"),
        (dict(metric="m", trials=0), "--trials must be"),
        (dict(metric="m", concurrent=1.5), "--concurrent must be"),
        (dict(metric="m", scheduler="pbt"), "--scheduler 'pbt'"),
        (dict(metric="m", search="bohb"), "--search 'bohb'"),
        (dict(metric="m", reduction_factor=1), "--reduction-factor must be at least 2"),
    ]
    for values, says in bad:
        with pytest.raises(SpecError) as err:
            SweepSettings(**values).validate()
        assert says in str(err.value)


def test_asha_rungs_and_trial_names():
    # Li et al. 2018: rung k's milestone is r * eta**k
    assert [asha_rung(i, 1, 2) for i in (0, 1, 2, 3, 4, 7, 8)] == [0, 1, 2, 2, 4, 4, 8]
    assert asha_rung(10, 3, 3) == 9
    assert trial_index("3f0a1_00003") == 3
    assert trial_key("tf-1a2b3c4d", 3) == "tf-1a2b3c4d-t3"


def test_concurrency_is_what_the_idle_cluster_holds():
    assert trials_that_fit({"a": 2}, workers=1) == 2
    assert trials_that_fit({"a": 2, "b": 1}, workers=2) == 1
    assert trials_that_fit({"a": 1}, workers=2) == 0


def test_grid_combinations_multiply_the_trials():
    from jupyter_trainfactory.sweeps.space import grid_size

    space = parse_space(["a=grid(1,2,3)", "b=grid(4,5)", "c=uniform(0,1)"])
    assert grid_size(space) == 6
    settings = SweepSettings(metric="m", trials=2, grid_size=grid_size(space))
    assert settings.total_trials == 12 and settings.params()["sweep.total_trials"] == "12"
