"""The Python API: ``launch``, ``attach``, ``list_jobs`` (one JobManager per target)."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from .datasets import check_datasets
from .jobs import Job, JobInfo, JobManager
from .spec import JobSpec, SpecError
from .trainers import is_torch_trainer, merge_options, trainer_parts

__all__ = [
    "attach",
    "get_manager",
    "health",
    "launch",
    "list_jobs",
    "poc",
    "reliability",
    "sweep",
]

_managers: dict[tuple, JobManager] = {}


def get_manager(
    address: str | None = None, tracking_uri: str | None = None, storage: str | None = None
) -> JobManager:
    """The JobManager for this target (cached); None values mean the embedded default."""
    key = (address, tracking_uri, storage)
    manager = _managers.get(key)
    if manager is None or not manager.services_alive():  # restarted services: new ports
        manager = _managers[key] = JobManager(address, tracking_uri, storage)
    return manager


def launch(
    fn: Callable[[dict], Any] | Any,
    workers: int = 2,
    config: dict | None = None,
    *,
    experiment: str = "trainfactory",
    run_name: str = "",
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    accelerator: str | None = None,
    resources: dict[str, float] | None = None,
    placement: str = "pack",
    label_selector: dict[str, str] | list[dict[str, str]] | None = None,
    max_failures: int = 0,
    max_preemptions: int = -1,
    keep_checkpoints: int = 2,
    keep_best: str | None = None,
    working_dir: str | None = None,
    pip: list[str] | None = None,
    env: dict[str, str] | None = None,
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    source: str = "",
    peak_tflops: float | None = None,
    flops_per_token: float | None = None,
    stall_timeout: float | None = None,
    on_stall: str = "warn",
    budget: float | None = None,
    price_catalog: str | None = None,
    spot: bool = False,
    project: str = "",
    target_steps: int | None = None,
    inputs: dict[str, Any] | None = None,
    model_fn: Callable[[str], Any] | None = None,
    datasets: dict[str, Any] | None = None,
    dataset_config: str | list[str] | None = None,
    preflight: bool = False,
    avoid_unhealthy: bool = False,
) -> Job:
    """Start ``fn`` as a Ray Train job and return at once.

    ``fn`` is ordinary Ray Train code taking one ``config`` dict, or a
    ``ray.train.torch.TorchTrainer`` built in the notebook: its loop, loop config,
    scaling config, failure and checkpoint settings and datasets become the job's, and
    each argument given here other than its default overrides the trainer's
    (:mod:`.trainers`). ``datasets`` (name -> a Ray ``Dataset`` such as
    ``ray.data.read_csv(path)``, or a function of no arguments returning one) are built
    in the job's driver for ``TorchTrainer(datasets=...)``, so each worker's
    ``ray.train.get_dataset_shard(name)`` works; ``dataset_config`` (``split=all``,
    ``split=none``, ``split=train`` or a list of names) says which are split among the
    workers (Ray's ``DataConfig(datasets_to_split=...)``). ``preflight`` checks the
    nodes the job may use first (:func:`health`) and refuses the launch if one fails;
    ``avoid_unhealthy`` checks them too and places the job away from a node that fails. Returns a :class:`Job`
    (``job.id``, ``job.run_id``, ``job.status()``, ``job.wait()``, ``job.stop()``,
    ``job.dashboard()``). ``accelerator`` (``gpu``, ``npu``, ``hpu``, ``cpu``) names
    what ``gpus_per_worker`` counts; ``resources`` adds custom Ray resources per worker;
    ``placement`` (``pack``, ``spread``, ``strict-pack``, ``strict-spread``) and
    ``label_selector`` (Ray node labels, one dict or one per worker) say where the
    workers go. ``peak_tflops`` (per accelerator) and ``flops_per_token``
    override what MFU is computed from; ``stall_timeout`` (s) and ``on_stall``
    (``warn``, ``restart`` or ``stop``) set stall detection; ``budget`` (an amount in
    the ``price_catalog``'s currency) stops the job before it spends more; ``spot``
    prices preemptible capacity; ``project`` groups costs for chargeback and
    ``target_steps`` projects the cost to that step (see :class:`~.spec.JobSpec`).
    ``inputs`` (name -> numpy array, local path or URI) are recorded as the run's
    datasets with a content or listing digest; ``model_fn(checkpoint_dir) -> model``
    rebuilds the model from a checkpoint for :meth:`Job.register`.

    Raises
    ------
    SpecError
        Bad input (``fn`` neither a function nor a TorchTrainer, a dataset that is
        neither a Dataset nor a function of no arguments, or one reading a local file
        that does not exist), an unreachable cluster, or resources the cluster can
        never provide.

    Examples
    --------
    In [1]: from jupyter_trainfactory import launch
    In [2]: job = launch(train, workers=2, config={"epochs": 3}, experiment="digits")
    In [3]: job.wait()
    Out[3]: 'SUCCEEDED'
    """
    arguments = locals()
    values = {name: arguments[name] for name in _SPEC_PARAMETERS}
    values["config"] = dict(config or {})
    if is_torch_trainer(fn) or not callable(fn):
        parts = trainer_parts(fn)  # SpecError for what is neither function nor trainer
        defaults = {n: p.default for n, p in inspect.signature(launch).parameters.items()}
        values = merge_options(parts.options, values, {**defaults, "config": {}})
        fn, datasets = parts.fn, {**parts.datasets, **(datasets or {})}  # given NAME wins
    spec = JobSpec(function_name=getattr(fn, "__name__", "train"), **values)
    check_datasets(datasets, spec.dataset_config)  # before any service starts
    return get_manager(address, tracking_uri, storage).submit(
        fn, spec, inputs=inputs, model_fn=model_fn, datasets=datasets
    )


#: launch's parameters that are JobSpec fields, passed on as they are (``config`` is copied);
#: ``tests/unit/test_spec.py`` checks that every field a user sets is one, with its default.
_SPEC_PARAMETERS = tuple(
    name
    for name in inspect.signature(launch).parameters
    if name in {f.name for f in dataclasses.fields(JobSpec)} and name != "config"
)


def sweep(
    fn: Callable[[dict], Any],
    params: dict[str, Any] | list[str],
    *,
    metric: str,
    mode: str = "min",
    trials: int = 8,
    concurrent: int = 2,
    scheduler: str = "asha",
    search: str = "random",
    grace_period: int = 1,
    reduction_factor: int = 2,
    workers: int = 2,
    config: dict | None = None,
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    model_fn: Callable[[str], Any] | None = None,
    **options: Any,
) -> Job:
    """Search ``fn``'s hyperparameters with Ray Tune: ``trials`` trials, at most
    ``concurrent`` at once (fewer if the cluster holds fewer), each a Ray Train job of
    ``workers`` workers with ``config`` and the trial's sample of ``params`` over it,
    judged by the reported ``metric`` (``mode`` ``min`` or ``max``). ``params`` maps a
    config key to Ray Tune text (``"loguniform(1e-4,1e-1)"``, ``"choice(32,64)"``,
    ``"grid(1,2)"``) or a ``ray.tune`` domain; ``scheduler`` is ``asha`` (stops the
    worse trials at reports ``grace_period * reduction_factor**k``) or ``fifo``;
    ``search`` is ``random``, ``grid`` or ``optuna``. ``options`` are launch's (resources,
    placement, failure budget, experiment, ...); ``model_fn(checkpoint_dir) -> model`` is
    kept for ``job.register`` (the best trial's best checkpoint). The sweep is one
    detached job: its MLflow run is the parent of one child run per trial. Returns its
    :class:`Job`.

    Raises SpecError (nothing submitted) for a bad search space or setting, or a trial
    the cluster can never hold."""
    from .sweeps import SweepSettings, submit_sweep

    fields = {f.name for f in dataclasses.fields(JobSpec)}
    unknown = sorted(set(options) - fields)
    if unknown:
        raise SpecError(
            f"sweep() got unknown option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}."
        )
    spec = JobSpec(
        function_name=getattr(fn, "__name__", "train"),
        workers=workers,
        config=dict(config or {}),
        **options,
    )
    settings = SweepSettings(
        metric=metric,
        mode=mode,
        trials=trials,
        concurrent=concurrent,
        scheduler=scheduler,
        search=search,
        grace_period=grace_period,
        reduction_factor=reduction_factor,
    )
    manager = get_manager(address, tracking_uri, storage)
    return submit_sweep(manager, fn, spec, params, settings, model_fn=model_fn)


def attach(job_id: str, address: str | None = None, tracking_uri: str | None = None) -> Job:
    """A handle on an existing job (for instance after a kernel restart).

    Raises :class:`~.jobs.JobNotFound` when the tracking server has no such job.
    """
    manager = get_manager(address, tracking_uri)
    info = manager.info(job_id)
    return Job(info.job_id, info.run_id, manager)


def list_jobs(
    all_users: bool = False, address: str | None = None, tracking_uri: str | None = None
) -> list[JobInfo]:
    """Jobs newest first: yours, or everyone's with ``all_users=True``."""
    return get_manager(address, tracking_uri).list(all_users=all_users)


def reliability(
    since: str | float | None = "30d",
    until: str | float | None = None,
    experiment: str | None = None,
    by: str | None = None,
    address: str | None = None,
    tracking_uri: str | None = None,
):
    """The fleet's reliability report over everyone's jobs started in ``[since, until)``
    (dates, ``30d`` / ``12h`` ago, or s since the epoch): a
    :class:`~.fleet.report.ReliabilityReport` (``.text()``, ``.to_csv(path)``,
    ``.to_html(path)``, ``.figure()``); ``by``: ``cluster``, ``node``, ``owner``,
    ``project`` or ``accelerator``. Raises SpecError for a bad date or ``by``."""
    from .chargeback import parse_since
    from .fleet.report import reliability_report

    def when(value, option):
        return value if isinstance(value, (int, float)) else parse_since(value, option)

    return reliability_report(
        get_manager(address, tracking_uri),
        since=when(since, "--since"),
        until=when(until, "--until"),
        experiment=experiment,
        by=by,
    )


def health(
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    timeout: float = 30.0,
):
    """Check every alive node of the cluster before a job uses it: NVML readable, GPU
    count and model against what Ray advertises, uncorrected ECC errors, pending or
    failed row remaps (retired pages), clock throttle reasons, PCIe link, driver version
    consistency, available memory and free disk in the Ray temp dir and ``storage``
    (default: the target's storage path). Runs as one short Ray job, one task per node,
    each given ``timeout`` seconds.

    Returns a :class:`~.nodehealth.report.HealthReport` (``.healthy``, ``.unhealthy``,
    ``.text()``, ``.rows()``, ``.to_dict()``). A field a device lacks is ``"n/a"``, never
    a pass. Raises SpecError when the cluster does not answer or the job does not finish.
    """
    from .nodehealth.node import cluster_health

    return cluster_health(get_manager(address, tracking_uri, storage), timeout_s=timeout)


def poc(
    workers: int = 2,
    gpus_per_worker: float = 0.0,
    *,
    cpus_per_worker: float = 1.0,
    resources: dict | None = None,
    placement: str = "pack",
    address: str | None = None,
    tracking_uri: str | None = None,
    storage: str | None = None,
    thresholds: str | None = None,
    quick: bool = False,
    checkpoint_mb: float | None = None,
    html: str | None = None,
    fn=None,
    fn_config: dict | None = None,
    progress=print,
    on_launch=None,
):
    """Prove a cluster before trusting it: node health, then one job that measures the
    matmul rate, allreduce / all-gather / reduce-scatter bus bandwidth, checkpoint save
    and restore, tokens/s and MFU of a reference model, and the recovery from a killed
    worker (the reference transformer's, or ``fn(fn_config)``'s: your own loop); each
    stage printed as it comes. Returns a :class:`~.poc.report.PocReport`
    (``.text()``, ``.passed``, ``.checks``, ``.html_path``), also written to its MLflow
    run in experiment ``trainfactory-poc`` (see :func:`.poc.run.poc` for the options;
    ``on_launch(job)`` is called once the job is submitted).
    Raises SpecError for a bad thresholds file or resources the cluster cannot give."""
    from .poc.run import poc as run_poc

    return run_poc(
        get_manager(address, tracking_uri, storage),
        workers,
        gpus_per_worker,
        cpus_per_worker=cpus_per_worker,
        resources=resources,
        placement=placement,
        address=address,
        tracking_uri=tracking_uri,
        storage=storage,
        thresholds=thresholds,
        quick=quick,
        checkpoint_mb=checkpoint_mb,
        html=html,
        fn=fn,
        fn_config=fn_config,
        progress=progress,
        on_launch=on_launch,
    )
