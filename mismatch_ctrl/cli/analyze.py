"""``mismatch-ctrl analyze``: calibrate eps and preview every controller on a slime run's ``--dump-details`` dumps."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Iterator

from ..errors import ConfigError
from ..formatting import shell_command


def analyze_command(ns: argparse.Namespace) -> int:
    from ..analyze import AnalyzeOptions, DumpError, analyze_dumps, write_report
    from ..analyze.consistency import warnings_of
    from ..analyze.dumps.rollout import is_refusal
    from ..analyze.report import not_measured
    from ..errors import InputError

    options = AnalyzeOptions(config=ns.config, architecture=ns.arch, num_experts=ns.num_experts,
                             hf_config=ns.hf_config, eps=ns.eps, lambda_0=ns.lambda_0, eta=ns.eta,
                             max_response_len=ns.max_response_len, unsafe_load=ns.unsafe_load,
                             reward_key=ns.reward_key)
    out = Path(ns.out) if ns.out else Path(ns.directory) / "analysis"
    json_path = Path(ns.json) if ns.json not in (None, "-") else None
    try:
        if Path(ns.directory).exists() and not Path(ns.directory).is_dir():
            raise DumpError(f"{ns.directory}: not a directory; give the --dump-details directory of a slime run")
        _check_outputs(out, json_path, create=Path(ns.directory).is_dir())
        with _warnings_on_stderr():
            result = analyze_dumps(ns.directory, options)
        report = write_report(result, out, command=shell_command(["mismatch-ctrl", *ns.argv]))
        if json_path is not None:
            try:
                json_path.parent.mkdir(parents=True, exist_ok=True)
                json_path.write_text(json.dumps(result, indent=1) + "\n")
            except OSError as exc:
                raise ConfigError(f"--json {json_path}: cannot write it ({exc.strerror or exc}); the report is in "
                                  f"{report}") from None
    except (ConfigError, DumpError, InputError) as exc:
        print(f"mismatch-ctrl analyze: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"mismatch-ctrl analyze: {exc.filename or ''}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if ns.json == "-":
        print(json.dumps(result, indent=1))
    print(f"report: {report}", file=sys.stderr if ns.json == "-" else sys.stdout)
    for line in warnings_of(result):
        print(f"mismatch-ctrl analyze: warning: {line}", file=sys.stderr)
    counts = result["counts"]
    partial = [row["rollout_id"] for row in result["rollouts"] if any(map(is_refusal, row["notes"]))]
    refused = bool(result["skipped"] or partial)
    if counts["measured"] == 0 and (refused or counts["with_train_log_probs"]):
        why = "dump files were refused" if refused else not_measured(counts)
        print(f"mismatch-ctrl analyze: no rollout could be measured, the report has no discrepancy numbers: {why} "
              "(the report's 'Skipped files and notes' names each file and the reason)", file=sys.stderr)
        return 1
    if result["skipped"] or partial:
        skipped = f"{len(result['skipped'])} dump file(s) or rollout(s) skipped, " if result["skipped"] else ""
        refused_part = (f"{len(partial)} rollout(s) with a refused dump file read from their other dump (rollouts "
                        f"{_id_list(partial)}), " if partial else "")
        print(f"mismatch-ctrl analyze: {skipped}{refused_part}{counts['measured']} rollout(s) measured (the report's "
              "'Skipped files and notes' names each and the reason)", file=sys.stderr)
    return 0


@contextlib.contextmanager
def _warnings_on_stderr() -> Iterator[None]:
    """The package's warnings while the dumps are analysed (the replayed DC-GRPO's, e.g. an eps below the engine's
    floor, once per run with why and what to do) on standard error, prefixed like the command's own."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("mismatch-ctrl analyze: warning: %(message)s"))
    logger = logging.getLogger("mismatch_ctrl")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _id_list(ids: list[int], shown: int = 8) -> str:
    """``0, 3, 5`` or ``0, 3, ... (12 in all)``."""
    text = ", ".join(map(str, ids[:shown]))
    return text if len(ids) <= shown else f"{text}, ... ({len(ids)} in all)"


def _check_outputs(out: Path, json_path: Path | None, create: bool) -> None:
    """Refuse output paths that cannot be written before the analysis spends any time (``create``: make ``out`` now,
    the only sure test; not when the dumps' directory is missing, which the analysis reports)."""
    if str(out) == "-":
        raise ConfigError("--out -: the report is a directory (report.md and plots/); give its path ('-' is only for "
                          "--json)")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory; give a directory for report.md and plots/")
    existing = next(p for p in (out, *out.parents) if p.exists())
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--out {out}: {existing} is not writable")
    try:
        if create:
            out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. under /proc, where root's access check says yes
        raise ConfigError(f"--out {out}: cannot create it ({exc.strerror or exc}); give a writable directory") \
            from None
    if json_path is not None:
        if json_path.is_dir():
            raise ConfigError(f"--json {json_path}: is a directory; give a file name (or '-' for standard output)")
        report = (out / "report.md").resolve()
        if json_path.resolve() == report or (out / "plots").resolve() in json_path.resolve().parents:
            raise ConfigError(f"--json {json_path}: would overwrite the report's own files in {out}; give another "
                              "file name")
        parent = next(p for p in json_path.parents if p.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise ConfigError(f"--json {json_path}: {parent} is not a writable directory")
