"""Dumps that cannot be one run, named: the analysis reads a directory as one run's rollouts in order, so what
contradicts that is said on standard error and in the report (``result["consistency"]``), never passed over.

- **Truncation length.** slime's single-turn rollout (``slime/rollout/sglang_rollout.py`` at 624b824a) marks a
  response truncated when SGLang stops it at ``max_new_tokens``, which is ``--rollout-max-response-len`` (less the
  part a partial rollout already generated), so in one run every truncated response has that length. Truncated
  responses of several lengths are named with the rollouts that hold each: dumps of runs with different response-length
  settings (a multi-turn rollout function can truncate at other lengths; then this names what to check).
- **A response longer than ``--max-response-len``**: that setting was not the run's.
- **The rollout ids.** A gap between the first and the last id: the replay joins the rollouts around it as if they
  were consecutive. Two ids holding the same samples (the same lengths, log-probs and rewards): one dump copied under
  another id, counted twice by the calibration.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import torch

from .dumps import RolloutDump
from .dumps.rollout import is_rewards_note

SHOWN = 4
"""Rollout ids named per finding before ``... (N in all)``."""


def _ids(ids: list[int]) -> str:
    text = ", ".join(map(str, ids[:SHOWN]))
    return text if len(ids) <= SHOWN else f"{text}, ... ({len(ids)} in all)"


def _digest(dump: RolloutDump) -> str | None:
    """sha256 of what makes a rollout's samples: lengths, both engines' log-probs, rewards; None without samples."""
    if not dump.num_samples:
        return None
    digest = hashlib.sha256(repr((dump.response_lengths, dump.rewards, dump.raw_rewards)).encode())
    for column in (dump.rollout_log_probs, dump.train_log_probs):
        for tensor in column or []:
            digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


@dataclass
class RunChecks:
    """What the rollouts of a directory say about being one run, gathered one rollout at a time."""

    max_response_len: int | None = None
    truncated_at: dict[int, list[int]] = field(default_factory=dict)
    too_long: list[tuple[int, int, int]] = field(default_factory=list)
    seen: dict[str, int] = field(default_factory=dict)
    copies: list[tuple[int, int]] = field(default_factory=list)

    def observe(self, dump: RolloutDump) -> None:
        """Record one rollout's truncated lengths, its responses above ``max_response_len`` and its samples."""
        for n, cut in zip(dump.response_lengths, dump.truncated or []):
            if cut and dump.rollout_id not in self.truncated_at.setdefault(n, []):
                self.truncated_at[n].append(dump.rollout_id)
        if self.max_response_len is not None:
            longest = max(range(dump.num_samples), key=dump.response_lengths.__getitem__, default=None)
            if longest is not None and dump.response_lengths[longest] > self.max_response_len:
                self.too_long.append((dump.rollout_id, longest, dump.response_lengths[longest]))
        digest = _digest(dump)
        if digest is not None:
            first = self.seen.setdefault(digest, dump.rollout_id)
            if first != dump.rollout_id:
                self.copies.append((first, dump.rollout_id))

    def findings(self, missing: dict[str, Any], first: int, last: int) -> list[str]:
        """One line per contradiction (see the module docstring); ``missing``: ``analysis.missing_ids``."""
        out = []
        if len(self.truncated_at) > 1:
            lengths = "; ".join(f"at {n} tokens in rollout{'s' * (len(ids) > 1)} {_ids(ids)}"
                                for n, ids in sorted(self.truncated_at.items()))
            out.append(f"truncated responses end at {len(self.truncated_at)} lengths ({lengths}): slime truncates a "
                       "single-turn response at --rollout-max-response-len, so these look like dumps of runs with "
                       "different response-length settings; analyse one run's dumps at a time")
        for rollout_id, sample, n in self.too_long[:SHOWN]:
            out.append(f"rollout {rollout_id}, sample {sample}: a response of {n} tokens, longer than "
                       f"--max-response-len {self.max_response_len}: give the run's --rollout-max-response-len")
        if len(self.too_long) > SHOWN:
            out.append(f"and {len(self.too_long) - SHOWN} more rollouts with responses longer than --max-response-len")
        if missing["count"]:
            gaps = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in missing["ranges"][:SHOWN])
            ranges = len(missing["ranges"]) + missing["more_ranges"]
            more = f" and {ranges - SHOWN} more ranges" if ranges > SHOWN else ""
            out.append(f"{missing['count']} rollout(s) between {first} and {last} have no dump ({gaps}{more}): the "
                       "replay joins the rollouts around each gap as if they were consecutive")
        for original, copy in self.copies[:SHOWN]:
            out.append(f"rollouts {original} and {copy} hold the same samples (lengths, log-probs, rewards): one dump "
                       "copied under another id, which the calibration would count twice; remove the copy")
        if len(self.copies) > SHOWN:
            out.append(f"and {len(self.copies) - SHOWN} more rollouts that repeat another's samples")
        return out


def warnings_of(result: dict[str, Any]) -> list[str]:
    """What ``mismatch-ctrl analyze`` says on standard error about a finished analysis: every finding of
    :class:`RunChecks`, and the rollouts whose rewards are not all numbers (the first named with its dump and
    sample)."""
    notes = [(row["rollout_id"], note) for row in result["rollouts"] for note in row["notes"] if is_rewards_note(note)]
    lines = list(result["consistency"])
    if notes:
        ids = list(dict.fromkeys(rid for rid, _ in notes))
        lines.append(f"{len(ids)} rollout(s) ({_ids(ids)}) with rewards that are not all numbers, left out of the "
                     f"replay; the first: {notes[0][1].split(': ', 1)[1]} (the report's notes name each)")
    return lines
