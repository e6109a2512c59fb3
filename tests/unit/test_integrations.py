"""ray_backend.integrations without Ray: the batch sizes it counts and its import hook."""

import importlib
import sys

import torch

from ray_backend.import_hooks import AfterImport
from ray_backend.integrations import batch_samples


def test_the_samples_of_a_batch_are_its_first_tensors_first_dimension():
    assert batch_samples((torch.zeros(32, 8), torch.zeros(32, 1))) == 32  # (x, y)
    assert batch_samples({"input_ids": torch.zeros(4, 16), "labels": torch.zeros(4, 16)}) == 4
    assert batch_samples([["no tensor"], torch.zeros(7)]) == 7
    assert batch_samples(torch.tensor(1.0)) is None  # a scalar has no batch dimension
    assert batch_samples(["text", 3]) is None


def test_the_hook_runs_after_the_module_is_imported_and_only_for_its_names(tmp_path, monkeypatch):
    (tmp_path / "fake_integration.py").write_text("def prepare_trainer(t):\n    return t\n")
    (tmp_path / "other_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    finder = AfterImport(("fake_integration",), lambda m: seen.append(m.prepare_trainer(5)))
    sys.meta_path.insert(0, finder)
    try:
        importlib.import_module("other_module")
        assert seen == []
        module = importlib.import_module("fake_integration")
        assert seen == [5] and module.prepare_trainer(6) == 6  # the module itself unchanged
    finally:
        sys.meta_path.remove(finder)
        for name in ("fake_integration", "other_module"):
            sys.modules.pop(name, None)
