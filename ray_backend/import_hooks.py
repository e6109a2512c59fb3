"""Worker side: run a hook on a module right after it is imported, without importing it.

A job's worker wraps functions of optional packages (Lightning's and Hugging Face's
``prepare_trainer``, FSDP2's ``fully_shard``) for its telemetry; importing them up front
costs every job seconds on its critical path (``torch.distributed.fsdp`` took 2.5-3.7 s
per worker on 2 CPUs, before the first step, in jobs that never shard). :func:`when_imported`
wraps a module now if the loop's process already has it, else when the loop imports it
(a finder on ``sys.meta_path`` whose loader calls the hook after the module executes, so
``from M import f`` already binds the wrapped ``f``). Imports neither Ray nor torch.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["AfterImport", "when_imported"]


class AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``hook(module)`` right after one of ``names`` is imported."""

    def __init__(self, names: tuple[str, ...], hook: Callable[[Any], None]):
        self.names, self.hook, self._finding = names, hook, False

    def find_spec(self, name, path, target=None):
        if name not in self.names or self._finding:
            return None
        self._finding = True  # the real finders give the spec; this one steps aside
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self._finding = False
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _HookedLoader(spec.loader, self.hook)
        return spec


class _HookedLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, hook: Callable[[Any], None]):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.hook(module)


def when_imported(names: tuple[str, ...], hook: Callable[[Any], None]) -> Callable[[], None]:
    """Call ``hook(module)`` for each of ``names`` already imported, and for the others
    when they are; returns the undo that removes the finder (the hook's own changes are
    the caller's to undo)."""
    for name in names:
        if name in sys.modules:
            hook(sys.modules[name])
    finder = AfterImport(tuple(n for n in names if n not in sys.modules), hook)
    sys.meta_path.insert(0, finder)

    def undo() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    return undo
