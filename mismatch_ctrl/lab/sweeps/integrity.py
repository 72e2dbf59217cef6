"""A finished run folder checked before its numbers are used (a resumed sweep, ``--report-only``, ``lab compare``).

``commit_run`` records in its ``fingerprint.json`` the sha256 of every file of a run (``files``) and a sha256 of the
record itself, over its inputs and that list (``sha256``), so removing the list, emptying it or taking a file out of
it is an edit the check sees. A folder is used only when those files are unchanged, the list holds the files the
checks read (``run.json``, ``metrics.jsonl``), its ``run.json`` agrees with the fingerprint and with the folder's name
(``<method>@<engine>[+r3]/seed<k>``), its ``metrics.jsonl`` holds every rollout in order with a final evaluation, and
its summary is finite. Every file is read by :mod:`mismatch_ctrl.regular_files` (a FIFO, a device or a directory where
a file belongs is refused by name, never opened). Two folders holding the same ``metrics.jsonl`` are one run copied:
refused, never counted twice.

A record whose ``sha256`` covers its inputs only was written before the record covered its list (kept: its list must
still hold the files the checks read); one with no list at all was written before hashes were recorded, or had its
list removed, and the two cannot be told apart: such an :class:`UnhashedRun` counts only when the user says so
(``trust_unhashed``: ``--trust-unhashed``), and is then named.

Anything else is a :class:`DamagedRun` naming the folder, what is wrong, and the choice: move the folder out of the
output directory to keep it (or delete it); the next ``mismatch-ctrl lab`` into that directory trains the run again,
because a run without its folder is a run still to train.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from ... import regular_files
from ...formatting import brief, clip
from ..training.methods import RunSpec
from ..training.settings import LabSettings
from ..training.summary import summarize
from ..training.trainer import RUN_FILE
from .sweep import FINGERPRINT_FILE, SweepError, differences, digest, record_digest

METRICS_FILE = "metrics.jsonl"
TRUSTED_FILES = (RUN_FILE, METRICS_FILE)
"""The files of a run whose content the checks and the reports read: a hashed record must list them."""
TRUST_OPTION = "--trust-unhashed"
_NOT_NUMBERS = ("label", "method", "quant", "replay", "seed", "settings")


class DamagedRun(SweepError):
    """A finished run folder whose files cannot be trusted; the message names the folder and what to do."""

    def __init__(self, folder: Path, problem: str) -> None:
        what = "folder" if folder.is_dir() else "file"
        super().__init__(f"{folder}: a damaged run ({problem}); its numbers are not used. Move the {what} out of "
                         f"{folder.parent.parent} to keep it (or delete it): the next `mismatch-ctrl lab` with this "
                         "--out trains the run again (`--report-only` reports the other runs)")
        self.folder, self.problem = folder, problem


class UnhashedRun(DamagedRun):
    """A run folder whose fingerprint records no file hashes: counted only with ``--trust-unhashed``."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder, f"{FINGERPRINT_FILE} records no file hashes: written by a lab before hashes were "
                                 "recorded, or its list of files was removed, which cannot be told apart; count it as "
                                 f"it is with {TRUST_OPTION} (the output names it)")


@dataclass(frozen=True)
class CheckedRun:
    """A run folder that passed every check: its run, settings, per-rollout records and summary; ``hashed``: whether
    its files were checked against recorded hashes (False only for an :class:`UnhashedRun` counted on request)."""

    folder: Path
    spec: RunSpec
    settings: LabSettings
    inputs: dict[str, Any]
    records: list[dict[str, Any]]
    summary: dict[str, Any]
    metrics_sha256: str
    hashed: bool = True


def _read(folder: Path, name: str, read: Callable[[Path], Any]) -> Any:
    """``read(folder / name)``; :class:`DamagedRun` naming the file when it is missing, no regular file, too large,
    not UTF-8 or malformed."""
    try:
        return read(folder / name)
    except FileNotFoundError:
        raise DamagedRun(folder, f"{name} is missing") from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DamagedRun(folder, f"{name} is unreadable or malformed: {clip(reason, 120)}") from None


def _recorded_files(folder: Path, fingerprint: dict[str, Any]) -> None:
    """Every file the fingerprint recorded is there, unchanged, and the list holds the files the checks read."""
    files = fingerprint["files"]
    if not isinstance(files, dict):
        raise DamagedRun(folder, f"{FINGERPRINT_FILE} records its files as {brief(files, 40)}, not a table")
    lacking = [name for name in TRUSTED_FILES if name not in files]
    if lacking:
        raise DamagedRun(folder, f"{FINGERPRINT_FILE}'s list of files lacks {' and '.join(lacking)}, which every run "
                                 "writes: the list was emptied or edited")
    for name, recorded in files.items():
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise DamagedRun(folder, f"{FINGERPRINT_FILE} records a file outside the folder: {brief(name, 60)}")
        if _read(folder, name, regular_files.sha256_of) != recorded:
            raise DamagedRun(folder, f"{name} was changed after the run finished (its sha256 differs from the one "
                                     f"{FINGERPRINT_FILE} recorded)")


def _fingerprint(folder: Path) -> tuple[dict[str, Any], bool]:
    """``fingerprint.json``, readable, with its inputs (run, settings, warm-up, method) and its list of files matching
    its sha256; and whether it records file hashes. :class:`UnhashedRun` for a record without a list."""
    try:
        fingerprint = regular_files.read_json(folder / FINGERPRINT_FILE)
        inputs = fingerprint["inputs"]
        if not all(isinstance(inputs[key], dict) for key in ("run", "settings", "warmup", "method_config")):
            raise ValueError("its inputs are not tables")
    except FileNotFoundError:
        raise DamagedRun(folder, f"no {FINGERPRINT_FILE}: made by an older lab, or not a lab run") from None
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DamagedRun(folder, f"{FINGERPRINT_FILE} is unreadable or malformed: {clip(reason, 120)}") from None
    recorded = fingerprint.get("sha256")
    if "files" in fingerprint and recorded == record_digest(inputs, fingerprint["files"]):
        return fingerprint, True
    if recorded != digest(inputs):
        raise DamagedRun(folder, f"{FINGERPRINT_FILE} was edited: its inputs or its list of files no longer match "
                                 "its sha256")
    return fingerprint, "files" in fingerprint  # a record of a lab whose sha256 covered the inputs only


def _run_info(folder: Path, inputs: dict[str, Any]) -> tuple[RunSpec, LabSettings]:
    """``run.json`` read, and checked against the fingerprint's inputs and the folder's name."""
    info = _read(folder, RUN_FILE, regular_files.read_json)
    try:
        spec = RunSpec(info["method"], info["quant"], info["replay"])
        settings = LabSettings(**info["settings"])
    except (ValueError, KeyError, TypeError) as exc:
        raise DamagedRun(folder, f"{RUN_FILE} is unreadable or malformed: {clip(str(exc), 120)}") from None
    recorded = {"run": inputs.get("run"), "settings": inputs.get("settings")}
    found = {"run": asdict(spec), "settings": asdict(settings)}
    if digest(recorded) != digest(found):
        raise DamagedRun(folder, f"{RUN_FILE} disagrees with {FINGERPRINT_FILE}: {differences(recorded, found)}")
    if (folder.parent.name, folder.name) != (spec.label, f"seed{settings.seed}"):
        raise DamagedRun(folder, f"{RUN_FILE} is run {spec.label} seed {settings.seed}, which belongs in "
                                 f"{spec.label}/seed{settings.seed}, not {folder.parent.name}/{folder.name} (a copied "
                                 "or renamed folder)")
    return spec, settings


def _records(folder: Path, settings: LabSettings) -> tuple[list[dict[str, Any]], str]:
    """``metrics.jsonl``: one record per rollout, the last with the final evaluation; and its sha256."""
    content = _read(folder, METRICS_FILE, regular_files.read_bytes)
    try:
        records = [json.loads(line) for line in content.decode().splitlines() if line.strip()]
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise DamagedRun(folder, f"{METRICS_FILE} is unreadable: {clip(str(exc), 120)}") from None
    if not all(isinstance(r, dict) and "reward" in r for r in records):
        raise DamagedRun(folder, f"{METRICS_FILE} holds a line that is not a rollout's record")
    if len(records) != settings.steps or "final_eval_acc_engine" not in records[-1]:
        raise DamagedRun(folder, f"{METRICS_FILE} holds {len(records)} of the run's {settings.steps} rollouts"
                                 + ("" if len(records) != settings.steps else " without the final evaluation"))
    wrong = next((k for k, r in enumerate(records) if type(r.get("step")) is not int or r["step"] != k), None)
    if wrong is not None:
        raise DamagedRun(folder, f"{METRICS_FILE}'s line {wrong + 1} is step {brief(records[wrong].get('step'), 20)}, "
                                 f"not {wrong}: its rollouts are not steps 0 to {settings.steps - 1} in order")
    return records, hashlib.sha256(content).hexdigest()


def _summary(folder: Path, spec: RunSpec, settings: LabSettings, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The run's summary; every number in it finite."""
    try:
        summary = summarize(spec, settings, records)
    except (KeyError, TypeError, ValueError, ZeroDivisionError, IndexError, AttributeError, OverflowError) as exc:
        raise DamagedRun(folder, f"{METRICS_FILE} lacks a value the summary needs ({type(exc).__name__}: "
                                 f"{clip(str(exc), 80)})") from None
    for key, value in summary.items():
        if key in _NOT_NUMBERS or value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise DamagedRun(folder, f"{METRICS_FILE} gives the summary's {key} = {brief(value, 40)}, not a finite "
                                     "number")
    return summary


def check_run(folder: Path, trust_unhashed: bool = False) -> CheckedRun:
    """Every check of the module docstring on one run folder; :class:`DamagedRun` naming the first that fails (an
    :class:`UnhashedRun` for a record without file hashes, unless ``trust_unhashed``)."""
    fingerprint, hashed = _fingerprint(folder)
    inputs = fingerprint["inputs"]
    if hashed:
        _recorded_files(folder, fingerprint)
    elif not trust_unhashed:
        raise UnhashedRun(folder)
    spec, settings = _run_info(folder, inputs)
    records, sha = _records(folder, settings)
    return CheckedRun(folder, spec, settings, inputs, records, _summary(folder, spec, settings, records), sha, hashed)


def run_folders(out_dir: Path) -> list[Path]:
    """Everything named ``<run>/seed*`` in a lab output directory: each must be a finished run folder."""
    return sorted(out_dir.glob("*/seed*"))


def check_runs(folders: list[Path], trust_unhashed: bool = False) -> list[CheckedRun]:
    """``check_run`` of each folder, and no two folders holding the same ``metrics.jsonl`` (a run copied under another
    seed or method is refused, never counted twice)."""
    for folder in folders:
        if not folder.is_dir():
            raise DamagedRun(folder, "not a folder, where the lab keeps its run folders")
    checked = [check_run(folder, trust_unhashed) for folder in folders]
    seen: dict[str, Path] = {}
    for run in checked:
        if run.metrics_sha256 in seen:
            raise DamagedRun(run.folder, f"its {METRICS_FILE} is the one of {seen[run.metrics_sha256]}: the same run "
                                         "copied, which would count twice")
        seen[run.metrics_sha256] = run.folder
    return checked


def unhashed_note(runs: list[CheckedRun]) -> str | None:
    """The line that names the runs counted without file hashes (``--trust-unhashed``); None when there are none."""
    folders = [str(run.folder) for run in runs if not run.hashed]
    if not folders:
        return None
    return (f"counted {len(folders)} run folder{'s' * (len(folders) > 1)} whose {FINGERPRINT_FILE} records no file "
            f"hashes, unchecked ({TRUST_OPTION}): {', '.join(folders)}")
