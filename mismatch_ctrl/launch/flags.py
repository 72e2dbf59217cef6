"""``python -m mismatch_ctrl.launch.flags FLAGS_JSON ARG...``: how slime's parsers read the flags given after ``--``.

Run by the preflight with the job's PYTHONPATH, only when the user passed flags after ``--``: the first argument is
those flags as a JSON list, the rest ``train.py``'s whole argument list, as the job receives it.

slime 624b824a parses ``train.py``'s arguments with three argparse parsers, each with ``parse_known_args``
(``slime/utils/arguments.py:1584-1632``):

- ``_pre_parse_mode``: a few mode flags, ``allow_abbrev=False``.
- ``sglang_parse_args``: the ``--sglang-*`` flags, read by a parser built with argparse's default ``allow_abbrev=True``
  (``slime/backends/sglang_utils/arguments.py:203-226``).
- ``megatron_parse_args``: Megatron's and slime's flags, ``allow_abbrev=False``, with ``ignore_unknown_args=True``
  (``slime/backends/megatron_utils/arguments.py:193-195``). Its first step, Megatron's ``parse_args`` with slime's
  flags, is what this module calls; the checks after it read the Hugging Face checkpoint.

Two things follow:

- A flag that none of the three knows is dropped without a word. A misspelt ``--rollout-max-respone-len`` trains with
  the launcher's value.
- An abbreviation that the SGLang parser can complete is read as the full flag. ``--sglang-context-len`` sets
  ``--sglang-context-length``, but the launcher's own checks read full names.

This module calls the three functions on the job's arguments and records what each parser left over, by wrapping
``argparse.ArgumentParser.parse_known_args``. What a function does after it has parsed does not matter here, so
errors from that part are ignored. It prints one line per finding on stdout:

- ``flag-check: unknown FLAG``: no parser took it.
- ``flag-check: abbreviation FLAG FULL``: a parser took it as ``FULL``.
- ``flag-check: refused: MESSAGE``: a parser rejected the arguments, as it would when the job starts (argparse's
  message: an ambiguous abbreviation, a value of the wrong type).
- ``flag-check: cannot check: ERROR``: slime's parsers could not be built or run.

What the parsers themselves print is dropped. It exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import sys
from typing import Any, Callable, Sequence

PARSERS = (
    ("slime.utils.arguments", "_pre_parse_mode"),
    ("slime.backends.sglang_utils.arguments", "sglang_parse_args"),
    ("megatron.training.arguments", "parse_args"),
)
"""The functions slime's ``parse_args`` parses ``train.py``'s arguments with (slime 624b824a), in its order."""


def _parse_calls(module: str, name: str) -> Callable[[], Any]:
    """The call of one of :data:`PARSERS` as slime makes it (Megatron's with slime's flags, unknown ones ignored)."""
    function = getattr(importlib.import_module(module), name)
    if name != "parse_args":
        return function
    provider = importlib.import_module("slime.utils.arguments").get_slime_extra_args_provider(None)
    return lambda: function(extra_args_provider=provider, ignore_unknown_args=True)


class Refused(Exception):
    """A parser of slime's rejected ``train.py``'s arguments, as at the job's start; the message is argparse's."""


def parsed(argv: Sequence[str]) -> list[tuple[argparse.ArgumentParser, list[str]]]:
    """Each parser that slime's parsing functions ran on ``argv`` (``train.py``'s arguments), with what it left over.
    :class:`Refused` when one of them rejects the arguments (an ambiguous abbreviation, a value of the wrong type)."""
    seen: list[tuple[argparse.ArgumentParser, list[str]]] = []
    original = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                result = original(self, args, namespace)
        except SystemExit:  # argparse's error(): its message, then exit 2
            said = [line.split(": error: ", 1)[1] for line in errors.getvalue().splitlines() if ": error: " in line]
            raise Refused(said[-1] if said else "the parser exited") from None
        seen.append((self, list(result[1])))
        return result

    calls = [_parse_calls(module, name) for module, name in PARSERS]
    saved_argv = sys.argv
    sys.argv = ["train.py", *argv]
    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    try:
        for call in calls:
            count = len(seen)
            try:
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    call()
            except Refused:
                raise
            except (Exception, SystemExit):
                if len(seen) == count:  # it failed before it parsed: the flags were not read
                    raise
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv
    return seen


def findings(user_flags: Sequence[str], runs: Sequence[tuple[argparse.ArgumentParser, list[str]]]) -> list[str]:
    """``unknown FLAG`` for each of ``user_flags`` no parser took, ``abbreviation FLAG FULL`` for each a parser took
    as another flag (argparse's rule: the one option that starts with it)."""
    out = []
    for flag in dict.fromkeys(user_flags):
        takers = [parser for parser, left in runs if flag not in (word.partition("=")[0] for word in left)]
        if not takers:
            out.append(f"unknown {flag}")
            continue
        if any(flag in parser._option_string_actions for parser in takers):
            continue
        full = sorted({option for parser in takers for option in parser._option_string_actions
                       if option.startswith(flag)})
        out.append(f"abbreviation {flag} {full[0] if len(full) == 1 else ' or '.join(full)}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mismatch_ctrl.launch.flags",
                                     description="Report the flags after -- that slime's parsers drop or complete "
                                                 "(the launcher preflight).")
    parser.add_argument("user_flags", type=json.loads, help="the user's flags after --, a JSON list (--name each)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="train.py's arguments, as the job receives them")
    ns = parser.parse_args(argv)
    try:
        runs = parsed(ns.train_args)
    except Refused as exc:
        print(f"flag-check: refused: {exc}", flush=True)
        return 0
    except (Exception, SystemExit) as exc:  # slime's or Megatron's code: whatever it raises is reported
        detail = f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__
        print(f"flag-check: cannot check: {detail}", flush=True)
        return 0
    for line in findings(ns.user_flags, runs):
        print(f"flag-check: {line}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
