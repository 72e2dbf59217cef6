"""Helpers of the sixth hostile round (``test_hostile_round_six*.py``): a case is a call on the test's temporary
directory and what a correct response is, either a refusal (:func:`refused`: the error type and substrings of its
message, which must name the field or the file) or, where training or the analysis must go on, an acceptance whose
result a check inspects (:func:`kept`: the guard counted in its metric, the value read as written)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pytest

MAX_MESSAGE = 1500


@dataclass(frozen=True)
class Case:
    run: Callable[[Path], Any]
    error: type[BaseException] | None = None
    needles: tuple[str, ...] = ()
    check: Callable[[Any], bool] | None = None


def refused(run: Callable[[Path], Any], error: type[BaseException], *needles: str) -> Case:
    """A case that must raise ``error`` whose message holds every needle (``{tmp}``: the test's directory)."""
    return Case(run, error, needles)


def kept(run: Callable[[Path], Any], check: Callable[[Any], bool]) -> Case:
    """A case that must be accepted, with ``check(result)`` true."""
    return Case(run, check=check)


def judge(case: Case, tmp: Path) -> None:
    """Run ``case`` on ``tmp`` and assert its correct response."""
    if case.error is None:
        result = case.run(tmp)
        assert case.check is not None and case.check(result), result
        return
    with pytest.raises(case.error) as info:
        case.run(tmp)
    message = str(info.value)
    for needle in case.needles:
        assert needle.format(tmp=tmp) in message, message
    assert len(message) < MAX_MESSAGE, message[:MAX_MESSAGE]


def write(tmp: Path, content: str | bytes, name: str = "method.yaml") -> Path:
    path = tmp / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path
