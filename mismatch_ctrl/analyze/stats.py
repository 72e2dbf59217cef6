"""What one rollout's dump says about the discrepancy: the section-6 metrics, the distribution of per-token
``|p_train - p_rollout|``, response lengths, truncation, and the rejections of every IS/RS preset (ALGORITHMS.md
sections 1, 3 and 6), all computed on the flat :class:`~mismatch_ctrl.batch.TokenBatch` (no loops over tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..batch import NonFinitePolicy, TokenBatch
from ..correction import apply_correction
from ..metrics import METRIC_COLUMNS, mismatch_metrics
from ..presets import PRESETS
from ..seqstats import SeqStats
from ..signals import token_signal
from ..sketch import histogram_quantiles, log_histogram
from .dumps import RolloutDump

PROB_DIFF_QUANTILES = (0.5, 0.9, 0.99, 0.999)
"""Quantiles of per-token |p_train - p_rollout| over the trained tokens (log-histogram, ~6% relative resolution)."""
TAIL_THRESHOLDS = (0.01, 0.1, 0.5)
"""Tail mass: the fraction of trained tokens with |p_train - p_rollout| above each threshold (exact)."""
PRESET_NAMES = tuple(name for name in PRESETS if name != "none")


def quantile_key(q: float) -> str:
    """``0.5 -> "p50"``, ``0.999 -> "p99.9"``."""
    return "p" + f"{100 * q:.10g}"


@dataclass
class RolloutStats:
    """One rollout's JSON-able ``row`` and its ``|p_train - p_rollout|`` histogram (summed over the run)."""

    row: dict[str, Any]
    histogram: torch.Tensor | None


def token_batch(dump: RolloutDump, nonfinite: NonFinitePolicy = "mask") -> TokenBatch | None:
    """Both engines' log-probs of the rollout as one flat batch (None without the training recompute)."""
    if dump.train_log_probs is None or dump.rollout_log_probs is None:
        return None
    return TokenBatch.from_lists(dump.train_log_probs, dump.rollout_log_probs, dump.loss_masks, nonfinite)


def one_engine_batch(dump: RolloutDump, nonfinite: NonFinitePolicy = "mask") -> TokenBatch | None:
    """The log-probs of the one engine a rollout has (the other's are missing) as a batch whose two sides are equal:
    the checks of the two-engine batch (loss masks 0/1, unusable log-probs dropped and counted, or refused with
    ``nonfinite: error``); None unless exactly one engine's log-probs are there."""
    present = [lp for lp in (dump.train_log_probs, dump.rollout_log_probs) if lp is not None]
    if len(present) != 1:
        return None
    return TokenBatch.from_lists(present[0], present[0], dump.loss_masks, nonfinite)


def rollout_stats(dump: RolloutDump, batch: TokenBatch | None, max_response_len: int | None,
                  one_engine: TokenBatch | None = None) -> RolloutStats:
    """Statistics of one rollout; the discrepancy parts are None when ``batch`` is None (no training log-probs); with
    only one engine's log-probs (``one_engine``, see :func:`one_engine_batch`) that engine's log-ppl."""
    lengths = torch.tensor(dump.response_lengths, dtype=torch.float64)
    row: dict[str, Any] = {
        "rollout_id": dump.rollout_id,
        "samples": dump.num_samples,
        "train_log_probs": batch is not None,
        "rollout_log_probs": dump.rollout_log_probs is not None,
        "mean_response_length": float(lengths.mean()) if lengths.numel() else 0.0,
        "max_response_length_seen": int(lengths.max()) if lengths.numel() else 0,
        "truncation_rate": None,
        "truncation_source": None,
        "reward_mean": _finite_mean(dump.raw_rewards),
    }
    if dump.truncated is not None:
        row.update(truncation_rate=sum(dump.truncated) / max(len(dump.truncated), 1), truncation_source="dump")
    elif max_response_len is not None:
        row.update(truncation_rate=float((lengths >= max_response_len).double().mean()) if lengths.numel() else 0.0,
                   truncation_source="max_response_len")
    histogram = None
    if batch is not None:
        row.update(mismatch_metrics(SeqStats.build(batch, METRIC_COLUMNS)).summarize())
        prob_diff = token_signal(batch, "prob_diff")
        trained = batch.mask > 0
        values = prob_diff[trained]
        histogram = log_histogram(values)
        row["prob_diff_quantiles"] = dict(zip(map(quantile_key, PROB_DIFF_QUANTILES),
                                              histogram_quantiles(histogram, list(PROB_DIFF_QUANTILES))))
        count = max(int(trained.sum()), 1)
        row["prob_diff_tail"] = {f">{t:g}": int((values > t).sum()) / count for t in TAIL_THRESHOLDS}
        row["rejection"] = preset_rejections(batch, row["trained_tokens"])
    elif one_engine is not None:  # both sides are that engine's: its log-ppl is the metric's
        name = "training_log_ppl" if dump.train_log_probs is not None else "rollout_log_ppl"
        row[name] = mismatch_metrics(SeqStats.build(one_engine, METRIC_COLUMNS)).summarize()[name]
    return RolloutStats(row, histogram)


def _finite_mean(values: list[float] | None) -> float | None:
    """The mean of the finite ``values`` (a NaN/inf reward is counted in the report, not averaged)."""
    finite = [v for v in values or () if math.isfinite(v)]
    return sum(finite) / len(finite) if finite else None


def preset_rejections(batch: TokenBatch, trained_tokens: float) -> dict[str, dict[str, float | None]]:
    """Per preset: the fraction of trained tokens and of sequences (one without trained tokens counts as kept) it
    rejects, and the fraction its IS weight truncates (``is_clip_high_fraction``, None for presets without an IS
    stage)."""
    out = {}
    for name in PRESET_NAMES:
        summary = apply_correction(PRESETS[name], batch).metrics.summary
        out[name] = {"tokens": summary["rejected_tokens"] / trained_tokens if trained_tokens > 0 else 0.0,
                     "sequences": summary["rejected_seq_fraction"],
                     "clipped": summary.get("is_clip_high_fraction")}
    return out
