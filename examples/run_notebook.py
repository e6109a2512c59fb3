"""Execute a notebook headless in a real Jupyter kernel (nbclient) and print its last output.

Usage: python examples/run_notebook.py examples/quickstart.ipynb [--timeout 900] [--set NAME=VALUE]
Exit code 1 (with the failing cell's error) when a cell raises.

``--set NAME=VALUE`` (repeatable; VALUE a Python literal) overrides a variable of the cell
tagged ``parameters``, papermill's convention: a cell tagged ``injected-parameters`` that
assigns the values is run right after it (the tests run the examples with smaller settings
this way). A name that the parameters cell does not assign is refused, before any cell runs.
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def parameter(text: str) -> tuple[str, object]:
    """``NAME=VALUE`` -> (name, value); VALUE is a Python literal (``ast.literal_eval``)."""
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"--set takes NAME=VALUE, got {text!r}")
    try:
        return name, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise argparse.ArgumentTypeError(
            f"--set {name}: {value!r} is not a Python literal"
        ) from None


def inject(nb: nbformat.NotebookNode, values: dict[str, object]) -> None:
    """Put a cell assigning ``values`` right after the cell tagged ``parameters``.

    Raises
    ------
    ValueError
        When no cell is tagged ``parameters``, or it assigns none of a name in ``values``.
    """
    if not values:
        return
    index = next(
        (i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])), None
    )
    if index is None:
        raise ValueError("the notebook has no cell tagged 'parameters' for --set")
    assigned = {
        target.id
        for node in ast.walk(ast.parse(nb.cells[index].source))
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    unknown = sorted(set(values) - assigned)
    if unknown:
        raise ValueError(f"the parameters cell assigns no {', '.join(unknown)} (it has: "
                         f"{', '.join(sorted(assigned))})")  # fmt: skip
    source = "\n".join(f"{name} = {value!r}" for name, value in values.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    nb.cells.insert(index + 1, cell)


def run(nb: nbformat.NotebookNode, path: Path, timeout: int) -> nbformat.NotebookNode:
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
    )
    try:
        client.execute()
    finally:
        out = path.with_suffix(".out.ipynb")
        nbformat.write(nb, out)
    return nb


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    parser.add_argument(
        "--set",
        type=parameter,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="override a variable of the cell tagged 'parameters' (a Python literal)",
    )
    args = parser.parse_args()
    nb = nbformat.read(args.notebook, as_version=4)
    try:  # before any cell runs; an error of a cell is not a usage error
        inject(nb, dict(args.set))
    except ValueError as exc:
        parser.error(str(exc))
    started = time.time()
    try:
        nb = run(nb, args.notebook, args.timeout)
    except CellExecutionError as exc:
        print(f"{args.notebook} failed:\n{exc}", file=sys.stderr)
        return 1
    last = next(c for c in reversed(nb.cells) if c.cell_type == "code")
    text = "".join(o.get("text", "") for o in last.get("outputs", []) if o.output_type == "stream")
    print(
        f"{args.notebook} ran in {time.time() - started:.0f} s "
        f"(executed copy: {args.notebook.with_suffix('.out.ipynb')})"
    )
    print(text.rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
