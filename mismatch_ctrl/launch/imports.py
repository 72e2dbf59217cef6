"""``python -m mismatch_ctrl.launch.imports TARGET...``: try to import each ``module`` or ``module:attribute``.

Run by the preflight with the job's PYTHONPATH. Prints one ``import-check: cannot import NAME: ERROR`` line per
failure on stdout (what the imports themselves print is dropped) and exits 0; a crash of this process is reported
by the caller as such.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import sys


def import_failure(target: str) -> str | None:
    """``None`` if ``target`` imports (and has the attribute), else ``"ExceptionType: first line"``."""
    module, _, attribute = target.partition(":")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            loaded = importlib.import_module(module)
        if attribute:
            getattr(loaded, attribute)
    except Exception as exc:  # any import-time error is what the check reports
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mismatch_ctrl.launch.imports",
                                     description="Report the targets that do not import (the launcher preflight).")
    parser.add_argument("targets", nargs="+", help="module or module:attribute")
    for target in parser.parse_args(argv).targets:
        failure = import_failure(target)
        if failure:
            print(f"import-check: cannot import {target.replace(':', '.')}: {failure}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
