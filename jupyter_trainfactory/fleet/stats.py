"""The statistics of the reliability report: Poisson rate intervals, the lemon-node test and
MTTR percentiles (scipy and numpy, both already required by MLflow)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["LEMON_ALPHA", "lemon_p_value", "percentiles", "poisson_interval"]

#: Family-wise significance level of the lemon-node test (Bonferroni over the nodes).
LEMON_ALPHA = 0.05


def poisson_interval(failures: int, level: float = 0.95) -> tuple[float, float]:
    """Exact two-sided interval for the mean of a Poisson count of ``failures``.

    Garwood's interval, from the chi-square distribution: ``[chi2(a/2, 2k) / 2,
    chi2(1 - a/2, 2k + 2) / 2]`` with ``a = 1 - level`` (the lower end 0 for k = 0).
    Source: F. Garwood, "Fiducial limits for the Poisson distribution", Biometrika 28
    (1936). Divide by the exposure for a rate. Raises ValueError for k < 0 or a level
    outside (0, 1)."""
    from scipy.stats import chi2

    if failures < 0 or not 0 < level < 1:
        raise ValueError("failures must be >= 0 and level in (0, 1).")
    a = 1.0 - level
    low = 0.0 if failures == 0 else float(chi2.ppf(a / 2, 2 * failures)) / 2
    return low, float(chi2.ppf(1 - a / 2, 2 * failures + 2)) / 2


def lemon_p_value(node_failures: int, total_failures: int, exposure_share: float) -> float:
    """Probability that a node with ``exposure_share`` of the fleet's exposure has
    ``node_failures`` or more of ``total_failures``, were every node's failure rate the
    same: the exact conditional test for comparing Poisson rates (given the total, a
    node's count is binomial with its exposure share; J. Przyborowski and H. Wilenski,
    "Homogeneity of results in testing samples from Poisson series", Biometrika 31,
    1940). A node is a lemon when this is below :data:`LEMON_ALPHA` / the number of nodes."""
    from scipy.stats import binom

    if node_failures <= 0:
        return 1.0
    share = min(1.0, max(0.0, exposure_share))
    return float(binom.sf(node_failures - 1, total_failures, share))


def percentiles(values: Sequence[float], qs: Sequence[float]) -> list[float] | None:
    """The ``qs`` percentiles (0-100) of ``values`` by linear interpolation between
    order statistics (numpy's default, Hyndman and Fan's type 7); None when empty."""
    import numpy as np

    if not values:
        return None
    return [float(x) for x in np.percentile(np.asarray(values, dtype=float), list(qs))]
