"""Random inputs for the unit tests: realistic per-sample log-probs and loss masks, as slime passes them.

Rollout log-probs mix confident tokens (near 0), uncertain ones and rare ones (down to -15); training log-probs add a
mismatch of scale ``noise`` plus rare catastrophic outliers in both directions. Lengths include 0; masks include
all-ones, all-zeros, random and interior gaps (tool output inside a response).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from mismatch_ctrl.batch import TokenBatch
from reference import Seq, prepare

NOISES = (0.0, 1e-4, 1e-3, 1e-2, 0.1, 0.5)


@dataclass(frozen=True)
class RawBatch:
    """Per-sample lists (slime's layout) of training log-probs, rollout log-probs and loss masks."""

    train: list[torch.Tensor]
    rollout: list[torch.Tensor]
    mask: list[torch.Tensor]

    @property
    def sizes(self) -> list[int]:
        return [t.numel() for t in self.train]

    def token_batch(self, nonfinite: str = "mask") -> TokenBatch:
        return TokenBatch.from_lists(self.train, self.rollout, self.mask, nonfinite)

    def seqs(self) -> list[Seq]:
        return prepare(self.train, self.rollout, self.mask)

    def select(self, indices: list[int]) -> RawBatch:
        """The sub-batch of the sequences ``indices`` (a data-parallel shard)."""
        return RawBatch([self.train[i] for i in indices], [self.rollout[i] for i in indices],
                        [self.mask[i] for i in indices])

    def piece(self, token_indices: list[torch.Tensor]) -> RawBatch:
        """The tokens ``token_indices[i]`` of every sequence i (a context-parallel piece)."""
        return RawBatch([t[ix] for t, ix in zip(self.train, token_indices)],
                        [r[ix] for r, ix in zip(self.rollout, token_indices)],
                        [m[ix] for m, ix in zip(self.mask, token_indices)])


def _mask(n: int, g: torch.Generator) -> torch.Tensor:
    style = int(torch.randint(4, (), generator=g))
    if style == 0 or n == 0:
        return torch.ones(n)
    if style == 1:
        return torch.zeros(n)
    if style == 2:
        return (torch.rand(n, generator=g) < 0.7).float()
    mask = torch.ones(n)
    start = int(torch.randint(n, (), generator=g))
    mask[start:start + int(torch.randint(1, max(n // 2, 1) + 1, (), generator=g))] = 0.0
    return mask


def random_batch(seed: int, num_seqs: int, max_len: int = 40, noise: float = 1e-2, outliers: float = 0.02,
                 empty: float = 0.15) -> RawBatch:
    """``num_seqs`` responses of lengths in [1, max_len] (0 with probability ``empty``)."""
    g = torch.Generator().manual_seed(seed)
    train, rollout, masks = [], [], []
    for _ in range(num_seqs):
        n = 0 if float(torch.rand((), generator=g)) < empty else int(torch.randint(1, max_len + 1, (), generator=g))
        kind = torch.randint(10, (n,), generator=g)
        confident = -torch.empty(n).exponential_(20.0, generator=g)
        uncertain = -torch.empty(n).exponential_(0.7, generator=g)
        rare = -5.0 - 10.0 * torch.rand(n, generator=g)
        lp_roll = torch.where(kind < 6, confident, torch.where(kind < 9, uncertain, rare))
        lp_train = (lp_roll + noise * torch.randn(n, generator=g)).clamp(max=0.0)
        u = torch.rand(n, generator=g)
        jump = 5.0 + 10.0 * torch.rand(n, generator=g)
        lp_train = torch.where(u < outliers / 2, lp_train - jump, lp_train)
        lp_roll = torch.where((u >= outliers / 2) & (u < outliers), lp_roll - jump, lp_roll)
        train.append(lp_train)
        rollout.append(lp_roll)
        masks.append(_mask(n, g))
    return RawBatch(train, rollout, masks)


@st.composite
def raw_batches(draw, min_seqs: int = 0, max_seqs: int = 8, max_len: int = 30) -> RawBatch:
    """Hypothesis strategy of :func:`random_batch` inputs (the structure is drawn; the values come from a seed)."""
    return random_batch(
        seed=draw(st.integers(0, 2**31 - 1)),
        num_seqs=draw(st.integers(min_seqs, max_seqs)),
        max_len=draw(st.integers(1, max_len)),
        noise=draw(st.sampled_from(NOISES)),
        outliers=draw(st.sampled_from((0.0, 0.02, 0.2))),
        empty=draw(st.sampled_from((0.0, 0.2))),
    )


def seq_advantages(batch: RawBatch, seed: int = 0) -> tuple[torch.Tensor, list[list[float]]]:
    """GRPO-like advantages: one normalised value per sequence (``[N]``), and as token rows for the reference."""
    g = torch.Generator().manual_seed(seed)
    per_seq = torch.randn(len(batch.sizes), generator=g)
    return per_seq, [[a] * n for a, n in zip(per_seq.tolist(), batch.sizes)]
