"""Collective bandwidth as nccl-tests defines it: algorithm and bus bandwidth.

Source: NVIDIA/nccl-tests, ``doc/PERFORMANCE.md``. For a collective over ``n`` ranks
that moves a buffer of ``S`` bytes in ``t`` seconds:

- algorithm bandwidth ``algbw = S / t``;
- bus bandwidth ``busbw = algbw * factor``, the factor being ``2 (n - 1) / n`` for
  allreduce and ``(n - 1) / n`` for all-gather and reduce-scatter. Bus bandwidth is
  comparable across rank counts and with the hardware's link speed.

``S`` is the whole buffer: the tensor for allreduce, the gathered output for all-gather
(``n`` shards), the input for reduce-scatter (``n`` shards), as in nccl-tests. GB/s are
10^9 bytes per second, as nccl-tests prints them. Pure: no torch, no Ray.
"""

from __future__ import annotations

__all__ = ["COLLECTIVES", "algbw", "bus_factor", "busbw"]

#: The collectives a proof of concept measures, in the order it runs them.
COLLECTIVES = ("allreduce", "all_gather", "reduce_scatter")


def bus_factor(collective: str, n: int) -> float:
    """nccl-tests' bus bandwidth factor for ``collective`` over ``n`` ranks.

    Raises ValueError for another collective or ``n < 1``.
    """
    if n < 1:
        raise ValueError(f"a collective needs at least one rank, got {n}.")
    if collective == "allreduce":
        return 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    raise ValueError(f"collective must be one of {', '.join(COLLECTIVES)}, got {collective!r}.")


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth, GB/s (10^9 B/s): ``nbytes / seconds``. Raises ValueError
    when ``seconds`` is not positive."""
    if seconds <= 0:
        raise ValueError(f"seconds must be > 0, got {seconds}.")
    return nbytes / seconds / 1e9


def busbw(collective: str, nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth, GB/s: :func:`algbw` times :func:`bus_factor`."""
    return algbw(nbytes, seconds) * bus_factor(collective, n)
