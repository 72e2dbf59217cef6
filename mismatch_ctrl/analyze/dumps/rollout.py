"""Build one rollout's :class:`RolloutDump` (the per-sample columns the analysis reads) from its train dump and/or
rollout dump.

The train dump is preferred (:func:`read_rollout`): it holds both engines' log-probs, the loss masks and the
group-normalised rewards; the rollout dump (slime ``Sample`` dicts) supplies what the train dump lacks
(``rollout_log_probs``, ``truncated``), joined by ``rollout_position``, or stands alone when there is no usable
train dump (then without the training engine's log-probs). :func:`iter_rollouts` does this for every rollout of a
directory, in order, turning an unusable rollout into a :class:`Skipped`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import torch

from ...formatting import clip
from .fields import constant_mask, flag, float_list, float_tensor, length_column, reward_list, token_column
from .files import RolloutFiles, Skipped, checked_id, dump_kind, find_rollouts, load_dump
from .schema import DumpError


REFUSED_NOTE = "not used: "
"""How a rollout's note names a dump file that was refused while its other dump was read."""


def is_refusal(note: str) -> bool:
    """Whether a rollout's note names a refused dump file (:data:`REFUSED_NOTE`)."""
    return note.startswith(REFUSED_NOTE)


REWARDS_NOTE = "rewards left out of the replay: "
"""How a rollout's note names rewards that are not all numbers (the dump, the first such sample and its value)."""


def is_rewards_note(note: str) -> bool:
    """Whether a rollout's note names rewards left out (:data:`REWARDS_NOTE`)."""
    return note.startswith(REWARDS_NOTE)


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


def read_rollout(files: RolloutFiles, unsafe_load: bool = False, reward_key: str | None = None) -> RolloutDump:
    """The :class:`RolloutDump` of one rollout; :class:`DumpError` names the file.

    The train dump is preferred; the rollout dump is loaded only when there is no usable train dump or the train dump
    lacks ``rollout_log_probs`` or ``truncated`` (then filled from it, joined by ``rollout_position``). Every loaded
    file's ``rollout_id`` must be the one in its name. A file that cannot be used is a note of the rollout when the
    other one can; :class:`DumpError` when neither can. ``unsafe_load``: see :mod:`.files`. ``reward_key``:
    slime's ``--reward-key``, for a rollout dump whose ``Sample.reward`` values are dicts.
    """
    loaded: dict[str, tuple[Path, dict[str, Any]]] = {}
    errors: list[DumpError] = []

    def load(path: Path, expected: str | None = None) -> None:
        try:
            payload = checked_id(load_dump(path, unsafe_load), path, files.rollout_id)
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
    dump.notes += [f"{REFUSED_NOTE}{exc}" for exc in errors]
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


def _from_train(rollout_id: int, payload: dict[str, Any], path: Path) -> RolloutDump:
    rows = payload["samples"]
    lengths = length_column(rows, "response_lengths", path)
    masks = token_column(rows, "loss_masks", lengths, path, "rollout_position")
    dump = RolloutDump(
        rollout_id=rollout_id,
        response_lengths=lengths,
        loss_masks=masks if masks is not None else [constant_mask(1.0, n) for n in lengths],
        rollout_log_probs=token_column(rows, "rollout_log_probs", lengths, path, "rollout_position"),
        train_log_probs=token_column(rows, "log_probs", lengths, path, "rollout_position"),
        files=[str(path)],
    )
    if all("truncated" in row for row in rows):
        dump.truncated = [flag(row["truncated"], path, f"sample {i}: truncated") for i, row in enumerate(rows)]
    notes = []
    if all("rewards" in row for row in rows):
        dump.rewards, note = reward_list([row["rewards"] for row in rows], path, "rewards")
        notes.append(note)
    dump.raw_rewards, note = reward_list(payload.get("raw_reward"), path, "raw_reward")
    if dump.raw_rewards is not None and len(dump.raw_rewards) < len(rows):  # the whole batch's: never fewer
        note = (f"{path}: raw_reward has {len(dump.raw_rewards)} values for {len(rows)} samples (slime stores the "
                "whole rollout batch's, never fewer than a dump's samples)")
        dump.raw_rewards = None
    notes.append(note)
    if dump.raw_rewards is None and all("local_raw_reward" in row for row in rows):
        dump.raw_rewards, note = reward_list([row["local_raw_reward"] for row in rows], path, "local_raw_reward")
        notes.append(note)
    dump.notes += [f"{REWARDS_NOTE}{note}" for note in notes if note is not None]
    if not rows:
        dump.notes.append("train dump without samples: nothing to measure in this rollout")
        return dump
    if masks is None:
        dump.notes.append("no loss_masks: every response token counted as trained")
    if dump.train_log_probs is None:
        dump.notes.append("train dump without log_probs (the training engine's): rollout-side statistics only")
    return dump


def _rollout_rows(payload: dict[str, Any], path: Path) -> tuple[list[dict[str, Any]], list[int], list[torch.Tensor]]:
    rows = payload["samples"]
    lengths = length_column(rows, "response_length", path)
    masks = []
    for i, (row, n) in enumerate(zip(rows, lengths)):
        mask = row.get("loss_mask")
        mask = constant_mask(1.0, n) if mask is None else float_tensor(mask, path, f"sample {i}: loss_mask")
        if mask.numel() != n:
            raise DumpError(f"{path}: sample {i}: loss_mask has {mask.numel()} entries but response_length is {n}")
        removed = flag(row.get("remove_sample", False), path, f"sample {i}: remove_sample")
        masks.append(constant_mask(0.0, n) if removed else mask)
    return rows, lengths, masks


def _truncated(rows: list[dict[str, Any]]) -> list[bool] | None:
    """``status == "truncated"`` per Sample dict (None if a sample has no status)."""
    if not all("status" in row for row in rows):
        return None
    return [getattr(row["status"], "value", row["status"]) == "truncated" for row in rows]


def _sample_rewards(rows: list[dict[str, Any]], reward_key: str | None, path: Path
                    ) -> tuple[list[float] | None, list[str]]:
    """The task rewards of ``Sample`` dicts, as slime's ``Sample.get_reward_value`` reads them (``reward[key]`` with
    ``--reward-key``), and a note when they cannot be read."""
    stored = [row.get("reward") for row in rows]
    if all(r is None for r in stored):
        return None, []
    rewards = [r.get(reward_key) if reward_key is not None and isinstance(r, Mapping) else r for r in stored]
    values = float_list(rewards)
    if values is not None:
        return values, []
    dicts = [r for r in stored if isinstance(r, Mapping)]
    keys = clip(", ".join(sorted({repr(k) for r in dicts for k in r})), 120)
    if reward_key is None and dicts:
        return None, [f"rewards are dicts (slime's --reward-key picks one entry): give --reward-key, one of {keys}"]
    if reward_key is not None and any(reward_key not in r for r in dicts):
        return None, [f"not every reward has the key {reward_key!r} (keys: {keys}): give another --reward-key"]
    return None, [f"{REWARDS_NOTE}{reward_list(rewards, path, 'reward')[1]}"]


def _from_rollout(rollout_id: int, payload: dict[str, Any], path: Path, reward_key: str | None = None
                  ) -> RolloutDump:
    rows, lengths, masks = _rollout_rows(payload, path)
    rewards, notes = _sample_rewards(rows, reward_key, path)
    return RolloutDump(
        rollout_id=rollout_id,
        response_lengths=lengths,
        loss_masks=masks,
        rollout_log_probs=token_column(rows, "rollout_log_probs", lengths, path, "sample"),
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
        dump.rollout_log_probs = token_column(picked, "rollout_log_probs", dump.response_lengths, path, "sample")
        if dump.rollout_log_probs is not None:
            dump.notes.append("rollout_log_probs taken from the rollout dump")
    if dump.truncated is None:
        dump.truncated = _truncated(picked)
