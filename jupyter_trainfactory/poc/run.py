"""``trainfactory.poc(...)``: run a proof of concept on a cluster and write its report.

1. **Node health** of every node (:func:`~..nodehealth.node.cluster_health`).
2. One Ray Train job, ``ray_backend.poc_loop.poc_loop``, in experiment
   ``trainfactory-poc``: compute, collectives, storage, then training through a worker
   kill (``max_failures=1``); each stage's result is printed as it lands in the run.
3. The checks (:mod:`.checks`) against the thresholds, written to the same run: every
   figure as ``poc/check/<name>``, the cluster as ``trainfactory.poc.*`` tags, the HTML
   report (``poc/report.html``) and the checks as JSON (``poc/report.json``) as artifacts.

The report is written by the kernel after the job has ended (the job's RunRecorder is
gone by then), as ``%train register`` writes a model: one writer at a time.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..jobstate import TERMINAL_STATES
from ..spec_values import SpecError
from .checks import CHECKS, PocCheck, bandwidth_curves, build_checks
from .report import PocReport, fmt_value
from .thresholds import Thresholds, default_for, load

__all__ = ["EXPERIMENT", "job_config", "load_report", "poc"]

EXPERIMENT = "trainfactory-poc"
_STAGES = ("compute", "collectives", "checkpoints", "training", "recovery")


def job_config(
    quick: bool, accelerator: str, storage: str, checkpoint_mb: float | None
) -> dict[str, Any]:
    """The poc job's config: sizes for ``quick`` (about a minute of work on 2 CPU
    workers) or a full run, on CPUs or GPUs."""
    gpu = accelerator != "cpu"
    every = 10 if quick else 20
    if gpu:
        model = {"vocab": 8192, "d_model": 512, "layers": 4, "heads": 8, "seq_len": 512}
    else:
        model = {"vocab": 256, "d_model": 64, "layers": 2, "heads": 4, "seq_len": 64}
    return {
        "quick": quick,
        "matmul_n": (4096 if quick else 8192) if gpu else (512 if quick else 1024),
        "matmul_repeats": 20 if gpu else (5 if quick else 10),
        "max_mib": (256 if quick else 4096) if gpu else (16 if quick else 64),
        "iters": (5 if quick else 20) if gpu else (3 if quick else 5),
        "storage": storage,
        "checkpoint_mb": checkpoint_mb,
        "model": model,
        "batch": 16 if gpu else 8,
        "steps": (4 if quick else 6) * every,
        "every": every,
        "kill_step": 2 * every + 5,  # a worker dies 5 steps after the second checkpoint
        "threads": 1,
    }


def _stage_lines(stage: str, checks: list[PocCheck]) -> list[str]:
    lines = []
    for c in checks:
        if c.stage == stage and c.status != "n/a":
            unit = "" if c.unit == "x" else f" {c.unit}"
            lines.append(f"  {c.label}: {fmt_value(c.value, c.unit)}{unit}  [{c.detail}]")
    return lines or [f"  {stage}: nothing measured"]


def _ready(stage: str, metrics: dict[str, float], ended: bool) -> bool:
    done = metrics.get("poc/stages_done", 0.0)
    return (
        ended
        or {
            "compute": done >= 1,
            "collectives": done >= 2,
            "checkpoints": done >= 3,
            "training": done >= 4,
            "recovery": "faults/mttr_s" in metrics,
        }[stage]
    )


#: Steps past a user function's checkpoint at which ``poc --fn`` kills its workers: the
#: reference workload's own choice (``job_config``'s ``kill_step``).
KILL_AFTER_STEPS = 5


def kill_target(run, job_state: str) -> dict[str, Any] | None:
    """Whether to kill a ``poc --fn`` job's workers now, and which: None (not yet: no
    checkpoint, or fewer than :data:`KILL_AFTER_STEPS` steps past it, or not running),
    ``{"node": label}`` on more than one node (every worker of the last rank's node,
    from the ``trainfactory.placement`` tag), else ``{"rank": None}`` (the last rank)."""
    from ..jobstate import JobState, latest_step
    from ..tracking import TAG

    tags = run.data.tags
    ckpt, step = tags.get(TAG.CKPT_STEP), latest_step(run)
    if job_state != JobState.RUNNING or not ckpt or step is None:
        return None
    if step < int(float(ckpt)) + KILL_AFTER_STEPS:
        return None
    try:
        placement = json.loads(tags.get(TAG.PLACEMENT) or "{}")
    except ValueError:
        placement = {}
    ranks = placement.get("ranks") or {}
    if len(placement.get("nodes") or {}) > 1 and ranks:
        return {"node": ranks[max(ranks, key=int)]}
    return {"rank": None}


def _kill(job, target: dict[str, Any], progress: Callable[[str], None]) -> bool:
    """Kill what :func:`kill_target` chose (``%train chaos``); True once done."""
    try:
        killed = job.chaos(**target)
    except SpecError as exc:  # the job moved on (restarting, ended): try again later
        progress(f"recovery: the kill waits ({exc})")
        return False
    where = ", ".join(f"rank {k['rank']} on {k['node']}" for k in killed) or "nothing alive"
    whose = f"node {target['node']}'s workers: " if target.get("node") else ""
    progress(f"recovery: killed {whose}{where}")
    return bool(killed)


def _watch(
    job,
    progress: Callable[[str], None],
    inputs: dict[str, Any],
    poll_s: float,
    kill: bool = False,
) -> str:
    """Poll the job's run until it ends, printing each stage's figures once they are in;
    with ``kill`` (a user's function) kill its workers once it has checkpointed."""
    shown: set[str] = set()
    client = job.manager.mlflow_client
    while True:
        state = job.status()
        ended = state in TERMINAL_STATES
        run = client.get_run(job.run_id)
        if kill and not ended and "faults/mttr_s" not in run.data.metrics:
            target = kill_target(run, state)
            if target is not None and _kill(job, target, progress):
                kill = False
        checks = build_checks(run.data.metrics, run.data.tags, thresholds=None, **inputs)
        for stage in _STAGES:
            if stage not in shown and _ready(stage, run.data.metrics, ended):
                shown.add(stage)
                progress("\n".join([f"{stage}:", *_stage_lines(stage, checks)]))
        if ended:
            return state
        time.sleep(poll_s)


def _cluster(manager, tags: dict[str, str], workers: int, gpus: float) -> dict[str, str]:
    info = manager.cluster(settle_s=5.0)
    device = tags.get("trainfactory.device_name") or ("CPU" if not gpus else "GPU")
    per = f"{gpus:g} x " if gpus else ""
    return {
        "address": info.address,
        "nodes": str(len(info.nodes)),
        "accelerators": f"{workers} workers x {per}{device}",
        "ray": tags.get("trainfactory.env.ray", info.ray_version),
        "torch": tags.get("trainfactory.env.torch", ""),
        "cuda": tags.get("trainfactory.env.cuda", ""),
        "nvidia_driver": tags.get("trainfactory.env.nvidia_driver", ""),
        "python": tags.get("trainfactory.env.python", info.python_version),
    }


def _write(manager, report: PocReport, html_path: str | None) -> None:
    """The report's metrics, tags and artifacts into its run; the HTML also to
    ``html_path`` (default: ``<state dir>/poc/<job id>.html``)."""
    from mlflow.entities import Metric, RunTag

    from ..services import state_dir
    from .html import write_html

    client = manager.mlflow_client
    now = int(time.time() * 1000)
    client.log_batch(
        report.run_id,
        metrics=[Metric(k, float(v), now, 0) for k, v in report.metrics().items()],
        tags=[RunTag(k, v[:5000]) for k, v in report.tags().items()],
    )
    path = Path(html_path) if html_path else state_dir() / "poc" / f"{report.job_id}.html"
    report.html_path = str(write_html(report, path))
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        page.write_bytes(Path(report.html_path).read_bytes())
        client.log_artifact(report.run_id, str(page), "poc")
        (Path(tmp) / "report.json").write_text(json.dumps(_to_json(report), indent=1))
        client.log_artifact(report.run_id, str(Path(tmp) / "report.json"), "poc")


def _to_json(report: PocReport) -> dict[str, Any]:
    return {
        "run_id": report.run_id,
        "job_id": report.job_id,
        "state": report.state,
        "thresholds": report.thresholds,
        "cluster": report.cluster,
        "checks": [c.to_dict() for c in report.checks],
    }


def load_report(manager, run_or_job: str) -> PocReport:
    """The report a poc wrote to its run (``poc/report.json``), by run id or job id.

    Raises SpecError when no such run exists or it holds no poc report.
    """
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # no bar per file
    client = manager.mlflow_client
    try:
        run_id = manager.find_run(run_or_job).info.run_id
    except Exception:
        run_id = run_or_job
    try:
        with tempfile.TemporaryDirectory() as tmp:
            local = client.download_artifacts(run_id, "poc/report.json", tmp)
            data = json.loads(Path(local).read_text())
    except Exception:
        raise SpecError(
            f"{run_or_job} is no proof-of-concept run with a report (see experiment {EXPERIMENT})."
        ) from None
    checks = [PocCheck(**c) for c in data["checks"]]
    return PocReport(
        data["run_id"], data["job_id"], data["state"], checks, data["cluster"], data["thresholds"]
    )


def poc(
    manager,
    workers: int = 2,
    gpus_per_worker: float = 0.0,
    *,
    cpus_per_worker: float = 1.0,
    resources: dict[str, float] | list[str] | None = None,
    placement: str = "pack",
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    thresholds: str | None = None,
    quick: bool = False,
    checkpoint_mb: float | None = None,
    html: str | None = None,
    fn: Callable[[dict], Any] | None = None,
    fn_config: dict[str, Any] | None = None,
    progress: Callable[[str], None] = print,
    on_launch: Callable[[Any], None] | None = None,
    poll_s: float = 2.0,
) -> PocReport:
    """Run a proof of concept on ``manager``'s cluster (the JobManager of ``address``,
    ``tracking_uri`` and ``storage``) with ``workers`` workers of ``gpus_per_worker`` GPUs
    (0: CPU workers), each also reserving the custom ``resources`` and placed by
    ``placement`` (as a launch's: ``spread`` puts the collectives and the recovery kill
    across nodes), print each stage's figures as they come (``progress``) and return the
    :class:`PocReport`, written to its MLflow run in experiment ``trainfactory-poc``.

    ``thresholds`` is a TOML file (:mod:`.thresholds`; default: the shipped file for
    the accelerator, if any); ``quick`` sizes every stage to finish in about a minute of
    work; ``checkpoint_mb`` sets the storage stage's checkpoint size (default: the
    reference model's weights and optimizer state); ``html`` where the report's page
    goes besides the run. ``fn`` (a training function of one config dict, called with
    ``fn_config``) is the training stage instead of the reference transformer: it should
    use ``trainfactory.step`` for tokens/s (and ``watch`` for MFU) and checkpoint with
    ``save_checkpoint`` and resume from ``get_checkpoint`` for the recovery stage, whose
    kill comes :data:`KILL_AFTER_STEPS` steps after its first checkpoint. ``on_launch(job)``
    is called once the job is submitted (the magic shows its dashboard there).

    Raises SpecError (one sentence, nothing submitted) for a bad thresholds file, fewer
    than one worker, or what a launch refuses (resources the cluster cannot give).
    """
    if workers < 1:
        raise SpecError(f"--workers must be at least 1, got {workers}.")
    if fn is not None and not callable(fn):
        raise SpecError(f"--fn must be a training function, got {type(fn).__name__}.")
    if fn_config is not None and fn is None:
        raise SpecError("--config goes with --fn: the reference workload takes none.")
    chosen: Thresholds | None = load(thresholds, set(CHECKS)) if thresholds else None
    accelerator = "gpu" if gpus_per_worker else "cpu"
    config = job_config(
        quick, accelerator, manager.storage or str(tempfile.gettempdir()), checkpoint_mb
    )
    job_fn, spec = _job(
        config,
        fn,
        fn_config,
        quick=quick,
        workers=workers,
        accelerator=accelerator,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
        resources=resources,
        placement=placement,
        address=address,
        tracking_uri=tracking_uri,
        storage=storage,
    )
    manager.check(spec)  # what the cluster cannot give, before the health check's job
    health = _node_health(manager, progress)
    job = manager.submit(job_fn, spec)
    progress(
        f"job {job.id} (run {job.run_id}): compute, collectives, checkpoints, training, recovery"
    )
    if on_launch is not None:
        on_launch(job)
    inputs = {"health": health, "accelerator": accelerator, "kill_step": config["kill_step"]}
    state = _watch(job, progress, inputs, poll_s, kill=fn is not None)
    run = manager.mlflow_client.get_run(job.run_id)
    metrics, tags = run.data.metrics, run.data.tags
    if chosen is None:
        default = default_for(tags.get("trainfactory.device_name", ""), accelerator)
        chosen = load(default, set(CHECKS)) if default else None
    checks = build_checks(metrics, tags, thresholds=chosen, **inputs)
    report = PocReport(
        run_id=job.run_id,
        job_id=job.id,
        state=state,
        checks=checks,
        cluster=_cluster(manager, tags, workers, gpus_per_worker),
        thresholds=f"{chosen.name} ({chosen.path})" if chosen else "none: measured only",
        curves=bandwidth_curves(metrics),
        timeline=_timeline(tags),
    )
    _write(manager, report, html)
    return report


def _node_health(manager, progress: Callable[[str], None]) -> dict[str, Any]:
    """The health check of every node (``cluster_health``), its outcome printed."""
    from ..nodehealth.node import cluster_health

    progress("node health: checking every node ...")
    health = cluster_health(manager).to_dict()
    bad = [n for n in health["nodes"] if not n["healthy"]]
    progress(
        f"node health: {len(health['nodes']) - len(bad)} of {len(health['nodes'])} nodes healthy"
        + "".join(f"\n  {n['host']}: {'; '.join(n['reasons'])}" for n in bad)
    )
    return health


def _job(
    config: dict[str, Any],
    fn,
    fn_config,
    *,
    quick: bool,
    workers: int,
    accelerator: str,
    **target: Any,
):
    """The job's function (``poc_loop``, or it with ``fn`` as its training stage) and its
    JobSpec; ``config`` gets ``fn_config`` and no kill step of its own when ``fn`` is given
    (the kernel kills ``fn``'s workers). ``target``: the spec's resource, placement and
    cluster fields, as given to :func:`poc`."""
    from ray_backend.poc_loop import poc_loop

    from ..spec import JobSpec

    job_fn = poc_loop
    if fn is not None:
        config.update(fn_config=dict(fn_config or {}), kill_step=None)
        job_fn = _with_training(poc_loop, fn)
    name = f"poc{' quick' if quick else ''} {workers}x{accelerator}"
    spec = JobSpec(
        function_name=job_fn.__name__,
        workers=workers,
        config=config,
        experiment=EXPERIMENT,
        run_name=name + (f" {fn.__name__}" if fn is not None else ""),
        max_failures=1,
        **{**target, "resources": target.get("resources") or {}},
    )
    return job_fn, spec


def _with_training(loop: Callable, fn: Callable) -> Callable[[dict], None]:
    """``loop`` with ``fn`` as its training stage, under ``fn``'s name and source (the
    run's code version is the user's function: ``inspect`` follows ``__wrapped__``)."""

    @functools.wraps(fn)
    def poc_with_fn(config: dict[str, Any]) -> None:
        loop(config, train_fn=fn)

    return poc_with_fn


def _timeline(tags: dict[str, str]) -> dict[str, Any] | None:
    try:
        return json.loads(tags["trainfactory.goodput.timeline"])
    except (KeyError, ValueError):
        return None
