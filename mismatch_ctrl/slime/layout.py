"""slime's per-sample lists <-> the core's flat CP-local batch, with the length checks users need to debug."""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from .. import host
from ..batch import NonFinitePolicy, TokenBatch, flat_cat
from ..errors import InputError
from . import cp
from ._groups import Topology


class LocalLayout:
    """The CP-local tokens of each sample: their count and where they sit in the concatenated full responses."""

    def __init__(self, total_lengths: Sequence[int], response_lengths: Sequence[int], topo: Topology) -> None:
        self.response_lengths = [int(n) for n in response_lengths]
        self.cp_size = topo.cp_size
        if topo.cp_size == 1:
            self.sizes, self.index = list(self.response_lengths), None
        else:
            self.sizes, self.index = cp.local_index(total_lengths, response_lengths, topo.cp_rank, topo.cp_size)
        self._device_index: dict[torch.device, torch.Tensor] = {}

    @property
    def num_tokens(self) -> int:
        """This rank's response tokens over all samples (CP-local)."""
        return sum(self.sizes)

    def _index_on(self, device: torch.device) -> torch.Tensor:
        """The CP-local token index on ``device`` (uploaded once, without a host synchronisation)."""
        if device not in self._device_index:
            self._device_index[device] = host.to_device(self.index, device, torch.int64)
        return self._device_index[device]

    def local_masks(self, loss_masks: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Full-length loss masks -> the CP-local slices, in the order of the CP-local log-probs."""
        if len(loss_masks) != len(self.response_lengths):
            raise InputError(f"loss_masks has {len(loss_masks)} samples but response_lengths has "
                             f"{len(self.response_lengths)}")
        for i, (mask, n) in enumerate(zip(loss_masks, self.response_lengths)):
            if mask.numel() != n:
                raise InputError(f"sample {i}: loss_masks has {mask.numel()} tokens but response_lengths[{i}] = {n}; "
                                 "loss masks must cover the full response")
        if self.index is None:
            return list(loss_masks)
        flat = flat_cat(loss_masks) if loss_masks else torch.zeros(0)
        return list(torch.split(flat[self._index_on(flat.device)], self.sizes))

    def full_masks(self, loss_masks: Sequence[torch.Tensor], local_keep: torch.Tensor) -> list[torch.Tensor]:
        """Full-length masks with this rank's tokens replaced by ``local_keep``; other ranks' tokens are left as
        they were (slime slices the returned masks back to each rank's own tokens)."""
        if not loss_masks:
            return []
        flat = flat_cat(loss_masks).clone()
        keep = local_keep.to(device=flat.device, dtype=flat.dtype)
        if self.index is None:
            flat = keep
        else:
            flat[self._index_on(flat.device)] = keep
        return list(torch.split(flat, self.response_lengths))

    def check_local(self, name: str, tensors: Sequence[torch.Tensor]) -> None:
        """Every CP-local per-sample tensor has this rank's number of tokens of that sample."""
        if len(tensors) != len(self.sizes):
            raise InputError(f"{name} has {len(tensors)} samples but response_lengths has {len(self.sizes)}")
        for i, (t, n) in enumerate(zip(tensors, self.sizes)):
            if t.numel() != n:
                where = "" if self.cp_size == 1 else \
                    f" (this context-parallel rank's share of {self.response_lengths[i]})"
                raise InputError(f"sample {i}: {name} has {t.numel()} tokens but the response has {n}{where}; "
                                 "the trainer and the rollout engine must score exactly the response tokens")

    def batch(self, train_log_probs: Sequence[torch.Tensor], rollout_log_probs: Sequence[torch.Tensor],
              loss_masks: Sequence[torch.Tensor], nonfinite: NonFinitePolicy,
              watch: Callable[[torch.Tensor], Sequence[torch.Tensor]] | None = None,
              device: torch.device | None = None) -> TokenBatch:
        """The core batch of CP-local log-probs and masks (lengths checked per sample, naming the sample); ``watch``
        and ``device`` (of a batch without samples) as in :meth:`~mismatch_ctrl.batch.TokenBatch.from_lists`."""
        self.check_local("log_probs (training engine)", train_log_probs)
        self.check_local("rollout_log_probs", rollout_log_probs)
        return TokenBatch.from_lists(train_log_probs, rollout_log_probs, self.local_masks(loss_masks), nonfinite,
                                     watch, device)
