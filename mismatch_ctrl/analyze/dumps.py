"""slime's debug dumps: read them one rollout at a time, and write them (the CPU lab's output) in the same format.

Layout (slime 624b824, ``slime/observability/{train,rollout}_data_utils.py``), with ``--dump-details DIR``:

- ``DIR/train_data/{rollout_id}.pt`` (``--save-debug-train-data``): ``{"format_version": 2, "rollout_id", "rank",
  "samples", "dp_shards", "raw_reward"?}``. ``samples`` holds one dict per trained sample, sorted by
  ``rollout_position`` (the sample's index in the rollout dump), with the per-sample columns of the training batch
  (``response_lengths``, ``total_lengths``, ``loss_masks`` int32, ``rewards`` (group-normalised), ``truncated``
  0/1, ``log_probs`` (training-engine recompute), ``rollout_log_probs`` (SGLang), ``advantages``, ``returns``,
  ``kl``, ... float32), context-parallel shards already gathered to full response length, and the ids
  ``rollout_position``, ``sample_index``, ``data_parallel_rank``. ``dp_shards`` keeps the DP / micro-batch layout
  only; ``raw_reward`` is the whole batch's raw rewards in rollout order.
- ``DIR/rollout_data/{rollout_id}.pt`` (``--save-debug-rollout-data``): ``{"rollout_id", "samples"}`` with slime
  ``Sample.to_dict()`` dicts (``response_length``, ``rollout_log_probs`` list, ``loss_mask`` list or None,
  ``status`` string, ``reward``, ...); ``eval_{rollout_id}.pt`` files hold evaluations and are ignored here.

Own templates (``--save-debug-train-data D/run_{rollout_id}_{rank}.pt``, ...) work too: the rollout id is the number
of the file name that differs between the files of one template (:func:`name_ids`).

The files are pickles. They are loaded with ``torch.load(weights_only=True)``, which builds only tensors, numbers,
strings, lists and dicts, plus numpy arrays and scalars (a custom reward function may return them) and dates and
times (parquet metadata), allowed explicitly, so a crafted file cannot run code. Train dumps always load this way;
a rollout dump holds whatever the run's ``Sample`` carries, and one with other objects (multimodal inputs such as
PIL images) is refused with the type named. ``unsafe_load=True`` (``mismatch-ctrl analyze --unsafe-load``) uses
``weights_only=False`` as slime's own reader does: a dump can then run arbitrary code, so only for dumps of your own
runs. A truncated, foreign or refused file is reported by name and skipped, as is a rollout whose id is ambiguous
(``2.pt`` and ``02.pt``) or disagrees with the ``rollout_id`` stored in the file.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import warnings
from dataclasses import dataclass, field
from numbers import Integral
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import torch

from ..errors import InputError
from ..formatting import brief, clip

TRAIN_DIR, ROLLOUT_DIR = "train_data", "rollout_data"
FORMAT_VERSION = 2
MAX_TOKENS = 2**53
"""The most tokens a response (or a batch) can have: anything above is not a length (and not exact in a float)."""
MAX_ID_DIGITS = 18
"""A rollout id in a file name has at most 18 digits (it fits an int64); longer numbers are not rollout ids."""
_ID = re.compile(r"[0-9]+")
_EVAL = re.compile(r"(?:^|[^0-9A-Za-z])eval_[0-9]+")
"""An evaluation dump: slime formats ``{rollout_id}`` as ``eval_{rollout_id}`` for them."""
CONTEXT_PARALLEL_FIELDS = ("rollout_log_probs", "teacher_log_probs", "log_probs", "ref_log_probs", "values",
                           "advantages", "returns", "kl", "entropy", "opd_reverse_kl")
"""Response-token columns slime gathers over context parallelism before writing (full response length each)."""
LAYOUT_FIELDS = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")
WHOLE_BATCH_FIELDS = ("raw_reward",)
TENSOR_DTYPES: dict[str, torch.dtype] = {"tokens": torch.long, "loss_masks": torch.int32,
                                         "rollout_mask_sums": torch.float32,
                                         **dict.fromkeys(CONTEXT_PARALLEL_FIELDS, torch.float32)}
"""dtypes of the tensor columns of a train dump (as slime's training batch holds them)."""
SAMPLE_DEFAULTS: dict[str, Any] = {
    "group_index": None, "index": None, "rollout_id": None, "prompt": "", "tokens": [], "multimodal_inputs": None,
    "multimodal_train_inputs": None, "multimodal_train_input_id": None, "apply_chat_template_kwargs": {},
    "response": "", "response_length": 0, "label": None, "reward": None, "loss_mask": None, "weight_versions": [],
    "rollout_log_probs": None, "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None, "remove_sample": False, "teacher_log_probs": None, "status": "pending",
    "metadata": {}, "generate_function_path": None, "custom_rm_path": None, "train_metadata": None,
    "session_id": None, "non_generation_time": 0.0,
    "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                  "completion_token_num": 0},
    "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
}
"""Every field of slime's ``Sample.to_dict()`` with its default (slime/utils/types.py at 624b824)."""
SAMPLE_STATUSES = ("pending", "completed", "truncated", "aborted", "failed")


class DumpError(ValueError):
    """A dump file cannot be used; the message names the file and the reason."""


# --- writing ---------------------------------------------------------------------------------------------------------

def samples_from_rollout_data(rollout_data: Mapping[str, Any], data_parallel_rank: int = 0
                              ) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Split one rank's slime ``rollout_data`` (the dict the advantage hook sees, CP = 1) the way slime's writer does.

    Returns ``(samples, whole_batch, layout)`` for :func:`write_train_dump`: a value that has one entry per sample
    (a list/tuple of that length, or a tensor whose first dimension is) becomes a per-sample column; ``raw_reward``
    is whole-batch; everything else (``micro_batch_indices``, ...) is layout. ``partition`` and ``sample_indices``
    become each sample's ``rollout_position`` / ``sample_index``; without ``partition`` the position is the index.
    """
    if "response_lengths" not in rollout_data:
        raise InputError("rollout_data has no 'response_lengths': it is what defines the number of samples")
    n = len(rollout_data["response_lengths"])
    positions = rollout_data.get("partition")
    positions = list(range(n)) if positions is None else [int(p) for p in positions]
    indices = rollout_data.get("sample_indices")
    samples: list[dict[str, Any]] = [{"data_parallel_rank": data_parallel_rank, "rollout_position": positions[i]}
                                     for i in range(n)]
    if indices is not None:
        for sample, index in zip(samples, indices):
            sample["sample_index"] = index
    whole_batch, layout = {}, {}
    for key, value in rollout_data.items():
        if key in ("partition", "sample_indices"):
            continue
        if key in WHOLE_BATCH_FIELDS:
            whole_batch[key] = value
        elif key not in LAYOUT_FIELDS and _is_per_sample(value, n):
            for sample, item in zip(samples, value):
                sample[key] = item
        else:
            layout[key] = value
    return samples, whole_batch, layout


def write_train_dump(directory: str | Path, rollout_id: int, samples: Sequence[Mapping[str, Any]],
                     extra: Mapping[str, Any] | None = None, layout: Mapping[str, Any] | None = None, *,
                     rank: int = 0) -> Path:
    """Write ``directory/train_data/{rollout_id}.pt`` exactly as slime's ``--dump-details directory`` does.

    ``samples``: one dict per trained sample with slime's column names (``response_lengths`` required; response
    tensors at full length); ids ``rollout_position`` (default: the sample's index), ``sample_index`` and
    ``data_parallel_rank`` (default 0) are optional. Tensors are detached to CPU in slime's dtypes
    (:data:`TENSOR_DTYPES`; lists of numbers in those columns become tensors). ``extra``: whole-batch keys stored at
    the top (``raw_reward``). ``layout``: scheduling keys copied into every ``dp_shards`` entry. A shard's ``rank``
    is ``rank + data_parallel_rank`` (one writer per DP rank, as with TP = PP = CP = 1). Written atomically.
    """
    extra = dict(extra or {})
    clash = sorted(set(extra) & {"format_version", "rollout_id", "rank", "samples", "dp_shards"})
    if clash:
        raise InputError(f"extra: keys {clash} are reserved by the dump format; rename them")
    rows = [_train_sample(i, sample) for i, sample in enumerate(samples)]
    order = "rollout_position"
    positions = [row[order] for row in rows]
    if len(set(positions)) != len(positions):
        raise InputError("samples: two samples share one rollout_position; each is the sample's index in the "
                         "rollout dump and must be unique")
    shards: dict[int, dict[str, Any]] = {}
    for row in rows:
        dp = row["data_parallel_rank"]
        shard = shards.setdefault(dp, {"rank": rank + dp, "data_parallel_rank": dp, "sample_indices": [],
                                       "partition": [], **dict(layout or {})})
        shard["sample_indices"].append(row.get("sample_index"))
        shard["partition"].append(row[order])
    for shard in shards.values():
        if all(index is None for index in shard["sample_indices"]):
            shard["sample_indices"] = None
    payload = {"format_version": FORMAT_VERSION, "rollout_id": int(rollout_id), "rank": int(rank),
               "samples": sorted(rows, key=lambda row: row[order]),
               "dp_shards": [shards[dp] for dp in sorted(shards)], **extra}
    return _save(payload, Path(directory) / TRAIN_DIR / f"{int(rollout_id)}.pt")


def write_rollout_dump(directory: str | Path, rollout_id: int, samples: Sequence[Mapping[str, Any]]) -> Path:
    """Write ``directory/rollout_data/{rollout_id}.pt``: ``{"rollout_id", "samples"}`` with slime ``Sample`` dicts.

    Each sample dict is completed with the defaults of every ``Sample`` field (:data:`SAMPLE_DEFAULTS`), so slime's
    ``Sample.from_dict`` (``--load-debug-rollout-data``) reads the file; ``status`` is one of
    :data:`SAMPLE_STATUSES`; ``rollout_log_probs`` and ``loss_mask`` (lists, or tensors converted to lists) must have
    ``response_length`` entries. Written atomically.
    """
    rows = []
    for i, sample in enumerate(samples):
        row = {**SAMPLE_DEFAULTS, **dict(sample)}
        for key in ("apply_chat_template_kwargs", "weight_versions", "metadata", "tokens", "spec_info",
                    "prefix_cache_info"):
            if row[key] is SAMPLE_DEFAULTS[key]:
                row[key] = type(row[key])(row[key])
        status = getattr(row["status"], "value", row["status"])
        if status not in SAMPLE_STATUSES:
            raise InputError(f"sample {i}: status {row['status']!r} is not a slime Sample.Status; use one of "
                             f"{SAMPLE_STATUSES}")
        row["status"] = status
        n = int(row["response_length"])
        for key, cast in (("rollout_log_probs", float), ("loss_mask", int), ("tokens", int)):
            if torch.is_tensor(row[key]):
                row[key] = [cast(v) for v in row[key].detach().cpu().reshape(-1).tolist()]
        for key in ("rollout_log_probs", "loss_mask"):
            if row[key] is not None and len(row[key]) != n:
                raise InputError(f"sample {i}: {key} has {len(row[key])} entries but response_length is {n}")
        rows.append(row)
    return _save({"rollout_id": int(rollout_id), "samples": rows},
                 Path(directory) / ROLLOUT_DIR / f"{int(rollout_id)}.pt")


def _is_per_sample(value: Any, n: int) -> bool:
    if torch.is_tensor(value):
        return value.dim() >= 1 and value.size(0) == n
    return isinstance(value, (list, tuple)) and len(value) == n


def _train_sample(i: int, sample: Mapping[str, Any]) -> dict[str, Any]:
    row = dict(sample)
    if "response_lengths" not in row:
        raise InputError(f"sample {i}: no 'response_lengths' (the number of response tokens)")
    n = int(row["response_lengths"])
    row["response_lengths"] = n
    row.setdefault("rollout_position", i)
    row.setdefault("data_parallel_rank", 0)
    for key, dtype in TENSOR_DTYPES.items():
        value = row.get(key)
        if value is None:
            continue
        tensor = value.detach().cpu() if torch.is_tensor(value) else torch.as_tensor(value)
        row[key] = tensor.to(dtype).contiguous()
        length = row[key].numel()
        if (key in CONTEXT_PARALLEL_FIELDS or key == "loss_masks") and length != n:
            raise InputError(f"sample {i}: {key} has {length} tokens but response_lengths is {n}; write full-length "
                             "response tensors (gather context-parallel shards first)")
    if "total_lengths" in row and "tokens" in row and row["tokens"].numel() != int(row["total_lengths"]):
        raise InputError(f"sample {i}: tokens has {row['tokens'].numel()} ids but total_lengths is "
                         f"{row['total_lengths']}")
    return row


def _save(payload: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)
    return path


# --- reading ---------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RolloutFiles:
    """The dump files of one rollout: its train dump and/or rollout dump, or files whose kind is read from them."""

    rollout_id: int
    train: Path | None = None
    rollout: Path | None = None
    unknown: tuple[Path, ...] = ()

    @property
    def paths(self) -> list[Path]:
        return [p for p in (self.train, self.rollout, *self.unknown) if p is not None]


@dataclass
class RolloutDump:
    """One rollout's per-sample columns, as the analysis needs them, from whichever dump supplied them.

    ``rewards`` are the group-normalised rewards slime trains on (GRPO's advantage); ``raw_rewards`` the task's.
    Optional columns are None when no dump recorded them.
    """

    rollout_id: int
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]
    rollout_log_probs: list[torch.Tensor] | None = None
    train_log_probs: list[torch.Tensor] | None = None
    truncated: list[bool] | None = None
    rewards: list[float] | None = None
    raw_rewards: list[float] | None = None
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return len(self.response_lengths)


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
    stored = _integer(load_dump(path, unsafe_load).get("rollout_id"))
    if stored is None or stored not in {int(n) for n in numbers}:
        raise DumpError(f"{path}: the name has several numbers ({', '.join(numbers)}) and the rollout_id stored in "
                        f"the file ({brief(stored, 40)}) is none of them; name dumps by slime's template "
                        "({rollout_id}.pt)")
    return stored


def safe_globals() -> list[Any]:
    """What ``weights_only`` loading may build besides tensors and plain Python data: numpy arrays and scalars of
    numeric dtypes (their reconstruct functions under numpy 2's and numpy 1's module paths), and ``datetime`` values
    (built from their own fields; no code runs)."""
    import datetime

    import numpy as np

    core = getattr(np, "_core", None) or np.core
    dtypes = {type(np.dtype(t)) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
                                         np.uint32, np.uint64, np.float16, np.float32, np.float64)}
    reconstruct, scalar = core.multiarray._reconstruct, core.multiarray.scalar
    return [np.ndarray, np.dtype, reconstruct, scalar, *sorted(dtypes, key=str), datetime.datetime, datetime.date,
            datetime.time, datetime.timedelta, datetime.timezone,
            (reconstruct, "numpy.core.multiarray._reconstruct"), (scalar, "numpy.core.multiarray.scalar")]


def load_dump(path: str | Path, unsafe_load: bool = False) -> dict[str, Any]:
    """``torch.load`` one dump on the CPU (memory-mapped when the file allows), with ``weights_only=True`` unless
    ``unsafe_load`` (see the module docstring); :class:`DumpError` if unreadable or refused."""
    path = Path(path)
    options: dict[str, Any] = {"map_location": "cpu", "weights_only": not unsafe_load}
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
                        "code from the file (safe loading builds tensors, numbers, strings, lists, dicts, numpy "
                        "arrays and dates). A rollout dump of a run whose samples carry such objects (multimodal "
                        "inputs) needs --unsafe-load: use it only for dumps of your own runs, or analyse the train "
                        "dumps (--dump-details) alone") from None
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
    if _integer(payload["format_version"]) != FORMAT_VERSION:
        raise DumpError(f"{path}: train dump format_version {brief(payload['format_version'], 40)}; this reader knows "
                        f"version {FORMAT_VERSION} (slime 624b824)")
    return "train"


def read_rollout(files: RolloutFiles, unsafe_load: bool = False, reward_key: str | None = None) -> RolloutDump:
    """The :class:`RolloutDump` of one rollout; :class:`DumpError` names the file.

    The train dump is preferred; the rollout dump is loaded only when there is no usable train dump or the train dump
    lacks ``rollout_log_probs`` or ``truncated`` (then filled from it, joined by ``rollout_position``). Every loaded
    file's ``rollout_id`` must be the one in its name. A file that cannot be used is a note of the rollout when the
    other one can; :class:`DumpError` when neither can. ``unsafe_load``: see the module docstring. ``reward_key``:
    slime's ``--reward-key``, for a rollout dump whose ``Sample.reward`` values are dicts.
    """
    loaded: dict[str, tuple[Path, dict[str, Any]]] = {}
    errors: list[DumpError] = []

    def load(path: Path, expected: str | None = None) -> None:
        try:
            payload = _checked_id(load_dump(path, unsafe_load), path, files.rollout_id)
            kind = dump_kind(payload, path)
            if expected is not None and kind != expected:
                raise DumpError(f"{path}: a {kind} dump in {path.parent.name}/; keep slime's layout (train_data/ for "
                                "train dumps, rollout_data/ for rollout dumps)")
        except DumpError as exc:
            errors.append(exc)
            return
        if kind in loaded:
            raise DumpError(f"{path}: a second {kind} dump for rollout {files.rollout_id} (also "
                            f"{loaded[kind][0].name}); keep one file per rollout and kind")
        loaded[kind] = (path, payload)

    for path in files.unknown:
        load(path)
    if files.train is not None:
        load(files.train, "train")
    dump = None
    if "train" in loaded:
        try:
            dump = _from_train(files.rollout_id, loaded["train"][1], loaded["train"][0])
        except DumpError as exc:
            errors.append(exc)
    incomplete = dump is None or dump.rollout_log_probs is None or dump.truncated is None
    if files.rollout is not None and "rollout" not in loaded and incomplete:
        load(files.rollout, "rollout")
    if dump is None:
        if "rollout" not in loaded:
            raise errors[0] if errors else DumpError(f"rollout {files.rollout_id}: no dump file")
        dump = _from_rollout(files.rollout_id, loaded["rollout"][1], loaded["rollout"][0], reward_key)
    elif "rollout" in loaded and incomplete:
        _fill_from_rollout(dump, loaded["rollout"][1], loaded["rollout"][0], loaded["train"][1]["samples"])
    dump.notes += [f"not used: {exc}" for exc in errors]
    return dump


def iter_rollouts(directory: str | Path, unsafe_load: bool = False, reward_key: str | None = None
                  ) -> Iterator[RolloutDump | Skipped]:
    """Every rollout under ``directory`` in order: a :class:`RolloutDump`, or :class:`Skipped` with the reason."""
    groups, skipped = find_rollouts(directory, unsafe_load)
    yield from skipped
    for files in groups:
        try:
            yield read_rollout(files, unsafe_load, reward_key)
        except DumpError as exc:
            yield Skipped.of(files.paths, exc)


def _short(exc: Exception | str, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _column(rows: list[dict[str, Any]], key: str, n_tokens: list[int], path: Path, label: str
            ) -> list[torch.Tensor] | None:
    """Per-sample 1-D tensors of ``key`` with ``n_tokens[i]`` entries each, or None if no sample has it."""
    present = [row.get(key) is not None for row in rows]
    if not any(present):
        return None
    if not all(present):
        raise DumpError(f"{path}: {key} is present for only {sum(present)} of {len(rows)} samples")
    out = []
    for i, (row, n) in enumerate(zip(rows, n_tokens)):
        if key.endswith("log_probs") and not _floating(row[key]):
            raise DumpError(f"{path}: sample {i} ({label} {row.get('rollout_position', i)}): {key} holds integers "
                            f"({_dtype_name(row[key])}), not log-probs: the dump is not what slime writes (token ids "
                            "or masks under the wrong key?); re-dump it")
        tensor = _tensor(row[key], path, f"sample {i}: {key}")
        if tensor.numel() != n:
            raise DumpError(f"{path}: sample {i} ({label} {row.get('rollout_position', i)}): {key} has "
                            f"{tensor.numel()} tokens but the response has {n}; the dump must hold full-length "
                            "response tensors (context-parallel shards gathered)")
        out.append(tensor)
    return out


def _floating(value: Any) -> bool:
    """Whether log-probs are floating point: a float tensor or array, or a list with a float (an empty list too)."""
    if torch.is_tensor(value) or isinstance(value, np.ndarray):
        return value.dtype.is_floating_point if torch.is_tensor(value) else np.issubdtype(value.dtype, np.floating)
    return not isinstance(value, (list, tuple)) or not value or any(isinstance(v, float) for v in value)


def _dtype_name(value: Any) -> str:
    return str(value.dtype) if hasattr(value, "dtype") else "a list of integers"


def _constant(value: float, n: int) -> torch.Tensor:
    """A default mask of ``n`` tokens that takes no memory (a stride-0 view): a response length read from a file
    must not allocate more than the file holds."""
    return torch.full((1,), value).expand(n)


def _tensor(value: Any, path: Path, what: str) -> torch.Tensor:
    """``value`` as a flat float tensor; a tensor whose elements overlap in memory (a stride-0 ``expand``, which
    slime never writes) is refused: copying it would take memory the file does not hold."""
    if torch.is_tensor(value) and value.untyped_storage().nbytes() < value.numel() * value.element_size():
        raise DumpError(f"{path}: {what} is a tensor of {value.numel()} elements stored in "
                        f"{value.untyped_storage().nbytes()} bytes (overlapping elements); re-dump it with slime")
    try:
        return torch.as_tensor(value).reshape(-1).float()
    except (TypeError, ValueError, RuntimeError):
        raise DumpError(f"{path}: {what} is not a list of numbers or a tensor ({type(value).__name__})") from None


def _integer(value: Any) -> int | None:
    """``value`` if it is an integer (Python or numpy, not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        return None
    return int(value)


def _flag(value: Any, path: Path, what: str) -> bool:
    """A 0/1 flag of a sample (``truncated``, ``remove_sample``): a bool or the integer 0 or 1, Python or numpy."""
    if isinstance(value, (bool, np.bool_)) or _integer(value) in (0, 1):
        return bool(value)
    raise DumpError(f"{path}: {what} must be true/false or 0/1, got {brief(value, 40)}")


def _checked_id(payload: dict[str, Any], path: Path, rollout_id: int) -> dict[str, Any]:
    """``payload`` if the ``rollout_id`` it stores (slime always writes one) is the id of its file name."""
    stored = payload.get("rollout_id")
    if stored is not None and _integer(stored) != rollout_id:
        raise DumpError(f"{path}: the file stores rollout_id {brief(stored, 40)} but its name says {rollout_id}; "
                        "rename the file after the id it stores (slime writes {rollout_id}.pt) or re-dump")
    return payload


def _lengths(rows: list[dict[str, Any]], key: str, path: Path) -> list[int]:
    try:
        lengths = [int(row[key]) for row in rows]
    except (KeyError, TypeError, ValueError, OverflowError):
        raise DumpError(f"{path}: every sample needs an integer '{key}'") from None
    if lengths and not 0 <= min(lengths) <= max(lengths) <= MAX_TOKENS:
        bad = min(lengths) if min(lengths) < 0 else max(lengths)
        raise DumpError(f"{path}: {key} must be between 0 and {MAX_TOKENS}, got {brief(bad, 40)}")
    return lengths


def _numbers(values: Any) -> list[float] | None:
    """Floats of a sequence of numbers (None if it is not one; a string is neither a sequence nor a number here)."""
    if values is None or isinstance(values, (str, bytes)):
        return None
    try:
        items = list(values)
        if any(isinstance(v, (str, bytes)) for v in items):
            return None
        return [float(v) for v in items]
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return None


def _from_train(rollout_id: int, payload: dict[str, Any], path: Path) -> RolloutDump:
    rows = payload["samples"]
    lengths = _lengths(rows, "response_lengths", path)
    masks = _column(rows, "loss_masks", lengths, path, "rollout_position")
    dump = RolloutDump(
        rollout_id=rollout_id,
        response_lengths=lengths,
        loss_masks=masks if masks is not None else [_constant(1.0, n) for n in lengths],
        rollout_log_probs=_column(rows, "rollout_log_probs", lengths, path, "rollout_position"),
        train_log_probs=_column(rows, "log_probs", lengths, path, "rollout_position"),
        files=[str(path)],
    )
    if all("truncated" in row for row in rows):
        dump.truncated = [_flag(row["truncated"], path, f"sample {i}: truncated") for i, row in enumerate(rows)]
    if all("rewards" in row for row in rows):
        dump.rewards = _numbers(row["rewards"] for row in rows)
    dump.raw_rewards = _numbers(payload.get("raw_reward"))
    if dump.raw_rewards is None and all("local_raw_reward" in row for row in rows):
        dump.raw_rewards = _numbers(row["local_raw_reward"] for row in rows)
    if masks is None:
        dump.notes.append("no loss_masks: every response token counted as trained")
    if dump.train_log_probs is None:
        dump.notes.append("train dump without log_probs (the training engine's): rollout-side statistics only")
    return dump


def _rollout_rows(payload: dict[str, Any], path: Path) -> tuple[list[dict[str, Any]], list[int], list[torch.Tensor]]:
    rows = payload["samples"]
    lengths = _lengths(rows, "response_length", path)
    masks = []
    for i, (row, n) in enumerate(zip(rows, lengths)):
        mask = row.get("loss_mask")
        mask = _constant(1.0, n) if mask is None else _tensor(mask, path, f"sample {i}: loss_mask")
        if mask.numel() != n:
            raise DumpError(f"{path}: sample {i}: loss_mask has {mask.numel()} entries but response_length is {n}")
        removed = _flag(row.get("remove_sample", False), path, f"sample {i}: remove_sample")
        masks.append(_constant(0.0, n) if removed else mask)
    return rows, lengths, masks


def _truncated(rows: list[dict[str, Any]]) -> list[bool] | None:
    """``status == "truncated"`` per Sample dict (None if a sample has no status)."""
    if not all("status" in row for row in rows):
        return None
    return [getattr(row["status"], "value", row["status"]) == "truncated" for row in rows]


def _sample_rewards(rows: list[dict[str, Any]], reward_key: str | None) -> tuple[list[float] | None, list[str]]:
    """The task rewards of ``Sample`` dicts, as slime's ``Sample.get_reward_value`` reads them (``reward[key]`` with
    ``--reward-key``), and a note when they cannot be read."""
    stored = [row.get("reward") for row in rows]
    if all(r is None for r in stored):
        return None, []
    rewards = [r.get(reward_key) if reward_key is not None and isinstance(r, Mapping) else r for r in stored]
    values = _numbers(rewards)
    if values is not None:
        return values, []
    dicts = [r for r in stored if isinstance(r, Mapping)]
    keys = clip(", ".join(sorted({repr(k) for r in dicts for k in r})), 120)
    if reward_key is None and dicts:
        return None, [f"rewards are dicts (slime's --reward-key picks one entry): give --reward-key, one of {keys}"]
    if reward_key is not None and any(reward_key not in r for r in dicts):
        return None, [f"not every reward has the key {reward_key!r} (keys: {keys}): give another --reward-key"]
    return None, ["rewards are not all numbers: not reported"]


def _from_rollout(rollout_id: int, payload: dict[str, Any], path: Path, reward_key: str | None = None
                  ) -> RolloutDump:
    rows, lengths, masks = _rollout_rows(payload, path)
    rewards, notes = _sample_rewards(rows, reward_key)
    return RolloutDump(
        rollout_id=rollout_id,
        response_lengths=lengths,
        loss_masks=masks,
        rollout_log_probs=_column(rows, "rollout_log_probs", lengths, path, "sample"),
        truncated=_truncated(rows),
        raw_rewards=rewards,
        files=[str(path)],
        notes=["rollout dump only: no training-engine log-probs", *notes],
    )


def _fill_from_rollout(dump: RolloutDump, payload: dict[str, Any], path: Path, train_rows: list[dict[str, Any]]
                       ) -> None:
    """Fill ``rollout_log_probs`` / ``truncated`` of a train dump from the rollout dump, joined by rollout_position."""
    rows, lengths, _ = _rollout_rows(payload, path)
    try:
        positions = [int(row["rollout_position"]) for row in train_rows]
        picked = [rows[p] for p in positions]
    except (KeyError, TypeError, ValueError, IndexError):
        dump.notes.append(f"{path}: cannot join to the train dump by rollout_position; not used")
        return
    if [lengths[p] for p in positions] != dump.response_lengths:
        dump.notes.append(f"{path}: response lengths differ from the train dump's; not used")
        return
    dump.files.append(str(path))
    if dump.rollout_log_probs is None:
        dump.rollout_log_probs = _column(picked, "rollout_log_probs", dump.response_lengths, path, "sample")
        if dump.rollout_log_probs is not None:
            dump.notes.append("rollout_log_probs taken from the rollout dump")
    if dump.truncated is None:
        dump.truncated = _truncated(picked)
