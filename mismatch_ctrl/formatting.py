"""Number formatting shared by the markdown reports (lab and analyze), bounded reprs for error messages, and commands
recorded so that they run again."""

from __future__ import annotations

import re
import reprlib
import shlex
from typing import Any, Sequence

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


def count_and_values(values: Sequence[int]) -> str:
    """How many integers and which, runs of consecutive ones as ranges: ``[0]`` -> ``1 (0)``, ``[70, ..., 74]`` ->
    ``5 (70-74)``, ``[7, 0, 2, 5, 6]`` -> ``5 (0,2,5-7)``; ``0`` for none. The lab's ``seeds`` column, where a bare
    ``0`` read as "no seeds"."""
    if not values:
        return "0"
    numbers = sorted(set(values))
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return f"{len(values)} (" + ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs) + ")"


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


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ANSI_C = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def shell_command(words: Sequence[str]) -> str:
    """``words`` as one line that a shell reads back as the same words: ``shlex.join`` (single quotes around any word
    with a space or a character the shell would read), except that a word holding a newline or another control
    character is written in ANSI-C quotes (``$'a\\nb'``, read by bash, zsh and ksh), so a recorded command stays one
    line and, pasted into bash, runs what ran."""
    return " ".join(_ansi_c(word) if _CONTROL.search(word) else shlex.quote(word) for word in words)


def _ansi_c(word: str) -> str:
    """``$'...'`` with backslash, quote and every control character escaped."""
    escaped = "".join(_ANSI_C.get(c) or (f"\\x{ord(c):02x}" if _CONTROL.fullmatch(c) else c) for c in word)
    return f"$'{escaped}'"


def code_span(text: str) -> str:
    """``text`` as one markdown code span: fenced by one backtick more than its longest run of backticks (CommonMark),
    padded with a space where it starts or ends with one."""
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * (max(runs, default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
