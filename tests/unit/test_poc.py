"""The proof of concept's arithmetic and report on recorded figures (issue 19): bus
bandwidth by nccl-tests' definitions, MFU against the measured and the data-sheet peak,
thresholds and pass/fail, the HTML table, the side-by-side comparison."""

from __future__ import annotations

import json
import math

import pytest
from mlflow.entities import Metric, Run, RunData, RunInfo, RunTag

from jupyter_trainfactory.arguments import CommandError
from jupyter_trainfactory.payload import function_source
from jupyter_trainfactory.poc.checks import CHECKS, FAIL, MEASURED, NA, PASS, build_checks
from jupyter_trainfactory.poc.html import report_html, write_html
from jupyter_trainfactory.poc.report import PocReport, compare_text
from jupyter_trainfactory.poc.run import _with_training, job_config, kill_target, poc
from jupyter_trainfactory.poc.thresholds import SHIPPED, default_for, load
from jupyter_trainfactory.spec import SpecError
from jupyter_trainfactory.telemetry.bandwidth import algbw, bus_factor, busbw
from jupyter_trainfactory.tracking import TAG

HEALTHY = {"healthy": True, "nodes": [{"host": "10.0.0.1", "healthy": True, "reasons": []}]}


def test_bus_bandwidth_follows_nccl_tests():
    # 8 ranks: allreduce 2*7/8 = 1.75, all-gather and reduce-scatter 7/8
    assert bus_factor("allreduce", 8) == 1.75
    assert bus_factor("all_gather", 8) == bus_factor("reduce_scatter", 8) == 0.875
    assert bus_factor("allreduce", 1) == 0.0
    # 16 GiB in 0.1 s: algbw 171.8 GB/s (10^9 B), busbw 1.75x
    assert algbw(16 * 2**30, 0.1) == pytest.approx(171.798691840)
    assert busbw("allreduce", 16 * 2**30, 0.1, 8) == pytest.approx(171.798691840 * 1.75)
    with pytest.raises(ValueError, match="collective must be"):
        bus_factor("alltoall", 8)
    with pytest.raises(ValueError):
        algbw(1, 0)


def _metrics(**extra):
    m = {
        "rank0/poc/compute/tflops": 0.05,
        "rank1/poc/compute/tflops": 0.04,
        "poc/collectives/ranks": 2.0,
        "poc/allreduce/intra/1MiB/busbw_gb_per_s": 0.3,
        "poc/allreduce/intra/16MiB/busbw_gb_per_s": 0.9,
        "poc/all_gather/intra/16MiB/busbw_gb_per_s": 0.4,
        "poc/reduce_scatter/intra/16MiB/busbw_gb_per_s": 0.2,
        "train/tokens_per_s_per_worker": 2000.0,
        "train/comm_fraction": 0.25,
        "train/data_wait_fraction": 0.01,
        "poc/storage/bytes": 4e6,
        "poc/storage/save_s": 0.02,
        "poc/storage/save_gb_per_s": 0.2,
        "poc/storage/restore_s": 0.04,
        "poc/storage/restore_gb_per_s": 0.1,
        "faults/mttr_s": 21.5,
        "faults/restore_step": 20.0,
    }
    m.update(extra)
    return m


def _by_name(checks):
    return {c.name: c for c in checks}


def test_checks_on_cpu_figures_with_the_shipped_cpu_thresholds():
    tags = {"trainfactory.flops_per_token": "1e6"}
    cpu = load(SHIPPED / "cpu.toml", set(CHECKS))
    checks = _by_name(
        build_checks(
            _metrics(), tags, health=HEALTHY, accelerator="cpu", kill_step=25, thresholds=cpu
        )
    )
    assert list(checks) == list(CHECKS)  # every check, in stage order
    assert checks["nodes_healthy"].status == PASS
    assert checks["compute_tflops"].value == 0.04  # the slowest rank
    assert checks["compute_fraction_of_peak"].status == NA  # no data-sheet peak for a CPU
    assert checks["allreduce_busbw_gb_per_s"].value == 0.9  # the largest size
    assert "16 MiB" in checks["allreduce_busbw_gb_per_s"].detail
    assert checks["allreduce_inter_busbw_gb_per_s"].status == NA
    # MFU against the measured rate: 2000 tokens/s * 1e6 FLOPs / 0.04e12 = 5 %
    assert checks["mfu_measured_peak"].value == pytest.approx(0.05)
    assert checks["mfu"].status == NA  # no train/mfu without a data-sheet peak
    assert checks["steps_lost"].value == 5.0  # killed at 25, restored from 20
    assert checks["recovery_mttr_s"].status == PASS
    assert checks["data_wait_fraction"].status == MEASURED  # no bound: shown, not passed


def test_gpu_figures_against_the_data_sheet_and_h200_thresholds():
    tags = {
        "trainfactory.device_name": "NVIDIA H200",
        "trainfactory.flops_per_token": "1e9",
        "trainfactory.peak_flops": "9.895e14",
    }
    metrics = _metrics(
        **{
            "rank0/poc/compute/tflops": 700.0,
            "rank1/poc/compute/tflops": 500.0,
            "poc/allreduce/intra/16MiB/busbw_gb_per_s": 300.0,
            "train/tokens_per_s_per_gpu": 100_000.0,
            "train/mfu": 0.101,
        }
    )
    path = default_for("NVIDIA H200", "gpu")
    assert path.name == "h200.toml"
    checks = _by_name(
        build_checks(
            metrics,
            tags,
            health=HEALTHY,
            accelerator="gpu",
            kill_step=45,
            thresholds=load(path, set(CHECKS)),
        )
    )
    # 500 of 989.5 dense bf16 TFLOP/s = 0.505 < 0.6: fails, naming the data sheet
    assert checks["compute_fraction_of_peak"].value == pytest.approx(500 / 989.5)
    assert checks["compute_fraction_of_peak"].status == FAIL
    # 300 GB/s against the Azure health checks' 431 GB/s
    assert checks["allreduce_busbw_gb_per_s"].status == FAIL
    assert "azurehpc-health-checks" in checks["allreduce_busbw_gb_per_s"].detail
    # MFU against the measured 500 TFLOP/s: 1e5 * 1e9 / 5e14 = 20 %
    assert checks["mfu_measured_peak"].value == pytest.approx(0.2)
    assert checks["mfu"].value == 0.101
    assert checks["steps_lost"].value == 25.0


def test_missing_stages_are_not_available_never_passed():
    checks = _by_name(
        build_checks({}, {}, health=None, accelerator="cpu", kill_step=25, thresholds=None)
    )
    assert all(c.status == NA for c in checks.values())
    assert "did not run" in checks["nodes_healthy"].detail
    assert "no failure was recorded" in checks["recovery_mttr_s"].detail
    one_rank = _by_name(
        build_checks(
            {"poc/collectives/ranks": 1.0},
            {},
            health=None,
            accelerator="cpu",
            kill_step=25,
            thresholds=None,
        )
    )
    assert "one rank" in one_rank["allreduce_busbw_gb_per_s"].detail


def test_thresholds_file_errors_are_one_sentence(tmp_path):
    bad = tmp_path / "t.toml"
    bad.write_text("[thresholds]\nallreduce_busbw = { min = 1 }\n")
    with pytest.raises(SpecError, match="unknown checks: allreduce_busbw"):
        load(bad, set(CHECKS))
    bad.write_text("[thresholds]\nsteps_lost = 3\n")
    with pytest.raises(SpecError, match="needs min or max"):
        load(bad, set(CHECKS))
    bad.write_text("not toml [")
    with pytest.raises(SpecError, match="not valid TOML"):
        load(bad, set(CHECKS))
    with pytest.raises(SpecError, match="Cannot read"):
        load(tmp_path / "missing.toml", set(CHECKS))
    for shipped in SHIPPED.glob("*.toml"):  # every shipped file loads, with sources
        assert load(shipped, set(CHECKS)).bounds
    nan_bound = load(SHIPPED / "cpu.toml", set(CHECKS)).bounds["steps_lost"]
    assert not nan_bound.passes(math.nan)


def _report(state="SUCCEEDED", **metrics):
    cpu = load(SHIPPED / "cpu.toml", set(CHECKS))
    checks = build_checks(
        _metrics(**metrics),
        {"trainfactory.flops_per_token": "1e6"},
        health=HEALTHY,
        accelerator="cpu",
        kill_step=25,
        thresholds=cpu,
    )
    curves = {("allreduce", "intra"): [(1, 0.3), (16, 0.9)]}
    cluster = {"nodes": "1", "accelerators": "2 workers x CPU"}
    return PocReport("r1", "tf-1", state, checks, cluster, cpu.name, curves=curves)


def test_report_verdict_table_html_and_comparison(tmp_path):
    good = _report()
    assert good.passed
    assert good.verdict().startswith("proof of concept PASSED")
    slow = _report(**{"faults/mttr_s": 400.0})
    assert not slow.passed and "1 fail" in slow.verdict()
    assert not _report(state="FAILED").passed
    assert good.metrics()["poc/passed"] == 1.0
    assert good.metrics()["poc/check/steps_lost"] == 5.0
    page = report_html(slow)
    assert "FAILED" in page and "<table" in page and "recovery" in page
    path = write_html(good, tmp_path / "r.html")
    text = path.read_text()
    assert "Bokeh" in text and "cdn.bokeh.org" not in text  # BokehJS inlined, no network
    side = compare_text(good, slow)
    assert "B/A" in side and "18.6" in side  # MTTR 400 / 21.5


def test_quick_config_kills_five_steps_after_a_checkpoint():
    config = job_config(True, "cpu", "/tmp/x", None)
    assert config["kill_step"] % config["every"] == 5
    assert config["kill_step"] < config["steps"]
    assert job_config(False, "gpu", "/tmp/x", 10.0)["checkpoint_mb"] == 10.0


def test_the_stage_figures_are_no_user_plots_on_the_dashboard():
    from jupyter_trainfactory.dashboard.layout import is_user_metric

    assert not is_user_metric("poc/allreduce/intra/16MiB/busbw_gb_per_s")
    assert not is_user_metric("rank1/poc/compute/tflops")
    assert is_user_metric("rank1/loss") and is_user_metric("loss")


def test_a_failure_record_gives_the_steps_lost_of_a_users_function():
    # poc --fn: no kill step known; the record says where the job was and what it restored
    record = {"rank": 1, "node": "10.0.0.2", "step_reached": 47, "restored_step": 40}
    tags = {"trainfactory.faults.records": json.dumps([record, {"rank": 0}])}
    checks = _by_name(
        build_checks(
            _metrics(), tags, health=HEALTHY, accelerator="cpu", kill_step=None, thresholds=None
        )
    )
    assert checks["steps_lost"].value == 7.0
    assert checks["steps_lost"].detail == "killed at step 47, restored from step 40"
    assert checks["recovery_mttr_s"].detail == "rank 1 on 10.0.0.2 SIGKILLed at step 47"


def _run(step, ckpt=None, placement=None):
    metrics = [Metric("loss", 0.5, 0, step)] if step else []
    tags = {TAG.CKPT_STEP: str(ckpt)} if ckpt is not None else {}
    if placement:
        tags[TAG.PLACEMENT] = json.dumps(placement)
    return Run(
        RunInfo("r", "0", "u", "RUNNING", 0, None, "active"),
        RunData(metrics=metrics, tags=[RunTag(k, v) for k, v in tags.items()]),
    )


def test_a_users_function_is_killed_five_steps_after_its_checkpoint_a_node_when_spread():
    assert kill_target(_run(12), "RUNNING") is None  # no checkpoint yet
    assert kill_target(_run(14, ckpt=10), "RUNNING") is None  # 4 steps past it
    assert kill_target(_run(15, ckpt=10), "RESTARTING") is None
    assert kill_target(_run(15, ckpt=10), "RUNNING") == {"rank": None}  # the last rank
    spread = {"nodes": {"10-0-0-1": [0, 1], "10-0-0-2": [2, 3]}}
    spread["ranks"] = {"0": "10-0-0-1", "1": "10-0-0-1", "2": "10-0-0-2", "3": "10-0-0-2"}
    assert kill_target(_run(15, ckpt=10, placement=spread), "RUNNING") == {"node": "10-0-0-2"}


def test_the_training_stage_takes_the_users_function_its_name_and_source():
    def my_loop(config):
        return config

    calls = []
    wrapped = _with_training(lambda config, train_fn: calls.append(train_fn(config)), my_loop)
    wrapped({"fn_config": 1})
    assert calls == [{"fn_config": 1}] and wrapped.__name__ == "my_loop"
    assert "def my_loop(config)" in function_source(wrapped)  # the run's code version


def test_config_without_fn_is_one_sentence_and_submits_nothing():
    class Refuses:  # poc refuses before it touches the cluster
        def __getattr__(self, name):
            raise AssertionError(f"touched the manager: {name}")

    with pytest.raises(SpecError, match="--config goes with --fn"):
        poc(Refuses(), fn_config={"lr": 0.1})
    with pytest.raises(SpecError, match="--fn must be a training function"):
        poc(Refuses(), fn="train")


def test_resources_the_cluster_cannot_give_are_refused_before_any_job():
    class NoGpus:  # check() refuses as a CPU cluster does; anything else is a job
        storage = None

        def check(self, spec):
            raise SpecError(f"The cluster has no GPU for {spec.gpus_per_worker:g} per worker.")

        def __getattr__(self, name):
            raise AssertionError(f"went past the check: {name}")

    with pytest.raises(SpecError, match="no GPU for 1 per worker"):
        poc(NoGpus(), quick=True, gpus_per_worker=1, progress=lambda line: None)


def test_a_node_is_named_by_ip_id_or_its_placement_label():
    from ray_backend.attempts import Attempts

    attempts = Attempts.__new__(Attempts)
    attempts.ranks = {
        0: {"node_ip": "192.0.2.2", "node_id": "aabbccddeeff0011"},
        1: {"node_ip": "192.0.2.2", "node_id": "ffeeddccbbaa0011"},
    }
    assert attempts.ranks_on_node("192.0.2.2") == [0, 1]
    assert attempts.ranks_on_node("192-0-2-2-ffeedd") == [1]  # nodes sharing an IP
    assert attempts.ranks_on_node("aabbccdd") == [0] and attempts.ranks_on_node("aabb") == []


def test_placement_and_resources_reach_the_poc_as_a_launchs(monkeypatch):
    import shlex

    from jupyter_trainfactory import api, commands
    from jupyter_trainfactory.arguments import build_parser

    seen = {}
    monkeypatch.setattr(api, "poc", lambda *a, **kw: seen.update(kw))
    line = "poc --quick --placement spread --resources tf_slot=1 --resources rack=2"
    ns = build_parser().parse_args(shlex.split(line))
    commands.poc_from_args(ns, None, None, None)
    assert seen["placement"] == "spread" and seen["resources"] == ["tf_slot=1", "rack=2"]
    ns = build_parser().parse_args(["poc"])
    commands.poc_from_args(ns, None, None, None)
    assert seen["placement"] == "pack" and seen["resources"] == []
    with pytest.raises(CommandError, match="placement"):
        build_parser().parse_args(["poc", "--placement", "scatter"])


def test_one_rank_per_node_measures_across_nodes_only():
    m = {k: v for k, v in _metrics().items() if "/intra/" not in k}
    m.update({"poc/collectives/nodes": 2.0, "poc/allreduce/inter/16MiB/busbw_gb_per_s": 0.5})
    checks = _by_name(
        build_checks(m, {}, health=HEALTHY, accelerator="cpu", kill_step=25, thresholds=None)
    )
    assert checks["allreduce_inter_busbw_gb_per_s"].value == 0.5
    within = checks["allreduce_busbw_gb_per_s"]
    assert within.status == NA and "one rank per node" in within.detail, within
