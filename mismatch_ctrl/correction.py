"""Rollout correction: importance-sampling weights and rejection (ALGORITHMS.md section 3; 003 Geo-MIS/Geo-RS).

All ratios are ``rho = pi_train / mu_rollout``. The log-weight of a token depends on the level:

- ``token``: ``l[t]``
- ``sequence``: ``sum_t m l`` broadcast to the sequence
- ``geometric``: ``sum_t m l / max(sum_t m, 1)`` broadcast (length-normalised: immune to the "length trap")

Two stages, which may be combined (e.g. a Geo-RS filter plus token TIS weights):

- **IS** (``is_*``): ``truncate`` ``w = min(rho, C_hi)`` (TIS); ``clip`` ``w = clamp(rho, C_lo, C_hi)``;
  ``mask`` ``w = rho`` and tokens/sequences with ``rho`` outside ``[C_lo, C_hi]`` are rejected (MIS, IcePop).
- **RS** (``rs_*``): reject tokens/sequences with ``rho`` outside ``[rs_low, rs_high]``; ``rs_k3_max`` rejects a
  sequence whose mean K3 exceeds it; ``veto`` rejects a sequence with any token ``rho < veto``.

``batch_normalize`` rescales kept weights to mean 1 over the micro-batch (token level: over tokens; sequence levels:
over sequences) [ours: the batch is what one call sees]. Rejected tokens get weight 0 and leave the modified mask;
the caller keeps them in the loss denominator (slime's convention), so an all-rejected batch contributes zero loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from .batch import LOG_RATIO_BOUND, TokenBatch
from .dist import Reducer, local_reduce
from .metrics import SeqMetrics
from .signals import k3

Level = Literal["token", "sequence", "geometric"]
Mode = Literal["truncate", "clip", "mask"]
LEVELS: tuple[str, ...] = get_args(Level)
MODES: tuple[str, ...] = get_args(Mode)


@dataclass(frozen=True)
class CorrectionSpec:
    """Explicit IS/RS settings; a preset (see :mod:`mismatch_ctrl.presets`) expands to one.

    ``is_low`` defaults to ``1 / is_high`` in ``clip`` and ``mask`` modes (slime's mis.yaml convention).
    """

    is_level: Level | None = None
    is_mode: Mode = "truncate"
    is_low: float | None = None
    is_high: float = 2.0
    rs_level: Level | None = None
    rs_low: float | None = None
    rs_high: float | None = None
    rs_k3_max: float | None = None
    veto: float | None = None
    batch_normalize: bool = False

    @property
    def active(self) -> bool:
        """Whether the spec changes anything (an IS or RS stage, a veto or a K3 rejection)."""
        return self.is_level is not None or self.rs_level is not None or self.rs_k3_max is not None or \
            self.veto is not None

    @property
    def is_bounds(self) -> tuple[float, float]:
        """``(C_lo, C_hi)`` of the IS stage, with ``is_low``'s default filled in."""
        low = self.is_low if self.is_low is not None else (1.0 / self.is_high if self.is_mode != "truncate" else 0.0)
        return low, self.is_high

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        out = []
        low, high = self.is_bounds
        if self.is_level is not None and not 0 <= low < high:
            out.append(("is_low", f"need 0 <= is_low < is_high, got {low}, {high}"))
        if self.rs_level is not None and self.rs_low is None and self.rs_high is None:
            out.append(("rs_level", "set rs_low and/or rs_high for the rejection band"))
        if self.rs_low is not None and self.rs_high is not None and not self.rs_low < self.rs_high:
            out.append(("rs_low", f"need rs_low < rs_high, got {self.rs_low}, {self.rs_high}"))
        if self.veto is not None and not 0 < self.veto < 1:
            out.append(("veto", "must be in (0, 1) or null (a ratio below which a token vetoes its sequence, e.g. "
                                f"1.0e-4), got {self.veto}"))
        if self.rs_k3_max is not None and not self.rs_k3_max > 0:
            out.append(("rs_k3_max", f"must be > 0 or null, got {self.rs_k3_max}"))
        return out


@dataclass(frozen=True)
class Correction:
    """Result of :func:`apply_correction`: per-token ``weights`` (detached, 0 unless kept), the modified loss ``mask``
    (original mask without rejected tokens) and per-sequence ``metrics``."""

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: SeqMetrics


def _log(x: float) -> float:
    return math.log(x) if x > 0 else -math.inf


def _outside(log_rho: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    """``rho`` outside ``[low, high]``, compared in log space (``rho = exp(log_rho)``)."""
    out = torch.zeros_like(log_rho, dtype=torch.bool)
    if low is not None:
        out |= log_rho < _log(low)
    if high is not None:
        out |= log_rho > _log(high)
    return out


def apply_correction(spec: CorrectionSpec, batch: TokenBatch, seq_reduce: Reducer = local_reduce) -> Correction:
    """IS weights, rejection mask and metrics of ``spec`` on ``batch``; CP shards combine with ``seq_reduce``.

    The loss mask is 0/1 (slime's loss masks), which lets masked products stand in for logical ands below.
    Comparisons are written as 0/1 floats into tensors whose sums are already taken (``out=``): no bool
    intermediates and few fresh token-sized tensors, which dominate the cost on CPU.
    """
    seg, m, l = batch.segments, batch.mask, batch.log_ratio
    seq_level = bool({spec.is_level, spec.rs_level} & {"sequence", "geometric"})
    lm = l * m if seq_level or spec.veto is not None else None
    parts = [seg.sum(m)]
    if lm is not None:
        parts.append(seg.sum(lm))
    if spec.veto is not None:  # veto < 1, so a masked token (lm = 0) is never catastrophic; lm is reused
        parts.append(seg.sum(torch.lt(lm, math.log(spec.veto), out=lm)))
    if spec.rs_k3_max is not None:
        parts.append(seg.sum(k3(l).mul_(m)))
    sums = seq_reduce(torch.cat(parts, dim=1), "sum")
    count = sums[:, 0]
    denom = count.clamp_min(1.0)
    has_tokens = count > 0
    seq_log: dict[str, torch.Tensor] = {}
    if lm is not None:
        seq_log["sequence"] = sums[:, 1].clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        seq_log["geometric"] = sums[:, 1] / denom

    rejected_seq = torch.zeros_like(has_tokens)
    metrics = SeqMetrics(counts=count)
    if spec.veto is not None:
        catastrophic = sums[:, 2]
        rejected_seq |= catastrophic > 0
        metrics.mean["veto_seq_fraction"] = (catastrophic > 0).float()
        metrics.mean["catastrophic_token_fraction"] = catastrophic / denom
    if spec.rs_k3_max is not None:
        k3_rejected = sums[:, -1] / denom > spec.rs_k3_max
        rejected_seq |= k3_rejected
        metrics.mean["k3_rejected_seq_fraction"] = k3_rejected.float()

    # Rejection by ratio bands: sequence-level decisions per sequence, token-level decisions per token.
    is_low, is_high = spec.is_bounds
    bands = []
    if spec.rs_level is not None:
        bands.append((spec.rs_level, spec.rs_low, spec.rs_high))
    if spec.is_level is not None and spec.is_mode == "mask":
        bands.append((spec.is_level, is_low, is_high))
    rejected_tok = None
    for level, low, high in bands:
        if level == "token":
            out = _outside(l, low, high)
            rejected_tok = out if rejected_tok is None else rejected_tok | out
        else:
            out = _outside(seq_log[level], low, high)
            rejected_seq |= out
            key = f"{level}_band_rejected_seq_fraction"  # IS and RS bands at one level share it: their union
            metrics.mean[key] = torch.maximum(metrics.mean[key], out.float()) if key in metrics.mean else out.float()

    keep = seg.expand((~rejected_seq).to(m.dtype)).mul_(m)
    if rejected_tok is not None:
        keep.masked_fill_(rejected_tok, 0.0)

    # IS weights (computed in place on fresh tensors).
    token_is = spec.is_level == "token"
    ratio_parts = []
    if spec.is_level is None:
        weights = keep
    elif token_is:
        rho = torch.exp(l)
        masked_rho = rho * m
        ratio_parts.append(seg.sum(masked_rho))
        if spec.is_mode != "mask":  # masked_rho is reused for the indicator
            ratio_parts.append(seg.sum(torch.gt(masked_rho, is_high, out=masked_rho)))
        if spec.is_mode == "clip":
            ratio_parts.append(seg.sum(torch.lt(rho, is_low, out=masked_rho).mul_(m)))
        weights = _shape_weights_(spec.is_mode, rho, is_low, is_high).mul_(keep)
    else:
        seq_rho = torch.exp(seq_log[spec.is_level])
        seq_weights = _shape_weights_(spec.is_mode, seq_rho.clone(), is_low, is_high)
        weights = seg.expand(seq_weights).mul_(keep)
        metrics.mean["is_ratio_mean"] = seq_rho
        _bound_metrics(metrics, spec.is_mode, seq_rho.gt(is_high).float(), seq_rho.lt(is_low).float())
    sums2 = seq_reduce(torch.cat([seg.sum(keep, weights), *ratio_parts], dim=1), "sum")
    kept, weight_sum = sums2[:, 0], sums2[:, 1]
    if token_is:
        metrics.mean["is_ratio_mean"] = sums2[:, 2] / denom
        above = sums2[:, 3] / denom if spec.is_mode != "mask" else None
        below = sums2[:, 4] / denom if spec.is_mode == "clip" else None
        _bound_metrics(metrics, spec.is_mode, above, below)

    if spec.batch_normalize and spec.is_level is not None:
        if token_is:
            total_kept, total_weight = kept.sum(), weight_sum.sum()
        else:
            kept_seqs = (kept > 0).float()
            total_kept, total_weight = kept_seqs.sum(), (seq_weights * kept_seqs).sum()
        if float(total_kept) > 0 and float(total_weight) > 0:
            scale = total_kept / total_weight
            weights = weights * scale
            weight_sum = weight_sum * scale

    metrics.mean["is_weight_mean"] = weight_sum / denom
    metrics.mean["rejected_token_fraction"] = 1.0 - kept / denom
    metrics.mean["rejected_seq_fraction"] = (rejected_seq & has_tokens).float()
    metrics.total["rejected_tokens"] = count - kept
    return Correction(weights=weights.detach(), mask=keep.detach(), metrics=metrics)


def _shape_weights_(mode: str, rho: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """IS weights from ratios, in place: truncate ``min(rho, high)``, clip ``clamp(rho, low, high)``, mask ``rho``."""
    if mode == "truncate":
        return rho.clamp_(max=high)
    if mode == "clip":
        return rho.clamp_(min=low, max=high)
    return rho


def _bound_metrics(metrics: SeqMetrics, mode: str, above: torch.Tensor | None, below: torch.Tensor | None) -> None:
    """Fractions of ratios above ``is_high`` (truncate, clip) and below ``is_low`` (clip); others may be None."""
    if mode in ("truncate", "clip"):
        metrics.mean["is_clip_high_fraction"] = above
    if mode == "clip":
        metrics.mean["is_clip_low_fraction"] = below
