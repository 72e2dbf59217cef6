"""Atomic, versioned controller-state files, and the one protocol every stateful controller restores by.

One JSON file per rollout, ``state_{rollout_id:07d}.json`` (plain floats and lists: human-readable, exact float
round-trip, and nothing executable is ever loaded). Writes go to a temporary file in the same directory, are
fsync'ed and renamed over the target, so a crash never leaves a half-written file under the final name.

**State protocol.** A stateful controller declares ``STATE``, a schema mapping each key of its ``state_dict()`` to
a check (:func:`number`, :func:`count`, :func:`optional`, :func:`list_of`, :func:`mapping`, ...), and its
``load_state_dict(state, where)`` starts with ``validated(state, self.STATE, where)``: unknown or missing keys and
values of the wrong type, non-finite or out of range raise :class:`StateError` naming ``where`` (the file and the
controller) and the key, exactly like the configuration. The controller then checks what depends on the current
configuration (e.g. lambda within ``[0, lambda_max]``).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

from . import regular_files
from .errors import StateError
from .formatting import brief, clip

FORMAT = "mismatch_ctrl.state"
VERSION = 3
MAX_STATE_BYTES = 16 << 20
"""A state file is a few KB (the surge detector's history grows by one number per rollout); more is not one."""


def _upgrade_v2(state: dict[str, Any]) -> dict[str, Any]:
    """Version 3 added DC-GRPO's drift guard (``dcgrpo.streak``, ``dcgrpo.lifts``): a version-2 run resumes with the
    guard's streak empty and no lift counted."""
    if isinstance(state.get("dcgrpo"), dict):
        state["dcgrpo"] = {"streak": [], "lifts": 0, **state["dcgrpo"]}
    return state


UPGRADES: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {2: _upgrade_v2}
"""Readable older versions and the function that brings a state of that version to the next one."""
_NAME = re.compile(r"^state_(\d{7,})\.json$")
MAX_DEPTH = 8
"""A state file nests 4 levels (document, state, controller, list); deeper is not one. Checked after parsing, so
Python versions whose JSON parser accepts any depth (3.12) refuse it as those that overflow (3.11) do."""


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` (parsed JSON) nests lists and dicts more than ``limit`` levels (iteratively: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            if depth > limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys occur once (the parser would keep the last of two silently)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {brief(key)}: the file was edited; keep one of them")
        out[key] = value
    return out


Check = Callable[[Any], Any]
"""Returns the value (converted, e.g. int -> float) or raises ``ValueError`` with what is wrong."""


def number(value: Any) -> float:
    """A finite real number (JSON int or float, not a boolean)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"must be a number, got {brief(value)}")
    try:
        out = float(value)
    except OverflowError:  # an integer beyond any float
        out = math.inf
    if not math.isfinite(out):
        raise ValueError(f"must be a finite number, got {brief(value)}")
    return out


def nonnegative(value: Any) -> float:
    """A finite number >= 0."""
    out = number(value)
    if out < 0:
        raise ValueError(f"must be >= 0, got {brief(value)}")
    return out


def positive(value: Any) -> float:
    """A finite number > 0."""
    out = number(value)
    if not out > 0:
        raise ValueError(f"must be > 0, got {brief(value)}")
    return out


MAX_COUNT = 2 ** 53
"""Rollout ids and counters stay below this (a float holds them exactly, and the LR period multiplies the surge onset
as a float); a larger one is not a run's."""


def count(value: Any) -> int:
    """An integer >= 0 and below :data:`MAX_COUNT` (a rollout id or a counter)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < MAX_COUNT:
        raise ValueError(f"must be an integer >= 0 (and below 2**53), got {brief(value)}")
    return value


def mapping(value: Any) -> Mapping[str, Any]:
    """A mapping (a nested controller's state, validated by that controller)."""
    if not isinstance(value, Mapping):
        raise ValueError(f"must be a mapping, got {brief(value)}")
    return value


def optional(check: Check) -> Check:
    """``None`` or a value passing ``check``."""
    def checked(value: Any) -> Any:
        return None if value is None else check(value)
    return checked


def list_of(check: Check) -> Check:
    """A list whose every item passes ``check``."""
    def checked(value: Any) -> list[Any]:
        if not isinstance(value, list):
            raise ValueError(f"must be a list, got {brief(value)}")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(check(item))
            except ValueError as exc:
                raise ValueError(f"item {i} {exc}") from None
        return out
    return checked


def either(*checks: Check) -> Check:
    """A value passing one of ``checks`` (tried in order; the last one's message if none does)."""
    def checked(value: Any) -> Any:
        for check in checks[:-1]:
            try:
                return check(value)
            except ValueError:
                pass
        return checks[-1](value)
    return checked


def literal(*allowed: Any) -> Check:
    """One of the ``allowed`` values."""
    def checked(value: Any) -> Any:
        if isinstance(value, (str, int, float, type(None))) and not isinstance(value, bool) and value in allowed:
            return value
        raise ValueError(f"must be one of {', '.join(map(repr, allowed))}, got {brief(value)}")
    return checked


def validated(state: Any, schema: Mapping[str, Check], where: str) -> dict[str, Any]:
    """``state`` checked against ``schema``: exactly the schema's keys, each value passed through its check.
    :class:`StateError` names ``where`` and the key otherwise."""
    if not isinstance(state, Mapping):
        raise StateError(f"{where}: expected a mapping of {', '.join(schema)}, got {brief(state)}")
    for key in state:
        if key not in schema:
            raise StateError(f"{where}.{clip(str(key), 60)}: unknown key (this version saves {', '.join(schema)}); the "
                             "file was edited or written by another version of mismatch_ctrl")
    out = {}
    for key, check in schema.items():
        if key not in state:
            held = clip(", ".join(map(str, state)), 200) or "no key"
            raise StateError(f"{where}.{key}: missing (the state holds {held}); the file was edited or written by "
                             "another version of mismatch_ctrl")
        try:
            out[key] = check(state[key])
        except ValueError as exc:
            raise StateError(f"{where}.{key}: {exc}") from None
    return out


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON to ``path`` atomically (temp file + fsync + rename + directory fsync)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise StateError(f"{path}: cannot write the controller state ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, sort_keys=True, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except ValueError as exc:  # NaN or inf (JSON has none: a reader would refuse them), or a circular reference
        Path(tmp).unlink(missing_ok=True)
        what = "holds a non-finite number" if "JSON compliant" in str(exc) else "cannot be written as JSON"
        raise StateError(f"{path}: the controller state {what} ({exc}); nothing was written, the previous state "
                         "file, if any, is intact") from None
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise StateError(f"{path}: cannot write the controller state ({exc.strerror or exc}); the previous state "
                         "file, if any, is intact") from None
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
            if (keep is None or not keep(old)) and not self.path(old).is_dir():  # a directory is not ours to delete
                self.path(old).unlink(missing_ok=True)
        return path

    def load(self, rollout_id: int) -> dict[str, Any]:
        """The state saved after rollout ``rollout_id``; :class:`StateError` if missing, corrupt or foreign."""
        path = self.path(rollout_id)
        if path.exists() or path.is_symlink():
            what = regular_files.what_is(path)
            if what is not None:
                raise StateError(f"{path}: not a regular file ({what}); put the state file written by the run back, "
                                 "or move this away and resume with --finetune")
        else:
            have = self.rollout_ids()
            raise StateError(
                f"{path}: no mismatch_ctrl state for rollout {rollout_id}, the checkpoint being resumed "
                f"(state files present for rollouts {have or 'none'}). Restore the file from the run that wrote the "
                "checkpoint, or start the controllers afresh on purpose with --finetune or a new --save directory.")
        try:
            document = regular_files.read_json(path, MAX_STATE_BYTES, object_pairs_hook=_unique_keys)
            if _deeper_than(document, MAX_DEPTH):
                raise ValueError(f"values nested deeper than a state file's {MAX_DEPTH} levels")
        except (OSError, ValueError, RecursionError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise StateError(f"{path}: unreadable mismatch_ctrl state ({clip(reason, 200)})") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise StateError(f"{path}: not a mismatch_ctrl state file (format {brief(document.get('format'))})"
                             if isinstance(document, dict) else f"{path}: not a mismatch_ctrl state file")
        version = document.get("version")
        if version != VERSION and (type(version) is not int or version not in UPGRADES):
            raise StateError(f"{path}: state version {brief(version)} is not supported (this version reads "
                             f"{', '.join(map(str, sorted([*UPGRADES, VERSION])))}: written by another version of "
                             "mismatch_ctrl)")
        if type(document.get("rollout_id")) is not int or document["rollout_id"] != rollout_id:  # not 4.0 or true
            raise StateError(f"{path}: corrupt state (rollout_id {brief(document.get('rollout_id'))}, expected "
                             f"{rollout_id})")
        if not isinstance(document.get("state"), dict):
            raise StateError(f"{path}: corrupt state (state: expected the controllers' mapping, got "
                             f"{brief(document.get('state'))}); the file was edited")
        state = document["state"]
        while version != VERSION:
            state, version = UPGRADES[version](state), version + 1
        return state
