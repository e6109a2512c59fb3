"""MLflow: tag names, the job's run and its params, run links (key hygiene:
``telemetry.keys``; reading runs back: ``runreads``).

Whatever a user's config holds is recorded, never refused over MLflow's rules
(``mlflow.utils.validation``): param keys go through the metric keys' stable mapping
(``telemetry.keys.KeyMapper``: refused characters, 250 characters, collisions) with the
renames in the tag ``trainfactory.renamed_params``; values over 6,000 characters (8,000
for tags) keep a marked prefix and a digest (:func:`fit_text`); values that are not text
are described by type, shape and digest (:func:`param_value`); at most
:data:`MAX_PARAMS` params are logged, in MLflow's batch sizes (:func:`log_params`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EXPERIMENT_KIND",
    "UI_QUERY",
    "MAX_PARAMS",
    "ParamSet",
    "TAG",
    "client",
    "create_job_run",
    "experiment_id",
    "experiment_name",
    "fit_tags",
    "fit_text",
    "flatten_config",
    "json_safe",
    "key_text",
    "log_data_inputs",
    "log_params",
    "param_value",
    "prepare_params",
    "run_tags",
    "run_url",
]

#: MLflow 3's limits (``mlflow.utils.validation``; names: its database columns).
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_PARAMS_PER_BATCH = 100
MAX_BATCH_CHARS = 500_000  # half of MLflow's 1 MB limit on a log_batch request
MAX_EXPERIMENT_NAME = 256
MAX_RUN_NAME = 250
#: Params logged per run: the job's settings first, then config leaves in their order;
#: the rest are in the artifact ``trainfactory/params.json`` (and the whole config in
#: the payload's ``job.json``), with the tag ``trainfactory.params.omitted``.
MAX_PARAMS = 1000
#: Lists and tuples of at most this many items are flattened into one param per item.
MAX_LIST_ITEMS = 16
#: The experiment tag the MLflow UI reads to open an experiment's view, and its value
#: for model training (``genai_development`` opens the GenAI "Evaluations" view).
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
EXPERIMENT_KIND = "custom_model_development"
#: The query a link into the MLflow UI ends with. MLflow 3's UI (3.17) picks an
#: experiment's view from its workflow switch, not from the experiment's tag: the
#: ``workflowType`` URL parameter, else the browser's last choice, else "genai" (the
#: "Evaluations" view); links the tool gives open the model-training view.
UI_QUERY = "workflowType=machine_learning"
#: Arrays larger than this (bytes) are described without a digest.
_MAX_DIGEST_BYTES = 256 * 2**20
PARAMS_ARTIFACT = "trainfactory/params.json"


class TAG:
    """Run tags this tool writes (all under the ``trainfactory.`` prefix)."""

    JOB_ID = "trainfactory.job_id"
    SUBMISSION = "trainfactory.ray_submission_id"
    DASHBOARD = "trainfactory.ray_dashboard"
    LOCAL_HEAD = "trainfactory.local_head"
    OWNER = "trainfactory.owner"
    SOURCE = "trainfactory.source"
    FUNCTION = "trainfactory.function"
    FUNCTION_SHA = "trainfactory.code.function_sha256"  # written by lineage.CodeVersion
    STATE = "trainfactory.state"
    REASON = "trainfactory.reason"
    WAITING = "trainfactory.waiting"  # a PENDING job's reason in a few words (the driver's)
    ERROR = "trainfactory.error"
    STOP = "trainfactory.stop_requested"
    STOP_GRACE = "trainfactory.stop_grace_s"
    STOP_TIME = "trainfactory.stop_time"
    STEP = "trainfactory.step"
    CKPT_PATH = "trainfactory.checkpoint.path"
    CKPT_STEP = "trainfactory.checkpoint.step"
    CKPT_TIME = "trainfactory.checkpoint.time"
    STARTED = "trainfactory.started"
    WORKERS = "trainfactory.workers"
    FAILURES = "trainfactory.faults.records"  # JSON: the latest FailureRecords, with kinds
    FAULT_COUNTS = "trainfactory.faults.counts"  # JSON: failures per kind and node, all
    FAILURE = "trainfactory.failure"  # JSON: the last failure's rank, node, type, traceback
    RANK = "trainfactory.rank."  # + rank -> JSON: pid, node_id, node_ip of its worker
    STALL = "trainfactory.stall"  # "" or what stalled since when
    STALL_SUGGESTED = "trainfactory.stall.suggested_s"
    STALL_TIMEOUT = "trainfactory.stall.timeout_s"  # the job's timeout, or "off"
    CHAOS = "trainfactory.chaos"  # JSON request: id and rank or node
    CHAOS_DONE = "trainfactory.chaos.done"  # JSON: id, killed ranks, error
    RESUMES = "trainfactory.resumes"  # number of resume submissions
    STOPS = "trainfactory.stops"  # planned stops of earlier submissions (written at a resume)
    RESUME_SPEC = "trainfactory.resume.spec"  # JSON: the latest resume's changed options
    # a resume of a job that saved no checkpoint trains from the start: as a new job
    STARTED_OVER_FROM = "trainfactory.started_over_from"  # on its run: the old job's id
    STARTED_OVER_AS = "trainfactory.started_over_as"  # on the old job's run: the new id
    ENV = "trainfactory.env."  # + python, ray, torch, cuda, nvidia_driver: as the workers see
    PROJECT = "trainfactory.project"  # chargeback group given at launch
    TARGET_STEPS = "trainfactory.target_steps"  # the step the user expects the job to reach
    DATA = "trainfactory.data."  # + input name -> JSON: digest, digest_of, source
    # + Ray Data dataset name -> JSON: source, digest, digest_of, paths, schema, rows, ...
    DATASET = "trainfactory.dataset."
    REDACTED = "trainfactory.redacted"  # JSON list: config/env paths whose values were masked
    # JSON {"price_gb_month", "history": [[time, bytes kept], ...]}: storage after the job
    STORAGE = "trainfactory.storage"
    REGISTERED = "trainfactory.registered"  # on a checkpoint's LoggedModel: "NAME/VERSION"
    DELETED = "trainfactory.checkpoint.deleted"  # on a checkpoint's LoggedModel: when
    # JSON {"strategy", "min_nodes", "nodes": {node label: [ranks]}, "ranks": {rank: label}}:
    # where the current attempt's workers were placed
    PLACEMENT = "trainfactory.placement"
    PLACEMENT_WARNING = "trainfactory.placement.warning"  # a pack request that ended spread
    RENAMED_KEYS = "trainfactory.renamed_keys"  # JSON {metric key: MLflow key} (recorder)
    RENAMED_PARAMS = "trainfactory.renamed_params"  # JSON {param key: MLflow key}
    PARAMS_OMITTED = "trainfactory.params.omitted"  # how many params are only in artifacts
    # written by the job's RunRecorder (ray_backend/)
    GPUS = "trainfactory.gpus."  # + node label -> JSON: the GPUs its sampler reads
    GPU_NOTE = "trainfactory.gpu_note."  # + node label -> why its sampler reads no GPU
    FAULTS_LAST = "trainfactory.faults.last"  # "HH:MM:SS rank R: error" of the last failure
    FAULTS_RESTARTS = "trainfactory.faults.restarts"
    RESTORE_STEP = "trainfactory.faults.restore_step"  # the step the last restart restored
    STOP_WAITING = "trainfactory.stop.waiting"  # "" or the rank a stop waits for
    FLOPS_PER_TOKEN = "trainfactory.flops_per_token"
    N_PARAMS = "trainfactory.model.n_params"
    DEVICE_NAME = "trainfactory.device_name"
    PEAK_FLOPS = "trainfactory.peak_flops"
    MFU_NOTE = "trainfactory.mfu_note"  # "" or why train/mfu is not written
    NONFINITE_STEP = "trainfactory.nonfinite.first_step"
    NONFINITE_KEY = "trainfactory.nonfinite.first_key"
    NONFINITE_COUNT = "trainfactory.nonfinite.count"
    OFFLINE_S = "trainfactory.tracking.offline_s"  # s the tracking server was away
    DROPPED_POINTS = "trainfactory.tracking.dropped_points"  # system points dropped
    LAST_OUTAGE = "trainfactory.tracking.last_outage"
    COST_CURRENCY = "trainfactory.cost.currency"
    COST_CATALOG = "trainfactory.cost.catalog"
    COST_WARNINGS = "trainfactory.cost.warnings"
    COST_BUDGET = "trainfactory.cost.budget"
    RUN_ID = "trainfactory.run_id"  # on a job's records outside its run (models, payload)
    SELECTED_BY = "trainfactory.selected_by"  # how a registered checkpoint was chosen
    TIMELINE = "trainfactory.goodput.timeline"  # JSON: the goodput timeline's segments
    CODE_NOTEBOOK = "trainfactory.code.notebook"
    CODE_NOTEBOOK_SHA256 = "trainfactory.code.notebook_sha256"
    CODE_FUNCTION_SHA256 = "trainfactory.code.function_sha256"
    CODE_GIT_DIRTY = "trainfactory.code.git_dirty"
    # a sweep (jupyter_trainfactory.sweeps): the parent run's settings (JSON) and counts;
    # on each trial's child run, the sweep's job id, the Tune trial id and its index
    SWEEP = "trainfactory.sweep.settings"
    SWEEP_JOB = "trainfactory.sweep.job_id"
    TRIAL = "trainfactory.sweep.trial_id"
    TRIAL_INDEX = "trainfactory.sweep.trial_index"
    SWEEP_BEST = "trainfactory.sweep.best"  # JSON: trial index, run id, value, iteration
    EARLY_STOP = "trainfactory.sweep.early_stop"  # JSON: the iteration and ASHA rung


def client(tracking_uri: str):
    """An ``MlflowClient`` for ``tracking_uri`` (imported lazily: workers need no MLflow)."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def fit_text(text: str, limit: int = MAX_PARAM_VALUE) -> str:
    """``text`` when it has at most ``limit`` characters, else its prefix marked with its
    length and the first 16 hex digits of its SHA-256 (``"xxxx ...[cut: 10,000 characters,
    sha256 3f2a...]"``): exactly ``limit`` characters, the same text always cut the same way.
    """
    if len(text) <= limit:
        return text
    digest = _digest(text.encode("utf-8", "surrogatepass"))
    marker = f" ...[cut: {len(text):,} characters, sha256 {digest}]"
    return text[: limit - len(marker)] + marker


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _array_digest(value: Any) -> str:
    """SHA-256 (16 hex digits) of an array's dtype, shape and bytes; "" when unavailable
    (a GPU tensor, a dtype numpy lacks, more than 256 MiB)."""
    np = sys.modules.get("numpy")
    if np is None or (getattr(value, "nbytes", 0) or 0) > _MAX_DIGEST_BYTES:
        return ""
    try:
        if hasattr(value, "detach"):  # a torch tensor: only one already in host memory
            if str(getattr(value, "device", "cpu")) != "cpu":
                return ""
            value = value.detach()
        array = np.ascontiguousarray(np.asarray(value))
        if array.dtype == object or array.nbytes > _MAX_DIGEST_BYTES:
            return ""
        head = f"{array.dtype.str}{array.shape}".encode()
        return _digest(head + array.tobytes())
    except Exception:
        return ""


def _describe(value: Any) -> str | None:
    """A short text for a value that is not text: arrays and tensors by type, shape,
    dtype and digest, 0-d ones by their number, functions and classes by name."""
    import inspect

    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype") and not isinstance(value, type):
        try:
            dims = tuple(int(d) for d in shape)
        except (TypeError, ValueError):
            dims = None
        if dims == () and callable(getattr(value, "item", None)):
            try:
                return param_value(value.item())
            except Exception:
                pass
        digest = _array_digest(value)
        text = f"<{_type_name(value)} shape={dims if dims is not None else shape}"
        text += f" dtype={value.dtype}" + (f" sha256={digest}>" if digest else ">")
        return fit_text(text)
    if inspect.isroutine(value) or inspect.isclass(value):
        module = getattr(value, "__module__", None) or "?"
        name = getattr(value, "__qualname__", None) or getattr(value, "__name__", "?")
        kind = "class" if inspect.isclass(value) else "function"
        return fit_text(f"<{kind} {module}.{name}>")
    return None


def _builtin_number(value: bool | int | float) -> bool | int | float:
    """``value`` as the builtin type it subclasses (``np.float64(0.5)`` -> ``0.5``)."""
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return value if type(value) is kind else kind(value)
    return value


def param_value(value: Any, limit: int = MAX_PARAM_VALUE) -> str:
    """The text MLflow records for one config value, at most ``limit`` characters.

    Text as it is; numbers, booleans and None as their ``repr``; arrays and tensors
    (anything with ``shape`` and ``dtype``) as ``<numpy.ndarray shape=(3, 4)
    dtype=float32 sha256=...>``, 0-d ones and numpy scalars as their number; functions and
    classes by qualified name; other objects by ``repr``. Anything longer than ``limit``
    is cut by :func:`fit_text` (marked prefix and digest), so a huge ``repr`` never
    reaches MLflow. Never raises.
    """
    if isinstance(value, str):
        return fit_text(value, limit)
    if value is None or isinstance(value, (bool, int, float)):
        # A subclass (np.float64 subclasses float) reprs as "np.float64(0.999)": its number
        value = value if value is None else _builtin_number(value)
        try:
            return fit_text(repr(value), limit)
        except ValueError:  # an int over Python's 4,300-digit conversion limit
            return f"<int of {value.bit_length()} bits sha256={_digest(hex(value).encode())}>"
    try:
        described = _describe(value)
    except Exception:
        described = None
    if described is not None:
        return described[:limit]
    try:
        text = repr(value)
    except Exception as exc:
        text = f"<{_type_name(value)} (repr failed: {type(exc).__name__})>"
    return fit_text(text, limit)


def key_text(key: Any) -> str:
    """A config key as text, the same way everywhere (params, ``job.json``): ``str`` for
    text, ``repr`` otherwise (``1`` -> ``"1"``, ``(1, 2)`` -> ``"(1, 2)"``)."""
    return key if isinstance(key, str) else repr(key)


def _unique(name: str, taken: Mapping[str, Any], key: Any) -> str:
    """``name``, or with ``~<type>`` (and a number) added when a key of another type
    already took it (``1`` and ``"1"`` in one dict)."""
    if name not in taken:
        return name
    base = f"{name}~{type(key).__name__}"
    candidate, n = base, 1
    while candidate in taken:
        n += 1
        candidate = f"{base}{n}"
    return candidate


def flatten_config(config: Any, prefix: str = "") -> dict[str, Any]:
    """Leaves of a nested config: ``{"a.b.0": value}``, values untouched, in config order.

    Mappings flatten at every depth (keys through :func:`key_text`; a key that another
    key's text already took gets ``~<type>``), lists and tuples of at most
    :data:`MAX_LIST_ITEMS` items flatten by index; empty ones, longer ones and anything
    else are leaves. A container holding itself ends in a ``"<cycle>"`` leaf. With no
    ``prefix`` a config that is not a mapping is the one leaf ``"value"``.
    """
    out: dict[str, Any] = {}
    # explicit stack (no recursion limit on deep configs): (path, value, ids on the path)
    stack: list[tuple[str, Any, frozenset]] = [(prefix, config, frozenset())]
    while stack:
        path, value, seen = stack.pop()
        if id(value) in seen:
            out[_unique(path, out, value)] = "<cycle>"
            continue
        if isinstance(value, Mapping) and (value or not seen):  # the root: even empty
            children, names = [], {}
            for key, item in value.items():
                name = _unique(key_text(key), names, key)
                names[name] = None
                children.append((f"{path}.{name}" if path else name, item))
        elif isinstance(value, (list, tuple)) and 0 < len(value) <= MAX_LIST_ITEMS:
            children = [(f"{path}.{i}" if path else str(i), v) for i, v in enumerate(value)]
        else:
            out[_unique(path or "value", out, value)] = value
            continue
        inner = seen | {id(value)}
        stack.extend((p, v, inner) for p, v in reversed(children))
    return out


def json_safe(value: Any, _seen: frozenset = frozenset()) -> Any:
    """``value`` as JSON can hold it: mappings with :func:`key_text` keys, tuples as
    lists, text, numbers and None unchanged (however long); anything else as
    :func:`param_value`'s description. The job itself gets the original (``config.pkl``)."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 4000:
            return param_value(value)
        return value
    if id(value) in _seen:
        return "<cycle>"
    inner = _seen | {id(value)}
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out[_unique(key_text(key), out, key)] = json_safe(item, inner)
        return out
    if isinstance(value, (list, tuple)):
        return [json_safe(item, inner) for item in value]
    return param_value(value)


@dataclass
class ParamSet:
    """Params ready for MLflow (:func:`prepare_params`).

    Attributes
    ----------
    params : dict of str to str
        MLflow key -> value (at most 6,000 characters), at most :data:`MAX_PARAMS` items.
    renamed : dict of str to str
        Given key -> MLflow key, for every key the mapping changed.
    omitted : dict of str to str
        Given key -> value of the params over the cap (not logged).
    """

    params: dict[str, str] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    omitted: dict[str, str] = field(default_factory=dict)

    def _renames_text(self) -> tuple[str, bool]:
        """The renames as JSON that fits in a tag, and whether some were left out."""
        shown: dict[str, str] = {}
        size = 2
        for key, mapped in self.renamed.items():
            size += len(json.dumps(key)) + len(json.dumps(mapped)) + 4
            if size > MAX_TAG_VALUE - 100:
                shown["..."] = f"{len(self.renamed) - len(shown)} more in {PARAMS_ARTIFACT}"
                return json.dumps(shown), True
            shown[key] = mapped
        return json.dumps(shown), False

    def tags(self) -> dict[str, str]:
        """``trainfactory.renamed_params`` (JSON, as many renames as fit in a tag, then
        ``"...": "N more in trainfactory/params.json"``) and ``trainfactory.params.omitted``
        (a sentence); empty when nothing was renamed or left out."""
        tags: dict[str, str] = {}
        if self.renamed:
            tags[TAG.RENAMED_PARAMS] = self._renames_text()[0]
        if self.omitted:
            total = len(self.params) + len(self.omitted)
            tags[TAG.PARAMS_OMITTED] = (
                f"{len(self.omitted)} of {total} params are not logged (at most"
                f" {len(self.params)} per run); they are in the artifact {PARAMS_ARTIFACT}"
                " and the whole config in trainfactory/payload/job.json"
            )
        return tags

    def needs_artifact(self) -> bool:
        """Whether some renames or values are only in :data:`PARAMS_ARTIFACT`."""
        return bool(self.omitted) or self._renames_text()[1]


def prepare_params(params: Mapping[Any, Any], max_params: int = MAX_PARAMS) -> ParamSet:
    """Map flat params (``{"config.timing(s)/gen": 1.5}``) to what MLflow accepts.

    Keys go through ``telemetry.keys.KeyMapper`` (refused characters -> ``_``, over 250
    characters cut with a hash, collisions and path prefixes told apart with ``_``);
    values through :func:`param_value`. The first ``max_params`` are kept, the rest go to
    ``omitted``. Never raises on a key or value.
    """
    from .telemetry.keys import KeyMapper

    mapper = KeyMapper()
    out = ParamSet()
    for key, value in params.items():
        raw = key_text(key)
        text = param_value(value)
        if len(out.params) >= max_params:
            out.omitted[raw] = text
            continue
        mapped = mapper(raw)
        out.params[mapped] = text
    out.renamed = dict(mapper.renamed)
    return out


def log_params(mlflow_client, run_id: str, params: Mapping[str, str]) -> None:
    """Log already valid params (:func:`prepare_params`) in batches of at most 100 and
    about 500,000 characters (MLflow refuses requests over 1 MB)."""
    from mlflow.entities import Param

    batch: list = []
    size = 0
    for key, value in params.items():
        item = len(json.dumps(key)) + len(json.dumps(value)) + 32
        if batch and (len(batch) >= MAX_PARAMS_PER_BATCH or size + item > MAX_BATCH_CHARS):
            mlflow_client.log_batch(run_id, params=batch)
            batch, size = [], 0
        batch.append(Param(key, value))
        size += item
    if batch:
        mlflow_client.log_batch(run_id, params=batch)


def fit_tags(tags: Mapping[str, Any]) -> dict[str, str]:
    """Tags MLflow accepts: keys through ``telemetry.keys.clean_key`` (a valid key is
    unchanged; ``trainfactory.data.données`` becomes ``trainfactory.data.donn_es``),
    values as text of at most 8,000 characters (:func:`fit_text`)."""
    from .telemetry.keys import clean_key

    return {
        clean_key(k): fit_text(v if isinstance(v, str) else str(v), MAX_TAG_VALUE)
        for k, v in tags.items()
    }


def run_tags(tags: Mapping[str, str]) -> list:
    """``tags`` as MLflow ``RunTag`` entities, for ``MlflowClient.log_batch``."""
    from mlflow.entities import RunTag

    return [RunTag(k, v) for k, v in tags.items()]


def clear_tags(mlflow_client, run_id: str, keys) -> None:
    """Delete the tags ``keys`` of run ``run_id`` that it has: a tag describes the run as it
    is now, so one that no longer holds goes, rather than stay stale or be written empty.
    A tag the server does not delete (not there; a server-side error, seen once from
    MLflow on SQLite: "Query-invoked autoflush") stays: a stale tag is better than a
    failed resume. Raises when the server cannot be reached."""
    from mlflow.exceptions import MlflowException

    for key in keys:
        with contextlib.suppress(MlflowException):
            mlflow_client.delete_tag(run_id, key)


def write_tags(mlflow_client, run_id: str, tags: Mapping[str, str]) -> None:
    """Set ``tags`` on run ``run_id``; an empty value deletes its tag (:func:`clear_tags`)."""
    kept = {k: v for k, v in tags.items() if v != ""}
    if kept:
        mlflow_client.log_batch(run_id, tags=run_tags(kept))
    clear_tags(mlflow_client, run_id, [k for k, v in tags.items() if v == ""])


def experiment_name(name: str) -> str:
    """``name`` as stored in MLflow: unchanged up to 256 characters (the experiments
    table's limit), else its first 247 with ``~`` and 8 hex digits of its SHA-1."""
    if len(name) <= MAX_EXPERIMENT_NAME:
        return name
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return name[: MAX_EXPERIMENT_NAME - 9] + "~" + digest


def experiment_id(mlflow_client, name: str) -> str:
    """Id of experiment ``name`` (through :func:`experiment_name`), created when missing
    with the tag that opens it in the MLflow UI's model-training view; an experiment
    without that tag gets it (one the user gave another kind keeps it)."""
    name = experiment_name(name)
    exp = mlflow_client.get_experiment_by_name(name)
    if exp is not None:
        if EXPERIMENT_KIND_TAG not in (exp.tags or {}):
            mlflow_client.set_experiment_tag(
                exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND
            )
        return exp.experiment_id
    try:
        return mlflow_client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
    except Exception:  # created concurrently by another process
        exp = mlflow_client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def create_job_run(
    mlflow_client, experiment: str, run_name: str, tags: dict[str, str], params: dict[str, Any]
):
    """Create the job's run with its tags and params (logged once, here). Returns the Run.

    ``params`` are flat (``{"config.lr": 0.1}``, any keys and values): they go through
    :func:`prepare_params`, with the renames and the params over :data:`MAX_PARAMS` in
    the run's tags (and the artifact ``trainfactory/params.json`` when they do not fit);
    tag values over 8,000 characters are cut (:func:`fit_tags`), the run name to 250
    characters (unicode kept).
    """
    from mlflow.entities import RunTag

    exp_id = experiment_id(mlflow_client, experiment)
    prepared = prepare_params(params)
    tags = fit_tags({**tags, **prepared.tags()})
    run = mlflow_client.create_run(exp_id, run_name=run_name[:MAX_RUN_NAME], tags=tags)
    log_params(mlflow_client, run.info.run_id, prepared.params)
    if prepared.needs_artifact():
        listing = {"renamed": prepared.renamed, "omitted": prepared.omitted}
        mlflow_client.log_text(run.info.run_id, json.dumps(listing, indent=1), PARAMS_ARTIFACT)
    mlflow_client.log_batch(run.info.run_id, tags=[RunTag(TAG.STARTED, str(time.time()))])
    return mlflow_client.get_run(run.info.run_id)


def log_data_inputs(mlflow_client, run_id: str, inputs: list) -> None:
    """Record ``lineage.DataInput`` items as the run's datasets (``log_inputs``, context
    ``training``): name, digest, source and profile, as the MLflow UI shows them."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    datasets = [
        DatasetInput(
            Dataset(
                name=d.name,
                digest=d.digest[:36],  # MLflow keeps digests of at most 36 characters
                source_type=d.source_type,
                source=json.dumps({"uri": d.source, "digest": d.digest, "digest_of": d.digest_of}),
                profile=json.dumps({**d.profile, "size_bytes": d.size_bytes}, default=str),
            ),
            tags=[InputTag("mlflow.data.context", "training")],
        )
        for d in inputs
    ]
    mlflow_client.log_inputs(run_id, datasets=datasets)


def run_url(tracking_uri: str, run) -> str:
    """Link to the run in the MLflow UI ("" for non-HTTP tracking URIs), in its
    model-training view (:data:`UI_QUERY`)."""
    if not tracking_uri.startswith(("http://", "https://")):
        return ""
    base = tracking_uri.rstrip("/")
    return f"{base}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}?{UI_QUERY}"
