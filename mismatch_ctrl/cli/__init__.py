"""``mismatch-ctrl``: the command line (also ``python -m mismatch_ctrl``). One module per command:
:mod:`.check_config`, :mod:`.lab` (``lab`` and ``lab compare``), :mod:`.analyze`; the options are in :mod:`.parser`."""

from __future__ import annotations

import os
import sys
from typing import Sequence

from .lab import lab_plan
from .parser import build_parser

__all__ = ["build_parser", "lab_plan", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    if not (sys.argv[1:] if argv is None else argv):
        parser.print_help()
        return 2
    ns, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse names a subcommand's unknown option under the top-level usage: give the subcommand's
        ns.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    ns.argv = list(sys.argv[1:] if argv is None else argv)  # recorded by lab and analyze (shell_command)
    try:
        return ns.run(ns)
    except BrokenPipeError:  # the reader of standard output went away (`analyze --json - | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
