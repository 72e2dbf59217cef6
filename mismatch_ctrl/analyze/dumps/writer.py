"""Write slime's debug dumps (the CPU lab's output) in the format slime's ``--dump-details`` writes.

:func:`samples_from_rollout_data` splits the ``rollout_data`` dict an advantage hook sees into per-sample columns;
:func:`write_train_dump` and :func:`write_rollout_dump` write ``train_data/{rollout_id}.pt`` and
``rollout_data/{rollout_id}.pt``, atomically, in slime's dtypes and with every ``Sample`` field, so slime's own
readers and :mod:`.rollout` read them back.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ...errors import InputError
from .schema import (CONTEXT_PARALLEL_FIELDS, FORMAT_VERSION, LAYOUT_FIELDS, ROLLOUT_DIR, SAMPLE_DEFAULTS,
                     SAMPLE_STATUSES, TENSOR_DTYPES, TRAIN_DIR, WHOLE_BATCH_FIELDS)


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
