"""Ray Data ingest of a job: the driver builds the datasets, each worker's shard is timed.

Driver side: :func:`build_datasets` turns the payload's datasets (name -> Dataset or a
function of no arguments) into the Datasets for ``TorchTrainer(datasets=...)`` and
returns the lineage tags of those a function built (``jupyter_trainfactory.datasets``);
:func:`data_config` is the ``DataConfig`` of ``--dataset-config``.

Worker side: :class:`TimedShard` wraps the ``DataIterator`` that
``ray.train.get_dataset_shard`` returns, so the time each ``next()`` of its batch and row
iterators waits counts as the worker's data wait (``train/data_wait_fraction``) and the
rows it hands over as its ingest (``train/ingest_rows_per_s``), with the loop itself
unchanged. Imports neither Ray nor torch at import time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = [
    "TimedShard",
    "batch_rows",
    "build_datasets",
    "data_config",
    "timed_get_dataset_shard",
    "timed_iter",
]


def build_datasets(datasets: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(name -> Dataset, lineage tags)`` of the payload's datasets
    (``jupyter_trainfactory.datasets.pack``): each function called here, in the driver
    (lazily: a ``read_*`` plans the read, it does not read), each Dataset rebuilt from
    its plan.

    The tags (``trainfactory.dataset.<name>``) describe the datasets a function built,
    from their plan's metadata as the driver's node sees it; the kernel recorded the
    others at launch. Raises RuntimeError (one sentence) when a function fails or returns
    something other than a Dataset."""
    from jupyter_trainfactory.datasets import describe, is_dataset, lineage_tags, unpack

    try:
        datasets = unpack(datasets)
    except Exception as exc:
        raise RuntimeError(
            f"Rebuilding the datasets from their plans failed: {type(exc).__name__}: {exc}"
        ) from exc
    built: dict[str, Any] = {}
    described = []
    for name, value in datasets.items():
        if is_dataset(value):
            built[name] = value
            continue
        try:
            dataset = value()
        except Exception as exc:
            raise RuntimeError(
                f"Building dataset {name!r} in the driver failed: {type(exc).__name__}: {exc}"
            ) from exc
        if not is_dataset(dataset):
            raise RuntimeError(
                f"The function of dataset {name!r} returned a {type(dataset).__name__},"
                " not a Ray Dataset."
            )
        built[name] = dataset
        described.append(describe(name, dataset, where="driver"))
    return built, lineage_tags(described)


def data_config(dataset_config: str | None):
    """Ray Train's ``DataConfig`` of a normalized ``--dataset-config``."""
    from ray.train import DataConfig

    from jupyter_trainfactory.spec_values import datasets_to_split

    return DataConfig(datasets_to_split=datasets_to_split(dataset_config))


def timed_iter(
    iterable: Iterable,
    add_wait: Callable[[float], None],
    add_rows: Callable[[float], None] | None = None,
    rows: Callable[[Any], int | None] | None = None,
) -> Iterator:
    """``iterable``'s items, with the seconds each ``next()`` took passed to ``add_wait``
    and, with ``add_rows``, the rows of each item (``rows(item)``; default
    :func:`batch_rows`) passed to it."""
    iterator = iter(iterable)
    count = rows or batch_rows
    while True:
        t0 = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        add_wait(time.perf_counter() - t0)
        if add_rows is not None:
            n = count(item)
            if n:
                add_rows(n)
        yield item


def batch_rows(batch: Any) -> int | None:
    """The rows of one Ray Data batch: a dict of columns (numpy arrays, tensors), a
    pandas DataFrame, a pyarrow Table or one array or tensor; None when it has no length
    (a ``collate_fn``'s own type)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), None)
    num_rows = getattr(batch, "num_rows", None)  # pyarrow
    if isinstance(num_rows, int):
        return num_rows
    shape = getattr(batch, "shape", None)  # numpy, torch, pandas
    if shape:
        return int(shape[0])
    try:
        return len(batch)
    except TypeError:
        return None


class TimedShard:
    """A ``ray.data.DataIterator`` whose ``iter_batches``, ``iter_torch_batches``,
    ``iter_tf_batches`` and ``iter_rows`` hand the seconds each ``next()`` waits to
    ``add_wait`` (``WorkerTelemetry.add_data_wait``) and the rows it returned to
    ``add_rows`` (``WorkerTelemetry.add_ingest_rows``); everything else is the shard's own.

    The wait is the whole ``next()``: Ray Data's prefetching, collation and the copy to
    the device that ``iter_torch_batches`` does, as a loop waiting on it sees it.
    """

    _TIMED = ("iter_batches", "iter_torch_batches", "iter_tf_batches", "iter_rows")

    def __init__(
        self,
        shard: Any,
        add_wait: Callable[[float], None],
        add_rows: Callable[[float], None] | None = None,
    ):
        self._shard = shard
        self._add_wait = add_wait
        self._add_rows = add_rows

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._shard, name)
        if name not in self._TIMED:
            return attr

        rows = _one_row if name == "iter_rows" else None

        def timed(*args: Any, **kwargs: Any) -> Iterator:
            return timed_iter(attr(*args, **kwargs), self._add_wait, self._add_rows, rows)

        return timed

    def __repr__(self) -> str:
        return f"TimedShard({self._shard!r})"


def _one_row(_: Any) -> int:
    return 1


def timed_get_dataset_shard(
    original: Callable,
    add_wait: Callable[[float], None],
    add_rows: Callable[[float], None] | None = None,
) -> Callable:
    """``ray.train.get_dataset_shard`` whose shards are :class:`TimedShard` s (None
    stays None: a job without that dataset)."""

    def get_dataset_shard(*args: Any, **kwargs: Any) -> Any:
        shard = original(*args, **kwargs)
        return None if shard is None else TimedShard(shard, add_wait, add_rows)

    get_dataset_shard.__wrapped__ = original
    get_dataset_shard.__doc__ = original.__doc__
    return get_dataset_shard
