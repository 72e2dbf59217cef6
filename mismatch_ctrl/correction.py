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

``batch_normalize`` divides the weights by the mean IS weight of the data-parallel batch before rejection (token
level: over its trained tokens; sequence levels: over its sequences with trained tokens), as slime's ``mis.py``
(``tis_batch_normalize``) and verl (``rollout_is_batch_normalize``) do, with the same single batch reduction as the
metrics; in slime's TIS hook that batch is one micro-batch slot of every DP rank (see
:mod:`mismatch_ctrl.slime.tis`). Rejected tokens get weight 0 and leave the modified mask; the caller keeps them in
the loss denominator (slime's convention), so an all-rejected batch contributes zero loss.

Everything per sequence (decisions, metrics) and per batch (means, diagnostics, the normalisation) is a function of
the sequence statistics (:mod:`mismatch_ctrl.seqstats`); only the IS weights touch tokens again. Rejections are
attributed per stage (each stage's own rejections; stages may overlap): ``tis_rejected_*`` (an IS mask band),
``rs_rejected_*`` (the RS band and the K3 rejection), ``veto_seq_fraction``; ``rejected_*`` is their union. The
diagnostics of the final weights (``is_ess``, ``chi2_token``, ...) are defined in :class:`CorrectionPlan`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence, get_args

import torch

from .batch import LOG_RATIO_BOUND, TokenBatch
from .dist import LOCAL, Reducers
from .metrics import SeqMetrics
from .seqstats import BatchTotals, Columns, Reduced, SeqStats, Tokens, Writer, reduce_batch
from .signals import SIGNAL_COLUMNS

NORMALIZE_MIN_MEAN = 1e-8
"""Batch normalisation leaves the weights alone when their mean is at most this (slime's ``mis.py`` threshold)."""

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

    def explain(self) -> list[str]:
        """``key: value`` lines of the settings that act (the IS bounds with their defaults filled in), for
        ``check-config``; none for an inactive spec."""
        if not self.active:
            return []
        defaults = CorrectionSpec()
        lines = [f"{name}: {value}" for name, value in vars(self).items()
                 if value != getattr(defaults, name) and name not in ("is_mode", "is_low", "is_high")]
        if self.is_level is not None:
            low, high = self.is_bounds
            lines.insert(1 if lines else 0, f"is_mode: {self.is_mode}, bounds [{low:g}, {high:g}]")
        return lines

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
        for key, least in (("rs_low", ">= 0"), ("rs_high", "> 0")):
            bound = getattr(self, key)
            if bound is not None and not (bound >= 0 if key == "rs_low" else bound > 0):
                out.append((key, f"must be {least} or null, got {bound}: the band bounds the ratio rho = pi_train / "
                                 "mu_rollout (> 0), not its log; e.g. rs_low: 0.999, rs_high: 1.001"))
        if self.rs_low is not None and self.rs_high is not None and not self.rs_low < self.rs_high:
            out.append(("rs_low", f"need rs_low < rs_high, got {self.rs_low}, {self.rs_high}"))
        # A band or weight that treats rho = 1 (the engines agree) as off-policy rejects or shrinks every token.
        for key, bound, holds in (("rs_low", self.rs_low, lambda b: b < 1), ("rs_high", self.rs_high, lambda b: b > 1)):
            if bound is not None and bound > 0 and not holds(bound):
                out.append((key, f"need rs_low < 1 < rs_high (rho = 1 is where the engines agree), got {key}={bound}: "
                                 "the band would reject on-policy tokens; e.g. rs_low: 0.999, rs_high: 1.001"))
        if self.is_level is not None and 0 <= low < high and not low <= 1 <= high:
            out.append(("is_high" if high < 1 else "is_low",
                        f"need is_low <= 1 <= is_high (rho = 1, where the engines agree, keeps weight 1), got "
                        f"{low:g}, {high:g}: e.g. is_high: 2.0"))
        if self.veto is not None and not 0 < self.veto < 1:
            out.append(("veto", "must be in (0, 1) or null (a ratio below which a token vetoes its sequence, e.g. "
                                f"1.0e-4), got {self.veto}"))
        if self.rs_k3_max is not None and not self.rs_k3_max > 0:
            out.append(("rs_k3_max", f"must be > 0 or null, got {self.rs_k3_max}"))
        return out


@dataclass(frozen=True)
class Correction:
    """Result of a correction: per-token ``weights`` (detached, 0 unless kept), the modified loss ``mask`` (original
    mask without rejected tokens) and the per-sequence ``metrics`` with their batch ``summary`` (diagnostics
    included)."""

    weights: torch.Tensor
    mask: torch.Tensor
    metrics: SeqMetrics


def _log(x: float | None, default: float) -> float:
    return default if x is None else (math.log(x) if x > 0 else -math.inf)


def _outside_writer(low: float | None, high: float | None) -> Writer:
    """Column ``m [rho outside [low, high]]``, compared in log space."""
    lo, hi = _log(low, -math.inf), _log(high, math.inf)

    def write(t: Tokens, out: torch.Tensor) -> None:
        if lo == -math.inf:
            torch.gt(t.log_ratio, hi, out=out)
        elif hi == math.inf:
            torch.lt(t.log_ratio, lo, out=out)
        else:
            torch.sub(t.log_ratio, (lo + hi) / 2, out=out).abs_().gt_((hi - lo) / 2)
        out.mul_(t.mask)

    return write


def _below_writer(threshold: float) -> Writer:
    """Column ``m [rho < threshold]`` for a threshold below 1, from the ``log_ratio`` column ``l m`` when present (an
    untrained token's 0 there is not below ``log(threshold) < 0``)."""
    log_threshold = math.log(threshold)

    def write(t: Tokens, out: torch.Tensor) -> None:
        if "log_ratio" in t.rows:
            torch.lt(t.rows["log_ratio"], log_threshold, out=out)
        else:
            torch.lt(t.log_ratio, log_threshold, out=out).mul_(t.mask)

    return write


def _above_writer(bound: float) -> Writer:
    """Column ``m [rho > bound]`` from the ``is_ratio`` column ``rho m`` (0 at an untrained token; bound > 0)."""
    def write(t: Tokens, out: torch.Tensor) -> None:
        torch.gt(t.rows["is_ratio"], bound, out=out)

    return write


def _below_rho_writer(bound: float) -> Writer:
    """Column ``m [rho < bound]``, compared as ``exp(l) - 1 < bound - 1``."""
    def write(t: Tokens, out: torch.Tensor) -> None:
        torch.lt(t.expm1, bound - 1.0, out=out).mul_(t.mask)

    return write


def _log_ratio(t: Tokens, out: torch.Tensor) -> None:
    torch.mul(t.log_ratio, t.mask, out=out)


def _is_ratio(t: Tokens, out: torch.Tensor) -> None:
    torch.addcmul(t.mask, t.expm1, t.mask, out=out)  # rho m = (exp(l) - 1) m + m


def _union_kept(rejects: list[str]) -> Writer:
    """Trained tokens outside every token-level band: ``m - max(rejections)`` (rejection columns are 0/1 and masked)."""
    def write(t: Tokens, out: torch.Tensor) -> None:
        if len(rejects) == 1:
            torch.sub(t.mask, t.rows[rejects[0]], out=out)
        else:
            torch.maximum(t.rows[rejects[0]], t.rows[rejects[1]], out=out)
            torch.sub(t.mask, out, out=out)

    return write


def _token_weight(spec: CorrectionSpec, kept: str) -> Writer:
    """Column ``w_tok = shape(rho)`` at kept tokens: truncated ``min(rho, high)``, clipped, or ``rho`` (mask); from
    the ``is_ratio`` column ``rho m`` (whose zeros truncation keeps)."""
    low, high = spec.is_bounds

    def write(t: Tokens, out: torch.Tensor) -> None:
        ratio = t.rows["is_ratio"]
        if spec.is_mode == "mask":
            torch.mul(ratio, t.rows[kept], out=out)
            return
        torch.clamp(ratio, min=low if spec.is_mode == "clip" else None, max=high, out=out)
        if kept != "trained" or spec.is_mode == "clip":  # token-level rejections; clipping lifts zeros to low
            out.mul_(t.rows[kept])

    return write


def _square(name: str) -> Writer:
    def write(t: Tokens, out: torch.Tensor) -> None:
        torch.mul(t.rows[name], t.rows[name], out=out)

    return write


def _headroom(weight: str, kept: str, high: float) -> Writer:
    """``1 - w / high`` at kept tokens, 0 elsewhere (one pass). A kept token's weight is at most ``high`` (truncated,
    clipped, or inside the mask band), so the maximum over a sequence with kept tokens is ``1 - min(w) / high``."""
    def write(t: Tokens, out: torch.Tensor) -> None:
        torch.sub(t.rows[kept], t.rows[weight], alpha=1.0 / high, out=out)

    return write


@dataclass(frozen=True)
class _Stages:
    """Which columns a spec needs, by stage: token-level bands (``tis`` for an IS mask, ``rs``), sequence-level bands
    (level, stage, low, high), the names of the token-weight column (before sequence factors) and of the token IS
    weight before any rejection (what batch normalisation averages)."""

    token_bands: tuple[tuple[str, float | None, float | None], ...]
    seq_bands: tuple[tuple[str, str, float | None, float | None], ...]
    kept: str
    weight: str
    weight_sq: str
    raw_weight: str

    @classmethod
    def of(cls, spec: CorrectionSpec) -> _Stages:
        bands = []
        if spec.rs_level is not None:
            bands.append((spec.rs_level, "rs", spec.rs_low, spec.rs_high))
        if spec.is_level is not None and spec.is_mode == "mask":
            bands.append((spec.is_level, "tis", *spec.is_bounds))
        token_bands = tuple((stage, low, high) for level, stage, low, high in bands if level == "token")
        kept = "kept" if token_bands else "trained"
        token_is = spec.is_level == "token"
        weight = "is_weight" if token_is else kept
        raw = weight if kept == "trained" else ("is_ratio" if spec.is_mode == "mask" else "is_weight_raw")
        return cls(token_bands, tuple(b for b in bands if b[0] != "token"), kept, weight,
                   "is_weight_sq" if token_is else kept, raw)


def correction_columns(spec: CorrectionSpec) -> Columns:
    """The columns :class:`CorrectionPlan` reads for ``spec``."""
    stages = _Stages.of(spec)
    sums: dict[str, Writer] = {}
    maxima: dict[str, Writer] = {}
    if stages.seq_bands or spec.is_level in ("sequence", "geometric"):
        sums["log_ratio"] = _log_ratio
    if spec.veto is not None:
        sums["below_veto"] = _below_writer(spec.veto)
    if spec.rs_k3_max is not None:
        sums["k3"] = SIGNAL_COLUMNS["k3"]
    for stage, low, high in stages.token_bands:
        sums[f"{stage}_rejected"] = _outside_writer(low, high)
    if stages.token_bands:
        sums["kept"] = _union_kept([f"{stage}_rejected" for stage, _, _ in stages.token_bands])
    if spec.is_level == "token":
        low, high = spec.is_bounds
        sums["is_ratio"] = _is_ratio
        if spec.is_mode != "mask":
            sums["is_above"] = _above_writer(high)
        if spec.is_mode == "clip":
            sums["is_below"] = _below_rho_writer(low)
        sums["is_weight"] = maxima["is_weight"] = _token_weight(spec, stages.kept)
        sums["is_weight_sq"] = _square("is_weight")
        if spec.batch_normalize and stages.raw_weight == "is_weight_raw":
            sums["is_weight_raw"] = _token_weight(spec, "trained")
        maxima["is_weight_headroom"] = _headroom("is_weight", stages.kept, high)
    return Columns(sums, maxima, keep=frozenset({stages.kept, stages.weight}))


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
        self.stages = stages = _Stages.of(spec)
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
            out = (seq_log[level] < _log(low, -math.inf)) | (seq_log[level] > _log(high, math.inf))
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
