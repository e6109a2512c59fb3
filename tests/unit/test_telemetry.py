"""Pure telemetry arithmetic: FLOPs, MFU, peaks, percentiles, energy, throughput, metric keys.

Every expected value is worked out by hand in the test (the arithmetic is written out), never
copied from running the code.
"""

from __future__ import annotations

import hashlib
import math
import random
import re

import pytest
from mlflow.utils.validation import _validate_metric_name

from jupyter_trainfactory.telemetry.flops import flops_per_token, lookup_peak, mfu
from jupyter_trainfactory.telemetry.keys import KeyMapper, clean_key, to_float
from jupyter_trainfactory.telemetry.stats import (
    EnergyMeter,
    JobThroughput,
    StepCounters,
    energy_kwh,
    percentile,
    summarize,
)

# GPT-2 small: N = 124M parameters, L = 12 layers, H = 12 heads, Q = 64, T = 1024.
GPT2_N = 124_000_000
GPT2_FLOPS = 6 * 124_000_000 + 12 * 12 * 12 * 64 * 1024  # 744_000_000 + 113_246_208
H100_SXM_PEAK = 989.5e12


def approx(x):
    return pytest.approx(x, rel=1e-12)


# --------------------------------------------------------------------------- flops / MFU


def test_flops_per_token_6n_only():
    assert flops_per_token(GPT2_N) == 6 * 124_000_000
    assert flops_per_token(GPT2_N) == 744_000_000
    assert flops_per_token(0) == 0


def test_flops_per_token_with_attention_term():
    # PaLM appendix B: 6N + 12 * L * H * Q * T
    got = flops_per_token(GPT2_N, layers=12, heads=12, head_dim=64, seq_len=1024)
    assert got == 6 * 124_000_000 + 12 * 12 * 12 * 64 * 1024
    assert got == 857_246_208
    # a small case: 6 * 10 + 12 * 2 * 3 * 4 * 5 = 60 + 1440
    assert flops_per_token(10, layers=2, heads=3, head_dim=4, seq_len=5) == 1500


@pytest.mark.parametrize(
    "shape",
    [
        {"layers": 12},
        {"layers": 12, "heads": 12},
        {"layers": 12, "heads": 12, "head_dim": 64},
        {"heads": 12, "head_dim": 64, "seq_len": 1024},
        {"seq_len": 1024},
    ],
)
def test_flops_per_token_partial_shape_raises(shape):
    with pytest.raises(ValueError):
        flops_per_token(GPT2_N, **shape)


def test_flops_per_token_bad_values_raise():
    with pytest.raises(ValueError):
        flops_per_token(-1)
    with pytest.raises(ValueError):
        flops_per_token(GPT2_N, layers=0, heads=12, head_dim=64, seq_len=1024)


def test_mfu_gpt2_small_on_h100_sxm():
    # 100,000 tokens/s per GPU * 857,246,208 FLOPs/token = 85,724,620,800,000 FLOP/s
    expected = 85_724_620_800_000 / 989_500_000_000_000
    assert mfu(100_000, GPT2_FLOPS, H100_SXM_PEAK) == approx(expected)
    assert mfu(100_000, GPT2_FLOPS, H100_SXM_PEAK) == approx(100_000 * GPT2_FLOPS / 989.5e12)
    # the peak as the table gives it for the NVML name of an H100 SXM
    peak = lookup_peak("NVIDIA H100 80GB HBM3")
    assert mfu(100_000, GPT2_FLOPS, peak) == approx(expected)
    assert mfu(0, GPT2_FLOPS, H100_SXM_PEAK) == 0


def test_mfu_non_positive_peak_raises():
    with pytest.raises(ValueError):
        mfu(100_000, GPT2_FLOPS, 0)
    with pytest.raises(ValueError):
        mfu(100_000, GPT2_FLOPS, -989.5e12)


@pytest.mark.parametrize(
    ("name", "dtype", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5e12),
        ("NVIDIA H100 80GB HBM3", "fp16", 989.5e12),
        ("NVIDIA H100 PCIe", "bf16", 756.5e12),
        ("NVIDIA H100 NVL", "bf16", 835.5e12),
        ("NVIDIA H200", "bf16", 989.5e12),
        ("NVIDIA H200 NVL", "bf16", 835.5e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100-SXM4-40GB", "fp16", 312e12),
        ("NVIDIA A100 80GB PCIe", "bf16", 312e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA L40S", "bf16", 362.05e12),
        ("NVIDIA B200", "bf16", 2250e12),
        ("Tesla V100-SXM2-16GB", "bf16", None),
        ("Tesla V100-SXM2-16GB", "fp16", 125e12),
        ("Tesla T4", "fp16", 65e12),
        ("Tesla T4", "bf16", None),
        ("NVIDIA A100-SXM4-40GB MIG 3g.20gb", "bf16", 312e12 * 3 / 7),
        ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "bf16", 989.5e12 / 7),
        ("cpu", "bf16", None),
        ("", "bf16", None),
        ("Intel(R) Xeon(R)", "bf16", None),
        ("Intel(R) Xeon(R)", "fp16", None),
    ],
)
def test_lookup_peak(name, dtype, expected):
    got = lookup_peak(name, dtype)
    if expected is None:
        assert got is None
    else:
        assert got == approx(expected)


def test_lookup_peak_l40s_is_not_l4():
    assert lookup_peak("NVIDIA L40S") == approx(362.05e12)
    assert lookup_peak("NVIDIA L40S") != lookup_peak("NVIDIA L4")


def test_lookup_peak_default_dtype_is_bf16():
    assert lookup_peak("Tesla V100-SXM2-16GB") is None
    assert lookup_peak("NVIDIA H100 PCIe") == approx(756.5e12)


@pytest.mark.parametrize("dtype", ["fp32", "BF16", "tf32", ""])
def test_lookup_peak_bad_dtype_raises(dtype):
    with pytest.raises(ValueError):
        lookup_peak("NVIDIA H100 80GB HBM3", dtype)
    with pytest.raises(ValueError):
        lookup_peak("cpu", dtype)


# --------------------------------------------------------------------------- percentile


def test_percentile_linear_like_numpy():
    v = [1, 2, 3, 4]
    # position (n - 1) * q / 100 in the sorted values
    assert percentile(v, 50) == approx(2 + 0.5 * (3 - 2))  # pos 1.5 -> 2.5
    assert percentile(v, 95) == approx(3 + 0.85 * (4 - 3))  # pos 2.85 -> 3.85
    assert percentile(v, 25) == approx(1 + 0.75 * (2 - 1))  # pos 0.75 -> 1.75
    assert percentile(v, 0) == 1
    assert percentile(v, 100) == 4
    # order of the input does not matter
    assert percentile([4, 1, 3, 2], 50) == approx(2.5)
    # [10, 20, 40], p90: pos 2 * 0.9 = 1.8 -> 20 + 0.8 * 20 = 36
    assert percentile([40, 10, 20], 90) == approx(20 + 0.8 * (40 - 20))


def test_percentile_agrees_with_numpy():
    np = pytest.importorskip("numpy")
    rng = random.Random(7)
    for n in (1, 2, 3, 5, 10, 37):
        values = [rng.uniform(-5, 5) for _ in range(n)]
        for q in (0, 1, 25, 50, 95, 99, 100):
            assert percentile(values, q) == approx(float(np.percentile(values, q)))


def test_percentile_single_value():
    for q in (0, 37.5, 50, 95, 100):
        assert percentile([7.25], q) == 7.25


def test_percentile_errors():
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1, 2], -0.1)
    with pytest.raises(ValueError):
        percentile([1, 2], 100.5)


# --------------------------------------------------------------------------- summarize / energy


def test_summarize():
    assert summarize([3.0, 1.0, 2.0]) == {"min": 1.0, "mean": (3 + 1 + 2) / 3, "max": 3.0}
    assert summarize(x for x in (10, 20)) == {"min": 10, "mean": 15, "max": 20}
    assert summarize([5]) == {"min": 5, "mean": 5, "max": 5}
    assert summarize([]) == {}


def test_energy_kwh_constant_power():
    # 300 W for 3600 s = 1,080,000 J = 0.3 kWh
    assert energy_kwh([0, 1800, 3600], [300, 300, 300]) == approx(300 * 3600 / 3.6e6)
    assert energy_kwh([0, 1800, 3600], [300, 300, 300]) == approx(0.3)


def test_energy_kwh_ramp():
    # 0 -> 100 W linearly over 10 s: area of the triangle 10 * 100 / 2 = 500 J
    times = list(range(11))
    power = [10 * t for t in times]
    assert energy_kwh(times, power) == approx(500 / 3.6e6)
    assert energy_kwh([0, 10], [0, 100]) == approx(500 / 3.6e6)


def test_energy_kwh_short_traces():
    assert energy_kwh([], []) == 0
    assert energy_kwh([5.0], [250.0]) == 0


def test_energy_kwh_errors():
    with pytest.raises(ValueError):
        energy_kwh([0, 1, 2], [100, 100])
    with pytest.raises(ValueError):
        energy_kwh([0, 1, 1], [100, 100, 100])
    with pytest.raises(ValueError):
        energy_kwh([0, 2, 1], [100, 100, 100])


def test_energy_meter_two_devices_out_of_order_and_gap():
    meter = EnergyMeter(max_gap_s=30)
    meter.add("gpu0", 0, 100)
    meter.add("gpu1", 0, 50)
    meter.add("gpu0", 10, 200)  # gpu0: (100 + 200) / 2 * 10 = 1500 J
    meter.add("gpu1", 4, 150)  # gpu1: (50 + 150) / 2 * 4 = 400 J
    meter.add("gpu0", 5, 999)  # older than gpu0's last sample: ignored
    meter.add("gpu1", 4, 1000)  # same time as gpu1's last sample: ignored
    meter.add("gpu0", 20, 200)  # gpu0: (200 + 200) / 2 * 10 = 2000 J (not 999 at t=5)
    meter.add("gpu0", 100, 300)  # gap of 80 s > 30 s: not integrated, counted in gap_s
    meter.add("gpu0", 110, 100)  # gpu0: (300 + 100) / 2 * 10 = 2000 J
    meter.add("gpu1", 34, 150)  # gpu1: exactly max_gap_s is integrated: 150 * 30 = 4500 J
    expected_j = 1500 + 400 + 2000 + 2000 + 4500
    assert meter.joules == approx(expected_j)
    assert meter.gap_s == 80
    assert meter.kwh == approx(expected_j / 3.6e6)


def test_energy_meter_empty():
    meter = EnergyMeter()
    assert meter.joules == 0
    assert meter.kwh == 0
    assert meter.gap_s == 0
    meter.add("gpu0", 1.0, 300.0)  # one sample: no interval yet
    assert meter.kwh == 0


# --------------------------------------------------------------------------- JobThroughput

# Two ranks; the workers' clocks agree with the driver's (derive's `now`).
R0_A = StepCounters(
    time=200.0,
    steps=10,
    samples=80,
    tokens=80 * 1024,
    step_time_s=4.0,
    data_wait_s=1.0,
    comm_s=0.5,
)
R1_A = StepCounters(
    time=200.0,
    steps=5,
    samples=40,
    tokens=40 * 1024,
    step_time_s=2.5,
    data_wait_s=0.5,
    comm_s=0.25,
)
# rank 0, 4 s later: +10 steps, +160 samples, +160 * 1024 tokens, +3.5 s in steps,
# +0.5 s data wait, +1.0 s allreduce
R0_B = StepCounters(
    time=204.0,
    steps=20,
    samples=240,
    tokens=240 * 1024,
    step_time_s=7.5,
    data_wait_s=1.5,
    comm_s=1.5,
    step_times=[1.0, 2.0, 3.0, 4.0],
)
# rank 1, 5 s later: +8 steps, +100 samples, +100 * 1024 tokens, +4.5 s in steps,
# +1.0 s data wait, +0.5 s allreduce
R1_B = StepCounters(
    time=205.0,
    steps=13,
    samples=140,
    tokens=140 * 1024,
    step_time_s=7.0,
    data_wait_s=1.5,
    comm_s=0.75,
    step_times=[6.0, 5.0],
)

# Expected numbers for the window A -> B:
SAMPLES_PER_S = 160 / 4 + 100 / 5  # 40 + 20 = 60
TOKENS_PER_S = 160 * 1024 / 4 + 100 * 1024 / 5  # 40960 + 20480 = 61440
TOKENS_PER_S_PER_WORKER = TOKENS_PER_S / 2  # 30720
STEP_TIME_S = (3.5 + 4.5) / (10 + 8)  # 4/9
# durations [1, 2, 3, 4, 5, 6]: p50 at pos 2.5 -> 3.5; p95 at pos 4.75 -> 5 + 0.75 * 1
STEP_P50 = 3.5
STEP_P95 = 5.75
DATA_WAIT_FRACTION = (0.5 / 4 + 1.0 / 5) / 2  # (0.125 + 0.2) / 2 = 0.1625
COMM_FRACTION = (1.0 / 4 + 0.5 / 5) / 2  # (0.25 + 0.1) / 2 = 0.175
COMM_S = (1.0 + 0.5) / (10 + 8)  # 1/12 s of allreduce per step
SAMPLES_TOTAL = 240 + 140
TOKENS_TOTAL = 240 * 1024 + 140 * 1024


def _fed(**kwargs) -> JobThroughput:
    jt = JobThroughput(**kwargs)
    jt.update(0, R0_A)
    jt.update(1, R1_A)
    return jt


def _assert_same(got: dict, expected: dict) -> None:
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert got[key] == approx(value), key


def test_job_throughput_first_derive_has_no_rates():
    jt = _fed(gpus_per_worker=1, flops_per_token=GPT2_FLOPS, peak_flops=H100_SXM_PEAK)
    # one snapshot per rank: totals only, no rate, step time, fraction or MFU
    assert jt.derive(now=205.0) == {
        "train/samples": 80 + 40,
        "train/tokens": 80 * 1024 + 40 * 1024,
    }
    assert jt.derive(now=206.0) == {"train/samples": 120, "train/tokens": 122880}


def test_job_throughput_two_ranks_exact():
    jt = _fed(gpus_per_worker=1, flops_per_token=GPT2_FLOPS, peak_flops=H100_SXM_PEAK)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(1, R1_B)
    got = jt.derive(now=205.0)
    _assert_same(
        got,
        {
            "train/samples": SAMPLES_TOTAL,
            "train/tokens": TOKENS_TOTAL,
            "train/samples_per_s": SAMPLES_PER_S,
            "train/tokens_per_s": TOKENS_PER_S,
            "train/tokens_per_s_per_worker": TOKENS_PER_S_PER_WORKER,
            "train/tokens_per_s_per_gpu": TOKENS_PER_S_PER_WORKER / 1,
            "train/mfu": 30720 * GPT2_FLOPS / 989.5e12,
            "train/step_time_s": STEP_TIME_S,
            "train/step_time_p50_s": STEP_P50,
            "train/step_time_p95_s": STEP_P95,
            "train/data_wait_fraction": DATA_WAIT_FRACTION,
            "train/comm_fraction": COMM_FRACTION,
            "train/comm_s": COMM_S,
        },
    )
    assert got["train/samples_per_s"] == approx(60)
    assert got["train/tokens_per_s"] == approx(61440)
    assert got["train/step_time_s"] == approx(4 / 9)
    assert got["train/data_wait_fraction"] == approx(0.1625)
    assert got["train/comm_fraction"] == approx(0.175)
    assert got["train/comm_s"] == approx(1 / 12)
    assert jt.steps == 20  # rank 0's steps, not rank 1's 13


def test_job_throughput_two_gpus_per_worker():
    jt = _fed(gpus_per_worker=2, flops_per_token=GPT2_FLOPS, peak_flops=H100_SXM_PEAK)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(1, R1_B)
    got = jt.derive(now=205.0)
    assert got["train/tokens_per_s_per_worker"] == approx(30720)
    assert got["train/tokens_per_s_per_gpu"] == approx(30720 / 2)
    assert got["train/mfu"] == approx(15360 * GPT2_FLOPS / 989.5e12)


def test_job_throughput_cpu_and_no_peak():
    # CPU (gpus_per_worker=0): no _per_gpu key; no peak: no MFU, never made up
    jt = _fed(gpus_per_worker=0, flops_per_token=GPT2_FLOPS, peak_flops=None)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(1, R1_B)
    got = jt.derive(now=205.0)
    assert "train/tokens_per_s_per_gpu" not in got
    assert "train/mfu" not in got
    assert got["train/tokens_per_s"] == approx(61440)
    assert got["train/tokens_per_s_per_worker"] == approx(30720)
    assert got["train/step_time_s"] == approx(4 / 9)


def test_job_throughput_no_flops_count_no_mfu():
    jt = _fed(gpus_per_worker=1, flops_per_token=None, peak_flops=H100_SXM_PEAK)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(1, R1_B)
    got = jt.derive(now=205.0)
    assert "train/mfu" not in got
    assert got["train/tokens_per_s_per_gpu"] == approx(30720)


def test_job_throughput_stale_rank_counts_with_rate_zero():
    jt = _fed(gpus_per_worker=1, stale_s=10.0)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(1, R1_B)
    jt.derive(now=205.0)
    # no new counters, rank 1 last seen 3 s ago (< stale_s): the last rates are kept
    held = jt.derive(now=208.0)
    assert held["train/samples_per_s"] == approx(60)
    assert held["train/tokens_per_s"] == approx(61440)
    # rank 0, 4 s later: +160 samples, +160 * 1024 tokens, +0.5 s data wait, +1.0 s comm;
    # rank 1 sends nothing and was last seen 216 - 205 = 11 s ago (> stale_s)
    jt.update(
        0,
        StepCounters(
            time=208.0,
            steps=30,
            samples=400,
            tokens=400 * 1024,
            step_time_s=11.0,
            data_wait_s=2.0,
            comm_s=2.5,
        ),
    )
    got = jt.derive(now=216.0)
    assert got["train/samples_per_s"] == approx(160 / 4 + 0)
    assert got["train/tokens_per_s"] == approx(160 * 1024 / 4 + 0)
    assert got["train/tokens_per_s_per_worker"] == approx(40960 / 2)
    assert got["train/tokens_per_s_per_gpu"] == approx(40960 / 2)
    assert got["train/data_wait_fraction"] == approx((0.5 / 4 + 0) / 2)
    assert got["train/comm_fraction"] == approx((1.0 / 4 + 0) / 2)
    # only rank 0 moved: 3.5 s over 10 steps, 1.0 s of allreduce over 10 steps
    assert got["train/step_time_s"] == approx(3.5 / 10)
    assert got["train/comm_s"] == approx(1.0 / 10)
    assert got["train/samples"] == 400 + 140
    assert jt.steps == 30


def test_job_throughput_fsdp_collectives_and_ingest():
    # FSDP2 ranks: comm_s holds the all-gathers and reduce-scatters, each also by kind;
    # a Ray Data shard's rows are the ingest (summed over ranks)
    jt = JobThroughput(world_size=2)
    for rank in (0, 1):
        jt.update(rank, StepCounters(time=100.0, steps=0))
    jt.derive(now=100.0)
    # in 2 s each rank: 4 steps, 0.6 s all-gather + 0.2 s reduce-scatter, 256 rows
    for rank in (0, 1):
        jt.update(
            rank,
            StepCounters(
                time=102.0,
                steps=4,
                comm_s=0.8,
                all_gather_s=0.6,
                reduce_scatter_s=0.2,
                ingest_rows=256,
            ),
        )
    got = jt.derive(now=102.0)
    assert got["train/comm_s"] == approx(0.8 / 4)
    assert got["train/all_gather_s"] == approx(0.6 / 4)
    assert got["train/reduce_scatter_s"] == approx(0.2 / 4)
    assert got["train/comm_fraction"] == approx(0.4)
    assert got["train/ingest_rows"] == 512
    assert got["train/ingest_rows_per_s"] == approx(256)


def test_job_throughput_without_fsdp_or_ray_data_has_no_such_keys():
    jt = _fed(gpus_per_worker=1)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(1, R1_B)
    got = jt.derive(now=205.0)
    assert not {"train/all_gather_s", "train/reduce_scatter_s", "train/ingest_rows"} & set(got)


def test_job_throughput_restart_resets_baseline():
    jt = JobThroughput(gpus_per_worker=1)
    jt.update(0, R0_A)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    assert jt.derive(now=204.0)["train/samples_per_s"] == approx(160 / 4)
    # the worker restarts: steps go back from 20 to 2; a new baseline, no rate yet
    jt.update(0, StepCounters(time=210.0, steps=2, samples=16, tokens=16 * 1024))
    assert jt.steps == 2
    # step durations already seen stay in the p50/p95 window: [1, 2, 3, 4] from R0_B
    _assert_same(
        jt.derive(now=210.0),
        {
            "train/samples": 16,
            "train/tokens": 16 * 1024,
            "train/step_time_p50_s": 2.5,
            "train/step_time_p95_s": 3 + 0.85 * 1,
        },
    )
    # 2 s later: +32 samples and +32 * 1024 tokens over the new baseline (not over R0_B)
    jt.update(0, StepCounters(time=212.0, steps=6, samples=48, tokens=48 * 1024))
    got = jt.derive(now=212.0)
    assert got["train/samples_per_s"] == approx(32 / 2)
    assert got["train/tokens_per_s"] == approx(32 * 1024 / 2)
    assert got["train/tokens_per_s_per_gpu"] == approx(16384)
    assert got["train/samples"] == 48
    assert jt.steps == 6


def test_job_throughput_ignores_old_and_repeated_counters():
    jt = JobThroughput()
    jt.update(0, R0_A)
    jt.derive(now=200.0)
    jt.update(0, R0_B)
    jt.update(0, R0_B)  # repeated
    jt.update(0, StepCounters(time=203.0, steps=99, samples=10_000))  # older than R0_B
    got = jt.derive(now=204.0)
    assert got["train/samples_per_s"] == approx((240 - 80) / (204 - 200))
    assert got["train/samples"] == 240
    # durations of R0_B once (repeat ignored): [1, 2, 3, 4]; p95 at pos 2.85 -> 3.85
    assert got["train/step_time_p50_s"] == approx(2.5)
    assert got["train/step_time_p95_s"] == approx(3 + 0.85 * 1)
    assert jt.steps == 20


def test_job_throughput_steps_is_lowest_rank():
    jt = JobThroughput()
    assert jt.steps == 0
    assert jt.derive(now=0.0) == {}
    jt.update(1, R1_A)
    assert jt.steps == 5  # only rank 1 seen so far
    jt.update(0, R0_A)
    assert jt.steps == 10
    jt.update(1, R1_B)
    assert jt.steps == 10  # still rank 0's


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("val acc%", "val acc_"),
        ("a//b/", "a/b"),
        ("é", "_"),
        ("/loss/", "loss"),
        ("train/loss", "train/loss"),
        ("a:b-c.d e_f", "a:b-c.d e_f"),
        ("loss(val)", "loss_val_"),
        ("", "_"),
        ("///", "_"),
        (3, "3"),
    ],
)
def test_clean_key(raw, expected):
    assert clean_key(raw) == expected


def test_clean_key_long():
    key = "k" * 300
    out = clean_key(key)
    assert len(out) == 250
    assert re.fullmatch(r"k{241}-[0-9a-f]{8}", out)
    # 241 kept characters + "-" + 8 hex digits of the SHA-1 of the raw key = 250
    assert out == "k" * 241 + "-" + hashlib.sha1(key.encode()).hexdigest()[:8]
    _validate_metric_name(out)  # MLflow accepts it
    assert clean_key(key) == out  # the same input maps the same way
    other = "k" * 299 + "j"  # same first 250 (and 299) characters
    assert clean_key(other) != out
    assert len(clean_key(other)) == 250
    # exactly 250 characters is left alone
    assert clean_key("k" * 250) == "k" * 250


def test_key_mapper_stable():
    m = KeyMapper()
    first = m("val acc%")
    assert first == "val acc_"
    assert m("val acc%") == first
    assert m("val acc%") == first
    assert len(m) == 1


def test_key_mapper_prefix_conflicts():
    m = KeyMapper()
    assert m("loss") == "loss"
    assert m("loss/val") == "loss_/val"  # "loss" is a metric, so it cannot be a folder
    assert m("loss") == "loss"

    m = KeyMapper()
    assert m("a/b") == "a/b"
    assert m("a") == "a_"  # "a" is a folder, so it cannot be a metric
    assert m("a/c") == "a/c"  # siblings in the folder are fine


def test_key_mapper_same_clean_text_distinct():
    m = KeyMapper()
    assert m("x%") == "x_"
    assert m("x#") == "x__"
    assert m("x%") == "x_"
    assert m("x#") == "x__"


def test_key_mapper_renamed():
    m = KeyMapper()
    m("loss")
    m("loss/val")
    m("ok/key")
    m("val acc%")
    m("val acc%")
    assert m.renamed == {"loss/val": "loss_/val", "val acc%": "val acc_"}
    assert len(m) == 4


def test_key_mapper_no_prefix_among_many_keys():
    rng = random.Random(1234)
    segments = ["loss", "val", "acc", "a", "b", "lr", "x%", "é", "loss_", "gpu 0", ""]
    raw_keys = []
    for _ in range(200):
        depth = rng.randint(1, 4)
        raw_keys.append("/".join(rng.choice(segments) for _ in range(depth)))
    m = KeyMapper()
    mapped = {raw: m(raw) for raw in raw_keys}
    # stable: asking again gives the same key
    assert all(m(raw) == key for raw, key in mapped.items())
    assert len(m) == len(mapped)
    keys = list(mapped.values())
    assert len(set(keys)) == len(keys)  # distinct raw keys -> distinct MLflow keys
    for a in keys:
        assert re.fullmatch(r"[\w\-. /:]+", a, re.ASCII)
        assert len(a) <= 250
        for b in keys:
            if a != b:
                assert not b.startswith(a + "/"), (a, b)
    # renamed is exactly the keys that changed
    assert m.renamed == {raw: key for raw, key in mapped.items() if raw != key}


# --------------------------------------------------------------------------- to_float


def test_to_float_python_values():
    assert to_float(True) == 1.0
    assert to_float(False) == 0.0
    assert type(to_float(True)) is float
    assert to_float(3) == 3.0
    assert type(to_float(3)) is float
    assert to_float(2.5) == 2.5
    assert to_float("1.5") is None
    assert to_float(None) is None
    assert to_float([1.0]) is None
    assert math.isnan(to_float(float("nan")))
    assert to_float(float("inf")) == math.inf
    assert to_float(-math.inf) == -math.inf


def test_to_float_numpy():
    np = pytest.importorskip("numpy")
    assert to_float(np.float32(0.5)) == 0.5
    assert to_float(np.float64(0.25)) == 0.25
    assert to_float(np.int64(7)) == 7.0
    assert type(to_float(np.int64(7))) is float
    assert to_float(np.bool_(True)) == 1.0
    assert to_float(np.array(1.5)) == 1.5  # 0-d array
    assert math.isnan(to_float(np.float64("nan")))
    assert to_float(np.array([1.0, 2.0])) is None  # .item() refuses two values


def test_to_float_torch():
    torch = pytest.importorskip("torch")
    assert to_float(torch.tensor(2.5)) == 2.5
    assert to_float(torch.tensor(3)) == 3.0
    assert to_float(torch.tensor(True)) == 1.0
    assert to_float(torch.tensor(0.5, dtype=torch.bfloat16)) == 0.5
    assert math.isnan(to_float(torch.tensor(float("nan"))))
    assert to_float(torch.tensor([1.0, 2.0])) is None  # .item() refuses two values


def test_clean_key_dot_segments_become_underscores():
    # MLflow refuses a name that posixpath.normpath would change ("a/./b" -> "a/b").
    assert clean_key("a/./b") == "a/_/b"
    assert clean_key("..") == "__"
    assert clean_key("../x") == "__/x"
    assert clean_key("x/.") == "x/_"
    assert clean_key("a.b/.c") == "a.b/.c"  # dots inside a segment are fine


def test_key_mapper_suffix_never_exceeds_250_characters():
    m = KeyMapper()
    first = m("a" * 249 + "%")  # cleans to 249 a's + "_"
    second = m("a" * 249 + "#")  # same clean text: needs a suffix, which must not overflow
    assert len(first) == 250 and len(second) <= 250 and second != first
    m = KeyMapper()
    m("ab")
    nested = m("ab/" + "c" * 247)  # "ab_/ccc..." would be 251 characters
    assert len(nested) <= 250 and not nested.startswith("ab/")


def test_job_throughput_waits_for_every_rank_of_a_known_world_size():
    jt = JobThroughput(world_size=2)
    jt.update(0, R0_A)
    jt.update(1, R1_A)
    jt.derive(now=200.0)
    jt.update(0, R0_B)  # rank 1 has no second batch yet: no partial sum
    assert "train/samples_per_s" not in jt.derive(now=204.0)
    jt.update(1, R1_B)
    assert "train/samples_per_s" in jt.derive(now=208.0)
