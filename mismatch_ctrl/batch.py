"""The one batch representation of the core: N responses concatenated into flat 1-D token tensors.

Adapters convert slime's list of per-sample tensors (:meth:`TokenBatch.from_lists`) or padded ``[B, T]`` tensors with a
mask (:meth:`TokenBatch.from_padded`) into it. Per-sequence reductions are vectorised (no Python loop over sequences).
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Literal, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from . import host
from .errors import InputError
from .formatting import brief

LOG_RATIO_BOUND = 20.0
"""Log-ratios are clamped to [-20, 20] before any ``exp`` (ALGORITHMS.md notation; slime and verl do the same)."""
LOG_PROB_TOLERANCE = 1e-3
"""A log-prob above 0 but at most this is rounding and reads as 0; above it, it is impossible (p > 1.001) [ours]."""
LOG_PROB_FLOOR = -1e30
"""A log-prob below this is an overflowed ``-inf`` and counts as non-finite [ours]: a float32 sum of a million such
tokens (a sequence's statistics; slime's per-sample mean of a token-shaped metric) would overflow, and no softmax of
finite float32 logits of a working model gives one (its ``exp`` is 0 from about -104)."""

NonFinitePolicy = Literal["mask", "error"]
DROPPED_WARNING = ("mismatch_ctrl: trained tokens with a NaN/inf (or < -1e30) or impossible (> 0) log-prob were "
                   "dropped from the loss and counted (slime: rollout/mismatch_ctrl/nonfinite_tokens per rollout, "
                   "train/mismatch_ctrl/nonfinite_token_fraction per train step); set mismatch_ctrl.nonfinite: error "
                   "to stop instead")
"""One fixed text, so Python's default warning filter shows it once per process."""


BLOCK = 128
"""Block size of the segment reductions (see :class:`Segments`)."""
LAYOUT = ("lengths", "first_block", "last_block", "block_counts", "block_index", "edge_sizes", "edge_index",
          "edge_owner", "block_owner")
"""The index arrays of a :class:`Segments` layout, in the order they are packed for the device."""


class Segments:
    """Layout of N variable-length sequences in one flat tensor: sequence i owns ``sizes[i]`` consecutive tokens.

    Per-sequence reductions run in two parts: whole aligned blocks of ``BLOCK`` tokens are reduced by one dense
    reduction and combined per sequence (sums through a float64 prefix sum of the block sums); the few tokens of each
    sequence outside its whole blocks (at most ``2 BLOCK``) are gathered and reduced per sequence. This is several
    times faster than one ``segment_reduce`` over all tokens, whose per-element cost dominates on long responses.
    :meth:`sum_rows`, :meth:`max_rows` and :meth:`expand` handle K rows at once, with a number of tensor operations
    that depends on neither K nor N. The index layout is computed once per instance on the host (numpy, from the
    Python ``sizes``) and copied to the device in one non-blocking transfer (:func:`mismatch_ctrl.host.to_device`):
    no device kernels for bookkeeping, no host synchronisation.
    """

    __slots__ = ("sizes", "num_tokens", "device", "_host", "_cache", "_packed")

    def __init__(self, sizes: Sequence[int], device: torch.device | str | None = None) -> None:
        self.sizes: tuple[int, ...] | None = tuple(int(s) for s in sizes)
        if any(s < 0 for s in self.sizes):
            raise InputError(f"sequence lengths must be >= 0, got {min(self.sizes)}")
        self.num_tokens = sum(self.sizes)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self._host: dict[str, np.ndarray] | None = None
        self._cache: dict[str, torch.Tensor] = {}
        self._packed: torch.Tensor | None = None

    @classmethod
    def of_index(cls, packed: torch.Tensor, sizes: Sequence[int], num_tokens: int) -> Segments:
        """The layout of another instance from its uploaded :meth:`index` (``packed`` arrays of ``sizes``), without
        host ``sizes``: what a compiled region rebuilds from tensors. The numbers of sequences and tokens are then
        sizes of tensors (symbolic in a trace, so one graph serves batches of every size); only the device methods
        work (no :meth:`split`, no windows of :meth:`edge_index`)."""
        segments = cls.__new__(cls)
        segments.sizes, segments.num_tokens, segments._host, segments._packed = None, num_tokens, None, packed
        segments._cache = dict(zip(LAYOUT, torch.split(packed, list(sizes))))
        segments.device = packed.device
        return segments

    def index(self) -> tuple[torch.Tensor, list[int]]:
        """The layout arrays (:data:`LAYOUT`) on the device, packed in one tensor, and their sizes (uploaded on
        first use)."""
        self._index("lengths")
        return self._packed, [self._cache[name].numel() for name in LAYOUT]

    @property
    def num_seqs(self) -> int:
        return len(self.sizes) if self.sizes is not None else self._cache["lengths"].shape[0]

    @property
    def lengths(self) -> torch.Tensor:
        """The sequence lengths ``[N]`` (long, on the device)."""
        return self._index("lengths")

    def _layout(self) -> dict[str, np.ndarray]:
        """Host index arrays: per sequence its first and end whole block, its whole blocks and its other ("edge")
        tokens (both concatenated over sequences, with counts), and the sequence owning each whole block of the flat
        tensor and each edge token."""
        if self._host is None:
            lengths = np.asarray(self.sizes, dtype=np.int64)
            ends = np.cumsum(lengths)
            starts = ends - lengths
            first = np.minimum((starts + BLOCK - 1) // BLOCK * BLOCK, ends)
            last = np.maximum(ends // BLOCK * BLOCK, first)
            edge_sizes = (first - starts) + (ends - last)
            first_block, last_block = first // BLOCK, last // BLOCK
            self._host = {
                "lengths": lengths,
                "first_block": first_block,
                "last_block": last_block,
                "block_counts": last_block - first_block,
                "block_index": concat_ranges(first_block, last_block - first_block),
                "edge_sizes": edge_sizes,
                "edge_index": concat_ranges(np.stack([starts, last], 1).reshape(-1),
                                            np.stack([first - starts, ends - last], 1).reshape(-1)),
                "edge_owner": np.repeat(np.arange(self.num_seqs), edge_sizes),
                "block_owner": np.searchsorted(ends, np.arange(self.num_tokens // BLOCK) * BLOCK, side="right"),
            }
        return self._host

    def _index(self, name: str) -> torch.Tensor:
        """The layout array ``name`` on the device; the first call uploads all of them in one transfer."""
        if not self._cache:
            layout = self._layout()
            arrays = [layout[name] for name in LAYOUT]
            self._packed = host.to_device(np.concatenate(arrays), self.device)
            self._cache = dict(zip(LAYOUT, torch.split(self._packed, [a.size for a in arrays])))
        return self._cache[name]

    @staticmethod
    def blocks(rows: torch.Tensor) -> torch.Tensor:
        """``[K, W, BLOCK]`` view of the whole blocks of ``[K, width]`` rows: all T tokens, or a window of them that
        starts at a multiple of ``BLOCK`` (whose blocks are then the flat tensor's own)."""
        whole = rows.shape[1] // BLOCK
        return rows.narrow(1, 0, whole * BLOCK).view(rows.shape[0], whole, BLOCK)

    def sum_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums ``[N, K]`` (float64) of the K rows of ``[K, T]``; empty sequences sum to 0.
        Differentiable."""
        return self.combine_sums(self.blocks(rows).sum(2), rows.index_select(1, self.edge_index()))

    def max_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """Per-sequence maxima ``[N, K]`` of the K rows of ``[K, T]``; ``-inf`` for sequences without tokens."""
        return self.combine_maxima(self.blocks(rows).amax(2), rows.index_select(1, self.edge_index()))

    def edge_index(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Positions of the edge tokens (those outside every whole block of their sequence) in ``[start, stop)``,
        relative to ``start``; all of them by default. With ``start`` and ``stop`` multiples of ``BLOCK`` (or
        ``stop`` the end), the parts of consecutive windows concatenate to all edge tokens, in order."""
        if start == 0 and stop is None:
            return self._index("edge_index")
        edges = self._layout()["edge_index"]
        first, last = np.searchsorted(edges, [start, self.num_tokens if stop is None else stop])
        return host.to_device(edges[first:last] - start, self.device)

    def combine_sums(self, block_sums: torch.Tensor, edge_values: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums ``[N, K]`` (float64) from the sums of the whole blocks ``[K, T // BLOCK]`` and the
        values of the edge tokens ``[K, E]`` (in :meth:`edge_index` order) of K rows: a float64 prefix sum over the
        blocks, differenced at each sequence's first and end whole block, plus its edge tokens."""
        k = block_sums.shape[0]
        if self.num_seqs == 0:
            return block_sums.new_zeros(0, k, dtype=torch.float64)
        prefix = F.pad(block_sums.double().cumsum(1), (1, 0))
        inner = prefix.index_select(1, self._index("last_block")) - prefix.index_select(1, self._index("first_block"))
        edges = torch.segment_reduce(edge_values, "sum", lengths=self._index("edge_sizes").expand(k, -1), axis=1,
                                     unsafe=True)
        return (inner + edges).t()

    def combine_maxima(self, block_max: torch.Tensor, edge_values: torch.Tensor) -> torch.Tensor:
        """Per-sequence maxima ``[N, K]`` from the maxima of the whole blocks and the edge tokens' values (as
        :meth:`combine_sums`); ``-inf`` for sequences without tokens."""
        k = block_max.shape[0]
        if self.num_seqs == 0:
            return block_max.new_zeros(0, k)
        blocks = block_max.index_select(1, self._index("block_index"))
        inner = torch.segment_reduce(blocks, "max", lengths=self._index("block_counts").expand(k, -1), axis=1,
                                     initial=-torch.inf, unsafe=True)
        edges = torch.segment_reduce(edge_values, "max", lengths=self._index("edge_sizes").expand(k, -1), axis=1,
                                     initial=-torch.inf, unsafe=True)
        return torch.maximum(inner, edges).t()

    def sum(self, *columns: torch.Tensor) -> torch.Tensor:
        """Per-sequence sums of each ``[T]`` column, stacked to ``[N, K]`` in the columns' dtype. Differentiable."""
        rows = columns[0].unsqueeze(0) if len(columns) == 1 else torch.stack(columns)
        return self.sum_rows(rows).to(columns[0].dtype)

    def expand(self, per_seq: torch.Tensor) -> torch.Tensor:
        """Broadcast per-sequence values ``[N]`` (or K rows ``[K, N]``) to their tokens: ``[T]`` (or ``[K, T]``).

        Whole blocks take their owner's value by one broadcast copy; only edge tokens are indexed one by one (an
        indexed copy of every token costs several elementwise passes on a CPU)."""
        rows = per_seq.new_empty(math.prod(per_seq.shape[:-1]), self.num_tokens)
        values = per_seq.reshape(rows.shape[0], self.num_seqs)
        owner = values.index_select(1, self._index("block_owner"))
        whole = rows.narrow(1, 0, owner.shape[1] * BLOCK).view(*owner.shape, BLOCK)  # blocks(rows), sized by the index
        whole.copy_(owner.unsqueeze(2).expand_as(whole))
        rows.index_copy_(1, self._index("edge_index"), values.index_select(1, self._index("edge_owner")))
        return rows.view(*per_seq.shape[:-1], self.num_tokens)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Cut a flat ``[T]`` tensor back into one tensor per sequence."""
        return list(torch.split(flat, self.sizes))


def concat_ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """The concatenation of ``arange(starts[i], starts[i] + sizes[i])`` over i, without a Python loop (host arrays)."""
    index = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    return index + np.arange(index.size)


@dataclass(frozen=True)
class TokenBatch:
    """Training-engine and rollout-engine log-probs of the sampled tokens, with the loss mask, flat.

    ``log_ratio`` is ``l = lp_train - lp_roll`` clamped to [-20, 20]. The loss mask must be 0/1 (slime's loss masks
    are), else :class:`InputError`. Log-probs are checked once per batch [ours]:

    - a log-prob in ``(0, LOG_PROB_TOLERANCE]`` is rounding (the log-softmax of a near-certain token) and becomes 0;
    - a trained token with a log-prob that is NaN/inf or below ``LOG_PROB_FLOOR`` (an overflowed ``-inf``), or above
      ``LOG_PROB_TOLERANCE`` (a probability above 1: the engine returned something else than a log-probability), is
      unusable: with policy ``"mask"`` it is removed from
      ``mask``, counted per sequence in ``nonfinite`` (both kinds) and ``impossible`` (the second kind only), and a
      :class:`RuntimeWarning` says so once; with ``"error"`` it raises :class:`InputError` naming the sample and the
      token. Untrained tokens are zeroed silently.

    Build it with :meth:`build`, :meth:`from_lists` or :meth:`from_padded`.
    """

    segments: Segments
    train_log_probs: torch.Tensor
    rollout_log_probs: torch.Tensor
    mask: torch.Tensor
    log_ratio: torch.Tensor
    nonfinite: torch.Tensor
    impossible: torch.Tensor
    dropped: bool = False
    """Whether this shard's guard dropped a trained token."""
    watched: tuple[float, ...] = ()
    """The values of ``watch`` (see :meth:`build`)."""

    @classmethod
    def build(
        cls,
        segments: Segments,
        train_log_probs: torch.Tensor,
        rollout_log_probs: torch.Tensor,
        mask: torch.Tensor,
        nonfinite: NonFinitePolicy = "mask",
        watch: Callable[[torch.Tensor], Sequence[torch.Tensor]] | None = None,
    ) -> TokenBatch:
        """Validate flat ``[T]`` tensors against ``segments``, check the mask and guard unusable log-probs.

        The checks cost one host transfer (:func:`mismatch_ctrl.host.fetch`; one more on the rare path where a
        log-prob is unusable: NaN/inf or below ``LOG_PROB_FLOOR``, or above 0 by more than ``LOG_PROB_TOLERANCE``).
        ``watch(mask)``, given the float loss mask before the guard, returns 0-d tensors the caller needs on the
        host: they are read in that same transfer, into ``watched``."""
        for name, t in (("train_log_probs", train_log_probs), ("rollout_log_probs", rollout_log_probs), ("mask", mask)):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"{name} must be a tensor, got {type(t).__name__}")
            if t.dim() != 1 or t.numel() != segments.num_tokens:
                raise InputError(
                    f"{name} must be a flat tensor of {segments.num_tokens} tokens (the sum of the response lengths), "
                    f"got shape {tuple(t.shape)}"
                )
            if name != "mask" and not t.is_floating_point():
                raise InputError(f"{name} must hold floating-point log-probs, got dtype {t.dtype}: integer or boolean "
                                 "values are token ids or masks, not log-probs (check which list was passed)")
            if name == "mask" and t.is_complex():
                raise InputError(f"loss_masks must hold 0/1 values (bool, integer or floating point), got dtype "
                                 f"{t.dtype} (check which list was passed)")
        devices = {name: t.device for name, t in (("train_log_probs", train_log_probs),
                                                  ("rollout_log_probs", rollout_log_probs), ("mask", mask))}
        if len(set(devices.values())) > 1:
            raise InputError("the batch's tensors are on different devices ("
                             + ", ".join(f"{name} on {device}" for name, device in devices.items())
                             + "): put the log-probs and the loss masks on one device")
        train = train_log_probs.detach().float()
        rollout = rollout_log_probs.detach().float()
        raw_mask = mask.detach()
        mask = raw_mask.float()
        bad_per_seq = impossible_per_seq = train.new_zeros(segments.num_seqs)
        checks = []
        if segments.num_tokens:
            # One pass per tensor and one host transfer find every problem: a log-prob's minimum and maximum are NaN
            # if any value is, -inf / > 0 if any value is; slime's integer masks are 0/1 iff their minimum and
            # maximum are, a float mask iff m (m - 1) vanishes everywhere.
            checks = [*torch.aminmax(train), *torch.aminmax(rollout)]
            if raw_mask.is_floating_point():
                checks.append((mask * (mask - 1)).abs_().max())
            elif raw_mask.dtype != torch.bool:
                checks += list(torch.aminmax(raw_mask))
        watched = list(watch(mask)) if watch is not None else []
        values = host.fetch(*checks, *watched) if checks or watched else []
        dropped = False
        if checks:
            low_t, top_t, low_r, top_r, *mask_range = values[:len(checks)]
            if mask_range and (mask_range[0] != 0 if len(mask_range) == 1 else
                               mask_range[0] < 0 or mask_range[1] > 1):
                first = _first(((mask != 0) & (mask != 1)))
                (value,) = host.fetch(mask[first])
                _raise_at(segments, first, "loss mask value other than 0/1", f"loss_masks={value:g}",
                          "loss masks must be 0 or 1 (slime builds them from each sample's 0/1 loss_mask)")
            in_range = low_t >= LOG_PROB_FLOOR and low_r >= LOG_PROB_FLOOR  # False for NaN (aminmax spreads it)
            if not (in_range and max(top_t, top_r) <= 0):
                highest = torch.maximum(train, rollout)
                finite = (torch.minimum(train, rollout) >= LOG_PROB_FLOOR) & (highest < math.inf)
                impossible = finite & (highest > LOG_PROB_TOLERANCE)
                usable = finite & ~impossible
                trained = mask > 0
                bad, impossible = ~usable & trained, impossible & trained
                # every log-prob finite and above 0 by rounding at most: nothing is dropped, known without a read
                rounding = in_range and max(top_t, top_r) <= LOG_PROB_TOLERANCE
                dropped = not rounding and host.fetch(bad.any())[0] > 0
                if nonfinite == "error" and dropped:
                    first = _first(bad)
                    above, train_value, rollout_value = host.fetch(impossible[first], train[first], rollout[first])
                    kind = "impossible log-prob (above 0)" if above else "non-finite log-prob" if not \
                        (math.isfinite(train_value) and math.isfinite(rollout_value)) else \
                        "overflowed log-prob (below -1e30, an -inf)"
                    _raise_at(segments, first, kind,
                              f"train_log_probs={train_value}, rollout_log_probs={rollout_value}",
                              "set mismatch_ctrl.nonfinite: mask to drop such tokens from the loss and count them "
                              "instead")
                train = torch.where(usable, train.clamp(max=0.0), 0.0)
                rollout = torch.where(usable, rollout.clamp(max=0.0), 0.0)
                mask = torch.where(usable, mask, 0.0)
                counts = segments.sum(bad.float(), impossible.float())
                bad_per_seq, impossible_per_seq = counts[:, 0], counts[:, 1]
                if dropped:
                    warnings.warn(DROPPED_WARNING, RuntimeWarning, stacklevel=1)
        log_ratio = (train - rollout).clamp_(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        return cls(segments, train, rollout, mask, log_ratio, bad_per_seq, impossible_per_seq, dropped,
                   tuple(values[len(checks):]))

    @classmethod
    def from_lists(
        cls,
        train_log_probs: Sequence[torch.Tensor],
        rollout_log_probs: Sequence[torch.Tensor],
        loss_masks: Sequence[torch.Tensor],
        nonfinite: NonFinitePolicy = "mask",
        watch: Callable[[torch.Tensor], Sequence[torch.Tensor]] | None = None,
        device: torch.device | None = None,
    ) -> TokenBatch:
        """From slime's per-sample lists (one 1-D tensor per response, all three of equal length per sample, all on
        one device); ``watch`` as in :meth:`build`; ``device`` holds a batch without samples (default: the CPU), so
        it meets the caller's other tensors."""
        counts = {"train_log_probs": len(train_log_probs), "rollout_log_probs": len(rollout_log_probs),
                  "loss_masks": len(loss_masks)}
        if len(set(counts.values())) != 1:
            raise InputError(f"the per-sample lists have different numbers of samples: {counts}")
        for name, items in (("train_log_probs", train_log_probs), ("rollout_log_probs", rollout_log_probs),
                            ("loss_masks", loss_masks)):
            for i, t in enumerate(items):
                if not isinstance(t, torch.Tensor):
                    raise InputError(f"sample {i}: {name} must be a tensor, got {type(t).__name__}")
                if t.device != train_log_probs[0].device:
                    raise InputError(f"sample {i}: {name} is on {t.device} but train_log_probs of sample 0 is on "
                                     f"{train_log_probs[0].device}: put the log-probs and the loss masks on one "
                                     "device")
        sizes = [t.numel() for t in train_log_probs]
        for i, (n, r, m) in enumerate(zip(sizes, rollout_log_probs, loss_masks)):
            if r.numel() != n or m.numel() != n:
                raise InputError(
                    f"sample {i}: train_log_probs has {n} tokens but rollout_log_probs has {r.numel()} and loss_masks "
                    f"has {m.numel()}; both engines must score exactly the response tokens of the sample"
                )
        if not sizes:
            empty = torch.zeros(0, device=device)
            return cls.build(Segments([], device=device), empty, empty, empty, nonfinite, watch)
        device = train_log_probs[0].device
        return cls.build(
            Segments(sizes, device=device),
            flat_cat(train_log_probs),
            flat_cat(rollout_log_probs),
            flat_cat(loss_masks),
            nonfinite,
            watch,
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
                raise InputError(f"lengths must give {rows} values in [0, {width}], got {brief(sizes)}")
            keep = torch.arange(width, device=mask.device)[None, :] < \
                host.to_device(sizes, mask.device, torch.int64)[:, None]

        def flat(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(-1) if keep is None else t[keep]

        return cls.build(Segments(sizes, device=mask.device), flat(train_log_probs), flat(rollout_log_probs),
                         flat(mask), nonfinite)

    @property
    def num_seqs(self) -> int:
        return self.segments.num_seqs

    @property
    def nonfinite_tokens(self) -> int:
        """Trained tokens of this shard dropped by the guard (a log-prob NaN/inf or impossible; a host transfer)."""
        return int(host.fetch(self.nonfinite.sum())[0])

    @property
    def impossible_tokens(self) -> int:
        """Trained tokens of this shard dropped for a log-prob above ``LOG_PROB_TOLERANCE`` (a host transfer)."""
        return int(host.fetch(self.impossible.sum())[0])


def flat_cat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors flattened and concatenated (no reshape op for the 1-D ones slime passes: one op per call)."""
    return torch.cat([t if t.dim() == 1 else t.reshape(-1) for t in tensors])


def _first(flags: torch.Tensor) -> int:
    """The first position where the device ``flags`` are true (one host transfer; for error messages)."""
    return int(host.fetch(flags.float().argmax())[0])


def _raise_at(segments: Segments, token: int, what: str, values: str, fix: str) -> None:
    """:class:`InputError` naming the sample and the response token of flat position ``token``."""
    sample = int(np.searchsorted(np.cumsum(segments.sizes), token, side="right"))
    raise InputError(f"sample {sample}: {what} at response token {token - sum(segments.sizes[:sample])} ({values}); "
                     f"{fix}")

