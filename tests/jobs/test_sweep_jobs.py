"""Real sweeps on the embedded cluster (Ray Tune + Ray Train V2, 1 CPU worker per trial,
2 trials at a time): the MLflow record (one parent, one child per trial, each step once),
ASHA's early stops, a stop of the whole sweep, and the input refused before anything is
submitted."""

from __future__ import annotations

import json

import pytest
from conftest import ipython_shell
from IPython.core.error import UsageError
from train_fns import linear_model, sweep_loop

from jupyter_trainfactory.runreads import sweep_children
from jupyter_trainfactory.sweeps.widget import SweepBoard
from jupyter_trainfactory.tracking import TAG

pytestmark = pytest.mark.job


@pytest.fixture(scope="module")
def shell(manager):
    ip = ipython_shell()
    ip.run_line_magic("load_ext", "jupyter_trainfactory")
    ip.user_ns.update(sweep_loop=sweep_loop, linear_model=linear_model, steps_30={"steps": 30})
    ip.user_ns["long_checkpointed"] = {"steps": 100, "sleep": 0.2, "checkpoint": True}
    return ip


def _children(client, job):
    return sweep_children(client, client.get_run(job.run_id))


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("--param lr=exp(1) --metric val_loss", "exp() is not one of"),
        ("--param lr=grid(0.1,0.2)", "needs --metric"),
        ("--metric val_loss", "at least one --param"),
        ("--param lr=grid(0.1,0.2) --metric val_loss --workers 9", "but 9 were asked for"),
        ("--param lr=grid(0.1) --metric val_loss --scheduler pbt", "--scheduler 'pbt'"),
    ],
)
def test_bad_sweeps_get_one_sentence_and_submit_nothing(shell, manager, line, says):
    before = len(manager.list(all_users=True))
    with pytest.raises(UsageError) as err:
        shell.run_line_magic("train", f"sweep sweep_loop {line}")
    assert says in str(err.value), str(err.value)
    assert "\n" not in str(err.value).strip()
    assert len(manager.list(all_users=True)) == before


@pytest.mark.timeout(420)
def test_a_sweep_is_one_parent_run_with_a_child_per_trial_and_asha_stops(shell, mlflow_client):
    job = shell.run_line_magic(
        "train",
        "sweep sweep_loop --param lr=grid(0.01,0.01,1.0,1.0) --trials 1 --concurrent 2"
        " --metric val_loss --workers 1 --config steps_30 --wait",
    )
    assert job.status() == "SUCCEEDED", job.logs(tail=60)
    parent = mlflow_client.get_run(job.run_id)
    children = _children(mlflow_client, job)
    assert len(children) == 4  # 1 + 4 runs: the grid's four values, one sample each
    assert all(c.data.tags["mlflow.parentRunId"] == job.run_id for c in children)
    by_lr = sorted(children, key=lambda c: (float(c.data.params["config.lr"]), c.info.run_id))
    good, bad = by_lr[:2], by_lr[2:]
    for child in good:  # ran to the end: every report once
        assert child.info.status == "FINISHED"
        steps = [m.step for m in mlflow_client.get_metric_history(child.info.run_id, "val_loss")]
        assert sorted(steps) == list(range(30)), steps
    for child in bad:  # worse at the first rung than the good trials: stopped there
        assert child.info.status == "KILLED", child.data.tags
        assert child.data.tags[TAG.REASON] == "early-stop"
        stop = json.loads(child.data.tags[TAG.EARLY_STOP])
        assert stop["rung"] == 1 and stop["iteration"] >= 1
        steps = [m.step for m in mlflow_client.get_metric_history(child.info.run_id, "val_loss")]
        # cut short: its reports reach Tune within half a second, 0.3 s apart
        assert len(steps) == len(set(steps)) and len(steps) < 30, steps
    metrics = parent.data.metrics
    assert metrics["sweep/trials_finished"] == 2 and metrics["sweep/trials_stopped_early"] == 2
    assert metrics["sweep/best"] == pytest.approx(0.1 + 1 / 30)
    assert metrics["cost/usd"] > 0
    # the sweep's run counts Tune's results, no training step: status shows none
    assert job.info().step is None and job.info().as_row()["step"] == "-"
    assert job.info().as_row()["detail"].startswith("best val_loss 0.1333 (trial ")
    assert parent.data.params["config.lr"] == "swept: grid([0.01, 0.01, 1.0, 1.0])"
    for key in ("cost/wasted_usd", "cost/accelerator_hours"):  # %train costs reads them
        total = sum(c.data.metrics.get(key, 0.0) for c in children)
        assert metrics.get(key, 0.0) == pytest.approx(total), key
    best = json.loads(parent.data.tags[TAG.SWEEP_BEST])
    assert best["run_id"] in {c.info.run_id for c in good}
    assert parent.data.params["sweep.space.lr"] == "grid([0.01, 0.01, 1.0, 1.0])"
    assert parent.data.params["keep_best"] == "val_loss:min"  # register's checkpoint stays
    board = SweepBoard(mlflow_client, job.run_id, start=False)
    view = board.poll_once()
    assert [r.best is not None for r in view.rows] == [True] * 4
    assert view.rows[0].run_id in {c.info.run_id for c in good}
    assert (view.done, view.stopped_early, view.pending) == (4, 2, 0)
    assert board.table.value.count("class='tf-trial'") == 4
    assert set(board.plots.sources["metric"]) == {f"trial {i}" for i in range(4)}
    figure = board.plots.figures["metric"]
    assert figure.legend[0] in figure.right  # beside the plot, over no curve
    # after a kernel restart, attach shows the sweep's leaderboard again
    again = shell.run_line_magic("train", f"attach {job.id}")
    shown = shell.magics_manager.registry["TrainMagics"]._dashboards[again.id]
    assert isinstance(shown, SweepBoard) and shown.run_id == job.run_id


@pytest.mark.timeout(300)
def test_a_metric_the_function_never_reports_fails_the_sweep_in_one_sentence(shell, mlflow_client):
    job = shell.run_line_magic(
        "train",
        "sweep sweep_loop --param lr=grid(0.01) --trials 1 --metric accuracy --workers 1 --wait",
    )
    assert job.status() == "FAILED"
    error = job.info().error
    assert "no 'accuracy'" in error and "val_loss" in error, error
    (child,) = _children(mlflow_client, job)
    assert child.info.status == "FAILED"


@pytest.mark.timeout(420)
def test_a_sweep_whose_every_trial_crashes_fails_with_the_trials_error(shell, mlflow_client):
    # no lr in the config: sweep_loop raises KeyError: 'lr' on every trial's rank 0
    job = shell.run_line_magic(
        "train",
        "sweep sweep_loop --param hidden=grid(1,2) --trials 1 --metric val_loss --workers 1 --wait",
    )
    assert job.status() == "FAILED"
    assert "every trial failed (2 of 2)" in job.info().error and "KeyError" in job.info().error
    children = _children(mlflow_client, job)
    assert [c.info.status for c in children] == ["FAILED", "FAILED"]
    assert all("KeyError: 'lr'" in c.data.tags[TAG.ERROR] for c in children)
    board = SweepBoard(mlflow_client, job.run_id, start=False)
    board.poll_once()
    assert "sweep failed: 2/2 trials done (0 stopped early, 2 failed)" in board.table.value
    assert "every trial failed" in board.table.value
    # its resume tries the failed trials again, in their own runs: they fail again
    shell.run_line_magic("train", f"resume {job.id}")
    assert job.wait(timeout=180) == "FAILED", job.logs(tail=60)
    assert "every trial failed (2 of 2)" in job.info().error, job.info().error
    children = _children(mlflow_client, job)
    assert [c.data.tags[TAG.RESUMES] for c in children] == ["1", "1"]
    assert [c.info.status for c in children] == ["FAILED", "FAILED"]
    assert mlflow_client.get_run(job.run_id).data.metrics["sweep/trials_failed"] == 2


@pytest.mark.timeout(420)
def test_stopping_a_sweep_stops_its_trials_at_a_checkpoint_and_starts_no_more(shell, mlflow_client):
    import time

    job = shell.run_line_magic(
        "train",
        "sweep sweep_loop --param lr=grid(0.01,0.02,0.03) --trials 1 --concurrent 2 --metric val_loss"
        " --workers 1 --scheduler fifo --config long_checkpointed --max-failures 1",
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # both first trials have reported
        children = _children(mlflow_client, job)
        if len(children) == 2 and all("val_loss" in c.data.metrics for c in children):
            break
        time.sleep(2)
    else:
        pytest.fail(f"the trials did not report: {job.logs(tail=40)}")
    # a fault in one trial: its worker group restarts from its checkpoint, no new run
    with pytest.raises(UsageError, match="has no trial 7"):
        shell.run_line_magic("train", f"chaos {job.id} --kill-worker --trial 7")
    shell.run_line_magic("train", f"chaos {job.id} --kill-worker --trial 0")
    (hit,) = [c for c in _children(mlflow_client, job) if c.data.tags[TAG.TRIAL_INDEX] == "0"]
    # the stop at once: trial 0 restarts, restores its checkpoint, and stops at its next
    shell.run_line_magic("train", f"stop {job.id}")
    assert job.wait(timeout=180) == "STOPPED", job.logs(tail=60)
    children = _children(mlflow_client, job)
    assert len(children) == 2  # the third trial never started
    for child in children:
        assert child.info.status == "KILLED", child.data.tags
        assert child.data.tags[TAG.STATE] == "STOPPED"
        assert child.data.tags[TAG.REASON] == "user"
        assert child.data.tags.get(TAG.CKPT_STEP), child.data.tags  # stopped at a checkpoint
    parent = mlflow_client.get_run(job.run_id)
    assert parent.info.status == "KILLED" and parent.data.tags[TAG.STATE] == "STOPPED"
    assert parent.data.metrics["sweep/trials_stopped"] == 2
    # the winner: the best trial's best checkpoint, with the way back to the sweep
    version = shell.run_line_magic(
        "train", f"register {job.id} --name sweep-best --model-fn linear_model"
    )
    best = min(children, key=lambda c: float(c.data.params["config.lr"]))
    tags = mlflow_client.get_model_version("sweep-best", str(version["version"])).tags
    assert tags[TAG.RUN_ID] == best.info.run_id and tags[TAG.SWEEP_JOB] == job.id
    assert tags[TAG.TRIAL] == best.data.tags[TAG.TRIAL]
    # the resume: Tune's restore runs the two stopped trials on from their checkpoints,
    # then the third; one parent run, one child per trial, each step once
    stopped = {c.data.tags[TAG.TRIAL]: int(c.data.tags[TAG.CKPT_STEP]) for c in children}
    shell.run_line_magic("train", f"resume {job.id}")
    assert job.wait(timeout=300) == "SUCCEEDED", job.logs(tail=60)
    parent = mlflow_client.get_run(job.run_id)
    assert parent.info.status == "FINISHED" and parent.data.tags[TAG.RESUMES] == "1"
    assert parent.data.metrics["sweep/trials_finished"] == 3
    assert parent.data.metrics["sweep/trials_stopped"] == 0  # the stopped ones went on
    children = _children(mlflow_client, job)
    assert len(children) == 3
    for child in children:
        assert child.info.status == "FINISHED", child.data.tags
        history = mlflow_client.get_metric_history(child.info.run_id, "val_loss")
        assert sorted(p.step for p in history) == list(range(100)), child.data.tags[TAG.TRIAL]
        trial = child.data.tags[TAG.TRIAL]
        if child.info.run_id == hit.info.run_id:
            assert child.data.metrics["faults/restarts"] == 1
        starts = mlflow_client.get_metric_history(child.info.run_id, "start")
        if trial in stopped:  # went on after its own checkpoint: it did not start again
            assert child.data.tags[TAG.RESUMES] == "1"
            assert max(p.value for p in starts) == stopped[trial] + 1
        else:
            assert {p.value for p in starts} == {0}


@pytest.mark.timeout(300)
def test_a_sweeps_budget_stops_its_trials_at_a_checkpoint_before_it_passes(
    shell, mlflow_client, tmp_path
):
    prices = tmp_path / "prices.toml"  # $36 per vCPU-hour: a one-CPU trial spends 1 cent a second
    prices.write_text('version = "test-budget"\ncpu_vcpu_hour = 36.0\n')
    job = shell.run_line_magic(
        "train",
        "sweep sweep_loop --param lr=grid(0.01,0.02) --trials 1 --concurrent 1"
        " --metric val_loss --workers 1 --scheduler fifo --config long_checkpointed"
        f" --budget 0.20 --price-catalog {prices}",
    )
    assert job.wait(timeout=240) == "STOPPED", job.logs(tail=60)
    parent = mlflow_client.get_run(job.run_id)
    assert parent.info.status == "KILLED" and parent.data.tags[TAG.REASON] == "budget"
    children = _children(mlflow_client, job)
    assert len(children) == 1  # the second trial never started
    spent = sum(c.data.metrics["cost/usd"] for c in children)
    assert 0.02 < spent <= 0.20  # stopped before it passed, the whole sweep's cost
    assert parent.data.metrics["cost/usd"] == pytest.approx(spent)
    for child in children:  # no trial's own budget: each stopped by the sweep's
        assert child.info.status == "KILLED" and child.data.tags[TAG.REASON] == "budget"
        assert child.data.tags.get(TAG.CKPT_STEP), child.data.tags
        assert "trainfactory.cost.budget" not in child.data.tags
        steps = mlflow_client.get_metric_history(child.info.run_id, "val_loss")
        assert 0 < len(steps) < 100
    assert "budget 0.2 would be passed" in job.logs()
    # its resume needs a larger budget, else it would stop again at once; nothing submitted
    with pytest.raises(UsageError, match="stopped by its budget .* with a larger --budget"):
        shell.run_line_magic("train", f"resume {job.id}")
    with pytest.raises(UsageError, match="a --budget of 0.01 would stop it at once"):
        shell.run_line_magic("train", f"resume {job.id} --budget 0.01")
    assert job.status() == "STOPPED"
