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

This module calls the three functions on the job's arguments, as slime does (it skips the SGLang parse where slime
skips it), and records what each parser left over, by wrapping ``argparse.ArgumentParser.parse_known_args``. It
prints one line per finding on stdout, ``flag-check: {JSON}``, whose ``kind`` is:

- ``unknown``: no parser took ``flag`` (``like``: close option names);
- ``abbreviation``: a parser took ``flag`` as one of ``full``;
- ``refused``: slime's parsing rejects the arguments, as it would when the job starts (``message``: argparse's, for an
  ambiguous abbreviation or a value of the wrong type, or the error of a parsing function once it has read them);
- ``cannot check``: slime's parsers could not be built or run (``error``).

What the parsers themselves print is dropped, and so is an error of Megatron's after its parse (its validation needs
the job's environment). It exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import importlib
import io
import json
import sys
from typing import Any, Callable, Sequence

PRE_PARSE = ("slime.utils.arguments", "_pre_parse_mode")
SGLANG = ("slime.backends.sglang_utils.arguments", "sglang_parse_args")
MEGATRON = ("megatron.training.arguments", "parse_args")
"""The functions slime's ``parse_args`` parses ``train.py``'s arguments with (slime 624b824a), in its order."""


class Refused(Exception):
    """slime's parsing rejects ``train.py``'s arguments, as at the job's start (argparse's message, or the error)."""


def _function(target: tuple[str, str]) -> Callable[..., Any]:
    """``(module, name)`` imported, what the import prints dropped."""
    module, name = target
    return getattr(_quietly(lambda: importlib.import_module(module)), name)


def _quietly(call: Callable[[], Any]) -> Any:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return call()


def parsed(argv: Sequence[str]) -> tuple[list[tuple[argparse.ArgumentParser, list[str]]], bool]:
    """Each parser that slime's parsing functions ran on ``argv`` (``train.py``'s arguments), with what it left over,
    and whether the SGLang flags were parsed (slime skips them with ``--debug-train-only`` or
    ``--load-debug-rollout-data``, ``arguments.py:1606-1613``). :class:`Refused` when the parsing rejects the
    arguments: a parser's error (an ambiguous abbreviation, a value of the wrong type, ``--help``), or an error of
    the pre-parse or the SGLang parse once it has read them. Errors after Megatron's parse are its validation's,
    which needs the job's environment: ignored."""
    seen: list[tuple[argparse.ArgumentParser, list[str]]] = []
    original = argparse.ArgumentParser.parse_known_args

    def recording(self: argparse.ArgumentParser, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        errors = io.StringIO()
        try:
            with contextlib.redirect_stderr(errors):
                result = original(self, args, namespace)
        except SystemExit as exc:  # argparse's error() (its message, exit 2), or --help (exit 0)
            if not exc.code:
                raise Refused("--help (or -h) makes slime print its help and exit without training") from None
            said = [line.split(": error: ", 1)[1] for line in errors.getvalue().splitlines() if ": error: " in line]
            raise Refused(said[-1] if said else f"a parser exited with status {exc.code}") from None
        if args is None or list(args) == sys.argv[1:]:  # a parse of the command line, not of a list of its own
            seen.append((self, list(result[1])))
        return result

    saved_argv = sys.argv
    sys.argv = ["train.py", *argv]  # before the imports too: the job's modules see its command line
    argparse.ArgumentParser.parse_known_args = recording  # type: ignore[method-assign]
    try:
        pre_parse, sglang, megatron = (_function(target) for target in (PRE_PARSE, SGLANG, MEGATRON))
        provider = _function(("slime.utils.arguments", "get_slime_extra_args_provider"))(None)
        mode = _checked(pre_parse, seen)
        with_sglang = not (getattr(mode, "debug_train_only", False)
                           or getattr(mode, "load_debug_rollout_data", None) is not None)
        if with_sglang:
            _checked(sglang, seen)
        count = len(seen)
        try:
            _quietly(lambda: megatron(extra_args_provider=provider, ignore_unknown_args=True))
        except (Exception, SystemExit):
            if len(seen) == count:  # it failed before it parsed: the flags were not read
                raise
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv
    return seen, with_sglang


def _checked(function: Callable[[], Any], seen: list[Any]) -> Any:
    """``function()``'s result; an error once it has parsed is slime's own failure at start: :class:`Refused`."""
    count = len(seen)
    try:
        return _quietly(function)
    except Refused:
        raise
    except (Exception, SystemExit) as exc:
        if len(seen) == count:
            raise
        raise Refused(f"{function.__name__} fails: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__


def findings(user_flags: Sequence[str], runs: Sequence[tuple[argparse.ArgumentParser, list[str]]],
             with_sglang: bool = True) -> list[dict[str, Any]]:
    """For each of ``user_flags``: ``unknown`` (no parser took it; ``like``: close option names) or ``abbreviation``
    (a parser took it as another option, ``full``: argparse's rule, the option that starts with it). A flag taken as
    a value (no option starts with it) is not a finding; nor are ``--sglang-*`` flags when slime skips SGLang."""
    options = sorted({option for parser, _ in runs for option in parser._option_string_actions
                      if option.startswith("--")})
    out: list[dict[str, Any]] = []
    for flag in dict.fromkeys(user_flags):
        if not with_sglang and flag.startswith("--sglang-"):
            continue
        takers = [parser for parser, left in runs if flag not in (word.partition("=")[0] for word in left)]
        if not takers:
            out.append({"kind": "unknown", "flag": flag, "like": difflib.get_close_matches(flag, options, n=3)})
        elif not any(flag in parser._option_string_actions for parser in takers):
            full = sorted({option for parser in takers for option in parser._option_string_actions
                           if option.startswith(flag)})
            if full:
                out.append({"kind": "abbreviation", "flag": flag, "full": full})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mismatch_ctrl.launch.flags",
                                     description="Report the flags after -- that slime's parsers drop or complete "
                                                 "(the launcher preflight).")
    parser.add_argument("user_flags", type=json.loads, help="the user's flags after --, a JSON list (--name each)")
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="train.py's arguments, as the job receives them")
    ns = parser.parse_args(argv)
    try:
        runs, with_sglang = parsed(ns.train_args)
        lines = findings(ns.user_flags, runs, with_sglang)
    except Refused as exc:
        lines = [{"kind": "refused", "message": str(exc)}]
    except (Exception, SystemExit) as exc:  # slime's or Megatron's code: whatever it raises is reported
        lines = [{"kind": "cannot check", "error": _first_line(exc)}]
    for line in lines:
        print(f"flag-check: {json.dumps(line)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
