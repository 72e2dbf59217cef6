"""A correction's decisions, weights and diagnostics (:mod:`mismatch_ctrl.correction`): per sequence from the statistics
table, per batch after its one reduction, then the token weights and the modified mask."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from ..batch import LOG_RATIO_BOUND, TokenBatch
from ..dist import LOCAL, Reducers
from ..metrics import SeqMetrics
from ..seqstats import BatchTotals, Reduced, SeqStats, reduce_batch
from .columns import Stages, correction_columns, log_bound
from .spec import CorrectionSpec

NORMALIZE_MIN_MEAN = 1e-8
"""Batch normalisation leaves the weights alone when their mean is at most this (slime's ``mis.py`` threshold)."""

@dataclass(frozen=True)
class Correction:
    """Result of a correction: per-token ``weights`` (detached, 0 unless kept), the modified loss ``mask`` (original
    mask without rejected tokens) and the per-sequence ``metrics`` with their batch ``summary`` (diagnostics
    included)."""

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: SeqMetrics

class CorrectionPlan:
    """The per-sequence decisions and metrics of ``spec`` on a batch's statistics (which must include
    :func:`correction_columns`); after the batch reduction (``add_to`` / ``read``, see
    :func:`~mismatch_ctrl.seqstats.reduce_batch`) :meth:`finish` gives the token weights and mask.

    A token's final weight is ``w[t] = w_tok[t] f_i s``: the token part ``w_tok`` (a column: the token IS weight at
    tokens no token-level band rejects, else 0), the sequence factor ``f_i`` (0 for a rejected sequence, the
    sequence-level IS weight if any, else 1) and the batch-normalisation scale ``s``. Batch values in
    ``metrics.summary``, global over the data-parallel batch: the means, ``rejected_tokens``, and

    - ``is_ess = (sum w)^2 / (n sum w^2)`` over the n trained tokens, ``chi2_token = n sum w^2 / (sum w)^2 - 1``
      (``mean(w^2) - 1`` with ``w`` normalised to mean 1; ``= 1 / is_ess - 1``);
    - ``is_ess_seq``, ``chi2_seq``: the same over the sequences with trained tokens, each weighing its mean token
      weight ``W_i = sum_t w / count_i`` (its sequence-level IS weight; 0 when rejected);
    - ``is_weight_min`` / ``is_weight_max``: the smallest / largest weight of a kept token;

    all 0 when no token is kept.
    """

    def __init__(self, spec: CorrectionSpec, stats: SeqStats) -> None:
        self.spec, self.stats = spec, stats
        self.stages = stages = Stages.of(spec)
        self.metrics = metrics = SeqMetrics(stats, "correction")
        count, denom = stats.counts, stats.denom
        seq_log = {}
        if "log_ratio" in stats.index:
            total_log = stats.sum("log_ratio")
            seq_log = {"sequence": total_log.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), "geometric": total_log / denom}
        flags: dict[str, torch.Tensor] = {}
        """Per-sequence 0/1 mean metrics (decisions)."""
        no = count.new_zeros(stats.num_seqs, dtype=torch.bool)
        stage_seq = {"rs": no, "tis": no}
        vetoed = no
        if spec.veto is not None:
            vetoed = flags["veto_seq_fraction"] = stats.sum("below_veto") > 0
            metrics.add("mean", ("catastrophic_token_fraction",), stats.mean("below_veto"),
                        stats.token_rows({"catastrophic_token_fraction": "below_veto"}))
        if spec.rs_k3_max is not None:
            flags["k3_rejected_seq_fraction"] = stats.mean("k3") > spec.rs_k3_max
            stage_seq["rs"] = stage_seq["rs"] | flags["k3_rejected_seq_fraction"]
        for level, stage, low, high in stages.seq_bands:
            out = (seq_log[level] < log_bound(low, -math.inf)) | (seq_log[level] > log_bound(high, math.inf))
            stage_seq[stage] = stage_seq[stage] | out
            key = f"{level}_band_rejected_seq_fraction"  # IS and RS bands at one level share it: their union
            flags[key] = flags[key] | out if key in flags else out
        rejected = vetoed | stage_seq["rs"] | stage_seq["tis"]
        self.keep_seq = ~rejected
        flags["rejected_seq_fraction"] = rejected & (count > 0)
        # Rejections attributed per stage: what each stage rejects on its own (stages may overlap).
        token_stages = {stage for stage, _, _ in stages.token_bands}
        seq_stages = {stage for _, stage, _, _ in stages.seq_bands} | ({"rs"} if spec.rs_k3_max is not None else set())
        for stage in sorted(token_stages | seq_stages):
            name, column = f"{stage}_rejected_token_fraction", f"{stage}_rejected"
            if stage in seq_stages:
                flags[f"{stage}_rejected_seq_fraction"] = stage_seq[stage]
            if stage not in token_stages:
                flags[name] = stage_seq[stage]
            elif stage not in seq_stages:
                metrics.add("mean", (name,), stats.mean(column), stats.token_rows({name: column}))
            else:
                metrics.add("mean", (name,), torch.where(stage_seq[stage], 1.0, stats.mean(column)))

        low, high = spec.is_bounds
        self.factor = self.keep_seq.double()
        self.seq_weight: torch.Tensor | None = None
        if spec.is_level == "token":
            for name, column in (("is_ratio_mean", "is_ratio"), ("is_clip_high_fraction", "is_above"),
                                 ("is_clip_low_fraction", "is_below")):
                if column in stats.index:
                    metrics.add("mean", (name,), stats.mean(column), stats.token_rows({name: column}))
        elif spec.is_level is not None:
            seq_rho = torch.exp(seq_log[spec.is_level])
            self.seq_weight = _shape_weights(spec.is_mode, seq_rho, low, high)
            self.factor = self.factor * self.seq_weight
            metrics.add("mean", ("is_ratio_mean",), seq_rho)
            if spec.is_mode != "mask":
                flags["is_clip_high_fraction"] = seq_rho > high
            if spec.is_mode == "clip":
                flags["is_clip_low_fraction"] = seq_rho < low
        self.per_sequence = len(flags) > 1 or self.seq_weight is not None
        """Whether a sequence-level decision or weight exists (else the token columns are the result)."""
        self.kept = stats.sum(stages.kept) * self.keep_seq
        self.weight_sum = stats.sum(stages.weight) * self.factor
        self.weight_sq_sum = stats.sum(stages.weight_sq) * self.factor ** 2
        metrics.add("mean", tuple(flags), torch.stack(list(flags.values()), 1))
        self.weight_block = len(metrics.blocks["mean"])
        metrics.add("mean", ("is_weight_mean", "rejected_token_fraction"),  # token rows: see finish()
                    torch.stack([self.weight_sum / denom, 1.0 - self.kept / denom], 1),
                    {"is_weight_mean": None, "rejected_token_fraction": None})
        metrics.add("total", ("rejected_tokens",), count - self.kept)
        self.scale: float | torch.Tensor = 1.0
        """The batch-normalisation scale ``s``: a 0-d tensor after :meth:`read` when normalising, else 1.0."""

    @property
    def normalizes(self) -> bool:
        """Whether the weights are batch-normalised (a scale is computed by :meth:`read`)."""
        return self.spec.batch_normalize and self.spec.is_level is not None

    def add_to(self, totals: BatchTotals) -> None:
        """The metrics' entries, the sums of the diagnostics and of the batch normalisation, and the extreme kept
        weights (before the scale)."""
        stats = self.stats
        self.metrics.add_to(totals)
        seq_mean_weight = self.weight_sum / stats.denom
        has_kept = self.kept > 0
        raw_weight: float | torch.Tensor = 0.0  # the IS weights before rejection, for batch normalisation
        if self.normalizes:
            raw_weight = stats.sum(self.stages.raw_weight).sum() if self.spec.is_level == "token" else \
                stats.valid @ self.seq_weight
        totals.add("sum", "correction.weights", [
            stats.counts.sum(), self.weight_sum.sum(), self.weight_sq_sum.sum(), stats.valid @ seq_mean_weight,
            stats.valid @ seq_mean_weight ** 2, raw_weight])
        # The extremes of the kept weights of each sequence with kept tokens, times its factor.
        if self.spec.is_level == "token":
            high = self.spec.is_bounds[1]
            top = stats.max("is_weight") * self.factor
            neg_bottom = (stats.max("is_weight_headroom") - 1.0) * high * self.factor
        else:
            top, neg_bottom = self.factor, -self.factor
        extremes = torch.where(has_kept, torch.stack([top, neg_bottom]), -math.inf)
        totals.add("max", "correction.extremes", extremes.amax(1) if stats.num_seqs else
                   extremes.new_full((2,), -math.inf))

    def read(self, reduced: Reduced) -> None:
        """Batch values; fixes the batch-normalisation scale (on the device of ``reduced``)."""
        self.metrics.read(reduced)
        n_tokens, s1, s2, seq_s1, seq_s2, raw_weight = reduced["correction.weights"].unbind(0)
        spec, values = self.spec, self.metrics.values
        n_seqs = values["valid_sequences"]
        if self.normalizes:
            n = n_tokens if spec.is_level == "token" else n_seqs
            mean = torch.where(n > 0, raw_weight / n, 0.0)
            self.scale = torch.where(mean > NORMALIZE_MIN_MEAN, 1.0 / mean, 1.0)
            values["is_weight_mean"] = values["is_weight_mean"] * self.scale
            names, weights = self.metrics.blocks["mean"][self.weight_block]
            self.metrics.blocks["mean"][self.weight_block] = (names, torch.cat([weights[:, :1] * self.scale,
                                                                                weights[:, 1:]], 1))
        top, neg_bottom = (self._scaled(v) for v in reduced["correction.extremes"].unbind(0))
        found = reduced["correction.extremes"] > -math.inf
        ess, chi2 = _ess_chi2(torch.stack([s1, seq_s1]), torch.stack([s2, seq_s2]), torch.stack([n_tokens, n_seqs]))
        values.update(
            is_weight_max=torch.where(found[0], top, 0.0), is_weight_min=torch.where(found[1], -neg_bottom, 0.0),
            is_ess=ess[0], chi2_token=chi2[0], is_ess_seq=ess[1], chi2_seq=chi2[1])

    def _scaled(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` times the batch-normalisation scale (no op without normalisation)."""
        return values * self.scale if self.normalizes else values

    def sequence_rows(self) -> list[torch.Tensor]:
        """The per-sequence factors :meth:`finish` needs at the tokens, after :meth:`read`: the keep flags, and
        ``f_i s`` unless that is the keep flag itself (no sequence weight, no normalisation); none without any
        sequence-level decision or weight."""
        if not self.per_sequence:
            return []
        keep = self.keep_seq.double()
        if self.seq_weight is None and not self.normalizes:
            return [keep]
        return [keep, self._scaled(self.factor)]

    def finish(self, sequence_tokens: Sequence[torch.Tensor], token_outputs: bool = False) -> Correction:
        """The token weights and mask, from :meth:`sequence_rows` broadcast to the tokens (after :meth:`read`; the
        broadcast rows are overwritten); with ``token_outputs`` also the token rows of ``is_weight_mean`` (the
        weights) and ``rejected_token_fraction`` (``m - keep``)."""
        stats, stages = self.stats, self.stages
        kept, token_weight = stats.rows[stages.kept], stats.rows[stages.weight]
        if len(sequence_tokens) == 2:
            keep, weights = sequence_tokens[0].mul_(kept), sequence_tokens[1].mul_(token_weight)
        elif len(sequence_tokens) == 1:  # the sequence factor is the keep flag
            keep = sequence_tokens[0]
            weights = keep * token_weight
            keep.mul_(kept)
        else:
            keep, weights = kept, self._scaled(token_weight)
        if token_outputs:
            self.metrics.rows.update(is_weight_mean=weights, rejected_token_fraction=stats.batch.mask - keep)
        return Correction(weights, keep, self.metrics)


def _ess_chi2(s1: torch.Tensor, s2: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From the sums of the weights ``s1``, of their squares ``s2`` and the counts ``n`` (tensors of one shape): the
    normalised effective sample size ``(sum w)^2 / (n sum w^2)`` and ``chi2 = n sum w^2 / (sum w)^2 - 1``
    (``mean(w^2) - 1`` of the weights normalised to mean 1), each 0 without weight."""
    s1_sq, n_s2 = s1 * s1, n * s2
    return torch.where((n > 0) & (s2 > 0), s1_sq / n_s2, 0.0), torch.where(s1 > 0, n_s2 / s1_sq - 1.0, 0.0)


def _shape_weights(mode: str, rho: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Sequence IS weights from ratios: truncate ``min(rho, high)``, clip ``clamp(rho, low, high)``, mask ``rho``."""
    if mode == "truncate":
        return rho.clamp(max=high)
    if mode == "clip":
        return rho.clamp(low, high)
    return rho


def apply_correction(spec: CorrectionSpec, batch: TokenBatch, reducers: Reducers = LOCAL) -> Correction:
    """``spec`` on ``batch`` on its own: statistics of :func:`correction_columns` (complete over CP shards with
    ``reducers.seq``), the plan, one batch reduction (``reducers.batch``), the weights. The TIS hook instead builds
    one table for the metrics and the correction and reduces once for both."""
    stats = SeqStats.build(batch, correction_columns(spec), reducers)
    plan = CorrectionPlan(spec, stats)
    reduce_batch(reducers.batch, plan)
    return plan.finish(stats.at_tokens(plan.sequence_rows(), stats.batch.mask.dtype))
