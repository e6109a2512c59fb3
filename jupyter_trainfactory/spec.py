"""JobSpec: the one description of a training job, shared by every door and the driver.

Its fields are the one table of a job's options: each field a user sets carries its
``launch`` option (flags, argparse keywords and help: :class:`Option`, in the field's
metadata), from which the ``%train launch`` / ``jupyter trainfactory launch`` parser and
``arguments.spec_from_args`` are generated; ``api.launch`` is checked against the fields
(``tests/unit/test_spec.py``). Validation has two steps: :meth:`JobSpec.check` needs nothing
but the values and runs on the cluster too (:meth:`JobSpec.from_dict`, in the job's
driver); :meth:`JobSpec.check_local` needs the launching machine (the working directory,
the price catalog file).

Importing this module loads the standard library and the package's pure modules only
(``spec_values``, ``accelerators``, ``tracking``'s helpers): the driver imports it.
"""

from __future__ import annotations

import copy
import getpass
import json
import os
from collections.abc import Mapping
from dataclasses import MISSING, Field, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .accelerators import ACCELERATORS, accelerator, default_accelerator, resources_per_worker
from .spec_values import (
    PLACEMENTS,
    SpecError,
    check_number,
    custom_resources,
    dataset_config_text,
    label_selector,
    parse_env,
    parse_pairs,
    placement_name,
    positive_number,
    selector_text,
)
from .tracking import flatten_config, json_safe, param_value

__all__ = [
    "ON_STALL",
    "PLACEMENTS",
    "JobSpec",
    "Option",
    "SpecError",
    "cli_default",
    "current_owner",
    "flatten",
    "launch_options",
    "parse_env",
    "parse_pairs",
    "selector_text",
]

DEFAULT_EXPERIMENT = "trainfactory"
#: What a stall (no progress for ``stall_timeout`` s) does; see :class:`JobSpec`.
ON_STALL = ("warn", "restart", "stop")


def current_owner() -> str:
    """The JupyterHub user when running under JupyterHub, else the OS user."""
    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts/lists into ``{"a.b": "value"}`` texts as MLflow params hold them
    (``tracking.flatten_config`` then ``tracking.param_value``)."""
    return {k: param_value(v) for k, v in flatten_config(value, prefix).items()}


@dataclass(frozen=True)
class Option:
    """The ``launch`` option of a JobSpec field.

    ``flags`` (``("--workers",)``) and ``kwargs`` (``type``, ``help``, ``choices``,
    ``metavar``, ``action``, ``nargs``) go to ``argparse.add_argument``; the option's
    ``dest`` is the field's name. ``default`` is argparse's default (``None``,
    ``[]`` ...), where it differs from the field's. A ``session`` option starts unset so
    that a door's own default (``%config TrainMagics.experiment``) can fill it; a
    ``shared`` one is an option of every subcommand (``--address``, ``--tracking-uri``).
    """

    flags: tuple[str, ...]
    kwargs: Mapping[str, Any]
    default: Any = MISSING
    session: bool = False
    shared: bool = False


def _option(
    *flags: str,
    default: Any = None,
    factory: Any = MISSING,
    cli_default: Any = MISSING,
    session: bool = False,
    shared: bool = False,
    **kwargs: Any,
) -> Any:
    """A JobSpec field (``default``, or ``factory()`` for a mutable one) with its option."""
    if session:
        cli_default = None
    elif cli_default is MISSING and factory is not MISSING:
        cli_default = []  # a repeatable option collects a list
    option = Option(flags, kwargs, cli_default, session, shared)
    if factory is not MISSING:
        return field(default_factory=factory, metadata={"option": option})
    return field(default=default, metadata={"option": option})


def launch_options() -> list[tuple[Field, Option]]:
    """The JobSpec fields a user sets, in order, each with its :class:`Option`."""
    return [(f, f.metadata["option"]) for f in fields(JobSpec) if "option" in f.metadata]


def cli_default(spec_field: Field, option: Option) -> Any:
    """What argparse gives ``spec_field``'s option when the line does not set it (a fresh
    list for a repeatable option)."""
    return copy.copy(spec_field.default if option.default is MISSING else option.default)


@dataclass
class JobSpec:
    """A training job: what to run, on how many workers, and where to record it.

    Attributes
    ----------
    function_name : str
        Name of the training function (``def train(config): ...``).
    workers : int
        Number of Ray Train workers (ranks), >= 1.
    cpus_per_worker, gpus_per_worker : float
        Resources each worker reserves: Ray ``CPU`` units, and accelerator units of the
        ``accelerator``'s Ray resource (``GPU``, ``NPU`` or ``HPU``).
    accelerator : str
        ``gpu``, ``npu``, ``hpu`` or ``cpu`` (:data:`~.accelerators.ACCELERATORS`): the Ray
        resource, torch backend and telemetry of the workers. Default: ``gpu`` when
        ``gpus_per_worker`` > 0, else ``cpu``.
    resources : dict
        Custom Ray resources each worker also reserves (``{"rack_a": 1}``).
    placement : str
        ``pack`` (default: as few nodes as possible, best effort), ``spread``,
        ``strict-pack`` (one node, or the job is refused) or ``strict-spread`` (one worker
        per node): Ray's placement group strategies (:data:`PLACEMENTS`).
    label_selector : dict or list of dict
        Ray label selector the workers' nodes must match (``{"ray.io/accelerator-type":
        "H100"}``), or one per worker.
    max_failures : int
        Worker-failure restarts Ray Train may make (-1: unlimited), mapped to ``FailureConfig``.
    max_preemptions : int
        Restarts after preemptions, a separate budget (-1: unlimited; Ray Train's
        ``FailureConfig.max_preemption_failures``).
    keep_checkpoints : int
        Checkpoints kept in storage (>= 1; default 2, so a damaged newest one leaves a
        previous one to restore), Ray Train's ``CheckpointConfig.num_to_keep``.
    keep_best : str or None
        ``"METRIC:max"`` or ``"METRIC:min"``: keep the best checkpoints by that reported
        metric instead of the newest (``checkpoint_score_attribute``/``_order``).
    config : dict
        Passed to the training function as its one argument; must be cloudpickle-able.
    experiment, run_name : str
        MLflow experiment and run name (run name defaults to the function name).
    working_dir, pip, env :
        The job's Ray runtime environment (``working_dir``, ``pip``, ``env_vars``).
    address, tracking_uri, storage : str or None
        Ray dashboard/Jobs API address, MLflow tracking URI and Ray Train storage path;
        None means the embedded local default.
    source : str
        Notebook or script path the job was launched from ("" when unknown).
    peak_tflops : float or None
        Peak dense TFLOP/s of one accelerator (one worker on CPU) for ``train/mfu``;
        None looks the GPU up in :data:`~.telemetry.flops.PEAK_TFLOPS` (no MFU on CPU).
    flops_per_token : float or None
        Training FLOPs per token, overriding ``6 * N`` (+ attention) from the model.
    stall_timeout : float or None
        Seconds without a step or report (from any rank) after which the job counts as
        stalled (None: no stall detection). The dashboard suggests a value once steps
        are seen (10 x the p95 step time, at least 60 s).
    on_stall : str
        What a stall does: ``"warn"`` (the dashboard and the run's tags say so),
        ``"restart"`` (the stalled workers are killed and Ray Train restarts them from
        the latest checkpoint; needs ``max_failures`` other than 0) or ``"stop"`` (the
        job is stopped, reason ``stall``).
    budget : float or None
        Money the job may spend, in the price catalog's currency: when the cost at the
        checkpoint after the next would pass it, the job stops gracefully (reason
        ``budget``); the dashboard warns at 80 %.
    price_catalog : str or None
        TOML price catalog (``telemetry.cost.PriceCatalog.load``); None: ``prices.toml``
        in the state directory if there is one, else the shipped example prices.
    spot : bool
        The workers run on preemptible (spot) capacity: spot prices apply.
    project : str
        Chargeback group (team, grant, cost centre) for ``%train costs --by project``
        (tag ``trainfactory.project``; "" when not given).
    target_steps : int or None
        The step the job is expected to reach: the dashboard and the run
        (``cost/projected_usd``) show what it will have cost by then.
    dataset_config : str or None
        Which Ray Data datasets are split among the workers (Ray Train's
        ``DataConfig(datasets_to_split=...)``): ``split=all``, ``split=none`` or
        ``split=train,validation``; None: Ray's default (all). The datasets themselves
        travel in the job's payload (:mod:`.datasets`), not in the spec.
    preflight : bool
        Before submitting, check every node the job may use (``%train health``,
        :mod:`.nodehealth`): a node that fails a check refuses the launch, naming it and
        the check; nothing is submitted and no run is created.
    avoid_unhealthy : bool
        Run the same check, and place the job away from a node that fails instead of
        refusing: ``ray.io/node-id: !in(<failed nodes>)`` is added to every worker's
        label selector; refused only when the other nodes cannot hold the job.
    """

    function_name: str
    workers: int = _option("--workers", default=2, type=int, help="Ray Train workers (ranks)")
    cpus_per_worker: float = _option("--cpus-per-worker", default=1.0, type=float)
    gpus_per_worker: float = _option(
        "--gpus-per-worker",
        "--accelerators-per-worker",
        default=0.0,
        type=float,
        help="accelerators (GPUs, NPUs or HPUs, by --accelerator) each worker uses",
    )
    accelerator: str | None = _option(
        "--accelerator",
        choices=list(ACCELERATORS),
        help="gpu, npu, hpu or cpu (default: gpu with --gpus-per-worker, else cpu)",
    )
    resources: dict[str, float] = _option(
        "--resources",
        factory=dict,
        action="append",
        metavar="NAME=AMOUNT",
        help="a custom Ray resource each worker reserves (repeat for more)",
    )
    placement: str = _option(
        "--placement",
        default="pack",
        choices=list(PLACEMENTS),
        help="pack (default: fewest nodes), spread, strict-pack (one node) or strict-spread",
    )
    label_selector: dict[str, str] | list[dict[str, str]] = _option(
        "--label-selector",
        factory=dict,
        action="append",
        metavar="KEY=VALUE",
        help="a Ray node label the workers' nodes must have: VALUE, !VALUE, in(A,B) (repeat for more)",
    )
    max_failures: int = _option(
        "--max-failures", default=0, type=int, help="worker-failure restarts (-1: unlimited)"
    )
    max_preemptions: int = _option(
        "--max-preemptions", default=-1, type=int, help="preemption restarts (-1: unlimited)"
    )
    keep_checkpoints: int = _option(
        "--keep-checkpoints", default=2, type=int, metavar="N", help="checkpoints kept (>= 1)"
    )
    keep_best: str | None = _option(
        "--keep-best", metavar="METRIC:max|min", help="keep the best checkpoints by a metric"
    )
    config: dict[str, Any] = _option(  # the door evaluates EXPR (spec_from_args gets it)
        "--config",
        factory=dict,
        cli_default=None,
        metavar="EXPR",
        help="Python expression for the config dict",
    )
    experiment: str = _option(
        "--experiment",
        default=DEFAULT_EXPERIMENT,
        session=True,
        help="MLflow experiment (default: trainfactory)",
    )
    run_name: str = _option(
        "--run-name",
        default="",
        cli_default=None,
        help="MLflow run name (default: the function's name)",
    )
    working_dir: str | None = _option("--working-dir", help="directory shipped to every worker")
    pip: list[str] = _option(
        "--pip",
        factory=list,
        nargs="+",
        action="extend",
        metavar="REQ",
        help="pip requirements installed for the job",
    )
    env: dict[str, str] = _option(
        "--env",
        factory=dict,
        nargs="+",
        action="extend",
        metavar="KEY=VALUE",
        help="environment variables of the job",
    )
    address: str | None = _option(
        "--address",
        session=True,
        shared=True,
        help="Ray dashboard / Jobs API URL (default: local head)",
    )
    tracking_uri: str | None = _option(
        "--tracking-uri",
        session=True,
        shared=True,
        help="MLflow tracking URI (default: local server)",
    )
    storage: str | None = _option(
        "--storage", session=True, help="Ray Train storage path (shared by all nodes)"
    )
    source: str = ""
    peak_tflops: float | None = _option(
        "--peak-tflops",
        type=float,
        metavar="TFLOPS",
        help="peak dense TFLOP/s of one accelerator for MFU (default: looked up by GPU name)",
    )
    flops_per_token: float | None = _option(
        "--flops-per-token",
        type=float,
        metavar="FLOPS",
        help="training FLOPs per token (default: 6N + attention, from the model)",
    )
    stall_timeout: float | None = _option(
        "--stall-timeout",
        type=float,
        metavar="SECONDS",
        help="a job with no step or report for this long is stalled (default: off)",
    )
    on_stall: str = _option(
        "--on-stall",
        default="warn",
        choices=ON_STALL,
        help="on a stall: warn (default), restart from the checkpoint, or stop",
    )
    budget: float | None = _option(
        "--budget",
        type=float,
        metavar="AMOUNT",
        help="stop gracefully before the cost passes this (price catalog's currency)",
    )
    price_catalog: str | None = _option(
        "--price-catalog",
        session=True,
        metavar="PATH",
        help="TOML prices (default: the example prices)",
    )
    spot: bool = _option(
        "--spot", default=False, action="store_true", help="workers on spot capacity"
    )
    project: str = _option(
        "--project",
        default="",
        cli_default=None,
        help="chargeback group (team, grant) for costs --by project",
    )
    target_steps: int | None = _option(
        "--target-steps",
        type=int,
        metavar="N",
        help="the step the job should reach: the dashboard projects its cost to it",
    )
    dataset_config: str | None = _option(
        "--dataset-config",
        metavar="split=NAMES",
        help="datasets split among the workers: split=all (default), split=none, split=train",
    )
    preflight: bool = _option(
        "--preflight",
        default=False,
        action="store_true",
        help="check the nodes the job may use first (as %%train health); refuse if one fails",
    )
    avoid_unhealthy: bool = _option(
        "--avoid-unhealthy",
        default=False,
        action="store_true",
        help="check the nodes first (as --preflight) and place the job away from one that fails",
    )
    owner: str = field(default_factory=current_owner)

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The JobSpec of a :meth:`to_dict` (a job's payload), checked with :meth:`check`
        only: where it is rebuilt (the job's driver, on a cluster node) the launching
        machine's working directory and price catalog file are not there to check.

        Keys it does not know are ignored, missing ones take their defaults (a payload
        written by another version). Raises SpecError (one sentence) on a bad value.
        """
        spec = cls.__new__(cls)  # not cls(...): __post_init__ runs the local checks too
        for f in fields(cls):
            if f.name in data:
                value = copy.deepcopy(data[f.name])
            elif f.default is not MISSING:
                value = f.default
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            else:
                raise SpecError(f"The job's description has no {f.name}.")
            setattr(spec, f.name, value)
        spec.check()
        return spec

    def validate(self) -> None:
        """Every check (:meth:`check`, then :meth:`check_local`); raises :class:`SpecError`
        with one sentence on the first problem."""
        self.check()
        self.check_local()

    def check(self) -> None:
        """Check and normalize every value without the file system or a cluster (it runs
        in the job's driver too); raise :class:`SpecError` with one sentence on the first
        problem."""
        if not self.function_name or not self.function_name.isidentifier():
            raise SpecError(f"{self.function_name!r} is not a function name.")
        check_number("workers", self.workers, 1, integer=True)
        self.workers = int(self.workers)
        check_number("cpus_per_worker", self.cpus_per_worker, 0)
        check_number("gpus_per_worker", self.gpus_per_worker, 0)
        if self.cpus_per_worker == 0 and self.gpus_per_worker == 0:
            raise SpecError(
                "A worker needs some CPU or GPU; set cpus_per_worker or gpus_per_worker above 0."
            )
        self._check_placement()
        self._check_retention()
        if self.config is None:
            self.config = {}
        if not isinstance(self.config, dict):
            raise SpecError(f"config must be a dict, got {type(self.config).__name__}.")
        if not self.experiment or not self.experiment.strip():
            raise SpecError("The experiment name must not be empty.")
        self.run_name = self.run_name or self.function_name
        if isinstance(self.pip, str):
            self.pip = [self.pip]
        self.pip = [str(p) for p in (self.pip or [])]
        self.env = parse_env(self.env)
        for name in ("peak_tflops", "flops_per_token"):
            value = getattr(self, name)
            if value is None:
                continue
            if not positive_number(value):
                raise SpecError(f"{name} must be a positive, finite number, got {value!r}.")
            setattr(self, name, float(value))
        self._check_stall()
        if self.budget is not None:
            if not positive_number(self.budget):
                raise SpecError(f"budget must be a positive amount, got {self.budget!r}.")
            self.budget = float(self.budget)
        self.project = str(self.project or "").strip()
        if self.target_steps is not None:
            check_number("target_steps", self.target_steps, 1, integer=True)
            self.target_steps = int(self.target_steps)
        self.dataset_config = dataset_config_text(self.dataset_config)
        if self.on_stall == "restart" and self.max_failures == 0:
            raise SpecError(
                "--on-stall restart restarts the workers, which uses the failure budget;"
                " set --max-failures (max_failures) to 1 or more, or -1."
            )

    def check_local(self) -> None:
        """The checks that need the launching machine: the working directory exists (its
        path made absolute) and the price catalog file loads. Raises SpecError."""
        if self.working_dir is not None:
            path = Path(self.working_dir).expanduser()
            if not path.is_dir():
                raise SpecError(f"The working directory {self.working_dir!r} does not exist.")
            self.working_dir = str(path.resolve())
        if self.price_catalog:
            self.price_catalog = str(Path(self.price_catalog).expanduser().resolve())
            self.catalog()  # a bad file is refused now, before anything is submitted

    def _check_placement(self) -> None:
        try:
            row = accelerator(self.accelerator or default_accelerator(self.gpus_per_worker))
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        self.accelerator = row.name
        if row.resource is None and self.gpus_per_worker:
            raise SpecError(
                "--accelerator cpu takes no accelerators; drop --gpus-per-worker or name"
                " the accelerator (gpu, npu, hpu)."
            )
        if row.resource is not None and not self.gpus_per_worker:
            raise SpecError(
                f"--accelerator {row.name} needs --gpus-per-worker N, the {row.resource}s"
                " each worker uses."
            )
        self.resources = custom_resources(self.resources)
        self.placement = placement_name(self.placement)
        self.label_selector = label_selector(self.label_selector, self.workers)

    def _check_retention(self) -> None:
        check_number("max_failures", self.max_failures, -1, integer=True)
        self.max_failures = int(self.max_failures)
        check_number("max_preemptions", self.max_preemptions, -1, integer=True)
        self.max_preemptions = int(self.max_preemptions)
        check_number("keep_checkpoints", self.keep_checkpoints, 1, integer=True)
        self.keep_checkpoints = int(self.keep_checkpoints)
        if self.keep_best is not None:
            metric, sep, order = str(self.keep_best).rpartition(":")
            if not sep or not metric or order not in ("max", "min"):
                raise SpecError(
                    f"keep_best takes METRIC:max or METRIC:min, got {self.keep_best!r}."
                )

    def _check_stall(self) -> None:
        if self.stall_timeout is not None:
            check_number("stall_timeout", self.stall_timeout, 1)
            self.stall_timeout = float(self.stall_timeout)
        if self.on_stall not in ON_STALL:
            raise SpecError(f"on_stall takes {', '.join(ON_STALL)}, got {self.on_stall!r}.")
        if self.on_stall != "warn" and self.stall_timeout is None:
            raise SpecError(
                f"--on-stall {self.on_stall} needs --stall-timeout SECONDS (stall_timeout)."
            )

    def keep_best_order(self) -> tuple[str, str] | None:
        """``keep_best`` as ``(metric, "max" | "min")``; None when the newest are kept."""
        if not self.keep_best:
            return None
        metric, _, order = self.keep_best.rpartition(":")
        return metric, order

    def worker_resources(self) -> dict[str, float]:
        """The Ray resources of one worker: ``{"CPU": 1, "GPU": 1, "rack_a": 1}``."""
        need = resources_per_worker(
            self.cpus_per_worker, self.gpus_per_worker, self.accelerator, self.resources
        )
        return {k: v for k, v in need.items() if v > 0}

    def catalog(self):
        """The :class:`~.telemetry.cost.PriceCatalog` this job is metered with.

        Raises SpecError (one sentence) for a missing or invalid catalog file."""
        from .services import state_dir
        from .telemetry.cost import EXAMPLE_CATALOG, PriceCatalog

        path = self.price_catalog or state_dir() / "prices.toml"
        if not self.price_catalog and not Path(path).is_file():
            return EXAMPLE_CATALOG
        try:
            return PriceCatalog.load(path)
        except FileNotFoundError:
            raise SpecError(f"No price catalog at {path}.") from None
        except ValueError as exc:
            raise SpecError(f"Bad price catalog: {exc}") from None

    def runtime_env_extras(self) -> dict[str, Any]:
        """The user's part of the Ray runtime environment."""
        extras: dict[str, Any] = {}
        if self.working_dir:
            extras["working_dir"] = self.working_dir
        if self.pip:
            extras["pip"] = list(self.pip)
        return extras

    def params(self) -> dict[str, Any]:
        """MLflow params, logged once: resources, failure budget (text) and the config's
        leaves as ``config.<path>`` (``tracking.flatten_config``; values as given:
        ``tracking.prepare_params`` makes keys and values valid for MLflow)."""
        params = {
            "workers": str(self.workers),
            "cpus_per_worker": f"{self.cpus_per_worker:g}",
            "gpus_per_worker": f"{self.gpus_per_worker:g}",
            "accelerator": str(self.accelerator),
            "placement": self.placement,
            "max_failures": str(self.max_failures),
            "max_preemptions": str(self.max_preemptions),
            "keep_checkpoints": str(self.keep_checkpoints),
            "function": self.function_name,
        }
        if self.working_dir:
            params["working_dir"] = self.working_dir
        if self.resources:
            params["resources"] = json.dumps(self.resources, sort_keys=True)
        if self.label_selector:
            params["label_selector"] = json.dumps(self.label_selector, sort_keys=True)
        if self.keep_best:
            params["keep_best"] = self.keep_best
        if self.peak_tflops:
            params["peak_tflops"] = f"{self.peak_tflops:g}"
        if self.flops_per_token:
            params["flops_per_token"] = f"{self.flops_per_token:g}"
        if self.budget:
            params["budget"] = f"{self.budget:g}"
        if self.spot:
            params["spot"] = "true"
        if self.preflight:
            params["preflight"] = "true"
        if self.avoid_unhealthy:
            params["avoid_unhealthy"] = "true"
        if self.target_steps:
            params["target_steps"] = str(self.target_steps)
        if self.stall_timeout:
            params["stall_timeout"] = f"{self.stall_timeout:g}"
            params["on_stall"] = self.on_stall
        if self.pip:
            params["pip"] = " ".join(self.pip)
        if self.dataset_config:
            params["dataset_config"] = self.dataset_config
        params.update(flatten_config(self.config, "config"))
        return params

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe dict (the config through ``tracking.json_safe``: keys as text, values
        that are not JSON described by type, shape and digest)."""
        shallow = copy.copy(self)
        shallow.config = {}  # asdict would deep-copy every tensor of the config
        data = asdict(shallow)
        data["config"] = json_safe(self.config)
        return data
