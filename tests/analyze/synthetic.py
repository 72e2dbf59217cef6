"""Synthetic slime runs for the analyze tests: per rollout, the raw per-sample tensors (the ground truth) and their
dumps written in slime's ``--dump-details`` format with :func:`write_train_dump` / :func:`write_rollout_dump`.

Train dumps hold full-length response tensors with a prompt in front (``total_lengths > response_lengths``), loss
masks with gaps, an empty response, and (optionally) a trained token whose rollout log-prob is ``-inf``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from mismatch_ctrl.analyze.dumps import write_rollout_dump, write_train_dump

PROMPT = 7


@dataclass
class Rollout:
    """One rollout's ground truth: per-sample tensors and columns, as the trainer had them."""

    rollout_id: int
    lengths: list[int]
    train: list[torch.Tensor]
    rollout: list[torch.Tensor]
    masks: list[torch.Tensor]
    truncated: list[int]
    rewards: list[float]
    raw: list[float]
    omit: set[str] = field(default_factory=set)

    def train_samples(self) -> list[dict]:
        """Train-dump sample dicts with slime's column names, minus the columns in ``omit``."""
        rows = []
        for i, n in enumerate(self.lengths):
            row = {"rollout_position": i, "sample_index": 100 + i, "response_lengths": n,
                   "total_lengths": PROMPT + n, "tokens": torch.arange(PROMPT + n), "loss_masks": self.masks[i].int(),
                   "log_probs": self.train[i], "rollout_log_probs": self.rollout[i], "rewards": self.rewards[i],
                   "truncated": self.truncated[i], "advantages": torch.full((n,), self.rewards[i]),
                   "kl": torch.zeros(n)}
            rows.append({k: v for k, v in row.items() if k not in self.omit})
        return rows

    def rollout_samples(self) -> list[dict]:
        """Rollout-dump Sample dicts (lists, status strings), as slime's ``Sample.to_dict`` gives them."""
        return [{"index": 100 + i, "group_index": i // 2, "response_length": n, "tokens": list(range(PROMPT + n)),
                 "rollout_log_probs": self.rollout[i].tolist(), "loss_mask": self.masks[i].int().tolist(),
                 "reward": self.raw[i], "status": "truncated" if self.truncated[i] else "completed"}
                for i, n in enumerate(self.lengths)]


def make_rollout(rollout_id: int, g: torch.Generator, samples: int = 8, max_len: int = 24, noise: float = 0.05,
                 lengths: list[int] | None = None, nonfinite: bool = False) -> Rollout:
    """Random log-probs: rollout ``lp_roll`` in [-4, 0]; training ``lp_train = lp_roll + noise * N(0, 1)`` (<= 0)."""
    if lengths is None:
        lengths = [int(torch.randint(1, max_len + 1, (), generator=g)) for _ in range(samples)]
        lengths[1] = 0
        lengths[2] = max_len
    train, rollout, masks = [], [], []
    for i, n in enumerate(lengths):
        lp_roll = -4.0 * torch.rand(n, generator=g) ** 3
        lp_train = (lp_roll + noise * torch.randn(n, generator=g)).clamp(max=0.0)
        mask = (torch.rand(n, generator=g) < 0.8).float() if i % 3 == 0 else torch.ones(n)
        if nonfinite and i == 0 and n:
            lp_roll[0], mask[0] = -torch.inf, 1.0
        train.append(lp_train)
        rollout.append(lp_roll)
        masks.append(mask)
    raw = [float(torch.rand((), generator=g) < 0.5) for _ in lengths]
    rewards = [r - sum(raw) / len(raw) for r in raw]
    truncated = [int(n == max_len) for n in lengths]
    return Rollout(rollout_id, lengths, train, rollout, masks, truncated, rewards, raw)


def write_run(directory: Path, rollouts: list[Rollout], rollout_dumps: bool = True,
              train_dumps: set[int] | None = None) -> None:
    """Write every rollout's train dump (those in ``train_dumps``, default all) and rollout dump."""
    for r in rollouts:
        if train_dumps is None or r.rollout_id in train_dumps:
            write_train_dump(directory, r.rollout_id, r.train_samples(), {"raw_reward": r.raw})
        if rollout_dumps:
            write_rollout_dump(directory, r.rollout_id, r.rollout_samples())
