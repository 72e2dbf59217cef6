"""Straightforward reference implementations of mismatch_ctrl's formulas, for the tests.

Written from ALGORITHMS.md and the core modules' docstrings, not from the vectorised code: one Python loop over the
sequences and one over their tokens, plain Python floats in double precision (``math.exp``), no segment operations.
Sequences are :class:`Seq` objects holding the fp32 values the core sees, after the non-finite guard.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

LOG_RATIO_BOUND = 20.0
MAX_METRICS = frozenset({"prob_diff_max", "log_ppl_diff_max"})
MIN_METRICS = frozenset({"log_ppl_diff_min"})
TOTAL_METRICS = frozenset({"trained_tokens", "nonfinite_tokens", "rejected_tokens"})


@dataclass
class Seq:
    """One response: training-engine and rollout-engine log-probs, loss mask, and the trained tokens dropped as
    non-finite (their log-probs are replaced by 0 and their mask by 0)."""

    train: list[float]
    rollout: list[float]
    mask: list[float]
    nonfinite: int = 0

    @property
    def count(self) -> float:
        return sum(self.mask)

    def log_ratios(self) -> list[float]:
        return [clamp(a - b, -LOG_RATIO_BOUND, LOG_RATIO_BOUND) for a, b in zip(self.train, self.rollout)]


def clamp(x: float, low: float, high: float) -> float:
    return min(max(x, low), high)


def prepare(train: Sequence[torch.Tensor], rollout: Sequence[torch.Tensor], mask: Sequence[torch.Tensor]) -> list[Seq]:
    """Per-sample tensors -> :class:`Seq` list: fp32 values; a token whose ``lp_train - lp_roll`` is not finite leaves
    the mask (and counts as non-finite if it was trained)."""
    out = []
    for t, r, m in zip(train, rollout, mask):
        seq = Seq([], [], [])
        for a, b, w in zip(t.float().tolist(), r.float().tolist(), m.float().tolist()):
            if not math.isfinite(a - b):
                seq.nonfinite += int(w > 0)
                a = b = w = 0.0
            seq.train.append(a)
            seq.rollout.append(b)
            seq.mask.append(w)
        out.append(seq)
    return out


def masked_mean(values: Sequence[float], mask: Sequence[float]) -> float:
    """``sum_t m x / max(sum_t m, 1)``."""
    return sum(m * x for m, x in zip(mask, values)) / max(sum(mask), 1.0)


def median(values: Sequence[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


# --- signals (ALGORITHMS.md section 1) ---------------------------------------------------------------------------

def token_signal(seq: Seq, signal: str) -> list[float]:
    out = []
    for a, b, l in zip(seq.train, seq.rollout, seq.log_ratios()):
        if signal == "prob_diff":
            out.append(abs(math.exp(a) - math.exp(b)))
        elif signal == "log_diff":
            out.append(abs(l))
        elif signal == "ratio_diff":
            out.append(abs(math.exp(l) - 1.0))
        elif signal == "k3":
            out.append(math.expm1(l) - l)
        else:
            raise ValueError(signal)
    return out


# --- mismatch metrics (section 6) -----------------------------------------------------------------------------------

def mismatch_metrics(seq: Seq) -> dict[str, float]:
    """Per-sequence metric values with slime/verl names."""
    m = seq.mask
    log_ppl_diff = masked_mean(seq.rollout, m) - masked_mean(seq.train, m)
    prob_diff = token_signal(seq, "prob_diff")
    return {
        "training_log_ppl": -masked_mean(seq.train, m),
        "rollout_log_ppl": -masked_mean(seq.rollout, m),
        "log_ppl_diff": log_ppl_diff,
        "log_ppl_abs_diff": abs(log_ppl_diff),
        "kl": masked_mean([b - a for a, b in zip(seq.train, seq.rollout)], m),
        "k3_kl": masked_mean(token_signal(seq, "k3"), m),
        "prob_diff_mean": masked_mean(prob_diff, m),
        "logprob_abs_diff": masked_mean(token_signal(seq, "log_diff"), m),
        "prob_diff_max": max([p for p, w in zip(prob_diff, m) if w > 0], default=0.0),
        "log_ppl_diff_max": log_ppl_diff,
        "log_ppl_diff_min": log_ppl_diff,
        "trained_tokens": seq.count,
        "nonfinite_tokens": float(seq.nonfinite),
    }


def summarize(rows: Sequence[dict[str, float]], counts: Sequence[float]) -> dict[str, float]:
    """Batch values: mean over all sequences (the per-sequence values of a sequence without trained tokens are 0),
    max / min over the sequences with trained tokens, totals over all sequences."""
    valid = [row for row, n in zip(rows, counts) if n > 0]
    names = rows[0].keys() if rows else ()
    out = {"sequences": float(len(rows)), "valid_sequences": float(len(valid))}
    for name in names:
        if name in TOTAL_METRICS:
            out[name] = sum(row[name] for row in rows)
        elif name in MAX_METRICS:
            out[name] = max((row[name] for row in valid), default=0.0)
        elif name in MIN_METRICS:
            out[name] = min((row[name] for row in valid), default=0.0)
        else:
            out[name] = sum(row[name] for row in valid) / len(rows) if valid else 0.0
    return out


# --- rollout correction (section 3) ---------------------------------------------------------------------------------

def _inside(rho: float, low: float | None, high: float | None) -> bool:
    return (low is None or rho >= low) and (high is None or rho <= high)


def _shape(mode: str, rho: float, low: float, high: float) -> float:
    if mode == "truncate":
        return min(rho, high)
    if mode == "clip":
        return clamp(rho, low, high)
    return rho


def correction(spec, seqs: Sequence[Seq]) -> tuple[list[list[float]], list[list[float]], list[dict[str, float]]]:
    """Weights, modified masks and per-sequence metrics of a ``CorrectionSpec`` (read as plain settings)."""
    is_low = spec.is_low
    if is_low is None:
        is_low = 0.0 if spec.is_mode == "truncate" else 1.0 / spec.is_high
    is_high = spec.is_high
    bands = []
    if spec.rs_level is not None:
        bands.append((spec.rs_level, spec.rs_low, spec.rs_high, "rs"))
    if spec.is_level is not None and spec.is_mode == "mask":
        bands.append((spec.is_level, is_low, is_high, "tis"))
    k3_on = spec.rs_k3_max is not None

    weights, keeps, rows, seq_weights = [], [], [], []
    for seq in seqs:
        m, ls = seq.mask, seq.log_ratios()
        count = seq.count
        denom = max(count, 1.0)
        rhos = [math.exp(l) for l in ls]
        total_log = sum(w * l for w, l in zip(m, ls))
        seq_rho = {"sequence": math.exp(clamp(total_log, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)),
                   "geometric": math.exp(total_log / denom)}
        row: dict[str, float] = {}
        rejected = False
        if spec.veto is not None:
            catastrophic = sum(1 for w, r in zip(m, rhos) if w > 0 and r < spec.veto)
            row["veto_seq_fraction"] = float(catastrophic > 0)
            row["catastrophic_token_fraction"] = catastrophic / denom
            rejected |= catastrophic > 0
        too_far = False
        if k3_on:
            too_far = masked_mean(token_signal(seq, "k3"), m) > spec.rs_k3_max
            row["k3_rejected_seq_fraction"] = float(too_far)
            rejected |= too_far
        token_ok = [True] * len(ls)
        stage_seq = {"rs": too_far, "tis": False}  # a sequence rejected by the stage itself
        stage_tokens = {"rs": 0.0, "tis": 0.0}  # trained tokens rejected by the stage's token band
        for level, low, high, stage in bands:
            if level == "token":
                inside = [_inside(r, low, high) for r in rhos]
                token_ok = [ok and i for ok, i in zip(token_ok, inside)]
                stage_tokens[stage] += sum(w for w, i in zip(m, inside) if not i)
            else:
                out = not _inside(seq_rho[level], low, high)
                key = f"{level}_band_rejected_seq_fraction"
                row[key] = max(row.get(key, 0.0), float(out))
                rejected |= out
                stage_seq[stage] |= out
        for stage in ("rs", "tis"):
            levels = [level for level, _, _, s in bands if s == stage] + (["k3"] if stage == "rs" and k3_on else [])
            if not levels:
                continue
            if any(level != "token" for level in levels):
                row[f"{stage}_rejected_seq_fraction"] = float(stage_seq[stage])
            row[f"{stage}_rejected_token_fraction"] = 1.0 if stage_seq[stage] else stage_tokens[stage] / denom
        keep = [float(w > 0 and ok and not rejected) for w, ok in zip(m, token_ok)]

        if spec.is_level is None:
            w = list(keep)
            seq_weights.append(None)
        elif spec.is_level == "token":
            w = [_shape(spec.is_mode, r, is_low, is_high) * k for r, k in zip(rhos, keep)]
            row["is_ratio_mean"] = masked_mean(rhos, m)
            above = masked_mean([float(r > is_high) for r in rhos], m)
            below = masked_mean([float(r < is_low) for r in rhos], m)
            seq_weights.append(None)
        else:
            rho = seq_rho[spec.is_level]
            seq_w = _shape(spec.is_mode, rho, is_low, is_high)
            w = [seq_w * k for k in keep]
            row["is_ratio_mean"] = rho
            above, below = float(rho > is_high), float(rho < is_low)
            seq_weights.append(seq_w)
        if spec.is_level is not None and spec.is_mode in ("truncate", "clip"):
            row["is_clip_high_fraction"] = above
        if spec.is_level is not None and spec.is_mode == "clip":
            row["is_clip_low_fraction"] = below
        row["rejected_seq_fraction"] = float(rejected and count > 0)
        row["rejected_tokens"] = count - sum(keep)
        weights.append(w)
        keeps.append(keep)
        rows.append(row)

    if spec.batch_normalize and spec.is_level is not None:
        # slime's mis.py / verl: the IS weights before rejection, of every trained token (token level) or of every
        # sequence with trained tokens (sequence levels), rescaled to mean 1.
        if spec.is_level == "token":
            raw = [_shape(spec.is_mode, math.exp(l), is_low, is_high)
                   for seq in seqs for l, w in zip(seq.log_ratios(), seq.mask) if w > 0]
        else:
            raw = [seq_w for seq_w, seq in zip(seq_weights, seqs) if seq.count > 0]
        mean = sum(raw) / len(raw) if raw else 0.0
        if mean > 1e-8:
            weights = [[x / mean for x in w] for w in weights]

    for seq, w, keep, row in zip(seqs, weights, keeps, rows):
        denom = max(seq.count, 1.0)
        row["is_weight_mean"] = sum(w) / denom
        row["rejected_token_fraction"] = 1.0 - sum(keep) / denom
    return weights, keeps, rows


def correction_diagnostics(weights: Sequence[Sequence[float]], keeps: Sequence[Sequence[float]],
                           seqs: Sequence[Seq]) -> dict[str, float]:
    """``is_ess`` / ``chi2_token`` over trained tokens, ``is_ess_seq`` / ``chi2_seq`` over sequences with trained
    tokens (each weighing its mean token weight), and the smallest / largest weight of a kept token (0 without)."""
    def ess_chi2(values: list[float]) -> tuple[float, float]:
        s1, s2, n = sum(values), sum(v * v for v in values), len(values)
        return (s1 * s1 / (n * s2) if n and s2 > 0 else 0.0), (n * s2 / (s1 * s1) - 1.0 if s1 > 0 else 0.0)

    token = [w for ws, seq in zip(weights, seqs) for w, m in zip(ws, seq.mask) if m > 0]
    per_seq = [sum(ws) / seq.count for ws, seq in zip(weights, seqs) if seq.count > 0]
    kept = [w for ws, ks in zip(weights, keeps) for w, k in zip(ws, ks) if k > 0]
    (is_ess, chi2_token), (is_ess_seq, chi2_seq) = ess_chi2(token), ess_chi2(per_seq)
    return {"is_ess": is_ess, "chi2_token": chi2_token, "is_ess_seq": is_ess_seq, "chi2_seq": chi2_seq,
            "is_weight_max": max(kept, default=0.0), "is_weight_min": min(kept, default=0.0)}


# --- DC-GRPO (section 2) --------------------------------------------------------------------------------------------

def penalty(c: float, lam: float, eps: float, form: str) -> float:
    if form in ("lagrangian", "fixed"):
        return lam * c
    if form == "centered":
        return lam * (c - eps)
    if form == "hinge":
        return lam * max(c - eps, 0.0)
    raise ValueError(form)


def shape_advantages(seqs: Sequence[Seq], advantages: Sequence[Sequence[float]], signal: str, form: str,
                     aggregation: str, lam: float, eps: float, cap: float | None = None,
                     skip_zero: bool = False) -> tuple[list[list[float]], float | None, float, float]:
    """Shaped token advantages (penalty on trained tokens only; with ``skip_zero`` not on sequences whose advantage
    is 0), ``C_bar``, mean |penalty| and penalty share over trained tokens. With ``cap`` the multiplier is lowered
    until mean |penalty| <= cap x mean |A|."""
    penalised = [not (skip_zero and all(a == 0 for a in adv)) for adv in advantages]
    seq_means = []
    tokens = sum_c = sum_unit = sum_adv = 0.0
    for seq, adv, on in zip(seqs, advantages, penalised):
        c = token_signal(seq, signal)
        seq_means.append(masked_mean(c, seq.mask))
        tokens += seq.count
        sum_c += sum(w * x for w, x in zip(seq.mask, c))
        sum_unit += sum(w * abs(penalty(x, 1.0, eps, form)) for w, x in zip(seq.mask, c)) if on else 0.0
        sum_adv += sum(w * abs(a) for w, a in zip(seq.mask, adv))
    if tokens and cap is not None and lam * sum_unit > cap * sum_adv:
        lam = cap * sum_adv / sum_unit
    shaped = []
    for seq, adv, on in zip(seqs, advantages, penalised):
        c = token_signal(seq, signal)
        shaped.append([a - (penalty(x, lam, eps, form) if w > 0 and on else 0.0) for a, x, w in zip(adv, c, seq.mask)])
    if tokens == 0:
        return shaped, None, 0.0, 0.0
    c_bar = sum(seq_means) / len(seq_means) if aggregation == "seq_mean" else sum_c / tokens
    pen_mean = lam * sum_unit / tokens
    return shaped, c_bar, pen_mean, pen_mean / max(sum_adv / tokens, 1e-8)


def lagrange_trajectory(c_bars: Sequence[float | None], lambda_0: float, eta: float, eps: float | str,
                        lambda_max: float, form: str = "lagrangian", calibration: int = 10, factor: float = 1.1,
                        guard: str = "clamp", floor_window: int = 3, drift_window: int | None = None,
                        drift: str = "saturated") -> list[tuple[float, float | None]]:
    """``(lambda that shapes rollout k, eps in force for it)`` for every rollout k, then the state after the last.

    ``lambda_{k+1} = clip(lambda_k + eta (C_bar_k - eps), 0, lambda_max)``; ``eps: auto`` keeps lambda 0 for the
    first ``calibration`` measured rollouts, then sets eps = factor x their median and lambda = lambda_0; the guard
    raises eps to factor x floor (median of the first ``floor_window``) when eps is below it. With ``drift_window``
    W: after W consecutive updates ending at lambda_max (``drift="saturated"``) or with C_bar > eps (``"persistent"``),
    if the median violation of the last W // 2 of them is above half that of the first W // 2, eps becomes
    max(eps, factor x median of the W C_bars) and lambda lambda_0. Any change of eps empties the window.
    """
    auto = eps == "auto"
    lam, budget = (0.0, None) if auto else (lambda_0, eps)
    window = calibration if auto else floor_window
    seen: list[float] = []
    at_max: list[float] = []
    out = []
    for c in c_bars:
        shaping = 0.0 if budget is None else (lambda_0 if form == "fixed" else lam)
        out.append((shaping, budget))
        if c is None or math.isnan(c):
            continue
        if len(seen) < window:
            seen.append(c)
            if len(seen) == window:
                floor = median(seen)
                if auto:
                    budget, lam = factor * floor, lambda_0
                    continue
                if budget < floor and guard == "clamp":
                    budget, at_max = factor * floor, []
        if budget is None or form == "fixed":
            continue
        lam = clamp(lam + eta * (c - budget), 0.0, lambda_max)
        if drift_window is None:
            continue
        pressed = lam == lambda_max if drift == "saturated" else c > budget
        at_max = at_max + [c] if pressed else []
        if len(at_max) == drift_window:
            half = drift_window // 2
            if median(at_max[-half:]) - budget > 0.5 * (median(at_max[:half]) - budget):
                budget, lam, at_max = max(budget, factor * median(at_max)), lambda_0, []
            else:
                at_max = at_max[1:]
    out.append((0.0 if budget is None else (lambda_0 if form == "fixed" else lam), budget))
    return out


# --- ACRL band controller (section 5) -------------------------------------------------------------------------------

def sequence_discrepancies(seqs: Sequence[Seq]) -> list[float]:
    """Per-sequence mean ``|l|`` of the sequences with trained tokens."""
    return [masked_mean(token_signal(s, "log_diff"), s.mask) for s in seqs if s.count > 0]


def band_trajectory(ds: Sequence[float | None], c_0: float, c_min: float, c_max: float, band_low: float,
                    band_high: float, shrink: float, grow: float, reference: float | None,
                    calibration: int) -> list[float]:
    """The band half-width ``c`` after each rollout's ``D``."""
    c, seen, out = c_0, [], []
    for d in ds:
        if d is not None:
            if reference is None:
                seen.append(d)
                if len(seen) == calibration:
                    reference = median(seen)
            elif d > band_high * reference:
                c = max(shrink * c, c_min)
            elif d < band_low * reference:
                c = min(grow * c, c_max)
        out.append(c)
    return out


# --- quantiles and the LR schedule ----------------------------------------------------------------------------------

def order_statistic(values: Sequence[float], q: float) -> float:
    """The ``ceil(q n)``-th smallest value (1-based, at least the first): the value a histogram quantile's bin holds."""
    v = sorted(values)
    return v[max(math.ceil(q * len(v) - 1e-9), 1) - 1]


def lr_scale(step: int, period: int, first: int, factor: float = 0.5, min_scale: float = 0.1) -> float:
    """``max(factor ** k, min_scale)`` with one halving at ``first`` and one every ``period`` rollouts after it."""
    halvings = 0
    t = first
    while t <= step:
        halvings += 1
        t += period
    return max(factor ** halvings, min_scale)
