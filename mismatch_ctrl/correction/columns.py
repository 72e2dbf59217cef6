"""The token columns a correction reads (:mod:`mismatch_ctrl.correction`): band rejections, the veto, the token IS
weight and its square, written in one pass each into the batch's statistics table (:mod:`mismatch_ctrl.seqstats`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..seqstats import Columns, Tokens, Writer
from ..signals import SIGNAL_COLUMNS
from .spec import CorrectionSpec


def log_bound(x: float | None, default: float) -> float:
    """``log(x)`` of a ratio bound; ``default`` for no bound, ``-inf`` for a bound of 0."""
    return default if x is None else (math.log(x) if x > 0 else -math.inf)


def _outside_writer(low: float | None, high: float | None) -> Writer:
    """Column ``m [rho outside [low, high]]``, compared in log space."""
    lo, hi = log_bound(low, -math.inf), log_bound(high, math.inf)

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
class Stages:
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
    def of(cls, spec: CorrectionSpec) -> Stages:
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
    stages = Stages.of(spec)
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
