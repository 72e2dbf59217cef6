"""Number formatting shared by the markdown reports (lab and analyze), and bounded reprs for error messages."""

from __future__ import annotations

import reprlib
from typing import Any

_BRIEF = reprlib.Repr()
_BRIEF.maxlevel = 3
_BRIEF.maxtuple = _BRIEF.maxlist = _BRIEF.maxarray = _BRIEF.maxdict = _BRIEF.maxset = _BRIEF.maxfrozenset = 4
_BRIEF.maxdeque = 4
_BRIEF.maxstring, _BRIEF.maxlong, _BRIEF.maxother = 60, 40, 60


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


def brief(value: Any, limit: int = 80) -> str:
    """``repr(value)`` bounded in time and length (at most ``limit`` characters, nested containers cut short), for
    error messages about values a user or a file supplied: a YAML alias bomb or a huge string stays one short line."""
    try:
        text = _BRIEF.repr(value)
    except Exception:  # a repr that fails (e.g. an int beyond Python's digit limit) must not hide the real error
        text = f"<{type(value).__name__}>"
    return clip(text, limit)


def clip(text: str, limit: int = 400) -> str:
    """``text`` cut to at most ``limit`` characters."""
    return text if len(text) <= limit else text[:limit - 3] + "..."
