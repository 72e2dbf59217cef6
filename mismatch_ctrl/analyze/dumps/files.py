"""Find the dump files of each rollout and load one safely.

Rollout ids: slime names a dump ``{rollout_id}.pt`` in ``train_data/`` or ``rollout_data/``. Own templates
(``--save-debug-train-data D/run_{rollout_id}_{rank}.pt``, ...) work too: the rollout id is the number of the file
name that differs between the files of one template (:func:`name_ids`). Evaluation dumps (``eval_{rollout_id}``)
are left out; a rollout whose id is ambiguous (``2.pt`` and ``02.pt``) or disagrees with the ``rollout_id`` stored
in the file (:func:`checked_id`) is skipped with the reason (:class:`Skipped`).

Loading: the files are pickles. They are loaded with ``torch.load(weights_only=True)``, which builds only tensors,
numbers, strings, byte strings, lists and dicts, plus numpy arrays and scalars (a custom reward function may return
them) and dates and times (parquet metadata), allowed explicitly (:func:`safe_globals`), so a crafted file cannot run
code. Train dumps always load this way; a rollout dump holds whatever the run's ``Sample`` carries, and one with other
objects (multimodal inputs such as PIL images) is refused with the type named. ``unsafe_load=True``
(``mismatch-ctrl analyze --unsafe-load``) uses ``weights_only=False`` as slime's own reader does: a dump can then run
arbitrary code, so only for dumps of your own runs. A truncated, foreign or refused file is a :class:`DumpError`
that names it.
"""

from __future__ import annotations

import contextlib
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ... import regular_files
from ...formatting import brief, clip
from .fields import integer
from .schema import FORMAT_VERSION, ROLLOUT_DIR, TRAIN_DIR, DumpError

MAX_ID_DIGITS = 18
"""A rollout id in a file name has at most 18 digits (it fits an int64); longer numbers are not rollout ids."""
_ID = re.compile(r"[0-9]+")
_EVAL = re.compile(r"(?:^|[^0-9A-Za-z])eval_[0-9]+")
"""An evaluation dump: slime formats ``{rollout_id}`` as ``eval_{rollout_id}`` for them."""


@dataclass(frozen=True)
class RolloutFiles:
    """The dump files of one rollout: its train dump and/or rollout dump, or files whose kind is read from them."""

    rollout_id: int
    train: Path | None = None
    rollout: Path | None = None
    unknown: tuple[Path, ...] = ()

    @property
    def paths(self) -> list[Path]:
        """Every file of the rollout: train dump, rollout dump, then the files of unknown kind."""
        return [p for p in (self.train, self.rollout, *self.unknown) if p is not None]


@dataclass(frozen=True)
class Skipped:
    """A file (or rollout) left out of the analysis, and why."""

    path: str
    reason: str

    @classmethod
    def of(cls, paths: Sequence[Path], exc: Exception) -> Skipped:
        """The files ``paths`` left out because of ``exc`` (its message without a leading file name)."""
        reason = str(exc)
        for path in paths:
            reason = reason.removeprefix(f"{path}: ")
        return cls(", ".join(str(p) for p in paths), reason)


def find_rollouts(directory: str | Path, unsafe_load: bool = False) -> tuple[list[RolloutFiles], list[Skipped]]:
    """The rollouts under ``directory``, by rollout id, and the files that do not fit slime's naming.

    ``directory`` is the ``--dump-details`` directory (with ``train_data/`` and/or ``rollout_data/``) or a directory
    of dump files written by ``--save-debug-train-data`` / ``--save-debug-rollout-data`` templates (each file's kind
    is then read from its content). The rollout id comes from the file names (see :func:`name_ids`); evaluation dumps
    (slime puts ``eval_{id}`` where the template says ``{rollout_id}``) are left out. ``unsafe_load``: see the module
    docstring (a file whose name alone does not give its id is loaded to read it).
    """
    root = Path(directory)
    if not root.is_dir():
        raise DumpError(f"{root}: not a directory; give the --dump-details directory of a slime run")
    skipped: list[Skipped] = []
    groups: dict[int, dict[str, Any]] = {}
    clashes: dict[int, list[Path]] = {}
    subdirs = [root / TRAIN_DIR, root / ROLLOUT_DIR]
    if any(d.is_dir() for d in subdirs):
        folders = [(kind, sub) for kind, sub in zip(("train", "rollout"), subdirs) if sub.is_dir()]
    else:
        folders = [("unknown", root)]
    for kind, folder in folders:
        paths = [p for p in sorted(folder.glob("*.pt")) if not _EVAL.search(p.stem)]
        skipped += [Skipped(str(p), "not a regular file") for p in paths if not p.is_file()]
        ids, refused = name_ids([p for p in paths if p.is_file()], unsafe_load)
        skipped += refused
        for path, rid in ids.items():
            group = groups.setdefault(rid, {})
            if kind == "unknown":
                group[kind] = (*group.get(kind, ()), path)
                continue
            if kind in group:
                clashes.setdefault(rid, [group[kind]]).append(path)
            group[kind] = path
    for rid, paths in clashes.items():
        files = RolloutFiles(rid, **groups.pop(rid))
        skipped.append(Skipped(", ".join(str(p) for p in files.paths),
                               f"rollout id {rid} is named twice ({', '.join(p.name for p in paths)}); keep one file "
                               "per rollout and kind"))
    return [RolloutFiles(rid, **groups[rid]) for rid in sorted(groups)], skipped


def name_ids(paths: Sequence[Path], unsafe_load: bool = False) -> tuple[dict[Path, int], list[Skipped]]:
    """The rollout id of each file, from its name, and the files left out.

    slime names dumps by a path template with ``{rollout_id}`` (train dumps may also hold the writer's ``{rank}``,
    a constant). Files of one template have the same text between their numbers; the id is the number that differs
    between them (``run3_{rollout_id}_{rank}.pt``: the middle one). A file alone with its text, or one whose numbers
    differ in more than one place, has its id from its single number, else from the ``rollout_id`` stored in it,
    which must be one of the numbers of its name.
    """
    shapes: dict[tuple[str, ...], list[tuple[Path, list[str]]]] = {}
    for path in paths:
        shapes.setdefault(tuple(_ID.split(path.stem)), []).append((path, _ID.findall(path.stem)))
    ids: dict[Path, int] = {}
    skipped: list[Skipped] = []
    for files in shapes.values():
        width = len(files[0][1])
        varying = [k for k in range(width) if len({numbers[k] for _, numbers in files}) > 1]
        slot = varying[0] if len(varying) == 1 else 0 if width == 1 else None
        for path, numbers in files:
            try:
                if not numbers:
                    raise DumpError("no rollout id (a number) in the file name")
                rid = _stored_id(path, numbers, unsafe_load) if slot is None else numbers[slot]
                if len(str(rid).lstrip("0")) > MAX_ID_DIGITS:
                    raise DumpError(f"the rollout id in the file name has more than {MAX_ID_DIGITS} digits")
            except DumpError as exc:
                skipped.append(Skipped.of([path], exc))
                continue
            ids[path] = int(rid)
    return ids, skipped


def _stored_id(path: Path, numbers: list[str], unsafe_load: bool) -> int:
    """The ``rollout_id`` stored in ``path``, if it is one of the ``numbers`` of its name."""
    stored = integer(load_dump(path, unsafe_load).get("rollout_id"))
    if stored is None or stored not in {int(n) for n in numbers}:
        raise DumpError(f"{path}: the name has several numbers ({', '.join(numbers)}) and the rollout_id stored in "
                        f"the file ({brief(stored, 40)}) is none of them; name dumps by slime's template "
                        "({rollout_id}.pt)")
    return stored


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()`` as pickle protocol 2 writes the empty byte string (e.g. the buffer of an empty numpy array; other
    byte strings come through ``_codecs.encode``, bounded by the file). ``bytes(n)`` would let a small file claim n
    bytes of memory: refused."""
    if args:
        raise pickle.UnpicklingError("bytes() with arguments: only the empty byte string is built from a dump")
    return b""


def _reconstructor(reconstruct: Any) -> Any:
    """numpy's ``_reconstruct`` for the empty array that ``ndarray.__reduce__`` always writes (shape ``(0,)``; its
    data and shape follow in ``__setstate__``, bounded by the file). Another shape would allocate from a number in
    the file: refused."""

    def empty_array(subtype: Any, shape: Any, dtype: Any) -> Any:
        if tuple(shape) != (0,):
            raise pickle.UnpicklingError(f"an array built with shape {brief(shape, 40)} before its data: only numpy's "
                                         "own empty start is built from a dump")
        return reconstruct(subtype, shape, dtype)
    return empty_array


def safe_globals() -> list[Any]:
    """What ``weights_only`` loading may build besides tensors and plain Python data: numpy arrays and scalars of
    numeric dtypes (their functions under numpy 2's and numpy 1's module paths, whichever numpy wrote the file and
    whichever reads it; arrays from numpy's own empty start only), the empty byte string (:func:`_empty_bytes`) and
    ``datetime`` values (built from their own fields; no code runs). Nothing here allocates more than the file holds."""
    import datetime

    import numpy as np

    if int(np.__version__.split(".")[0]) >= 2:
        from numpy._core import multiarray
    else:  # numpy 1 (slime's image: 1.26.4), whose numpy._core is a stub once torch is imported
        from numpy.core import multiarray
    dtypes = {type(np.dtype(t)) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                         np.uint32, np.uint64, np.float16, np.float32, np.float64)}
    reconstruct, scalar = _reconstructor(multiarray._reconstruct), multiarray.scalar
    return [np.ndarray, np.dtype, *sorted(dtypes, key=str), datetime.datetime, datetime.date, datetime.time,
            datetime.timedelta, datetime.timezone, (_empty_bytes, "builtins.bytes"),
            *((function, f"{module}.multiarray.{name}") for module in ("numpy._core", "numpy.core")
              for function, name in ((reconstruct, "_reconstruct"), (scalar, "scalar")))]


def load_dump(path: str | Path, unsafe_load: bool = False) -> dict[str, Any]:
    """``torch.load`` one dump on the CPU (memory-mapped when the file allows), with ``weights_only=True`` unless
    ``unsafe_load`` (see the module docstring); :class:`DumpError` if unreadable or refused."""
    path = Path(path)
    options: dict[str, Any] = {"map_location": "cpu", "weights_only": not unsafe_load}
    try:
        regular_files.regular_file(path)  # a FIFO would block torch.load, a device never end
    except OSError as exc:
        raise DumpError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        with torch.serialization.safe_globals(safe_globals()) if not unsafe_load else contextlib.nullcontext(), \
                warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected pickle protocol")  # a foreign file: reported below
            try:
                payload = torch.load(path, mmap=True, **options)
            except RuntimeError as exc:
                if "mmap" not in str(exc):
                    raise
                payload = torch.load(path, **options)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        found = re.search(r"GLOBAL ([\w.]+)", text) or re.search(r"got <class '([^']+)'>", text)
        if found is None:
            reason = text.split("WeightsUnpickler error:")[-1].split("Check the documentation")[0]
            raise DumpError(f"{path}: cannot be read as a torch dump (UnpicklingError: {_short(reason)})") from None
        raise DumpError(f"{path}: refused: it holds the type {clip(found.group(1), 80)}, and unpickling it could run "
                        "code from the file (safe loading builds tensors, numbers, strings, byte strings, lists, "
                        "dicts, numpy arrays and dates). A rollout dump of a run whose samples carry such objects "
                        "(multimodal inputs) needs --unsafe-load: use it only for dumps of your own runs, or analyse "
                        "the train dumps (--dump-details) alone") from None
    except Exception as exc:  # a truncated or foreign file can fail in pickle, zipfile or torch: report, never crash
        detail = _short(exc) or "empty or truncated file"
        raise DumpError(f"{path}: cannot be read as a torch dump ({type(exc).__name__}: {detail})") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("samples"), list):
        if isinstance(payload, dict) and "rollout_data" in payload:
            raise DumpError(f"{path}: a per-rank train dump of slime before 681b3ad (CP-local tensors): not "
                            "supported; dump with a newer slime")
        what = f"keys {list(payload)[:8]}" if isinstance(payload, dict) else f"a {type(payload).__name__}"
        raise DumpError(f"{path}: not a slime debug dump (no 'samples' list; {what})")
    if not all(isinstance(s, dict) for s in payload["samples"]):
        raise DumpError(f"{path}: 'samples' must be a list of dicts")
    return payload


def dump_kind(payload: Mapping[str, Any], path: str | Path) -> str:
    """``"train"`` (has ``format_version``) or ``"rollout"``; :class:`DumpError` for an unsupported version."""
    if "format_version" not in payload:
        return "rollout"
    if integer(payload["format_version"]) != FORMAT_VERSION:
        raise DumpError(f"{path}: train dump format_version {brief(payload['format_version'], 40)}; this reader knows "
                        f"version {FORMAT_VERSION} (slime 624b824)")
    return "train"


def checked_id(payload: dict[str, Any], path: Path, rollout_id: int) -> dict[str, Any]:
    """``payload`` if the ``rollout_id`` it stores (slime always writes one) is the id of its file name."""
    stored = payload.get("rollout_id")
    if stored is not None and integer(stored) != rollout_id:
        raise DumpError(f"{path}: the file stores rollout_id {brief(stored, 40)} but its name says {rollout_id}; "
                        "rename the file after the id it stores (slime writes {rollout_id}.pt) or re-dump")
    return payload


def _short(exc: Exception | str, limit: int = 160) -> str:
    """An exception's message on one line, cut at ``limit`` characters."""
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."
