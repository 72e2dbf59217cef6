"""Atomic, versioned controller-state files.

One JSON file per rollout, ``state_{rollout_id:07d}.json`` (plain floats and lists: human-readable, exact float
round-trip, and nothing executable is ever loaded). Writes go to a temporary file in the same directory, are
fsync'ed and renamed over the target, so a crash never leaves a half-written file under the final name.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable

from .errors import StateError

FORMAT = "mismatch_ctrl.state"
VERSION = 1
_NAME = re.compile(r"^state_(\d{7,})\.json$")


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file + fsync + rename + directory fsync)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


class StateStore:
    """The state files of one run in ``directory``, keeping the newest ``keep_last``."""

    def __init__(self, directory: str | Path, keep_last: int = 3) -> None:
        self.directory = Path(directory)
        self.keep_last = keep_last

    def path(self, rollout_id: int) -> Path:
        return self.directory / f"state_{rollout_id:07d}.json"

    def rollout_ids(self) -> list[int]:
        """Rollout ids with a state file, ascending."""
        if not self.directory.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.directory.iterdir() if (m := _NAME.match(p.name)))

    def save(self, rollout_id: int, state: dict[str, Any], keep: Callable[[int], bool] | None = None) -> Path:
        """Write the state after rollout ``rollout_id``; delete older files except the newest ``keep_last`` and
        those for which ``keep(rollout_id)`` is true (e.g. rollouts that end with a checkpoint)."""
        path = self.path(rollout_id)
        write_json_atomic(path, {"format": FORMAT, "version": VERSION, "rollout_id": rollout_id, "state": state})
        for old in self.rollout_ids()[:-self.keep_last]:
            if keep is None or not keep(old):
                self.path(old).unlink(missing_ok=True)
        return path

    def load(self, rollout_id: int) -> dict[str, Any]:
        """The state saved after rollout ``rollout_id``; :class:`StateError` if missing, corrupt or foreign."""
        path = self.path(rollout_id)
        if not path.is_file():
            have = self.rollout_ids()
            raise StateError(
                f"{path}: no mismatch_ctrl state for rollout {rollout_id}, the checkpoint being resumed "
                f"(state files present for rollouts {have or 'none'}). Restore the file from the run that wrote the "
                "checkpoint, or start the controllers afresh on purpose with --finetune or a new --save directory.")
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise StateError(f"{path}: unreadable mismatch_ctrl state ({exc})") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise StateError(f"{path}: not a mismatch_ctrl state file (format {document.get('format')!r})"
                             if isinstance(document, dict) else f"{path}: not a mismatch_ctrl state file")
        if document.get("version") != VERSION:
            raise StateError(f"{path}: state version {document.get('version')} is not supported (expected {VERSION})")
        if document.get("rollout_id") != rollout_id or not isinstance(document.get("state"), dict):
            raise StateError(f"{path}: corrupt state (rollout_id {document.get('rollout_id')}, expected {rollout_id})")
        return document["state"]
