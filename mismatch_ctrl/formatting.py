"""Number formatting shared by the markdown reports (lab and analyze)."""

from __future__ import annotations

from typing import Any


def fmt(value: Any, digits: int = 3) -> str:
    """A report cell: ``-`` for None, yes/no for booleans, fixed point for ordinary floats, ``g`` format for very
    small or large ones."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if value and (abs(value) < 1e-2 or abs(value) >= 1e4) else f"{value:.{digits}f}"
    return str(value)
