"""GPU check: the real NVML readers and the MFU computation around a bf16 matmul workload.

Needs only torch, nvidia-ml-py and ``jupyter_trainfactory.telemetry`` (no Ray, no MLflow).
On one GPU, for about a minute in all, it:

1. reads the GPUs this process sees (``visible_gpus``) and one idle sample of each;
2. runs ``M x K @ K x N`` bf16 matmuls for ``--seconds`` while a thread samples NVML
   every 0.25 s, and measures the FLOP/s directly (``2*M*N*K`` per matmul over CUDA-synced
   wall time);
3. computes MFU the way a job does (``JobThroughput`` with a row of the left matrix as a
   "token" and ``2*N*K`` FLOPs per token, the peak from ``lookup_peak(device name)``) and
   prints it next to the direct figure (they must agree), with utilization, power, clocks,
   temperature and the energy integral;
4. runs the NodeSampler (``ray_backend.sampler``, no Ray needed) with the GPU chosen by
   index, by UUID and by UUID prefix in ``CUDA_VISIBLE_DEVICES``, and with none;
5. times gradient allreduces through the worker's DDP comm hook on NCCL (one rank), the
   CUDA-event path of ``ray_backend.session``.

Prints one JSON object at the end (also written to ``--json PATH``). Exit code 0; 2 when
there is no CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_trainfactory.telemetry.flops import lookup_peak  # noqa: E402
from jupyter_trainfactory.telemetry.stats import EnergyMeter, JobThroughput, StepCounters  # noqa: E402
from jupyter_trainfactory.telemetry.system import gpu_sample, init_nvml, visible_gpus  # noqa: E402


def _sampler(pynvml, device, stop: threading.Event, out: list, period: float = 0.25) -> None:
    while not stop.wait(period):
        out.append((time.time(), gpu_sample(pynvml, device.handle)))


class _Calls:
    """Stands in for the RunRecorder actor handle: records ``.remote`` calls."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        outer = self

        class _Method:
            def remote(self, *args):
                outer.calls.append((name, args))

        return _Method()


def _sampler_check(devices) -> dict:
    """The NodeSampler on this GPU: devices chosen by CUDA_VISIBLE_DEVICES, one sample."""
    from ray_backend.sampler import NodeSampler

    uuid = devices[0].uuid
    out = {}
    for label, cvd in (
        ("index", "0"),
        ("uuid", uuid),
        ("uuid_prefix", uuid[:12]),
        ("empty", ""),
        ("invalid", "7"),
    ):
        recorder = _Calls()
        sampler = NodeSampler(recorder, "127.0.0.1", interval_s=3600)
        watched = sampler.watch_devices(cvd)
        sample = sampler.sample()
        sampler.stop()
        out[f"sampler_{label}"] = {
            "watched": watched,
            "gpu_keys": sorted(k.split("/", 2)[2] for k in sample if "/gpu" in k),
            "gpu_info": [a[1] for n, a in recorder.calls if n == "gpu_info"],
        }
    return out


def _ddp_comm_check(torch) -> dict:
    """One-rank NCCL DDP with the worker's timing comm hook; returns what it measured."""
    import torch.distributed as dist

    from ray_backend import session

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29512")
    dist.init_process_group("nccl", rank=0, world_size=1)
    try:
        telemetry = session.WorkerTelemetry(send=None)
        session._current = telemetry
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(*[torch.nn.Linear(4096, 4096) for _ in range(8)]).cuda(),
            device_ids=[0],
        )
        session.watch(model)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        x = torch.randn(256, 4096, device="cuda")
        steps = 30
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            with session.step(samples=256):
                opt.zero_grad()
                model(x).square().mean().backward()
                opt.step()
                torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        batch = telemetry.batch()
        counters = batch["counters"]
        return {
            "ddp_steps": steps,
            "ddp_step_time_s": elapsed / steps,
            "ddp_comm_s_per_step": counters["comm_s"] / steps,
            "ddp_n_params": batch["model"]["n_params"],
        }
    finally:
        session._current = None
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="matmul workload length")
    parser.add_argument("--size", type=int, default=8192, help="M = N = K")
    parser.add_argument("--json", help="also write the result here")
    parser.add_argument("--no-ddp", action="store_true", help="skip the NCCL comm-hook check")
    args = parser.parse_args(argv)

    try:
        import pynvml
    except ImportError:
        pynvml = None
    import torch

    note = init_nvml(pynvml)
    devices = [] if note else visible_gpus(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES"))
    print(note or f"NVML ok; visible GPUs: {[(d.label, d.name, d.uuid) for d in devices]}")
    if not torch.cuda.is_available() or not devices:
        print("no CUDA device here: nothing to check.")
        return 2
    device = devices[0]
    torch_name = torch.cuda.get_device_name(0)
    idle = gpu_sample(pynvml, device.handle)
    print(f"device {device.label}: NVML name {device.name!r}, torch name {torch_name!r}")
    print(f"idle sample: {idle}")

    n = args.size
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):  # warm up cuBLAS and the clocks
        a @ b
    torch.cuda.synchronize()

    samples: list = []
    stop = threading.Event()
    thread = threading.Thread(target=_sampler, args=(pynvml, device, stop, samples), daemon=True)
    thread.start()
    rows = 0
    matmuls = 0
    throughput = JobThroughput(gpus_per_worker=1)
    throughput.flops_per_token = 2.0 * n * n  # one row of A times B: 2*N*K FLOPs
    throughput.peak_flops = lookup_peak(device.name) or lookup_peak(torch_name)
    t_start = time.time()
    throughput.update(0, StepCounters(time=t_start))
    deadline = time.perf_counter() + args.seconds
    t0 = time.perf_counter()
    while time.perf_counter() < deadline:
        for _ in range(50):
            a @ b
        torch.cuda.synchronize()
        matmuls += 50
        rows += 50 * n
    elapsed = time.perf_counter() - t0
    throughput.update(0, StepCounters(time=t_start + elapsed, steps=matmuls, tokens=float(rows)))
    derived = throughput.derive(time.time())
    stop.set()
    thread.join()

    direct_flops = 2.0 * n * n * n * matmuls / elapsed
    peak = throughput.peak_flops
    meter = EnergyMeter()
    for t, s in samples:
        if s.get("power_w") is not None:
            meter.add(device.label, t, s["power_w"])

    def series(key):
        return [s[key] for _, s in samples if s.get(key) is not None]

    def med(key):
        values = series(key)
        return statistics.median(values) if values else None

    result = {
        "device": device.name,
        "torch_device": torch_name,
        "uuid": device.uuid,
        "peak_tflops": peak / 1e12 if peak else None,
        "matmul_size": n,
        "matmuls": matmuls,
        "seconds": elapsed,
        "direct_tflops": direct_flops / 1e12,
        "direct_mfu": direct_flops / peak if peak else None,
        "telemetry_mfu": derived.get("train/mfu"),
        "telemetry_tokens_per_s_per_gpu": derived.get("train/tokens_per_s_per_gpu"),
        "nvml_samples": len(samples),
        "utilization_median_pct": med("utilization"),
        "power_median_w": med("power_w"),
        "power_max_w": max(series("power_w"), default=None),
        "sm_clock_median_mhz": med("sm_clock_mhz"),
        "temperature_max_c": max(series("temperature_c"), default=None),
        "memory_used_max_mb": max(series("memory_used_mb"), default=None),
        "memory_total_mb": idle.get("memory_total_mb"),
        "energy_kwh": meter.kwh,
        "joules_per_tflop": meter.joules / (direct_flops * elapsed / 1e12)
        if meter.joules
        else None,
        "unavailable_fields": sorted(k for k, v in idle.items() if v is None),
    }
    result.update(_sampler_check(devices))
    if not args.no_ddp:
        result.update(_ddp_comm_check(torch))

    print(f"matmul bf16 {n}^3 x {matmuls} in {elapsed:.1f} s")
    print(f"  FLOP/s measured directly : {result['direct_tflops']:.1f} TFLOP/s")
    if peak:
        print(f"  peak (data sheet)        : {peak / 1e12:.1f} TFLOP/s")
        print(
            f"  MFU direct / telemetry   : {result['direct_mfu']:.4f} / {result['telemetry_mfu']:.4f}"
        )
    else:
        print("  MFU unavailable: this device is not in the peak table")
    print(
        f"  NVML: utilization {result['utilization_median_pct']} % (median),"
        f" power {result['power_median_w']} W (median), SM clock"
        f" {result['sm_clock_median_mhz']} MHz, max temperature {result['temperature_max_c']} C"
    )
    print(f"  energy {result['energy_kwh'] * 1000:.3f} Wh, {result['joules_per_tflop']} J/TFLOP")
    if "ddp_comm_s_per_step" in result:
        print(
            f"  DDP (NCCL, 1 rank): {result['ddp_step_time_s'] * 1000:.2f} ms/step, allreduce"
            f" {result['ddp_comm_s_per_step'] * 1000:.2f} ms/step, {result['ddp_n_params']} params"
        )
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
