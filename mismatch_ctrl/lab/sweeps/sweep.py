"""A lab output directory as a store of finished runs: fingerprints, atomic run folders, and the checks an operator
needs before any warm-up work (the lock: ``lock``; the checks of a finished folder: ``integrity``).

A run is a pure function of (method, engine, settings, seed). Its folder ``OUT/<label>/seed<k>/`` appears only once
the run finished (its files are written to ``OUT/<label>/.seed<k>.partial/`` and renamed), with ``fingerprint.json``:
every field of the ``RunSpec``, the ``LabSettings``, the ``WarmupConfig`` and the method's ``mismatch_ctrl`` section,
taken generically from the dataclasses so new fields are covered. A rerun skips runs whose fingerprint matches and
refuses a directory that holds runs made with other settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ... import regular_files
from ...formatting import brief, clip
from ..model.warmup import WarmupConfig
from ..training.methods import RunSpec, method_section
from ..training.settings import LabSettings

FINGERPRINT_FILE = "fingerprint.json"
PARTIAL_SUFFIX = ".partial"
BYTES_PER_STEP = 4096
"""A generous size of one rollout's record in ``metrics.jsonl`` (about 1-2 KB measured), for the free-space check."""


class SweepError(Exception):
    """A lab output directory that cannot be used as asked; the message names the path and the fix."""


@dataclass(frozen=True)
class RunTask:
    """One run of a grid: what it trains and the warmed-up policy it starts from (``torch.save`` bytes)."""

    spec: RunSpec
    settings: LabSettings
    policy_bytes: bytes

    @property
    def key(self) -> tuple[str, int]:
        return self.spec.label, self.settings.seed


def run_dir(out_dir: Path, spec: RunSpec, seed: int) -> Path:
    """Where one finished run (a method at a seed) lives."""
    return out_dir / spec.label / f"seed{seed}"


def fingerprint_inputs(spec: RunSpec, settings: LabSettings, warmup: WarmupConfig) -> dict[str, Any]:
    """Everything that determines a run's results, as JSON-ready dictionaries."""
    return {"run": dataclasses.asdict(spec), "settings": dataclasses.asdict(settings),
            "warmup": dataclasses.asdict(dataclasses.replace(warmup, seed=settings.seed)),
            "method_config": method_section(spec.method)}


def digest(inputs: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``inputs``."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


def record_digest(inputs: dict[str, Any], files: Any) -> str:
    """The ``sha256`` of a run's ``fingerprint.json``: over its inputs and its list of file hashes, so the record
    covers its own list (removing or emptying ``files`` is an edit ``integrity`` sees)."""
    return digest({"inputs": inputs, "files": files})


def file_digests(files: dict[str, bytes]) -> dict[str, str]:
    """sha256 of each file of a run (relative path -> hex digest), as ``fingerprint.json`` records them: a resumed
    sweep and ``--report-only`` use a run only while its files are unchanged (``integrity``)."""
    return {name: hashlib.sha256(content).hexdigest() for name, content in sorted(files.items())}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def changed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """The dotted names of the leaves in which two nested dictionaries differ, sorted."""
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>"))


def differences(old: dict[str, Any], new: dict[str, Any], limit: int = 6) -> str:
    """``field: old -> new`` for each differing leaf of two nested dictionaries (at most ``limit``)."""
    a, b = _flatten(old), _flatten(new)
    keys = changed_fields(old, new)
    parts = [f"{k}: {brief(a.get(k, '<absent>'), 40)} -> {brief(b.get(k, '<absent>'), 40)}" for k in keys[:limit]]
    return "; ".join(parts) + (f"; and {len(keys) - limit} more" if len(keys) > limit else "")


def shared_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """The part of a fingerprint every run of one directory shares: settings and warm-up, seed left out."""
    return {"settings": {k: v for k, v in inputs["settings"].items() if k != "seed"},
            "warmup": {k: v for k, v in inputs["warmup"].items() if k != "seed"}}


def plan(out_dir: Path, grid: list[tuple[RunSpec, LabSettings]], warmup: WarmupConfig,
         done: dict[Path, dict[str, Any]]) -> list[bool]:
    """For each run of ``grid``: whether it is already finished in ``out_dir`` (True) or must be trained. ``done``:
    the fingerprint inputs of every finished run folder there (checked by ``integrity.check_runs``). Refuses a
    directory whose runs were made with other settings."""
    status = []
    new_inputs = [fingerprint_inputs(spec, settings, warmup) for spec, settings in grid]
    for folder, inputs in done.items():
        if shared_inputs(inputs) != shared_inputs(new_inputs[0]):
            raise SweepError(f"--out {out_dir}: {folder} was trained with other settings "
                             f"({differences(shared_inputs(inputs), shared_inputs(new_inputs[0]))}); use another "
                             "--out, or rerun with the settings it was made with")
    for (spec, settings), inputs in zip(grid, new_inputs):
        folder = run_dir(out_dir, spec, settings.seed)
        if folder in done and digest(done[folder]) != digest(inputs):
            raise SweepError(f"{folder}: made with other settings ({differences(done[folder], inputs)}); use "
                             "another --out or move that folder away")
        status.append(folder in done)
    return status


def clean_partial(out_dir: Path) -> list[Path]:
    """Remove the unfinished run folders a killed sweep left (``<label>/.seed<k>.partial``); return them. A file or a
    symbolic link of such a name was not left by the lab, which writes only folders there: SweepError naming what it
    is, before anything is removed (a link is never followed)."""
    stale = sorted(out_dir.glob(f"*/.seed*{PARTIAL_SUFFIX}"))
    for path in stale:
        if path.is_symlink() or not path.is_dir():
            what = f"a symbolic link to {os.readlink(path)}" if path.is_symlink() else \
                regular_files.what_is(path) or "a file"
            raise SweepError(f"--out {out_dir}: {path} is {what}, where the lab keeps the folder of a run it is "
                             "writing (a stopped sweep leaves one, which the next sweep removes); the lab wrote no "
                             f"such {'link' if path.is_symlink() else 'thing'} and removes only its own folders: move "
                             "it out of the output directory (or delete it), then rerun")
    for path in stale:
        shutil.rmtree(path)
    return stale


def commit_run(out_dir: Path, task: RunTask, files: dict[str, bytes], warmup: WarmupConfig) -> Path:
    """Write a finished run's ``files`` (relative path -> content) and its fingerprint into its folder atomically:
    into ``.seed<k>.partial`` first, then one rename."""
    final = run_dir(out_dir, task.spec, task.settings.seed)
    partial = final.parent / f".{final.name}{PARTIAL_SUFFIX}"
    inputs = fingerprint_inputs(task.spec, task.settings, warmup)
    try:
        if partial.exists():
            shutil.rmtree(partial)
        for name, content in files.items():
            target = partial / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
        hashes = file_digests(files)
        record = {"sha256": record_digest(inputs, hashes), "inputs": inputs, "files": hashes}
        (partial / FINGERPRINT_FILE).write_text(json.dumps(record, indent=1, default=str) + "\n")
        os.replace(partial, final)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise SweepError(f"--out {out_dir}: cannot write run {task.spec.label} seed {task.settings.seed} to "
                         f"{exc.filename or final} ({exc.strerror or exc}); free space or choose another --out, then "
                         "rerun: finished runs are kept") from None
    return final


def check_names(out_dir: Path, specs: list[RunSpec]) -> None:
    """Refuse run labels that cannot be folder names under ``out_dir`` (too long), before any work."""
    try:
        limit = os.pathconf(out_dir, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    for spec in specs:
        if len(spec.label.encode()) + len(PARTIAL_SUFFIX) + 1 > limit:
            raise SweepError(f"--methods: run name {clip(spec.label, 60)!r} is {len(spec.label.encode())} bytes, too "
                             f"long for a folder name under {out_dir} (at most {limit - len(PARTIAL_SUFFIX) - 1})")


def check_writable(directory: Path, flag: str, needed: int = 0) -> None:
    """Create ``directory`` if needed and write a probe file into it; SweepError naming ``flag`` and the path when
    it is read-only, not a directory, or has less than ``needed`` bytes free."""
    probe = directory / f".probe-{os.getpid()}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"0" * 1024)
        probe.unlink()
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        if directory.is_dir():
            probe.unlink(missing_ok=True)
        raise SweepError(f"{flag} {directory}: cannot write there ({exc.strerror or exc}); choose a writable "
                         "directory with free space") from None
    if free < needed:
        raise SweepError(f"{flag} {directory}: {free / 1e6:.1f} MB free, the runs need about {needed / 1e6:.1f} MB; "
                         "free space or choose another directory")
