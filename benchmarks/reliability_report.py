"""The reliability report over a fleet's worth of job runs: does it finish in a minute?

Starts a real MLflow server on SQLite (``services.ensure_services(ray=False)`` in a fresh
``TRAINFACTORY_HOME``: a temporary directory, removed at the end), fills it with
``--runs`` synthetic job runs, then times ``fleet.report.reliability_report``
reading them back through the server's REST API (tracking URI ``http://...``), exactly as
a user's kernel does: MLflow's search in pages of 1,000, tags, params and latest metrics,
no metric history, eight time slices two at a time against the server's two workers,
each page's JSON read as it is (``fleet.rest_runs``).

The runs are what the recorder leaves in a run when a job ends: the tags (job id, owner,
project, cluster, state, the failure log and its counts, the placement, the device,
the environment, the ranks' workers, the goodput timeline, the checkpoint, ...), the
params (resources and a config of about 25 keys) and one point of every summary metric
(``train/*``, ``system/<node>/*`` with each GPU's series, ``goodput/*``, ``badput/*``,
``cost/*``, ``faults/*``, ``energy/*`` and the user's own), on average 50 tags, 32
params and 75 metrics a run (15 kB of the search's JSON), so that the search's payload is a real one's. The fleet: 12 owners, 6
projects, 3 experiments, 2 clusters of 16 nodes, GPU (H100, 1 to 16 per job) and CPU
jobs over the last 30 days, failures of every kind on some of them (node ``10-0-0-7``
of the first cluster fails 6 times as often: a lemon), user errors, planned stops and a
few jobs still running.

For speed the fill writes straight into the server's SQLite database through MLflow's
own ``SqlAlchemyStore`` (its engine and its table models, bulk inserts, one point in
``metrics`` and ``latest_metrics`` per key) rather than through the REST API; only the
report's read goes through the server.

Prints the fill time, the load average, the report's time, runs read, runs/s, the
report's first lines (``views.report_text``) and, on its last line, the ratio report
time / 60 s (goal <= 1.0). Exits non-zero when the report does not count every run.
``--profile`` prints cProfile's top functions of the report.

Usage: python benchmarks/reliability_report.py [--runs 10000] [--seed 7] [--profile]
Short: python benchmarks/reliability_report.py --runs 300
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_trainfactory import tracking  # noqa: E402
from jupyter_trainfactory.fleet import kinds  # noqa: E402
from jupyter_trainfactory.telemetry.goodput import BADPUT_CATEGORIES  # noqa: E402
from jupyter_trainfactory.tracking import TAG  # noqa: E402

GOAL_S = 60.0
DAY = 86400.0
OWNERS = [f"user{i:02d}" for i in range(12)]
PROJECTS = ["llm-pretrain", "vision", "recsys", "speech", "rl", "eval"]
EXPERIMENTS = ["fleet/pretrain", "fleet/finetune", "fleet/sweeps"]
CLUSTERS = {  # dashboard -> node labels
    "http://10.0.0.1:8265": [f"10-0-0-{i}" for i in range(1, 17)],
    "http://10.1.0.1:8265": [f"10-1-0-{i}" for i in range(1, 17)],
}
LEMON = "10-0-0-7"
GPUS_PER_NODE = 8
INFRA_KINDS = (kinds.WORKER_CRASH, kinds.NODE_LOSS, kinds.PREEMPTION, kinds.STALL)
HOST_KEYS = ("cpu_utilization", "memory_used_mb", "memory_percent", "net_rx_mb_s", "net_tx_mb_s")
GPU_KEYS = ("utilization", "memory_used_mb", "power_w", "temperature_c")
TRAIN_KEYS = (
    "samples", "samples_per_s", "tokens", "tokens_per_s", "tokens_per_s_per_worker",
    "tokens_per_s_per_gpu", "mfu", "step_time_s", "step_time_p50_s", "step_time_p95_s",
    "data_wait_fraction", "comm_fraction", "comm_s", "nonfinite_count",
)  # fmt: skip
USER_KEYS = ("loss", "val_loss", "lr", "accuracy", "grad_norm", "epoch")


class ServerReader:
    """What ``reliability_report`` needs of a ``JobManager``: its ``mlflow_client`` (here
    on the server's REST API) and ``experiment_ids(name)``."""

    def __init__(self, tracking_uri: str):
        self.tracking_uri = tracking_uri
        self.mlflow_client = tracking.client(tracking_uri)

    def experiment_ids(self, name: str | None) -> list[str] | None:
        if not name:
            return None
        exp = self.mlflow_client.get_experiment_by_name(tracking.experiment_name(name))
        return [exp.experiment_id] if exp else []


def _placement(rng: random.Random, nodes: list[str], ranks: int, per_node: int) -> dict:
    """``{"strategy", "min_nodes", "nodes": {label: [ranks]}, "ranks": {rank: label}}``."""
    used = rng.sample(nodes, max(1, -(-ranks // per_node)))
    by_node = {n: [r for r in range(ranks) if r // per_node == i] for i, n in enumerate(used)}
    by_node = {n: r for n, r in by_node.items() if r}
    ranks_of = {str(r): n for n, rs in by_node.items() for r in rs}
    return {"strategy": "PACK", "min_nodes": len(by_node), "nodes": by_node, "ranks": ranks_of}


def _failures(rng: random.Random, job: dict, placed: dict) -> list[dict]:
    """The failure rows (``FailureRecord`` fields, ``kind``, ``rank``, ``node``), oldest first."""
    nodes = list(placed["nodes"])
    weights = [6.0 if n == LEMON else 1.0 for n in nodes]
    chance = 0.12 * (6.0 if LEMON in nodes else 1.0) * min(len(nodes), 4) / 4
    count = 0
    while rng.random() < chance and count < 4:
        count += 1
        chance *= 0.5
    if job["status"] == "FAILED" and rng.random() < 0.5:
        count += 1  # the one that ended it (a user error or the last infrastructure one)
    rows = []
    for i in range(count):
        t = job["start"] + job["wall_s"] * (i + 1) / (count + 1)
        last_user = job["status"] == "FAILED" and i == count - 1 and rng.random() < 0.6
        kind = kinds.USER_ERROR if last_user else rng.choice(INFRA_KINDS)
        node = rng.choices(nodes, weights)[0]
        rank = rng.choice(placed["nodes"][node])
        reached = int((t - job["start"]) / 0.5)
        restored = max(0, reached - rng.randint(0, 400))
        recovered = kind != kinds.USER_ERROR and rng.random() < 0.9
        mttr = rng.uniform(20, 600) if recovered else None
        rows.append(
            {"time": t, "kind": kind, "step_reached": reached,
             "restored_step": restored if recovered else None,
             "steps_lost": reached - restored if recovered else None, "mttr_s": mttr,
             "detected": t + rng.uniform(0.5, 30),
             "restored": t + mttr * 0.6 if mttr else None, "rank": rank, "node": node}
        )  # fmt: skip
    return rows


def _counts(rows: list[dict]) -> dict:
    out: dict = {"kinds": {}, "nodes": {}}
    for r in rows:
        out["kinds"][r["kind"]] = out["kinds"].get(r["kind"], 0) + 1
        per = out["nodes"].setdefault(r["node"], {})
        per[r["kind"]] = per.get(r["kind"], 0) + 1
    return out


def _timeline(rng: random.Random, job: dict, rows: list[dict]) -> str:
    """A ``goodput.timeline`` tag: about 40 segments, as a long job's (2 to 3 KB)."""
    codes = ("g", "su", "dl", "cs", "g", "g", "cr", "wp", "ir", "g")
    edges = sorted(rng.uniform(0, job["wall_s"]) for _ in range(40))
    segs = [
        [round(a, 1), round(b, 1), rng.choice(codes)]
        for a, b in zip([0.0, *edges], edges, strict=False)
    ]
    fails = [[round(r["time"] - job["start"], 1), "failure"] for r in rows]
    return json.dumps({"t0": job["start"], "wall_s": job["wall_s"], "segments": segs,
                       "failures": fails})  # fmt: skip


def synthetic_job(rng: random.Random, i: int, now: float) -> dict:
    """One job: ``tags``, ``params``, ``metrics`` (key -> value) and its run's fields."""
    dashboard = rng.choice(list(CLUSTERS))
    gpu = rng.random() < 0.6
    workers = rng.choice((1, 2, 4, 8, 8, 16)) if gpu else rng.choice((2, 4, 8))
    cpus = rng.choice((2, 4, 8)) if not gpu else 8
    wall = rng.uniform(0.1, 24) * 3600 * (1 if gpu else 0.3)
    start = now - rng.uniform(0, 30 * DAY)
    roll = rng.random()
    status = "RUNNING" if start + wall > now else (
        "FAILED" if roll < 0.08 else "KILLED" if roll < 0.14 else "FINISHED")  # fmt: skip
    wall = min(wall, now - start)
    job = {"id": f"tf-{uuid.UUID(int=rng.getrandbits(128)).hex[:12]}", "start": start,
           "wall_s": wall, "status": status, "exp": rng.choice(EXPERIMENTS),
           "owner": rng.choice(OWNERS), "name": f"job-{i}"}  # fmt: skip
    placed = _placement(rng, CLUSTERS[dashboard], workers, GPUS_PER_NODE if gpu else 4)
    rows = _failures(rng, job, placed)
    job["tags"] = _tags(rng, job, dashboard, placed, rows, gpu, workers)
    job["params"] = _params(rng, gpu, workers, cpus)
    job["metrics"] = _metrics(rng, job, placed, rows, gpu, workers, cpus)
    return job


def _tags(rng, job, dashboard, placed, rows, gpu, workers) -> dict[str, str]:
    state = {"FINISHED": "SUCCEEDED", "FAILED": "FAILED", "KILLED": "STOPPED"}
    tags = {
        TAG.JOB_ID: job["id"], TAG.OWNER: job["owner"], TAG.PROJECT: rng.choice(PROJECTS),
        TAG.DASHBOARD: dashboard, TAG.STATE: state.get(job["status"], "RUNNING"),
        TAG.SUBMISSION: f"raysubmit_{uuid.UUID(int=rng.getrandbits(128)).hex[:16]}",
        TAG.LOCAL_HEAD: "false", TAG.SOURCE: "notebook:train.ipynb",
        TAG.FUNCTION: "train_loop", TAG.FUNCTION_SHA: uuid.uuid4().hex * 2,
        TAG.CODE_NOTEBOOK: "notebooks/train.ipynb", TAG.CODE_NOTEBOOK_SHA256: uuid.uuid4().hex,
        TAG.CODE_GIT_DIRTY: "false", TAG.STARTED: str(job["start"]), TAG.WORKERS: str(workers),
        TAG.PLACEMENT: json.dumps(placed), TAG.COST_CURRENCY: "USD",
        TAG.COST_CATALOG: "builtin-2026-10", TAG.STEP: str(int(job["wall_s"] / 0.5)),
        TAG.CKPT_PATH: f"/mnt/storage/{job['id']}/checkpoint_{rng.randint(0, 999):06d}",
        TAG.CKPT_STEP: str(int(job["wall_s"] / 0.6)), TAG.CKPT_TIME: str(job["start"] + 60),
        TAG.STALL: "", TAG.STALL_TIMEOUT: "600", TAG.RESUMES: str(rng.choice((0, 0, 0, 1))),
        TAG.FAULTS_RESTARTS: str(len(rows)), TAG.TIMELINE: _timeline(rng, job, rows),
        TAG.REDACTED: json.dumps(["env.WANDB_API_KEY"]), TAG.OFFLINE_S: "0",
        TAG.DROPPED_POINTS: "0", TAG.STOP_WAITING: "", TAG.MFU_NOTE: "",
        "mlflow.user": job["owner"], "mlflow.runName": job["name"],
        "mlflow.source.name": "trainfactory", "mlflow.source.type": "JOB",
    }  # fmt: skip
    for name, value in (("python", "3.12.7"), ("ray", "2.52.1"), ("torch", "2.9.1"),
                        ("cuda", "12.8" if gpu else ""), ("nvidia_driver", "570.86" if gpu else "")):  # fmt: skip
        tags[TAG.ENV + name] = value
    for rank, node in list(placed["ranks"].items())[:16]:
        tags[TAG.RANK + rank] = json.dumps(
            {"pid": rng.randint(1000, 99999), "node_id": uuid.uuid4().hex * 2, "node_ip": node}
        )
    if gpu:
        tags[TAG.DEVICE_NAME] = "NVIDIA H100 80GB HBM3"
        tags[TAG.PEAK_FLOPS] = "989000000000000.0"
        tags[TAG.FLOPS_PER_TOKEN] = "8400000000.0"
        tags[TAG.N_PARAMS] = "1400000000"
        for node in placed["nodes"]:
            gpus = [{"label": f"gpu{g}", "uuid": f"GPU-{uuid.uuid4()}", "name": "NVIDIA H100"
                     " 80GB HBM3", "mig": False, "memory_total_mb": 81559} for g in range(8)]  # fmt: skip
            tags[TAG.GPUS + node] = json.dumps(gpus)
    if rows:
        tags[TAG.FAILURES] = json.dumps(rows)
        tags[TAG.FAULT_COUNTS] = json.dumps(_counts(rows))
        last = rows[-1]
        tags[TAG.FAULTS_LAST] = f"12:00:00 rank {last['rank']}: {last['kind']}"
        tags[TAG.FAILURE] = json.dumps(
            {"rank": last["rank"], "node": last["node"], "type": "RayActorError",
             "traceback": "Traceback (most recent call last):\n" + "  File ...\n" * 40}
        )  # fmt: skip
    return tags


def _params(rng, gpu: bool, workers: int, cpus: int) -> dict[str, str]:
    params = {
        "accelerator": "gpu" if gpu else "cpu", "workers": str(workers),
        "cpus_per_worker": str(cpus), "gpus_per_worker": "1" if gpu else "0",
        "max_failures": "3", "placement": "pack", "checkpoint_every": "500",
    }  # fmt: skip
    for k in ("lr", "weight_decay", "beta1", "beta2", "warmup_steps", "batch_size", "seq_len",
              "epochs", "hidden", "layers", "heads", "dropout", "seed", "grad_clip",
              "dataset", "tokenizer", "optimizer", "scheduler", "precision", "eval_every",
              "log_every", "model", "vocab_size", "accum_steps", "compile"):  # fmt: skip
        params[f"config.{k}"] = str(rng.choice((0.1, 3e-4, 128, 2048, "adamw", "cosine", "bf16")))
    return params


def _metrics(rng, job, placed, rows, gpu, workers, cpus) -> dict[str, float]:
    wall, units = job["wall_s"], workers * (1 if gpu else cpus)
    bad = {c: wall * rng.uniform(0, 0.02) for c in BADPUT_CATEGORIES}
    bad["wasted_progress"] = sum(r["steps_lost"] or 0 for r in rows) * 0.5
    bad["infrastructure_recovery"] = sum(r["mttr_s"] or 0 for r in rows) * 0.5
    good = max(0.0, wall - sum(bad.values()))
    price = 2.5 if gpu else 0.04  # USD per unit-hour
    out = {"goodput/wall_s": wall, "goodput/goodput_s": good, "goodput/ettr": good / wall}
    out.update({f"badput/{c}_s": s for c, s in bad.items()})
    hours = units * wall / 3600
    out["cost/accelerator_hours"] = hours if gpu else 0.0
    out["cost/vcpu_hours"] = hours if not gpu else workers * cpus * wall / 3600
    out["cost/usd"] = hours * price
    out["cost/wasted_usd"] = units * price * sum(bad.values()) / 3600
    out.update({f"cost/{c}_usd": units * price * s / 3600 for c, s in bad.items() if s})
    out.update({"cost/storage_usd": 0.3, "cost/rate_per_h": units * price})
    out.update({"faults/count": len(rows), "faults/restarts": len(rows)})
    if rows:
        out["faults/mttr_s"] = rows[-1]["mttr_s"] or 0.0
        out["faults/restore_step"] = float(rows[-1]["restored_step"] or 0)
    out.update({f"train/{k}": rng.uniform(0, 1000) for k in TRAIN_KEYS})
    out.update({k: rng.uniform(0, 3) for k in USER_KEYS})
    for node, ranks in placed["nodes"].items():
        out.update({f"system/{node}/{k}": rng.uniform(0, 100) for k in HOST_KEYS})
        for g in range(len(ranks) if gpu else 0):
            out.update({f"system/{node}/gpu{g}/{k}": rng.uniform(0, 100) for k in GPU_KEYS})
    if gpu:
        for k in ("utilization", "memory_used_mb", "power_w"):
            out.update({f"system/cluster/gpu_{k}_{s}": 50.0 for s in ("mean", "min", "max")})
        out["energy/gpu_kwh"] = units * 0.7 * wall / 3600
    return out


def fill(db: Path, runs: int, seed: int, now: float) -> dict[str, int]:
    """Write ``runs`` synthetic job runs into the MLflow database ``db`` (bulk inserts
    through ``SqlAlchemyStore``'s engine and models). Returns the rows written per kind
    (``runs``, ``tags``, ``params``, ``metrics``; each metric also in ``latest_metrics``)."""
    import sqlalchemy as sa
    from mlflow.store.tracking.dbmodels import models as m
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    store = SqlAlchemyStore(f"sqlite:///{db}", str(db.parent / "artifacts"))
    exp_ids = {e: int(store.create_experiment(e)) for e in EXPERIMENTS}
    rng = random.Random(seed)
    written = dict.fromkeys(("runs", "tags", "params", "metrics"), 0)
    for lo in range(0, runs, 500):
        batch: dict[str, list] = {"runs": [], "tags": [], "params": [], "metrics": []}
        for i in range(lo, min(runs, lo + 500)):
            job = synthetic_job(rng, i, now)
            _rows(batch, job, exp_ids[job["exp"]], db)
        with store.engine.begin() as conn:  # one transaction a batch, as many writers do
            conn.execute(sa.insert(m.SqlRun.__table__), batch["runs"])
            conn.execute(sa.insert(m.SqlTag.__table__), batch["tags"])
            conn.execute(sa.insert(m.SqlParam.__table__), batch["params"])
            conn.execute(sa.insert(m.SqlMetric.__table__), batch["metrics"])
            conn.execute(sa.insert(m.SqlLatestMetric.__table__), batch["metrics"])
        for kind, rows in batch.items():
            written[kind] += len(rows)
    with store.engine.begin() as conn:  # a server's database long after its writes
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    store.engine.dispose()
    return written


def _rows(batch: dict, job: dict, exp_id: int, db: Path) -> None:
    run_id = uuid.uuid4().hex
    start_ms = int(job["start"] * 1000)
    end_ms = None if job["status"] == "RUNNING" else int((job["start"] + job["wall_s"]) * 1000)
    batch["runs"].append(
        {"run_uuid": run_id, "name": job["name"], "source_type": "JOB",
         "source_name": "trainfactory", "entry_point_name": "", "user_id": job["owner"],
         "status": job["status"], "start_time": start_ms, "end_time": end_ms,
         "source_version": "", "lifecycle_stage": "active", "experiment_id": exp_id,
         "artifact_uri": f"{db.parent}/artifacts/{exp_id}/{run_id}/artifacts"}
    )  # fmt: skip
    batch["tags"] += [{"key": k, "value": v, "run_uuid": run_id} for k, v in job["tags"].items()]
    batch["params"] += [
        {"key": k, "value": v, "run_uuid": run_id} for k, v in job["params"].items()
    ]
    ts = end_ms or start_ms + int(job["wall_s"] * 1000)
    batch["metrics"] += [
        {"key": k, "value": float(v), "timestamp": ts, "step": 0, "is_nan": False,
         "run_uuid": run_id}
        for k, v in job["metrics"].items()
    ]  # fmt: skip


def time_report(tracking_uri: str, profile: bool):
    """``(seconds, report)`` of one ``reliability_report`` over every run, read through
    the server at ``tracking_uri``; with ``profile`` prints cProfile's top 25."""
    from jupyter_trainfactory.fleet.report import reliability_report

    reader = ServerReader(tracking_uri)
    prof = None
    if profile:
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    report = reliability_report(reader)
    took = time.perf_counter() - t0
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return took, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile the report")
    parser.add_argument("--lines", type=int, default=14, help="report lines to print")
    args = parser.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="tf-bench-reliability-"))
    os.environ["TRAINFACTORY_HOME"] = str(home)
    from jupyter_trainfactory import services as svc

    try:
        services = svc.ensure_services(ray=False, mlflow=True)
        uri = services.tracking_uri
        now = time.time()
        t0 = time.perf_counter()
        rows = fill(home / "mlflow" / "mlflow.db", args.runs, args.seed, now)
        fill_s = time.perf_counter() - t0
        tracking.client(uri).search_runs(  # warm-up: the server's first search imports
            [e.experiment_id for e in tracking.client(uri).search_experiments()], max_results=10
        )
        load = [os.getloadavg()[0]]
        report_s, report = time_report(uri, args.profile)
        load.append(os.getloadavg()[0])
    finally:
        svc.stop_services(("mlflow",))
        shutil.rmtree(home, ignore_errors=True)

    n = rows["runs"]
    print(f"{n} synthetic job runs at {uri} (MLflow {_mlflow_version()} on SQLite), a run:"
          f" {rows['tags'] / n:.0f} tags, {rows['params'] / n:.0f} params,"
          f" {rows['metrics'] / n:.0f} metrics")  # fmt: skip
    print(f"fill (SqlAlchemyStore bulk insert): {fill_s:.1f} s; load average before the"
          f" report {load[0]:.1f}, after {load[1]:.1f} (1 min; {os.cpu_count()} CPUs)")  # fmt: skip
    print("\n".join(report.text().splitlines()[: args.lines]))
    print("...")
    print(f"report: {report_s:.1f} s, {len(report.jobs)} runs read, "
          f"{len(report.jobs) / report_s:.0f} runs/s")  # fmt: skip
    if len(report.jobs) != args.runs:
        print(f"the report counted {len(report.jobs)} jobs, not {args.runs}")
        return 1
    ratio = report_s / GOAL_S
    print(f"report time / {GOAL_S:.0f} s = {ratio:.2f} ({'met' if ratio <= 1.0 else 'NOT met'})")
    return 0


def _mlflow_version() -> str:
    import mlflow

    return mlflow.__version__


if __name__ == "__main__":
    sys.exit(main())
