"""A sweep's search space and search settings, from text or Ray Tune objects.

``--param lr=loguniform(1e-4,1e-1)`` is Ray Tune's own syntax written as text: the
functions of ``ray.tune``'s search space API (``uniform``, ``quniform``,
``loguniform``, ``qloguniform``, ``randn``, ``qrandn``, ``randint``, ``qrandint``,
``lograndint``, ``qlograndint``, ``choice``, ``grid_search``; ``grid`` is short for
``grid_search``, and a ``tune.`` prefix is allowed), each argument a Python literal.
Only those calls are evaluated (``ast``), never arbitrary code.
"""

from __future__ import annotations

import ast
from dataclasses import asdict, dataclass, field
from typing import Any

from ..spec_values import SpecError

__all__ = [
    "SCHEDULERS",
    "SEARCHES",
    "SPACE_FILE",
    "SweepSettings",
    "domain_text",
    "grid_size",
    "parse_param",
    "parse_space",
]

#: The payload file that holds the sweep's search space (Ray Tune domains, cloudpickled).
SPACE_FILE = "search_space.pkl"
#: Ray Tune's search space functions (``ray.tune.search.sample``) a ``--param`` may call,
#: with the number of arguments each takes (min, max).
_FUNCTIONS = {
    "uniform": (2, 2),
    "quniform": (3, 3),
    "loguniform": (2, 3),
    "qloguniform": (3, 4),
    "randn": (0, 2),
    "qrandn": (3, 3),
    "randint": (2, 2),
    "qrandint": (2, 3),
    "lograndint": (2, 3),
    "qlograndint": (3, 4),
    "choice": (1, None),
    "grid_search": (1, None),
}
_ALIASES = {"grid": "grid_search"}
_LIST_ARGUMENT = {"choice", "grid_search"}  # choice(1,2,3) == choice([1, 2, 3])
#: ``--scheduler``: ASHA stops the worse trials early at its rungs (Li et al. 2018,
#: "A System for Massively Parallel Hyperparameter Tuning"); FIFO runs each to its end.
SCHEDULERS = ("asha", "fifo")
#: ``--search``: random sampling (Tune's default BasicVariantGenerator), a grid (every
#: combination of the ``grid`` values, each ``--trials`` times) or Optuna's TPE.
SEARCHES = ("random", "grid", "optuna")


def _literal(node: ast.AST, name: str, text: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise SpecError(
            f"--param {name}={text}: the arguments must be numbers or strings"
            f" ({ast.unparse(node)} is neither)."
        ) from None


def _call(name: str, text: str) -> tuple[str, list[Any]]:
    """``loguniform(1e-4, 1e-1)`` -> ``("loguniform", [0.0001, 0.1])``; raises SpecError."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise SpecError(
            f"--param {name}={text} is not a search space: write a Ray Tune function such"
            " as loguniform(1e-4,1e-1), choice(32,64) or grid(1,2,3)."
        ) from None
    if not isinstance(tree, ast.Call):
        raise SpecError(
            f"--param {name}={text} is not a search space: write a Ray Tune function such"
            f" as choice({text}) for a fixed set of values."
        )
    func = ast.unparse(tree.func).removeprefix("tune.")
    func = _ALIASES.get(func, func)
    if func not in _FUNCTIONS or tree.keywords:
        known = ", ".join(sorted([*_FUNCTIONS, *_ALIASES]))
        raise SpecError(f"--param {name}={text}: {ast.unparse(tree.func)}() is not one of {known}.")
    args = [_literal(a, name, text) for a in tree.args]
    if func in _LIST_ARGUMENT and len(args) == 1 and isinstance(args[0], (list, tuple)):
        args = list(args[0])
    low, high = _FUNCTIONS[func]
    if len(args) < low or (high is not None and len(args) > high):
        want = f"{low}" if low == high else f"{low} to {high}" if high else f"at least {low}"
        raise SpecError(f"--param {name}={text}: {func}() takes {want} arguments, got {len(args)}.")
    return func, args


def parse_param(item: str) -> tuple[str, Any]:
    """``"lr=loguniform(1e-4,1e-1)"`` -> ``("lr", <ray.tune Float domain>)``; a
    ``grid``/``grid_search`` gives Tune's ``{"grid_search": [...]}``. Raises SpecError
    (one sentence) for a missing ``=``, an unknown function, bad arguments or a range
    Tune refuses (``loguniform(0, 1)``)."""
    name, sep, text = item.partition("=")
    name = name.strip()
    if not sep or not name or not text.strip():
        raise SpecError(
            f"--param {item!r} must be NAME=FUNCTION(...), e.g. lr=loguniform(1e-4,1e-1)."
        )
    func, args = _call(name, text)
    from ray import tune

    if func == "grid_search":
        return name, tune.grid_search(args)
    if func == "choice":
        return name, tune.choice(args)
    try:
        return name, getattr(tune, func)(*args)
    except (ValueError, TypeError, AssertionError) as exc:
        raise SpecError(f"--param {name}={text}: Ray Tune refuses it ({exc}).") from None


def parse_space(params: dict[str, Any] | list[str] | None) -> dict[str, Any]:
    """The search space as Ray Tune's ``param_space``: ``["lr=loguniform(1e-4,1e-1)", ...]``
    or ``{"lr": "loguniform(1e-4,1e-1)" or tune.loguniform(1e-4, 1e-1), ...}``. Raises
    SpecError when it is empty, a name repeats or a value is neither text nor a Tune
    domain / grid."""
    if not params:
        raise SpecError("A sweep needs at least one --param NAME=FUNCTION(...) to search over.")
    items = params.items() if isinstance(params, dict) else [p.partition("=")[::2] for p in params]
    space: dict[str, Any] = {}
    for name, value in items:
        if name in space:
            raise SpecError(f"--param {name} is given twice.")
        if isinstance(value, str):
            space.update([parse_param(f"{name}={value}")])
        elif _is_domain(value):
            space[name] = value
        else:
            raise SpecError(
                f"The search space's {name!r} is a {type(value).__name__}: give Ray Tune text"
                " such as 'choice(32,64)' or a ray.tune domain (tune.choice([32, 64]))."
            )
    return space


def _is_domain(value: Any) -> bool:
    from ray.tune.search.sample import Domain

    return isinstance(value, Domain) or (isinstance(value, dict) and set(value) == {"grid_search"})


def grid_size(space: dict[str, Any]) -> int:
    """Combinations of the grid entries of ``space`` (1 without any)."""
    size = 1
    for value in space.values():
        if isinstance(value, dict) and "grid_search" in value:
            size *= len(value["grid_search"])
    return size


def domain_text(value: Any) -> str:
    """How a search space entry reads in the parent run's params: ``loguniform(0.0001, 0.1)``,
    ``choice([32, 64, 128])``, ``grid([1, 2])``."""
    from ray.tune.search.sample import Categorical, Float, Integer, LogUniform, Normal

    if isinstance(value, dict) and "grid_search" in value:
        return f"grid({value['grid_search']!r})"
    if isinstance(value, Categorical):
        return f"choice({list(value.categories)!r})"
    sampler = getattr(value, "sampler", None)
    base = getattr(sampler, "get_sampler", lambda: sampler)()
    q = getattr(sampler, "q", None)
    prefix = "q" if q is not None else ""
    tail = f", {q:g}" if q is not None else ""
    if isinstance(value, (Float, Integer)):
        kind = "int" if isinstance(value, Integer) else ""
        if isinstance(base, Normal):
            return f"{prefix}randn({base.mean:g}, {base.sd:g}{tail})"
        if isinstance(base, LogUniform):
            name = "lograndint" if kind else "loguniform"
            return f"{prefix}{name}({value.lower:g}, {value.upper:g}{tail})"
        name = "randint" if kind else "uniform"
        return f"{prefix}{name}({value.lower:g}, {value.upper:g}{tail})"
    return repr(value)


@dataclass
class SweepSettings:
    """How a sweep searches: ``trials`` (Tune's ``num_samples``), at most ``concurrent``
    trials at once (``max_concurrent_trials``), the reported ``metric`` to ``mode``
    (``min``/``max``; ``grid_size`` grid combinations each get ``trials`` samples), the ``scheduler`` (:data:`SCHEDULERS`; ASHA's ``grace_period``
    and ``reduction_factor`` in reports) and the ``search`` algorithm (:data:`SEARCHES`).
    ``space_text`` is the search space as text (parent run params)."""

    metric: str
    mode: str = "min"
    trials: int = 8
    concurrent: int = 2
    scheduler: str = "asha"
    search: str = "random"
    grace_period: int = 1
    reduction_factor: int = 2
    space_text: dict[str, str] = field(default_factory=dict)
    grid_size: int = 1  # combinations of the space's grid values (Tune runs each `trials` times)

    @property
    def total_trials(self) -> int:
        """Trials Tune runs: ``trials`` samples of every grid combination."""
        return self.trials * self.grid_size

    def validate(self) -> None:
        """Raise SpecError (one sentence) for a value no sweep can run with."""
        if not self.metric or not isinstance(self.metric, str):
            raise SpecError("A sweep needs --metric, the reported key to optimize (e.g. val_loss).")
        if self.mode not in ("min", "max"):
            raise SpecError(f"--mode {self.mode!r} must be min or max.")
        for name in ("trials", "concurrent", "grace_period", "reduction_factor"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                option = name.replace("_", "-")
                raise SpecError(f"--{option} must be a whole number of at least 1, got {value!r}.")
        if self.reduction_factor < 2:
            raise SpecError("--reduction-factor must be at least 2 (ASHA keeps 1/factor per rung).")
        if self.scheduler not in SCHEDULERS:
            raise SpecError(
                f"--scheduler {self.scheduler!r} must be one of {', '.join(SCHEDULERS)}."
            )
        if self.search not in SEARCHES:
            raise SpecError(f"--search {self.search!r} must be one of {', '.join(SEARCHES)}.")
        if self.search == "optuna":
            try:
                import optuna  # noqa: F401
            except ImportError:
                raise SpecError(
                    "--search optuna needs Optuna in the kernel and on the cluster"
                    " (pip install optuna); --search random needs nothing."
                ) from None

    def params(self) -> dict[str, str]:
        """The parent run's params: ``sweep.metric``, ``sweep.space.lr``, ..."""
        values = {k: v for k, v in asdict(self).items() if k != "space_text"}
        values["total_trials"] = self.total_trials
        values.update({f"space.{k}": v for k, v in self.space_text.items()})
        return {f"sweep.{k}": str(v) for k, v in values.items()}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SweepSettings:
        return cls(**data)
