"""One-sentence messages: an error's first line, shortened at a word (a leaf module: no
imports of this package, so ``services`` and ``rayjobs`` both use it)."""

from __future__ import annotations

__all__ = ["first_line"]


def first_line(error: BaseException | str, limit: int = 200) -> str:
    """The first non-empty line of ``error`` (its type's name when it has no text), at
    most ``limit`` characters, cut at a word boundary and marked with an ellipsis, so a
    one-sentence message never ends mid-word (``"pip install ray["``)."""
    text = str(error).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        line = type(error).__name__ if isinstance(error, BaseException) else ""
    if len(line) <= limit:
        return line
    cut = line[: limit - 1].rsplit(" ", 1)[0].rstrip(" ,;:([{")
    return cut + "…"
