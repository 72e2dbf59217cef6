"""Which response tokens of each sample a context-parallel rank holds (slime's zigzag layout, ``qkv_format=thd``).

Contract (slime ``backends/megatron_utils/cp_utils.py``, ``get_logits_and_tokens_offset_with_cp`` and
``slice_log_prob_with_cp``): a sequence of ``total`` tokens is cut into ``2 C`` chunks of ``ceil(total / 2C)``;
rank ``r`` holds chunks ``r`` and ``2C - 1 - r``. A response token at response position ``j`` is predicted by the
logit at sequence position ``prompt - 1 + j``, so rank ``r`` holds the response positions whose logit position lies
in one of its two chunks, in that order (chunk ``r`` first). Log-probs arrive CP-local in this order; loss masks
arrive full length.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..batch import concat_ranges


def local_ranges(total_lengths: torch.Tensor, response_lengths: torch.Tensor, cp_rank: int,
                 cp_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Start and end response positions ``[N, 2]`` of the two pieces rank ``cp_rank`` holds (end <= start: empty)."""
    total = total_lengths.long()
    prompt = total - response_lengths.long()
    chunk = (total + 2 * cp_size - 1) // (2 * cp_size)
    first_chunk = torch.tensor([cp_rank, 2 * cp_size - 1 - cp_rank], device=total.device)
    chunk_start = chunk[:, None] * first_chunk[None, :]
    start = torch.maximum(chunk_start, (prompt - 1)[:, None])
    end = torch.minimum(chunk_start + chunk[:, None], (total - 1)[:, None])
    return start - (prompt - 1)[:, None], end - (prompt - 1)[:, None]


def local_index(total_lengths: Sequence[int], response_lengths: Sequence[int], cp_rank: int,
                cp_size: int) -> tuple[list[int], torch.Tensor]:
    """CP-local token count per sample and the index of each local token in the concatenated full responses."""
    total = torch.tensor(list(total_lengths), dtype=torch.long)
    response = torch.tensor(list(response_lengths), dtype=torch.long)
    start, end = local_ranges(total, response, cp_rank, cp_size)
    sizes = (end - start).clamp_min(0)
    offsets = torch.cumsum(response, 0) - response
    index = concat_ranges((start + offsets[:, None]).reshape(-1), sizes.reshape(-1))
    return sizes.sum(dim=1).tolist(), index
