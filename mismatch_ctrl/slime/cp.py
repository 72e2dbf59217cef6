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

import numpy as np

from ..batch import concat_ranges


def local_ranges(total_lengths: np.ndarray, response_lengths: np.ndarray, cp_rank: int,
                 cp_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Start and end response positions ``[N, 2]`` of the two pieces rank ``cp_rank`` holds (end <= start: empty)."""
    prompt = total_lengths - response_lengths
    chunk = (total_lengths + 2 * cp_size - 1) // (2 * cp_size)
    chunk_start = chunk[:, None] * np.array([cp_rank, 2 * cp_size - 1 - cp_rank])[None, :]
    start = np.maximum(chunk_start, (prompt - 1)[:, None])
    end = np.minimum(chunk_start + chunk[:, None], (total_lengths - 1)[:, None])
    return start - (prompt - 1)[:, None], end - (prompt - 1)[:, None]


def local_index(total_lengths: Sequence[int], response_lengths: Sequence[int], cp_rank: int,
                cp_size: int) -> tuple[list[int], np.ndarray]:
    """CP-local token count per sample and the index of each local token in the concatenated full responses
    (computed on the host from the Python lengths)."""
    total = np.asarray(total_lengths, dtype=np.int64).reshape(-1)
    response = np.asarray(response_lengths, dtype=np.int64).reshape(-1)
    start, end = local_ranges(total, response, cp_rank, cp_size)
    sizes = np.maximum(end - start, 0)
    offsets = np.cumsum(response) - response
    index = concat_ranges((start + offsets[:, None]).reshape(-1), sizes.reshape(-1))
    return sizes.sum(axis=1).tolist(), index
