"""JobSpec: the one validated description of a training job, shared by every door."""

from __future__ import annotations

import copy
import getpass
import json
import math
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .tracking import flatten_config, json_safe, param_value

__all__ = [
    "ON_STALL",
    "PLACEMENTS",
    "JobSpec",
    "SpecError",
    "current_owner",
    "flatten",
    "parse_env",
    "parse_pairs",
    "selector_text",
]

DEFAULT_EXPERIMENT = "trainfactory"
#: What a stall (no progress for ``stall_timeout`` s) does; see :class:`JobSpec`.
ON_STALL = ("warn", "restart", "stop")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: ``--placement`` -> Ray's placement group strategy (``ray.util.placement_group``), which
#: Ray Train uses for the workers' bundles (``ScalingConfig.placement_strategy``).
PLACEMENTS = {
    "pack": "PACK",
    "spread": "SPREAD",
    "strict-pack": "STRICT_PACK",
    "strict-spread": "STRICT_SPREAD",
}
#: Resources with their own option; ``resources`` holds the custom ones.
_BUILTIN_RESOURCES = {
    "CPU": "CPUs come from --cpus-per-worker",
    "GPU": "GPUs come from --gpus-per-worker",
    "NPU": "NPUs come from --gpus-per-worker with --accelerator npu",
    "HPU": "HPUs come from --gpus-per-worker with --accelerator hpu",
    "TPU": "TPUs are not supported",
    "memory": "Ray's memory resource is not reserved per worker by this tool",
    "object_store_memory": "Ray's object store is not reserved per worker by this tool",
}
_LABEL_KEY = re.compile(r"^([A-Za-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")


class SpecError(ValueError):
    """Bad input for a job; the message is one sentence that says what to do instead."""


def current_owner() -> str:
    """The JupyterHub user when running under JupyterHub, else the OS user."""
    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


def parse_env(items: list[str] | dict[str, str] | None) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (or a dict) -> ``{"KEY": "VALUE"}``; raises SpecError on bad items."""
    if not items:
        return {}
    if isinstance(items, dict):
        pairs = list(items.items())
    else:
        pairs = []
        for item in items:
            key, sep, value = item.partition("=")
            if not sep:
                raise SpecError(f"--env takes KEY=VALUE, got {item!r}.")
            pairs.append((key, value))
    for key, _ in pairs:
        if not _ENV_KEY.match(key):
            raise SpecError(f"{key!r} is not a valid environment variable name.")
    return {k: str(v) for k, v in pairs}


def parse_pairs(items: list[str] | dict[str, str] | None, option: str) -> dict[str, str]:
    """``["KEY=VALUE", ...]`` (or a dict) -> ``{"KEY": "VALUE"}`` for ``option``'s message;
    raises SpecError on an item without ``=`` or an empty key."""
    if not items:
        return {}
    if isinstance(items, dict):
        return {str(k): str(v) for k, v in items.items()}
    out = {}
    for item in items:
        key, sep, value = str(item).partition("=")
        if not sep or not key.strip():
            raise SpecError(f"{option} takes KEY=VALUE, got {item!r}.")
        out[key.strip()] = value.strip()
    return out


def _label_selector(value: Any, workers: int) -> dict[str, str] | list[dict[str, str]]:
    """Validate a Ray label selector: one ``{label: expression}`` for every worker, or a
    list of them, one per worker (Ray Train's per-worker-group form). An expression is
    ``value``, ``!value``, ``in(a,b)`` or ``!in(a,b)`` (Ray's label selector syntax)."""
    selectors = value if isinstance(value, list) else [value]
    if isinstance(value, list) and len(value) != workers:
        raise SpecError(
            f"A per-worker label_selector list needs one entry per worker ({workers}),"
            f" got {len(value)}."
        )
    out = []
    for selector in selectors:
        if not isinstance(selector, dict):
            raise SpecError(f"A label selector is a dict of label -> value, got {selector!r}.")
        for key, expr in selector.items():
            if not _LABEL_KEY.match(str(key)):
                raise SpecError(f"{key!r} is not a node label name (like 'ray.io/node-group').")
            if not str(expr).strip() or str(expr).strip() in ("!", "in()", "!in()"):
                raise SpecError(f"The label selector {key}= needs a value.")
        out.append({str(k): str(v).strip() for k, v in selector.items()})
    return out if isinstance(value, list) else out[0]


def selector_text(selector: dict[str, str] | list[dict[str, str]] | None) -> str:
    """A label selector (one dict, or one per worker) as ``key=value ...``, sorted."""
    selectors = selector if isinstance(selector, list) else [selector] if selector else []
    return " ".join(sorted({f"{k}={v}" for s in selectors for k, v in s.items()}))


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """Flatten nested dicts/lists into ``{"a.b": "value"}`` texts as MLflow params hold them
    (``tracking.flatten_config`` then ``tracking.param_value``)."""
    return {k: param_value(v) for k, v in flatten_config(value, prefix).items()}


def _check_number(name: str, value: Any, minimum: float, integer: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise SpecError(f"{name} must be a number, got {value!r}.")
    if integer and int(value) != value:
        raise SpecError(f"{name} must be a whole number, got {value!r}.")
    if value < minimum:
        raise SpecError(f"{name} must be at least {minimum:g}, got {value!r}.")


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
    """

    function_name: str
    workers: int = 2
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    accelerator: str | None = None
    resources: dict[str, float] = field(default_factory=dict)
    placement: str = "pack"
    label_selector: dict[str, str] | list[dict[str, str]] = field(default_factory=dict)
    max_failures: int = 0
    max_preemptions: int = -1
    keep_checkpoints: int = 2
    keep_best: str | None = None
    config: dict[str, Any] = field(default_factory=dict)
    experiment: str = DEFAULT_EXPERIMENT
    run_name: str = ""
    working_dir: str | None = None
    pip: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    address: str | None = None
    tracking_uri: str | None = None
    storage: str | None = None
    source: str = ""
    peak_tflops: float | None = None
    flops_per_token: float | None = None
    stall_timeout: float | None = None
    on_stall: str = "warn"
    budget: float | None = None
    price_catalog: str | None = None
    spot: bool = False
    project: str = ""
    target_steps: int | None = None
    owner: str = field(default_factory=current_owner)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field; raise :class:`SpecError` with one sentence on the first problem."""
        if not self.function_name or not self.function_name.isidentifier():
            raise SpecError(f"{self.function_name!r} is not a function name.")
        _check_number("workers", self.workers, 1, integer=True)
        self.workers = int(self.workers)
        _check_number("cpus_per_worker", self.cpus_per_worker, 0)
        _check_number("gpus_per_worker", self.gpus_per_worker, 0)
        if self.cpus_per_worker == 0 and self.gpus_per_worker == 0:
            raise SpecError(
                "A worker needs some CPU or GPU; set cpus_per_worker or gpus_per_worker above 0."
            )
        self._validate_placement()
        _check_number("max_failures", self.max_failures, -1, integer=True)
        self.max_failures = int(self.max_failures)
        _check_number("max_preemptions", self.max_preemptions, -1, integer=True)
        self.max_preemptions = int(self.max_preemptions)
        _check_number("keep_checkpoints", self.keep_checkpoints, 1, integer=True)
        self.keep_checkpoints = int(self.keep_checkpoints)
        if self.keep_best is not None:
            metric, sep, order = str(self.keep_best).rpartition(":")
            if not sep or not metric or order not in ("max", "min"):
                raise SpecError(
                    f"keep_best takes METRIC:max or METRIC:min, got {self.keep_best!r}."
                )
        if self.config is None:
            self.config = {}
        if not isinstance(self.config, dict):
            raise SpecError(f"config must be a dict, got {type(self.config).__name__}.")
        if not self.experiment or not self.experiment.strip():
            raise SpecError("The experiment name must not be empty.")
        self.run_name = self.run_name or self.function_name
        if self.working_dir is not None:
            path = Path(self.working_dir).expanduser()
            if not path.is_dir():
                raise SpecError(f"The working directory {self.working_dir!r} does not exist.")
            self.working_dir = str(path.resolve())
        if isinstance(self.pip, str):
            self.pip = [self.pip]
        self.pip = [str(p) for p in (self.pip or [])]
        self.env = parse_env(self.env)
        for name in ("peak_tflops", "flops_per_token"):
            value = getattr(self, name)
            if value is None:
                continue
            number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not number or not math.isfinite(value) or value <= 0:
                raise SpecError(f"{name} must be a positive, finite number, got {value!r}.")
            setattr(self, name, float(value))
        if self.stall_timeout is not None:
            _check_number("stall_timeout", self.stall_timeout, 1)
            self.stall_timeout = float(self.stall_timeout)
        if self.on_stall not in ON_STALL:
            raise SpecError(f"on_stall takes {', '.join(ON_STALL)}, got {self.on_stall!r}.")
        if self.on_stall != "warn" and self.stall_timeout is None:
            raise SpecError(
                f"--on-stall {self.on_stall} needs --stall-timeout SECONDS (stall_timeout)."
            )
        if self.budget is not None:
            number = isinstance(self.budget, (int, float)) and not isinstance(self.budget, bool)
            if not number or not math.isfinite(self.budget) or self.budget <= 0:
                raise SpecError(f"budget must be a positive amount, got {self.budget!r}.")
            self.budget = float(self.budget)
        if self.price_catalog:
            self.price_catalog = str(Path(self.price_catalog).expanduser().resolve())
            self.catalog()  # a bad file is refused now, before anything is submitted
        self.project = str(self.project or "").strip()
        if self.target_steps is not None:
            _check_number("target_steps", self.target_steps, 1, integer=True)
            self.target_steps = int(self.target_steps)
        if self.on_stall == "restart" and self.max_failures == 0:
            raise SpecError(
                "--on-stall restart restarts the workers, which uses the failure budget;"
                " set --max-failures (max_failures) to 1 or more, or -1."
            )

    def _validate_placement(self) -> None:
        from .accelerators import accelerator, default_accelerator

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
        resources = self.resources or {}
        if isinstance(resources, list):
            resources = parse_pairs(resources, "--resources")
        if not isinstance(resources, dict):
            raise SpecError(f"resources must be a dict, got {type(resources).__name__}.")
        checked = {}
        for key, value in resources.items():
            if key in _BUILTIN_RESOURCES:
                raise SpecError(f"--resources is for custom resources; {_BUILTIN_RESOURCES[key]}.")
            try:
                amount = float(value)
            except (TypeError, ValueError):
                amount = math.nan
            if not math.isfinite(amount) or amount < 0:
                raise SpecError(
                    f"--resources {key} takes an amount of 0 or more, like {key}=1; got {value!r}."
                )
            if amount > 0:
                checked[str(key)] = amount
        self.resources = checked
        placement = str(self.placement or "pack").lower().replace("_", "-")
        if placement not in PLACEMENTS:
            raise SpecError(f"--placement takes {', '.join(PLACEMENTS)}, got {self.placement!r}.")
        self.placement = placement
        selector = self.label_selector or {}
        if isinstance(selector, (list, tuple)) and all(isinstance(x, str) for x in selector):
            selector = parse_pairs(list(selector), "--label-selector")
        self.label_selector = _label_selector(
            list(selector) if isinstance(selector, tuple) else selector, self.workers
        )

    def worker_resources(self) -> dict[str, float]:
        """The Ray resources of one worker: ``{"CPU": 1, "GPU": 1, "rack_a": 1}``."""
        from .accelerators import resources_per_worker

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
        if self.target_steps:
            params["target_steps"] = str(self.target_steps)
        if self.stall_timeout:
            params["stall_timeout"] = f"{self.stall_timeout:g}"
            params["on_stall"] = self.on_stall
        if self.pip:
            params["pip"] = " ".join(self.pip)
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
