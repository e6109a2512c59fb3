"""Execute a notebook headless in a real Jupyter kernel (nbclient) and print its last output.

Usage: python examples/run_notebook.py examples/quickstart.ipynb [--timeout 900]
Exit code 1 (with the failing cell's error) when a cell raises.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def run(path: Path, timeout: int) -> nbformat.NotebookNode:
    nb = nbformat.read(path, as_version=4)
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
    args = parser.parse_args()
    started = time.time()
    try:
        nb = run(args.notebook, args.timeout)
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
