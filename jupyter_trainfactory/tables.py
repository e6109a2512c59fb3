"""Plain-text tables of the command-line and ``%train`` outputs."""

from __future__ import annotations

__all__ = ["format_table"]


def format_table(rows: list[dict[str, str]]) -> str:
    """Plain-text table with a header row (the first row's keys, upper case), columns
    padded to their widest cell; ``"(none)"`` for no rows."""
    if not rows:
        return "(none)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols}
    lines = ["  ".join(c.upper().ljust(widths[c]) for c in cols)]
    lines += ["  ".join(str(r.get(c, "")).ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
