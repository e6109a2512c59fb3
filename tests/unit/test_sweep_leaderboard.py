"""The sweep leaderboard's model: rows, order, best, counts (MLflow entities, no server)."""

from __future__ import annotations

import json

from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag

from jupyter_trainfactory.sweeps.leaderboard import (
    leaderboard_html,
    panel_trials,
    param_text,
    sweep_view,
)
from jupyter_trainfactory.tracking import TAG


def _run(
    run_id: str,
    tags: dict,
    params: dict | None = None,
    metrics: dict | None = None,
    start_ms: int = 1_000_000,
    end_ms: int | None = None,
) -> Run:
    info = RunInfo(
        run_id=run_id,
        experiment_id="1",
        user_id="u",
        status="RUNNING",
        start_time=start_ms,
        end_time=end_ms,
        lifecycle_stage="active",
        run_name=run_id,
    )
    data = RunData(
        metrics=[Metric(k, v, 0, 0) for k, v in (metrics or {}).items()],
        params=[Param(k, str(v)) for k, v in (params or {}).items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    return Run(info, data)


def _history(*values):
    return [Metric("val_loss", v, 0, step) for step, v in enumerate(values)]


def _sweep(mode="min", state="RUNNING", trials=4):
    settings = {
        "metric": "val_loss",
        "mode": mode,
        "trials": trials,
        "space_text": {"lr": "loguniform(0.0001, 0.1)"},
    }
    tags = {TAG.SWEEP: json.dumps(settings), TAG.STATE: state, TAG.STARTED: "1000.0"}
    parent = _run("parent", tags)
    children, histories = [], {}
    cases = [  # index, state, reason, history
        (0, "STOPPED", "early-stop", (0.9, 0.8)),
        (1, "SUCCEEDED", "", (0.7, 0.4, 0.3)),
        (2, "RUNNING", "", (0.6, 0.5)),
    ]
    for index, st, reason, values in cases:
        run_id = f"c{index}"
        tags = {TAG.TRIAL_INDEX: str(index), TAG.STATE: st, TAG.REASON: reason}
        children.append(_run(run_id, tags, {"config.lr": 0.01 * (index + 1)}, {"cost/usd": 0.5}))
        histories[run_id] = _history(*values)
    return parent, children, histories


def test_rows_sorted_by_best_with_counts_and_eta():
    parent, children, histories = _sweep()
    view = sweep_view(parent, children, histories, now=1100.0)
    assert [r.index for r in view.rows] == [1, 2, 0]
    best = view.best
    assert best.index == 1 and best.best == 0.3 and best.latest == 0.3 and best.step == 2
    assert view.rows[2].reason == "early-stop" and view.rows[2].best == 0.8
    assert (view.done, view.running, view.pending, view.stopped_early) == (2, 1, 1, 1)
    assert view.cost == 1.5
    assert view.rows[0].params == {"lr": "0.02"}
    assert view.eta_s == 100.0 / 2 * 2  # 100 s for 2 ended trials, 2 left


def test_max_mode_puts_the_highest_first_and_trials_without_points_last():
    parent, children, histories = _sweep(mode="max")
    children.append(_run("c3", {TAG.TRIAL_INDEX: "3", TAG.STATE: "PENDING"}))
    view = sweep_view(parent, children, histories, now=1100.0)
    assert [r.index for r in view.rows] == [0, 1, 2, 3]  # best of each: 0.9, 0.7, 0.6
    # a trial whose run waits for workers is pending, not running
    assert view.rows[-1].best is None and (view.pending, view.running) == (1, 1)


def test_rested_and_failed_trials_are_not_done_and_a_failed_sweep_says_why():
    parent, children, histories = _sweep(state="STOPPED")
    children[2] = _run("c2", {TAG.TRIAL_INDEX: "2", TAG.STATE: "STOPPED", TAG.REASON: "user"})
    view = sweep_view(parent, children, histories, now=1100.0)
    assert (view.done, view.stopped, view.running, view.pending) == (2, 1, 0, 1)
    assert view.eta_s is None  # a stopped sweep has no ETA
    text = leaderboard_html(view)
    assert "2/4 trials done (1 stopped early), 0 running, 1 pending, 1 stopped" in text
    tags = {**parent.data.tags, TAG.STATE: "FAILED", TAG.ERROR: "every trial failed (2 of 2)"}
    failed = _run("parent", tags)
    crashed = [
        _run(f"c{i}", {TAG.TRIAL_INDEX: str(i), TAG.STATE: "FAILED", TAG.ERROR: "KeyError"})
        for i in range(2)
    ]
    text = leaderboard_html(sweep_view(failed, crashed, {}, now=1100.0))
    assert "sweep failed: 2/4 trials done (0 stopped early, 2 failed)" in text
    assert "no result yet; cost $0.0000. every trial failed (2 of 2)" in text


def test_html_highlights_the_best_row_and_names_early_stops():
    parent, children, histories = _sweep(state="SUCCEEDED")
    text = leaderboard_html(sweep_view(parent, children, histories, now=1100.0))
    assert text.count("class='tf-trial'") == 3
    rows = text.split("<tr class='tf-trial' style='")[1:]
    assert rows[0].startswith("background:#e6f4ea") and not rows[1].startswith("background")
    assert ">1<" in rows[0]  # trial 1 has the lowest val_loss
    assert "early-stop" in text
    assert "2/4 trials done (1 stopped early)" in text
    assert "best val_loss 0.3 (trial 1)" in text


def test_panel_trials_come_from_the_runs_latest_values_best_first():
    parent, children, _ = _sweep(mode="max")
    latest = {"c0": 0.8, "c1": 0.3}  # c2 has reported nothing yet
    children = [
        _run(
            c.info.run_id,
            c.data.tags,
            {"config.lr": c.data.params["config.lr"]},
            {
                "cost/usd": 0.5,
                **({"val_loss": latest[c.info.run_id]} if c.info.run_id in latest else {}),
            },
        )
        for c in children
    ]
    rows = panel_trials(parent, children)
    assert [r["index"] for r in rows] == [0, 1, 2]  # max: highest first, no value last
    assert rows[0] == {
        "index": 0,
        "params": "lr=0.01",
        "state": "STOPPED",
        "reason": "early-stop",
        "metric": "val_loss",
        "value": 0.8,
        "step": 0,
        "cost_usd": 0.5,
        "run_id": "c0",
    }
    assert rows[2]["value"] is None


def test_long_float_params_and_tiny_costs_are_shortened_for_the_table():
    assert param_text("0.006940721493676259") == "0.006941"
    assert param_text("0.01") == "0.01" and param_text("128") == "128"
    assert param_text("adamw") == "adamw" and param_text("1e-05") == "1e-05"
    parent, children, histories = _sweep(state="SUCCEEDED")
    children[0] = _run(
        children[0].info.run_id,
        children[0].data.tags,
        {"config.lr": "0.006940721493676259"},
        {"cost/usd": 8.311e-05},
    )
    children[1] = _run(
        children[1].info.run_id, children[1].data.tags, {"config.lr": "0.02"}, {"cost/usd": 3e-06}
    )
    text = leaderboard_html(sweep_view(parent, children, histories, now=1100.0))
    assert "0.006941" in text and "0.0069407" not in text
    assert ">0.0001<" in text and "&lt;0.0001" in text and "e-0" not in text
    assert "lr=0.006941" in [r["params"] for r in panel_trials(parent, children)]


def test_the_board_keeps_a_static_summary_of_its_last_read(monkeypatch):
    from jupyter_trainfactory.sweeps import widget

    parent, children, histories = _sweep(state="SUCCEEDED")
    view = sweep_view(parent, children, histories, now=1100.0)
    monkeypatch.setattr(widget, "read_sweep", lambda client, run_id: view)
    board = widget.SweepBoard(None, "parent", start=False, job_id="tf-12345678")
    assert board.summary("when the sweep ended") is None  # nothing read yet
    board.poll_once()
    assert f"trainfactory-live-{board.uid}" in board.table.value  # hides the summary
    figure = board.plots.figures["metric"]
    assert figure.legend[0] in figure.right and figure.legend[0] not in figure.center
    assert len(figure.legend[0].items) == 3  # a line per trial, beside the plot
    # ... and in the bundle a view is made from (a cell re-rendered, a reload): a line
    # that reached the browser only as a patch was missing from such a view
    bundle = json.dumps(board.plots.views["metric"].render_bundle)
    assert all(f'"trial {i}"' in bundle for i in range(3)), bundle[:300]
    assert repr(board).startswith("<live leaderboard of sweep tf-12345678")
    bundle = board.summary("when the sweep ended")
    text = bundle["text/html"]
    assert f"trainfactory-summary-{board.uid}" in text
    assert "sweep tf-12345678: summary written when the sweep ended" in text
    assert text.count("class='tf-trial'") == 3 and "data:image/svg+xml;base64," in text
    assert 'alt="val_loss, trial 1"' in text  # the best trial's curve
    assert bundle["text/plain"] == "sweep tf-12345678: SUCCEEDED"
    board.close()


def test_a_trials_step_is_its_furthest_step_as_the_panel_counts_it():
    # issue 48, finding 12: the leaderboard said "step 2999" (the metric's last point) where
    # the panel and dashboard said 3000 (steps done, the recorder's step tag)
    parent, _, _ = _sweep()
    child = _run("c9", {TAG.TRIAL_INDEX: "0", TAG.STEP: "3000"}, {"config.lr": "0.01"})
    history = {"c9": [Metric("val_loss", 0.5, 0, 2999)]}
    (row,) = sweep_view(parent, [child], history, now=1100.0).rows
    assert row.step == 3000 == panel_trials(parent, [child])[0]["step"]
