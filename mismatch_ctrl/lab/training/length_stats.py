"""The mismatch of one rollout by response length: additive sums per length, so that a run's records answer "does a
sequence's discrepancy grow with its length?" (``results.surge``).

For sequence i with n_i response tokens, trainer log-probs ``p_t`` (the fp32 recompute) and engine log-probs ``q_t``:

    c_i = (1 / n_i) sum_t |exp(p_t) - exp(q_t)|    its share of C_bar (ALGORITHMS.md section 2, DC-GRPO)
    m_i = max_t |p_t - q_t|                         its largest |log ratio|
    s_i = sum_t (p_t - q_t)                         the sequence log-ratio log pi(y) / mu(y)

grouped by n_i: per distinct length its count and the sums of c, m, s and |s|. Paper 002 ("Beyond Precision",
section 3.3) bounds the gradient shift by a term quadratic in the horizon; ``s`` is the quantity whose spread that
argument says grows with the length. Sequences with a non-finite log-prob (a blown-up policy) are left out.
"""

from __future__ import annotations

import torch
from torch import Tensor

BUCKET_KEYS = ("length", "count", "discrepancy_sum", "max_abs_log_ratio_sum", "log_ratio_sum", "abs_log_ratio_sum")
"""The lists of one rollout's ``length_buckets`` record, aligned: one entry per distinct response length."""


def length_buckets(train_log_probs: Tensor, rollout_log_probs: Tensor, mask: Tensor) -> dict[str, list[float]]:
    """Per distinct response length of a rollout, the count of its sequences and the sums of their ``c``, ``m``,
    ``s`` and ``|s|`` (module docstring). Inputs ``[N, R]``: log-probs of the trainer and the engine, and the
    response mask (True on generated tokens); lengths are the mask's row sums (rows of length 0 are left out)."""
    if not train_log_probs.shape == rollout_log_probs.shape == mask.shape:
        raise ValueError(f"length_buckets: log-probs and mask must share one shape [N, R], got "
                         f"{tuple(train_log_probs.shape)}, {tuple(rollout_log_probs.shape)}, {tuple(mask.shape)}")
    mask = mask.bool()
    lengths = mask.sum(dim=1)
    diff = (train_log_probs - rollout_log_probs).masked_fill(~mask, 0.0)
    prob_diff = (train_log_probs.exp() - rollout_log_probs.exp()).abs().masked_fill(~mask, 0.0)
    keep = torch.isfinite(diff).all(dim=1) & torch.isfinite(prob_diff).all(dim=1) & (lengths > 0)
    columns = torch.stack([
        torch.ones_like(diff[:, 0]),
        prob_diff.sum(dim=1) / lengths.clamp_min(1),
        diff.abs().amax(dim=1) if diff.shape[1] else torch.zeros_like(diff[:, 0]),
        diff.sum(dim=1),
        diff.sum(dim=1).abs(),
    ], dim=1)[keep].double()
    values, index = lengths[keep].unique(return_inverse=True)
    sums = torch.zeros(values.numel(), columns.shape[1], dtype=torch.float64, device=columns.device)
    sums.index_add_(0, index, columns)
    out: dict[str, list[float]] = {"length": [float(v) for v in values.tolist()]}
    for j, key in enumerate(BUCKET_KEYS[1:]):
        out[key] = sums[:, j].tolist()
    return out
