"""Ray Data ingest of a job: the driver builds the datasets, each worker's shard is timed.

Driver side: :func:`build_datasets` turns the payload's datasets (name -> Dataset or a
function of no arguments) into the Datasets for ``TorchTrainer(datasets=...)`` and
returns the lineage tags of those a function built (``jupyter_trainfactory.datasets``);
:func:`data_config` is the ``DataConfig`` of ``--dataset-config``.

Worker side: :class:`TimedShard` wraps the ``DataIterator`` that
``ray.train.get_dataset_shard`` returns, so the time each ``next()`` of its batch and row
iterators waits counts as the worker's data wait (``train/data_wait_fraction``), with
the loop itself unchanged. Imports neither Ray nor torch at import time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["TimedShard", "build_datasets", "data_config", "timed_get_dataset_shard", "timed_iter"]


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


def timed_iter(iterable: Iterable, add_wait: Callable[[float], None]) -> Iterator:
    """``iterable``'s items, with the seconds each ``next()`` took passed to ``add_wait``."""
    iterator = iter(iterable)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(iterator)
        except StopIteration:
            return
        add_wait(time.perf_counter() - t0)
        yield item


class TimedShard:
    """A ``ray.data.DataIterator`` whose ``iter_batches``, ``iter_torch_batches``,
    ``iter_tf_batches`` and ``iter_rows`` hand the seconds each ``next()`` waits to
    ``add_wait`` (``WorkerTelemetry.add_data_wait``); everything else is the shard's own.

    The wait is the whole ``next()``: Ray Data's prefetching, collation and the copy to
    the device that ``iter_torch_batches`` does, as a loop waiting on it sees it.
    """

    _TIMED = ("iter_batches", "iter_torch_batches", "iter_tf_batches", "iter_rows")

    def __init__(self, shard: Any, add_wait: Callable[[float], None]):
        self._shard = shard
        self._add_wait = add_wait

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._shard, name)
        if name not in self._TIMED:
            return attr

        def timed(*args: Any, **kwargs: Any) -> Iterator:
            return timed_iter(attr(*args, **kwargs), self._add_wait)

        return timed

    def __repr__(self) -> str:
        return f"TimedShard({self._shard!r})"


def timed_get_dataset_shard(original: Callable, add_wait: Callable[[float], None]) -> Callable:
    """``ray.train.get_dataset_shard`` whose shards are :class:`TimedShard` s (None
    stays None: a job without that dataset)."""

    def get_dataset_shard(*args: Any, **kwargs: Any) -> Any:
        shard = original(*args, **kwargs)
        return None if shard is None else TimedShard(shard, add_wait)

    get_dataset_shard.__wrapped__ = original
    get_dataset_shard.__doc__ = original.__doc__
    return get_dataset_shard
