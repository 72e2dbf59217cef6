"""The benchmarks' option types: every number is checked when the command line is parsed, before any work, and a
bad one ends the script with argparse's exit status 2 and a message naming the option and the range.

The ranges are what one machine can run: counts of responses, tokens and repeats up to sizes that fit a GPU's or a
CPU's memory and finish within hours (each bound says which), seeds as the lab takes them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

from mismatch_ctrl.regular_files import what_is

MAX_SEED = 2**32 - 1
"""Seeds as the lab takes them (``mismatch_ctrl.lab.sweeps.options.MAX_SEED``): below 2**32."""


def bounded_int(low: int, high: int, what: str) -> Callable[[str], int]:
    """An option type: an integer from ``low`` to ``high``; ``what`` says what the number counts (and why the bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"expected an integer from {low} to {high} ({what}), got {text[:40]!r}")
        return value
    parse.__name__ = f"integer from {low} to {high}"  # argparse names the type in its message: "invalid <name> value"
    return parse


SEED = bounded_int(0, MAX_SEED, "a seed")
REPEATS = bounded_int(1, 1000, "timed repeats; the median is reported")
THREADS = bounded_int(1, 1024, "torch threads")
RESPONSES = bounded_int(1, 65536, "responses of one batch")
LENGTH = bounded_int(1, 1 << 20, "tokens of one response")
PROMPTS = bounded_int(1, 4096, "prompts per rollout, as the lab's --prompts")
SAMPLES = bounded_int(1, 256, "samples per prompt, as the lab's --samples")


def check_order(parser: argparse.ArgumentParser, low: tuple[str, int], high: tuple[str, int]) -> None:
    """``parser.error`` (exit 2) when option ``low`` is above option ``high`` (each ``(flag, value)``)."""
    if low[1] > high[1]:
        parser.error(f"{low[0]} {low[1]} is above {high[0]} {high[1]}: give {low[0]} <= {high[0]}")


def check_most(parser: argparse.ArgumentParser, name: str, value: int, most: int, why: str) -> None:
    """``parser.error`` (exit 2) when ``value`` (named ``name``) is above ``most``; ``why`` says what the bound is."""
    if value > most:
        parser.error(f"{name} = {value:,} is above {most:,}: {why}")


def check_output_file(parser: argparse.ArgumentParser, flag: str, path: str | Path | None) -> None:
    """``parser.error`` (exit 2), before any work, when the file ``path`` given to ``flag`` cannot be written at the
    end: its folder is missing, or something other than a regular file is there (a folder, or a FIFO that would block
    the write)."""
    if path is None:
        return
    path = Path(path)
    if not path.parent.is_dir():
        parser.error(f"{flag} {path}: {path.parent} is not a directory; create it or name a file in an existing one")
    if os.path.lexists(path):
        kind = what_is(path)
        if kind not in (None, "a broken link"):
            parser.error(f"{flag} {path}: is {kind}, not a regular file; name the JSON file to write")
