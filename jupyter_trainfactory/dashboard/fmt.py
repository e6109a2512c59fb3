"""Number formatting shared by the dashboard's header, timeline and summary (pure)."""

from __future__ import annotations

__all__ = ["fmt_duration", "fmt_ms", "fmt_number", "pct"]


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def fmt_ms(value: float | None) -> str:
    return "n/a" if value is None else f"{1000 * value:.1f} ms"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt_number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    text = f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()
