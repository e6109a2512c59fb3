"""examples/run_notebook.py --set: papermill's 'parameters' cell convention, checked on a
notebook in memory (no kernel)."""

import argparse
import importlib.util
from pathlib import Path

import nbformat
import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "run_notebook.py"
spec = importlib.util.spec_from_file_location("run_notebook", SCRIPT)
run_notebook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_notebook)


def _notebook(tags=("parameters",)):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell('workers = 2\nconfig = {"epochs": 12}')
    params.metadata["tags"] = list(tags)
    nb.cells = [nbformat.v4.new_code_cell("import os"), params, nbformat.v4.new_code_cell("x")]
    return nb


def test_values_go_in_a_cell_right_after_the_parameters_cell():
    nb = _notebook()
    run_notebook.inject(nb, dict([run_notebook.parameter('config={"epochs": 3}')]))
    injected = nb.cells[2]
    assert injected.metadata["tags"] == ["injected-parameters"]
    assert injected.source == "config = {'epochs': 3}"
    assert [c.source for c in (nb.cells[1], nb.cells[3])] == [
        'workers = 2\nconfig = {"epochs": 12}',
        "x",
    ]


def test_nothing_to_set_leaves_the_notebook_as_it_is():
    nb = _notebook(tags=())
    run_notebook.inject(nb, {})
    assert len(nb.cells) == 3


@pytest.mark.parametrize(
    ("tags", "values", "message"),
    [
        ((), {"workers": 1}, "no cell tagged 'parameters'"),
        (("parameters",), {"steps": 1}, "assigns no steps (it has: config, workers)"),
    ],
)
def test_a_name_the_parameters_cell_does_not_assign_is_refused(tags, values, message):
    nb = _notebook(tags)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        run_notebook.inject(nb, values)
    assert len(nb.cells) == 3  # nothing inserted


@pytest.mark.parametrize("text", ["workers", "2=x", "workers=not a literal"])
def test_a_bad_setting_is_one_sentence(text):
    with pytest.raises(argparse.ArgumentTypeError):
        run_notebook.parameter(text)
