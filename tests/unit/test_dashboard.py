"""The dashboard's model and widget against a real MLflow run, polled by hand (no timing)."""

import base64
import json
import time

import pytest
from mlflow import MlflowClient
from mlflow.entities import Metric

from jupyter_trainfactory.dashboard import DashboardModel, JobDashboard, RunSource, Snapshot
from jupyter_trainfactory.dashboard.timeline import timeline_html
from jupyter_trainfactory.jobs import JobInfo
from jupyter_trainfactory.telemetry.goodput import TIMELINE_TAG, Attempt, CheckpointSave, Step
from jupyter_trainfactory.telemetry.goodput import account as account_goodput
from jupyter_trainfactory.tracking import TAG


@pytest.fixture
def run(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(uri)
    exp = client.create_experiment("t", artifact_location=str(tmp_path / "artifacts"))
    run = client.create_run(exp, tags={TAG.JOB_ID: "tf-0000abcd", TAG.STATE: "RUNNING"})
    return uri, client, run.info.run_id


def _log(client, run_id, steps, key="loss"):
    client.log_batch(run_id, metrics=[Metric(key, 1.0 / s, 1000 + s, s) for s in steps])


def test_a_live_plot_starts_at_the_run_s_first_step_not_at_the_first_poll(run):
    """A fast loop makes many steps before the poll that first sees its metric: the plot
    reads that metric's history once then, so the curve's start shows while it runs."""
    uri, client, run_id = run
    board = JobDashboard(source=RunSource(uri, run_id), start=False)  # launched: no metric yet
    _log(client, run_id, range(1, 301))
    client.log_metric(run_id, "train/samples_per_s", 900.0, step=300)
    board.poll_once()
    assert [s for s, _ in board.model.series["loss"]][:3] == [1, 2, 3]
    assert list(board.source_of("loss").data["x"])[:3] == [1, 2, 3]
    assert len(board.source_of("loss").data["x"]) == 300
    _log(client, run_id, range(301, 311))
    board.poll_once()  # later polls append the latest point only: no history read again
    assert list(board.source_of("loss").data["x"])[-2:] == [300, 310]
    board.close()


def test_points_grow_and_thin_out_over_the_whole_run(run):
    uri, client, run_id = run
    board = JobDashboard(source=RunSource(uri, run_id), max_points=3, start=False)
    model: DashboardModel = board.model
    assert model.series == {} and not board.polling

    for step in range(1, 9):
        _log(client, run_id, [step])
        client.log_metric(run_id, "system/node-1/cpu_utilization", 40.0 + step, step=step)
        if step >= 7:  # a second node: the plot gets its legend, beside it
            client.log_metric(run_id, "system/node-2/cpu_utilization", 10.0, step=step)
        assert board.poll_once() is True
        utilization = board._system.figures["utilization"]
        assert bool(utilization.legend) is (step >= 7), step
    # 7 points passed 2 x 3: every other one was dropped; the first step stays, the last too
    assert [s for s, _ in model.series["loss"]] == [1, 3, 5, 7, 8]
    assert model.nodes["node-1"]["cpu_utilization"] == 48.0
    cds = board.source_of("loss")
    assert list(cds.data["x"]) == [1, 3, 5, 7, 8]  # the bokeh source thins the same way
    # the node's CPU is a line of the utilization plot, by elapsed time
    assert len(board.source_of("utilization", "node-1 CPU").data["y"]) == 5
    legend = utilization.legend[0]
    assert legend in utilization.right and legend not in utilization.center  # covers no line
    assert [item.label["value"] for item in legend.items] == ["node-1 CPU", "node-2 CPU"]

    board.poll_once()  # nothing new: nothing appended
    assert len(cds.data["x"]) == 5 and model.polls == 10  # 1 on creation + 9
    assert "RUNNING" in board._header.value and "step" in board._header.value

    client.set_tag(run_id, TAG.ERROR, "ValueError: boom")
    client.set_terminated(run_id, "FAILED")
    assert board.poll_once() is False  # the job ended: the plots re-read the whole run
    steps = list(board.source_of("loss").data["x"])
    assert len(steps) == 6 and steps[0] == 1 and steps[-1] == 8 and steps == sorted(steps)
    assert model.info.state == "FAILED" and "ValueError: boom" in board._header.value
    assert board.ended
    board.close()


def test_attach_reads_history_once_downsampled(run):
    uri, client, run_id = run
    _log(client, run_id, range(1, 101))
    client.set_terminated(run_id, "FINISHED")
    board = JobDashboard(source=RunSource(uri, run_id), max_points=10, start=False)
    steps = [s for s, _ in board.model.series["loss"]]
    assert len(steps) == 20 and steps[-1] == 100 and steps == sorted(steps)  # 2 x max_points
    assert list(board.source_of("loss").data["x"]) == steps
    assert board.model.info.state == "SUCCEEDED"


def test_background_poller_follows_the_job_after_it_ends(run):
    uri, client, run_id = run
    board = JobDashboard(
        source=RunSource(uri, run_id), interval_s=0.01, follow_interval_s=0.05, start=True
    )
    assert board.polling
    client.set_terminated(run_id, "KILLED")
    assert board.wait(timeout=30)
    assert board.polling and board.model.info.state == "STOPPED"  # slower, still following
    # a resume (from the side panel, another kernel or the CLI) reopens the run
    client.update_run(run_id, "RUNNING")
    client.set_tag(run_id, TAG.STATE, "RUNNING")
    _log(client, run_id, [1, 2])
    deadline = time.monotonic() + 30
    while board.ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not board.ended and board.model.info.state == "RUNNING"
    assert "RUNNING" in board._header.value
    board.close()
    assert not board.polling


def test_header_shows_throughput_mfu_split_checkpoint_and_warnings(run):
    uri, client, run_id = run
    values = {
        "train/samples_per_s": 2000.0,
        "train/tokens_per_s": 64000.0,
        "train/tokens_per_s_per_gpu": 8000.0,
        "train/mfu": 0.412,
        "train/step_time_s": 0.0124,
        "train/step_time_p50_s": 0.012,
        "train/step_time_p95_s": 0.0154,
        "train/data_wait_fraction": 0.15,
        "train/comm_fraction": 0.08,
        "train/comm_s": 0.001,
        "checkpoint/save_s": 0.5,
        "checkpoint/bytes": 200e6,
        "checkpoint/mb_per_s": 400.0,
        "system/n1/gpu0/utilization": 97.0,
        "system/n1/gpu0/memory_used_mb": 40960.0,
        "system/n1/gpu0/power_w": 650.0,
        "system/n1/cpu_utilization": 30.0,
    }
    client.log_batch(run_id, metrics=[Metric(k, v, 1000, 3) for k, v in values.items()])
    client.set_tag(run_id, "trainfactory.nonfinite.count", "2")
    client.set_tag(run_id, "trainfactory.nonfinite.first_key", "loss")
    client.set_tag(run_id, "trainfactory.nonfinite.first_step", "17")
    client.set_tag(run_id, "trainfactory.gpus.n1", '[{"label": "gpu0", "memory_total_mb": 143360}]')
    placement = {"strategy": "pack", "min_nodes": 1, "nodes": {"n1": [0, 1], "n2": [2]}}
    client.set_tag(run_id, "trainfactory.placement", json.dumps(placement))
    client.set_tag(run_id, "trainfactory.placement.warning", "pack placed the workers on 2 nodes")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    header, nodes = board._header.value, board._nodes.value
    assert "placement pack: 3 workers on 2 nodes" in nodes
    assert "<b>warning</b>: pack placed the workers on 2 nodes" in nodes
    assert "<td>n1</td><td>0, 1</td><td>CPU</td>" in nodes  # which ranks ran on the node
    for text in (
        "2,000 samples/s",
        "64,000 tokens/s",
        "8,000 tokens/s per GPU",
        "MFU</b> 41.2 %",
        "step</b> p50 12.0 ms · p95 15.4 ms · mean of the last second 12.4 ms",
        "data wait 15.0 %",
        "allreduce 8.0 % (1.0 ms/step, may overlap compute)",
        "checkpoint save</b> 0.5 s · 400 MB/s · 200 MB",
        "2 non-finite value(s)",
        "<code>loss</code> at step 17",
    ):
        assert text in header, text
    assert "gpu0" in nodes and "97 %" in nodes and "40.0 / 140 GiB" in nodes and "650 W" in nodes
    # tokens/s is the job's throughput; the GPU is a line of the device plots; the step
    # time split stacks compute 77 %, data wait 15 %, allreduce 8 %
    assert board.plot_ids() == {
        "user": [],
        "system": ["throughput", "utilization", "memory", "step_split"],
        "cost": [],
    }
    assert board.source_of("throughput").data["y"] == [64000.0]
    assert board.source_of("memory", "n1 gpu0").data["y"] == [40.0]  # GiB
    split = board.source_of("step_split").data
    assert split["data wait"] == [pytest.approx(12.4 * 0.15)]  # ms
    assert split["communication"] == [pytest.approx(12.4 * 0.08)]
    assert split["compute"] == [pytest.approx(12.4 * 0.77)]
    figures = board._system.figures
    assert figures["utilization"].title.text == "GPU utilization"
    assert figures["memory"].title.text == "GPU memory used"
    assert not figures["utilization"].legend  # one GPU: its name is in the hover, no key
    assert figures["step_split"].legend[0] in figures["step_split"].below  # over no part
    board.close()


def test_mfu_is_unavailable_not_made_up(run):
    uri, client, run_id = run
    client.log_metric(run_id, "train/tokens_per_s", 5000.0, step=1)
    note = "MFU unavailable: no peak FLOP/s known for this device; give --peak-tflops."
    client.set_tag(run_id, "trainfactory.mfu_note", note)
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert "MFU</b> <span" in board._header.value and "unavailable" in board._header.value
    assert "give --peak-tflops" in board._header.value
    board.close()


class _DownSource:
    """A RunSource whose tracking server has gone away."""

    def snapshot(self):
        raise ConnectionError("Connection refused")


def test_unreachable_tracking_server_is_said(run):
    uri, client, run_id = run
    board = JobDashboard(source=RunSource(uri, run_id), interval_s=0.01, start=False)
    board.source = _DownSource()
    board.start()
    deadline = time.monotonic() + 30
    while "tracking server unreachable" not in board._footer.value:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert "Connection refused" in board._footer.value and board.polling
    board.close()


def test_goodput_and_failures_in_the_header(run):
    uri, client, run_id = run
    values = {
        "goodput/ettr": 0.9,
        "goodput/goodput_s": 900.0,
        "badput/startup_s": 60.0,
        "badput/infrastructure_recovery_s": 30.0,
        "badput/wasted_progress_s": 10.0,
        "badput/other_s": 0.2,
        "faults/count": 1.0,
        "faults/mttr_s": 41.5,
        "faults/restarts": 1.0,
        "faults/restore_step": 200.0,
    }
    client.log_batch(run_id, metrics=[Metric(k, v, 1000, 1) for k, v in values.items()])
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    header = board._header.value
    assert (
        "ETTR 90.0 % (badput: startup 60 s, infrastructure recovery 30 s, wasted progress 10 s)"
        in header
    )
    assert "failures</b> 1 (MTTR 41.5 s) · 1 restart(s), last from step 200" in header
    assert board.plot_ids() == {"user": [], "system": [], "cost": ["goodput/ettr"]}
    assert board._cost_box.selected_index is None  # collapsed until the user opens it
    board.close()


def _two_failure_timeline():
    """The timeline of tests/unit/test_goodput.py's two failures (the second a preemption)."""
    steps = [Step(float(e), s, 1.0) for s, e in enumerate([11, 12, 13, 14, 25, 26], start=1)]
    steps += [Step(float(35 + k), 4 + k, 1.0) for k in range(1, 5)]
    steps += [Step(float(52 + k), 4 + k, 1.0, 0.5) for k in range(1, 7)]
    attempts = [
        Attempt(5.0, failed_at=26.0),
        Attempt(30.0, failed_at=39.0, kind="preemption"),
        Attempt(50.0),
    ]
    saves = [CheckpointSave(14.0, 24.0, 4), CheckpointSave(58.0, 68.0, 10)]
    return account_goodput(0.0, 70.0, attempts, steps, saves).timeline()


def test_timeline_html_has_the_categories_and_the_failures():
    text = timeline_html(_two_failure_timeline())
    for part in (
        'title="failure at 0:26 (failure)"',
        "left:37.14%;width:2px",  # 26 / 70 of the bar
        'title="failure at 0:39 (preemption)"',
        "left:55.71%;width:2px",
        'title="startup: 10 s (from 0:00 to 0:10)"',
        "left:0.00%;width:14.29%;background:#8c959f",
        'title="checkpoint save: 10 s (from 0:14 to 0:24)"',
        "left:20.00%;width:14.29%",
        'title="preemption: 11 s (from 0:39 to 0:50)"',
        "left:55.71%;width:15.71%",
        'title="data loading: 3 s (from 0:52 to 0:55)"',
        "goodput 7 s (10.0 %)",
        "checkpoint save 20 s (28.6 %)",
        "wasted progress 6 s (8.6 %)",
        "failures 2",
    ):
        assert part in text, part
    assert text.count('title="') == 13 + 2
    assert text.count("position:absolute") == 13 + 2


@pytest.mark.parametrize(
    "timeline",
    [None, [], {}, {"wall_s": 0, "segments": [[0, 1, "g"]]}, {"wall_s": 5, "segments": [[0]]}],
)
def test_timeline_html_of_something_else_is_empty(timeline):
    assert timeline_html(timeline) == ""


class _TagSource:
    """A RunSource with one fixed snapshot: a running job with these run tags, no metrics."""

    def __init__(self, tags):
        info = JobInfo(
            job_id="tf-0000abcd",
            name="demo",
            state="RUNNING",
            owner="me",
            experiment_id="1",
            run_id="r1",
            run_status="RUNNING",
            submission_id="",
            step=None,
            started=None,
            ended=None,
            reason="",
            error="",
            checkpoint_path="",
            checkpoint_step=None,
            run_url="",
        )
        self.snap = Snapshot(info, [], tags)

    def snapshot(self):
        return self.snap


def test_header_draws_the_timeline_of_the_run_tag():
    tag = json.dumps(_two_failure_timeline())
    board = JobDashboard(source=_TagSource({TIMELINE_TAG: tag}), start=False)
    header = board._header.value
    assert "goodput timeline</b> 1:10" in header and "failure at 0:39 (preemption)" in header
    assert header.index("goodput timeline") > header.index("RUNNING")
    board.close()


@pytest.mark.parametrize("tag", ["{not json", '{"wall_s": "soon"}', "[1, 2]", "", "null"])
def test_header_without_a_valid_timeline_tag_draws_none(tag):
    board = JobDashboard(source=_TagSource({TIMELINE_TAG: tag}), start=False)
    assert "RUNNING" in board._header.value and "timeline" not in board._header.value
    board.close()


def test_the_root_cause_of_a_failure_and_a_stall_are_shown(run):
    uri, client, run_id = run
    failure = {
        "rank": 1,
        "node": "10.0.0.7",
        "pid": 4242,
        "time": 1_700_000_000.0,
        "message": "ValueError: bad batch <7>",
        "type": "ValueError",
        "traceback": '  File "train.py", line 9, in train\n    raise ValueError("bad batch <7>")',
    }
    client.set_tag(run_id, TAG.FAILURE, json.dumps(failure))
    client.set_tag(run_id, TAG.STALL, "no step or report for 31 s since 10:00:00")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    header = board._header.value
    assert "last failure</b>: rank 1 on node 10.0.0.7 (pid 4242) at" in header
    assert "ValueError: bad batch &lt;7&gt;" in header  # escaped
    assert "line 9, in train" in header
    assert "stalled</b>: no step or report for 31 s since 10:00:00" in header
    board.close()


def test_a_stall_timeout_is_suggested_only_when_none_was_set(run):
    uri, client, run_id = run
    client.set_tag(run_id, TAG.STALL_SUGGESTED, "60")
    client.set_tag(run_id, TAG.STALL_TIMEOUT, "off")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    header = board._header.value
    assert "<code>--stall-timeout 60</code> would suit this job" in header
    assert "&#9888;" not in header  # a muted tip, not a warning: nothing is wrong
    board.close()
    client.set_tag(run_id, TAG.STALL_TIMEOUT, "120")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert "--stall-timeout" not in board._header.value
    board.close()


def test_cost_and_a_budget_warning_in_the_header(run):
    uri, client, run_id = run
    values = {"cost/usd": 12.5, "cost/rate_per_h": 28.8, "cost/wasted_usd": 1.25}
    values["cost/budget_fraction"] = 0.85
    client.log_batch(run_id, metrics=[Metric(k, v, 1000, 1) for k, v in values.items()])
    client.set_tag(run_id, "trainfactory.cost.currency", "EUR")
    client.set_tag(run_id, "trainfactory.cost.budget", "15")
    client.set_tag(run_id, "trainfactory.cost.catalog", "example-2026-11 (example prices)")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    header = board._header.value
    assert "cost</b> 12.50 EUR · 28.80 EUR/h · <span title=" in header
    assert "outside goodput</span> 1.25 EUR of a 15 EUR budget" in header
    assert "by step" not in header  # no --target-steps given
    assert "(example prices)" in header
    assert "budget</b>: 85 % spent" in header
    board.close()


def test_projected_cost_to_the_target_step(run):
    uri, client, run_id = run
    values = {"cost/usd": 2.0, "cost/rate_per_h": 8.0, "cost/projected_usd": 6.4}
    client.log_batch(run_id, metrics=[Metric(k, v, 1000, 1) for k, v in values.items()])
    client.set_tag(run_id, "trainfactory.target_steps", "100")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert "2.00 USD · 8.00 USD/h · 6.40 USD by step 100" in board._header.value
    board.close()


def test_the_users_metrics_come_first_then_throughput_and_devices_then_cost(run):
    uri, client, run_id = run
    values = {
        "cost/usd": 0.01,
        "cost/accelerator_hours": 0.0,
        "cost/storage_usd": 5e-12,
        "goodput/ettr": 0.5,
        "loss": 0.7,
        "train/samples_per_s": 900.0,
        "val_accuracy": 0.8,
        "system/n1/cpu_utilization": 55.0,
        "system/n1/memory_used_mb": 2048.0,
    }
    client.log_batch(run_id, metrics=[Metric(k, v, 1000, 1) for k, v in values.items()])
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert board.plot_ids() == {
        "user": ["loss", "val_accuracy"],
        "system": ["throughput", "utilization", "memory"],
        "cost": ["cost/usd", "goodput/ettr"],  # no plot of a flat 0 or of 5e-12 USD
    }
    assert [c for c in board.children if c.layout.display != "none"][:4] == [
        board._header,
        board._user.box,
        board._system.box,
        board._cost_box,
    ]
    label = {
        p: f.xaxis[0].axis_label for g in (board._user, board._system) for p, f in g.figures.items()
    }
    assert label == {"loss": "step", "val_accuracy": "step", "throughput": "step"} | {
        "utilization": "elapsed (s)",
        "memory": "elapsed (s)",
    }
    assert board.source_of("memory", "n1 host").data["y"] == [2.0]  # GiB
    titles = {p: f.title.text for p, f in board._system.figures.items()}
    assert titles["utilization"] == "CPU utilization per node (no GPUs)"  # not "GPU"
    assert titles["memory"] == "host memory used per node"
    board.close()


def test_a_static_summary_when_the_job_ends_none_after_a_resume(run):
    uri, client, run_id = run
    _log(client, run_id, range(1, 21))
    client.log_metric(run_id, "train/samples_per_s", 500.0, step=20)
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert board.summary() is None  # running
    client.set_terminated(run_id, "FINISHED")
    board.poll_once()
    summary = board.summary()["text/html"]
    assert f"trainfactory-summary-{board.uid}" in summary and "SUCCEEDED" in summary
    assert summary.count("data:image/svg+xml;base64,") == 2  # loss and throughput
    svg = base64.b64decode(summary.split("base64,")[1].split('"')[0]).decode()
    assert svg.startswith("<svg") and ">loss</text>" in svg and "<polyline" in svg
    assert "tf-0000abcd" in board.summary()["text/plain"]
    # hidden while this widget shows, by its own marker
    assert f".jp-OutputArea-child:has(.trainfactory-live-{board.uid})" in board._header.value
    client.update_run(run_id, "RUNNING")
    client.set_tag(run_id, TAG.STATE, "RUNNING")
    board.poll_once()
    assert board.summary() is None and not board.ended
    board.close()


def test_a_view_closed_while_its_job_runs_leaves_the_summary_of_its_last_read(run):
    # issue 48, finding 5: launch, stop, resume, then %train attach elsewhere closes this
    # view while the job runs: its cell kept an empty summary and showed nothing
    uri, client, run_id = run
    _log(client, run_id, range(1, 21))

    class Handle:  # the summary output's DisplayHandle
        bundle = None

        def update(self, bundle, raw=False):
            self.bundle = bundle

    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    board.poll_once()
    board._summary = handle = Handle()
    board.close()
    text = handle.bundle["text/html"]
    assert "summary written at its last read, when this view closed" in text
    assert "RUNNING" in text and text.count("data:image/svg+xml;base64,") == 1  # loss
    assert handle.bundle["text/plain"] == "job tf-0000abcd: RUNNING"


def test_a_stop_waiting_for_a_rank_is_said(run):
    uri, client, run_id = run
    client.set_tag(run_id, "trainfactory.stop.waiting", "waiting for rank 1 at step 400")
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert "<b>stop</b>: waiting for rank 1 at step 400" in board._header.value
    board.close()


def test_the_step_is_the_furthest_logged_step_before_any_report(run):
    # a loop that logs every step and reports only with its checkpoints (every 200)
    uri, client, run_id = run
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert "step -" in board._header.value
    _log(client, run_id, range(1, 38))
    client.log_metric(run_id, "system/node-1/cpu_utilization", 40.0, step=500)  # a tick
    board.poll_once()
    assert board.model.info.step == 37 and "step 37" in board._header.value
    client.set_tag(run_id, TAG.STEP, "40")  # a report's step further on counts too
    board.poll_once()
    assert board.model.info.step == 40
    board.close()


def test_after_a_resume_the_latest_numbers_are_the_resumed_submissions(run):
    uri, client, run_id = run
    client.log_batch(run_id, metrics=[Metric("train/samples_per_s", 276.0, 1_000_000, 181)])
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    assert "276 samples/s" in board._header.value
    client.set_tag(run_id, TAG.STARTED, "2000.0")  # resumed at t = 2000 s: nothing new yet
    board.poll_once()
    assert "train/samples_per_s" not in board.model.latest
    assert "samples/s" not in board._header.value
    assert [s for s, _ in board.model.series["train/samples_per_s"]] == [181]  # still drawn
    client.log_batch(run_id, metrics=[Metric("train/samples_per_s", 333.0, 2_001_000, 190)])
    board.poll_once()
    assert "333 samples/s" in board._header.value
    run_now = client.get_run(run_id)
    from jupyter_trainfactory.runreads import current_metrics

    assert current_metrics(run_now)["train/samples_per_s"] == 333.0  # the panel's numbers
    board.close()


def test_header_names_fsdp2_collectives_and_the_ingest_rate(run):
    uri, client, run_id = run
    values = {
        "train/step_time_s": 0.1,
        "train/data_wait_fraction": 0.05,
        "train/ingest_rows_per_s": 1200.0,
        "train/comm_fraction": 0.3,
        "train/comm_s": 0.03,
        "train/all_gather_s": 0.02,
        "train/reduce_scatter_s": 0.01,
    }
    client.log_batch(run_id, metrics=[Metric(k, v, 1000, 3) for k, v in values.items()])
    board = JobDashboard(source=RunSource(uri, run_id), start=False)
    header = board._header.value
    assert "data wait 5.0 % (ingest 1,200 rows/s)" in header
    assert (
        "communication 30.0 % (all-gather 20.0 ms/step, reduce-scatter 10.0 ms/step;"
        " may overlap compute)" in header
    )
    assert "allreduce" not in header
    board.close()


def test_every_goodput_category_has_a_colour_of_its_own():
    from jupyter_trainfactory.dashboard.timeline import CATEGORY_COLOURS
    from jupyter_trainfactory.telemetry.goodput import CATEGORY_CODES

    assert set(CATEGORY_COLOURS) == set(CATEGORY_CODES)  # user_error, drill: not grey
    assert len(set(CATEGORY_COLOURS.values())) == len(CATEGORY_COLOURS)
