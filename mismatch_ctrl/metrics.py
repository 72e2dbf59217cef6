"""Mismatch metrics with slime/verl names (ALGORITHMS.md section 6), built from additive per-sequence pieces.

Every metric is first a per-sequence value. A *mean* metric is then averaged over the sequences that have trained
tokens (slime's ``sum_of_sample_mean`` convention: per-sequence mean, then mean over sequences); a *max* metric takes
the maximum; a *total* metric sums. Broadcasting a mean metric's per-sequence value to that sequence's tokens gives a
token-shaped tensor that slime's loss reducer averages back to exactly the same number, both with and without
``--calculate-per-token-loss`` (token-weighted mean of per-sequence means = token mean).

Per sequence i, with masked means ``E_i[x] = sum_t m x / max(sum_t m, 1)``:

- ``training_log_ppl = -E_i[lp_train]``, ``rollout_log_ppl = -E_i[lp_roll]``
- ``log_ppl_diff = E_i[lp_roll] - E_i[lp_train]`` (= ``kl``, the direct estimator ``E[lp_roll - lp_train]``),
  ``log_ppl_abs_diff = |log_ppl_diff|``
- ``k3_kl = E_i[rho - 1 - l]``, ``logprob_abs_diff = E_i[|l|]``
- ``prob_diff_mean = E_i[|p_train - p_roll|]`` (the DC-GRPO signal), ``prob_diff_max = max_t m |p_train - p_roll|``
- totals: ``trained_tokens``, ``nonfinite_tokens`` (log-probs dropped by the non-finite guard).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .batch import Segments, TokenBatch
from .dist import Reducer, local_reduce
from .signals import k3, token_signal


@dataclass
class SeqMetrics:
    """Per-sequence metric values (each ``[N]``) grouped by how they aggregate over a batch."""

    counts: torch.Tensor
    mean: dict[str, torch.Tensor] = field(default_factory=dict)
    max: dict[str, torch.Tensor] = field(default_factory=dict)
    total: dict[str, torch.Tensor] = field(default_factory=dict)

    def update(self, other: SeqMetrics) -> SeqMetrics:
        """Add the metrics of ``other`` (same sequences) to this set; returns self."""
        self.mean.update(other.mean)
        self.max.update(other.max)
        self.total.update(other.total)
        return self

    def token_shaped(self, segments: Segments) -> dict[str, torch.Tensor]:
        """Mean metrics broadcast to tokens (``[T]`` each): the form slime's TIS hook must return."""
        if not self.mean:
            return {}
        stacked = segments.expand(torch.stack(list(self.mean.values()), dim=1))
        return {name: stacked[:, k] for k, name in enumerate(self.mean)}

    def summarize(self, batch_reduce: Reducer = local_reduce) -> dict[str, float]:
        """Batch values: mean over sequences with trained tokens, max, and totals, combined across ranks."""
        valid = (self.counts > 0).to(self.counts.dtype)
        sums = [valid.sum()] + [(v * valid).sum() for v in self.mean.values()] + [v.sum() for v in self.total.values()]
        sums = batch_reduce(torch.stack(sums).double(), "sum").tolist()
        n_valid, rest = sums[0], sums[1:]
        out = {name: rest[k] / n_valid if n_valid > 0 else 0.0 for k, name in enumerate(self.mean)}
        out.update({name: rest[len(self.mean) + k] for k, name in enumerate(self.total)})
        out["valid_sequences"] = n_valid
        if self.max:
            maxes = torch.stack([torch.where(valid > 0, v, 0.0).max() if v.numel() else v.new_zeros(())
                                 for v in self.max.values()])
            out.update(zip(self.max, batch_reduce(maxes, "max").tolist()))
        return out


def mismatch_metrics(batch: TokenBatch, seq_reduce: Reducer = local_reduce) -> SeqMetrics:
    """The section-6 mismatch metrics of ``batch``, per sequence (shards combined with ``seq_reduce``)."""
    m = batch.mask
    seg = batch.segments
    l = batch.log_ratio
    prob_diff = token_signal(batch, "prob_diff").mul_(m)
    buffer = batch.train_log_probs * m  # reused for each column once its sums are taken
    parts = [seg.sum(m, buffer)]
    parts.append(seg.sum(torch.mul(batch.rollout_log_probs, m, out=buffer)))
    parts.append(seg.sum(k3(l, out=buffer).mul_(m), prob_diff))
    parts.append(seg.sum(torch.abs(l, out=buffer).mul_(m)))
    sums = seq_reduce(torch.cat([*parts, batch.nonfinite.unsqueeze(1)], dim=1), "sum")
    prob_diff_max = seq_reduce(seg.max(prob_diff), "max")
    counts = sums[:, 0]
    means = sums[:, 1:6] / counts.clamp_min(1.0).unsqueeze(1)
    log_ppl_diff = means[:, 1] - means[:, 0]
    return SeqMetrics(
        counts=counts,
        mean={
            "training_log_ppl": -means[:, 0],
            "rollout_log_ppl": -means[:, 1],
            "log_ppl_diff": log_ppl_diff,
            "log_ppl_abs_diff": log_ppl_diff.abs(),
            "kl": log_ppl_diff,
            "k3_kl": means[:, 2],
            "prob_diff_mean": means[:, 3],
            "logprob_abs_diff": means[:, 4],
        },
        max={"prob_diff_max": prob_diff_max},
        total={"trained_tokens": counts, "nonfinite_tokens": sums[:, 6]},
    )
