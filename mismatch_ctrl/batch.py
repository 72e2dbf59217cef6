"""The one batch representation of the core: N responses concatenated into flat 1-D token tensors.

Adapters convert slime's list of per-sample tensors (:meth:`TokenBatch.from_lists`) or padded ``[B, T]`` tensors with a
mask (:meth:`TokenBatch.from_padded`) into it. Per-sequence reductions are vectorised (no Python loop over sequences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch

from .errors import InputError

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before any ``exp`` (ALGORITHMS.md notation; slime and verl do the same)."""

NonFinitePolicy = Literal["mask", "error"]


BLOCK = 128
"""Block size of the segment reductions (see :class:`Segments`)."""


class Segments:
    """Layout of N variable-length sequences in one flat tensor: sequence i owns ``sizes[i]`` consecutive tokens.

    Per-sequence sums run in two parts: whole aligned blocks of ``BLOCK`` tokens are summed by one dense reduction and
    combined per sequence through a float64 prefix sum of the block sums; the few tokens of each sequence outside
    its whole blocks (at most ``2 BLOCK``) are gathered and reduced per sequence. This is several times faster than
    one ``segment_reduce`` over all tokens, whose per-element cost dominates on long responses.
    """

    __slots__ = ("lengths", "sizes", "num_tokens", "_layout")

    def __init__(self, sizes: Sequence[int], device: torch.device | str | None = None) -> None:
        self.sizes = tuple(int(s) for s in sizes)
        if any(s < 0 for s in self.sizes):
            raise InputError(f"sequence lengths must be >= 0, got {min(self.sizes)}")
        self.lengths = torch.tensor(self.sizes, dtype=torch.long, device=device)
        self.num_tokens = sum(self.sizes)
        self._layout: tuple[torch.Tensor, ...] | None = None

    @property
    def num_seqs(self) -> int:
        return len(self.sizes)

    def _blocks(self) -> tuple[torch.Tensor, ...]:
        """Per sequence: first and end whole block, the indices of its whole blocks and of its other tokens (both
        concatenated over sequences), and the number of those other tokens."""
        if self._layout is None:
            ends = torch.cumsum(self.lengths, 0)
            starts = ends - self.lengths
            first = torch.minimum((starts + BLOCK - 1) // BLOCK * BLOCK, ends)
            last = torch.maximum(ends // BLOCK * BLOCK, first)
            head, tail = first - starts, ends - last
            first_block, last_block = first // BLOCK, last // BLOCK
            edge_index = concat_ranges(torch.stack([starts, last], 1).reshape(-1),
                                       torch.stack([head, tail], 1).reshape(-1))
            self._layout = (first_block, last_block, concat_ranges(first_block, last_block - first_block), edge_index,
                            head + tail)
        return self._layout

    def sum(self, *columns: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums of each ``[T]`` column, stacked to ``[N, K]``; empty sequences sum to 0.
        Differentiable."""
        if self.num_seqs == 0:
            return columns[0].new_zeros(0, len(columns))
        first, last, _, index, edge_sizes = self._blocks()
        whole = self.num_tokens // BLOCK
        out = []
        zero = columns[0].new_zeros(1, dtype=torch.float64)
        for column in columns:
            block_sums = column[:whole * BLOCK].reshape(whole, BLOCK).sum(1).double()
            prefix = torch.cat([zero, torch.cumsum(block_sums, 0)])
            edges = torch.segment_reduce(column[index], "sum", lengths=edge_sizes)
            out.append((prefix[last] - prefix[first] + edges).to(column.dtype))
        return torch.stack(out, dim=1)

    def max(self, column: torch.Tensor, empty: float = 0.0) -> torch.Tensor:
        """Per-sequence maximum of a ``[T]`` column; ``empty`` for sequences without tokens."""
        if self.num_seqs == 0:
            return column.new_zeros(0)
        first, last, block_index, index, edge_sizes = self._blocks()
        whole = self.num_tokens // BLOCK
        block_max = column[:whole * BLOCK].reshape(whole, BLOCK).amax(1)
        inner = torch.segment_reduce(block_max[block_index], "max", lengths=last - first, initial=-torch.inf)
        edges = torch.segment_reduce(column[index], "max", lengths=edge_sizes, initial=-torch.inf)
        return torch.where(self.lengths > 0, torch.maximum(inner, edges), empty)

    def expand(self, per_seq: torch.Tensor) -> torch.Tensor:
        """Broadcast a per-sequence ``[N]`` or ``[N, K]`` tensor to its tokens: ``[T]`` or ``[T, K]``."""
        return torch.repeat_interleave(per_seq, self.lengths, dim=0, output_size=self.num_tokens)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Cut a flat ``[T]`` tensor back into one tensor per sequence."""
        return list(torch.split(flat, self.sizes))


def concat_ranges(starts: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    """The concatenation of ``arange(starts[i], starts[i] + sizes[i])`` over i, without a Python loop."""
    index = torch.repeat_interleave(starts - (torch.cumsum(sizes, 0) - sizes), sizes)
    return index + torch.arange(index.numel(), device=index.device)


@dataclass(frozen=True)
class TokenBatch:
    """Training-engine and rollout-engine log-probs of the sampled tokens, with the loss mask, flat.

    ``log_ratio`` is ``l = lp_train - lp_roll`` clamped to [-20, 20]. Trained tokens whose log-probs are not finite
    are removed from ``mask`` and counted per sequence in ``nonfinite`` (policy ``"mask"``), or raise (``"error"``).
    Build it with :meth:`build`, :meth:`from_lists` or :meth:`from_padded`.
    """

    segments: Segments
    train_log_probs: torch.Tensor
    rollout_log_probs: torch.Tensor
    mask: torch.Tensor
    log_ratio: torch.Tensor
    nonfinite: torch.Tensor

    @classmethod
    def build(
        cls,
        segments: Segments,
        train_log_probs: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        mask: torch.Tensor,
        nonfinite: NonFinitePolicy = "mask",
    ) -> TokenBatch:
        """Validate flat ``[T]`` tensors against ``segments`` and guard non-finite log-probs."""
        for name, t in (("train_log_probs", train_log_probs), ("rollout_log_probs", rollout_log_probs), ("mask", mask)):
            if t.dim() != 1 or t.numel() != segments.num_tokens:
                raise InputError(
                    f"{name} must be a flat tensor of {segments.num_tokens} tokens (the sum of the response lengths), "
                    f"got shape {tuple(t.shape)}"
                )
        train = train_log_probs.detach().float()
        rollout = rollout_log_probs.detach().float()
        mask = mask.detach().float()
        raw_ratio = train - rollout
        bad_per_seq = train.new_zeros(segments.num_seqs)
        # One reduction finds any NaN/inf (it makes the sum non-finite); only then look token by token.
        if not bool(torch.isfinite(raw_ratio.sum())):
            finite = torch.isfinite(raw_ratio)
            bad = ~finite & (mask > 0)
            if nonfinite == "error" and bool(bad.any()):
                first = int(bad.nonzero()[0, 0])
                sample = int(torch.searchsorted(torch.cumsum(segments.lengths, 0).cpu(), first, right=True))
                raise InputError(
                    f"sample {sample}: non-finite log-prob at response token {first - sum(segments.sizes[:sample])} "
                    f"(train_log_probs={float(train[first])}, rollout_log_probs={float(rollout[first])}); "
                    "set mismatch_ctrl.nonfinite: mask to drop such tokens from the loss and count them instead"
                )
            train = torch.where(finite, train, 0.0)
            rollout = torch.where(finite, rollout, 0.0)
            mask = torch.where(finite, mask, 0.0)
            raw_ratio = train - rollout
            bad_per_seq = segments.sum(bad.float())[:, 0]
        log_ratio = raw_ratio.clamp_(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return cls(segments, train, rollout, mask, log_ratio, bad_per_seq)

    @classmethod
    def from_lists(
        cls,
        train_log_probs: Sequence[torch.Tensor],
        rollout_log_probs: Sequence[torch.Tensor],
        loss_masks: Sequence[torch.Tensor],
        nonfinite: NonFinitePolicy = "mask",
    ) -> TokenBatch:
        """From slime's per-sample lists (one 1-D tensor per response, all three of equal length per sample)."""
        counts = {"train_log_probs": len(train_log_probs), "rollout_log_probs": len(rollout_log_probs),
                  "loss_masks": len(loss_masks)}
        if len(set(counts.values())) != 1:
            raise InputError(f"the per-sample lists have different numbers of samples: {counts}")
        sizes = [t.numel() for t in train_log_probs]
        for i, (n, r, m) in enumerate(zip(sizes, rollout_log_probs, loss_masks)):
            if r.numel() != n or m.numel() != n:
                raise InputError(
                    f"sample {i}: train_log_probs has {n} tokens but rollout_log_probs has {r.numel()} and loss_masks "
                    f"has {m.numel()}; both engines must score exactly the response tokens of the sample"
                )
        if not sizes:
            empty = torch.zeros(0)
            return cls.build(Segments([]), empty, empty, empty, nonfinite)
        device = train_log_probs[0].device
        return cls.build(
            Segments(sizes, device=device),
            torch.cat([t.reshape(-1) for t in train_log_probs]),
            torch.cat([t.reshape(-1) for t in rollout_log_probs]),
            torch.cat([m.reshape(-1) for m in loss_masks]),
            nonfinite,
        )

    @classmethod
    def from_padded(
        cls,
        train_log_probs: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        mask: torch.Tensor,
        lengths: torch.Tensor | Sequence[int] | None = None,
        nonfinite: NonFinitePolicy = "mask",
    ) -> TokenBatch:
        """From right-padded ``[B, T]`` tensors and mask; row b keeps its first ``lengths[b]`` tokens (default T)."""
        shapes = {n: tuple(t.shape) for n, t in
                  (("train_log_probs", train_log_probs), ("rollout_log_probs", rollout_log_probs), ("mask", mask))}
        if len(set(shapes.values())) != 1 or train_log_probs.dim() != 2:
            raise InputError(f"padded inputs must all be [B, T] of one shape, got {shapes}")
        rows, width = train_log_probs.shape
        keep = None
        sizes = [width] * rows
        if lengths is not None:
            sizes = [int(n) for n in lengths]
            if len(sizes) != rows or any(n < 0 or n > width for n in sizes):
                raise InputError(f"lengths must give {rows} values in [0, {width}], got {sizes}")
            keep = torch.arange(width, device=mask.device)[None, :] < torch.tensor(sizes, device=mask.device)[:, None]

        def flat(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1) if keep is None else t[keep]

        return cls.build(Segments(sizes, device=mask.device), flat(train_log_probs), flat(rollout_log_probs),
                         flat(mask), nonfinite)

    @property
    def num_seqs(self) -> int:
        return self.segments.num_seqs

    @property
    def nonfinite_tokens(self) -> int:
        """Trained tokens of this shard dropped by the non-finite guard."""
        return int(self.nonfinite.sum())

