"""DC-GRPO's advantage shaping (:mod:`mismatch_ctrl.dcgrpo`): ``A~[i, t] = A_i - penalty(c[i, t])`` from the batch's
sequence statistics, completed by one batch reduction (``C_bar``, the penalty cap)."""

from __future__ import annotations

import torch

from ..seqstats import BatchTotals, Columns, Reduced, SeqStats, Tokens
from ..signals import SIGNAL_COLUMNS
from .settings import DCGRPOSettings


def shaping_columns(settings: DCGRPOSettings, eps: float) -> Columns:
    """The columns :func:`shape_advantages` reads: the signal ``c m`` and, for ``hinge`` / ``centered``, the
    penalty's absolute value (with the current ``eps``)."""
    signal = settings.signal
    sums = {signal: SIGNAL_COLUMNS[signal]}
    if settings.penalty_form == "hinge":
        def hinge(t: Tokens, out: torch.Tensor) -> None:  # c = 0 where m = 0, and so is the hinge
            torch.sub(t.rows[signal], eps, out=out).clamp_min_(0.0)

        sums["dcgrpo_hinge"] = hinge
    elif settings.penalty_form == "centered":
        def centered(t: Tokens, out: torch.Tensor) -> None:
            torch.sub(t.rows[signal], eps, out=out).abs_().mul_(t.mask)

        sums["dcgrpo_centered_abs"] = centered
    return Columns(sums, keep=frozenset({signal, "dcgrpo_hinge"} & set(sums)))


class ShapedAdvantages:
    """DC-GRPO shaping of one rollout, completed by the batch reduction (``add_to`` / ``read``;
    :func:`~mismatch_ctrl.seqstats.reduce_batch` with ``fetch=True``: the controller reads ``C_bar`` on the host, and
    so does the penalty cap, whose multiplier then shapes the tokens on the device). After it, identical on every
    rank: ``discrepancy`` (``C_bar``; None when no sequence of the global batch has a trained token),
    ``lambda_shaping`` (the multiplier after ``penalty_cap``), ``capped``, ``penalty_abs_mean``, ``penalty_share``,
    and this rank's shaped token advantages ``advantages`` (None when only measuring)."""

    def __init__(self, stats: SeqStats, seq_advantages: torch.Tensor | None, settings: DCGRPOSettings, lam: float,
                 eps: float) -> None:
        self.stats, self.seq_advantages, self.settings, self.lam, self.eps = stats, seq_advantages, settings, lam, eps
        self.discrepancy: float | None = None
        self.lambda_shaping = lam
        self.capped = False
        self.penalty_abs_mean = self.penalty_share = 0.0
        self.advantages: torch.Tensor | None = None
        self._abs_adv = None if seq_advantages is None else seq_advantages.detach().abs()

    def _skips_zero(self) -> bool:
        return self.seq_advantages is not None and self.settings.zero_advantage == "skip"

    def add_to(self, totals: BatchTotals) -> None:
        """Per batch: sequences, the sum of ``C_i``, trained tokens, the sum of ``c``, of ``|penalty| / lambda`` over
        penalised sequences and of ``|A|``, over trained tokens."""
        stats, form, signal = self.stats, self.settings.penalty_form, self.settings.signal
        penalty = stats.sum({"hinge": "dcgrpo_hinge", "centered": "dcgrpo_centered_abs"}.get(form, signal))
        adv = 0.0 if self._abs_adv is None else self._abs_adv
        if self._skips_zero():
            penalty = penalty * (self._abs_adv != 0)
        totals.add("sum", "dcgrpo", [stats.num_seqs, stats.valid @ stats.mean(signal), stats.counts.sum(),
                                     stats.sum(signal).sum(), penalty.sum(), (stats.counts * adv).sum()])

    def read(self, reduced: Reduced) -> None:
        n_seqs, sum_seq_c, n_tokens, sum_c, sum_penalty, sum_adv = reduced["dcgrpo"].tolist()
        if n_tokens:
            self.discrepancy = sum_seq_c / n_seqs if self.settings.aggregation == "seq_mean" else sum_c / n_tokens
        if self.seq_advantages is None:
            return
        unit, adv_mean = (sum_penalty / n_tokens, sum_adv / n_tokens) if n_tokens else (0.0, 0.0)
        cap = self.settings.cap
        if cap is not None and self.lam * unit > cap * adv_mean:
            self.lambda_shaping, self.capped = cap * adv_mean / unit, True
        self.penalty_abs_mean = self.lambda_shaping * unit
        self.penalty_share = self.penalty_abs_mean / max(adv_mean, 1e-8)
        self.advantages = self._shape(self.lambda_shaping)

    def _shape(self, lam: float) -> torch.Tensor:
        stats, form = self.stats, self.settings.penalty_form
        c = stats.rows[self.settings.signal]
        segments = stats.segments
        shaped = segments.expand(self.seq_advantages.to(c.dtype))
        penalty = stats.rows["dcgrpo_hinge"] if form == "hinge" else c
        mask = stats.batch.mask
        if self._skips_zero():
            penalised = segments.expand((self.seq_advantages != 0).to(c.dtype))
            penalty, mask = penalty * penalised, mask * penalised
        shaped.add_(penalty, alpha=-lam)
        if form == "centered":
            shaped.add_(mask, alpha=lam * self.eps)
        return shaped


def shape_advantages(stats: SeqStats, seq_advantages: torch.Tensor | None, settings: DCGRPOSettings, lam: float,
                     eps: float) -> ShapedAdvantages:
    """``A~[i, t] = A_i - penalty(c[i, t])`` for per-sequence advantages ``A_i`` (``[N]``; GRPO's normalised reward),
    flat over tokens, from statistics that include :func:`shaping_columns`; ``seq_advantages=None`` only measures
    ``C_bar``. Shaping completes with the batch reduction, which the penalty cap needs (see
    :class:`ShapedAdvantages`).

    The penalty applies to trained tokens only (``m = 1``): untrained positions (tool output, padding) carry no
    meaningful rollout log-prob (slime stores 0.0 there) and keep ``A_i`` [ours]; with ``zero_advantage: skip`` not
    to sequences with ``A_i = 0`` either.
    ``penalty_share = mean|penalty| / max(mean|A|, 1e-8)`` over trained tokens shows a penalty that swamps the task.
    """
    return ShapedAdvantages(stats, seq_advantages, settings, lam, eps)
