"""DC-GRPO: discrepancy-constrained GRPO by Lagrangian relaxation (ALGORITHMS.md section 2; paper 001).

Constrained problem: maximise ``E[R]`` subject to ``E[c] <= eps`` with ``c = |p_train - p_roll|``; Lagrangian
``max_theta min_{0 <= lambda <= lambda_max} E[R] - lambda (E[c] - eps)``.

Advantage shaping, per response token, with the multiplier ``lambda_k`` of the current rollout:

=================  ===========================================  ===========================================
``penalty_form``   shaped advantage                             source
=================  ===========================================  ===========================================
``lagrangian``     ``A_i - lambda_k c[i,t]``                    [digest + paper ablation text]
``centered``       ``A_i - lambda_k (c[i,t] - eps)``            [ours]
``hinge``          ``A_i - lambda_k max(c[i,t] - eps, 0)``      [paper prose, section 5]
``fixed``          ``A_i - lambda_0 c[i,t]``, no dual update    Dual-GRPO baseline [paper, section 4]
=================  ===========================================  ===========================================

Dual update, once per rollout after shaping: ``lambda_{k+1} = clip(lambda_k + eta (C_bar_k - eps), 0, lambda_max)``
with ``C_bar`` the mean over sequences of the per-sequence token mean of ``c`` (``seq_mean``) or the global token mean
(``token_mean``).

``eps: auto`` [ours]: the first K rollouts run with ``lambda = 0``; then ``eps = 1.1 median(C_bar)`` and
``lambda = lambda_0``. Infeasible-budget guard [ours]: ``floor`` = median ``C_bar`` of the first 3 rollouts (the
calibration window with ``eps: auto``); if ``eps < floor``, warn and, with ``eps_guard: clamp``, use ``1.1 floor``.
"""

from __future__ import annotations

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from .batch import TokenBatch
from .dist import Reducer, local_reduce
from .signals import Signal, token_signal

log = logging.getLogger(__name__)

PenaltyForm = Literal["lagrangian", "centered", "hinge", "fixed"]
Aggregation = Literal["seq_mean", "token_mean"]
PENALTY_FORMS: tuple[str, ...] = get_args(PenaltyForm)

@dataclass(frozen=True)
class DCGRPOSettings:
    """The ``dcgrpo:`` section. ``None`` for lambda_0 / eta / eps / lambda_max means the architecture default
    (``configs/arch/{dense,moe}.yaml``: dense 0.1 / 1.0 / 0.0037 / 1.0, MoE 0.05 / 1.0 / 0.005 / 1.0 [digest;
    lambda_max ours])."""

    enabled: bool = False
    signal: Signal = "prob_diff"
    penalty_form: PenaltyForm = "lagrangian"
    aggregation: Aggregation = "seq_mean"
    lambda_0: float | None = None
    eta: float | None = None
    eps: float | Literal["auto"] | None = None
    lambda_max: float | None = None
    calibration_rollouts: int = 10
    eps_auto_factor: float = 1.1
    eps_guard: Literal["clamp", "off"] = "clamp"
    floor_rollouts: int = 3

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        out = []
        if isinstance(self.eps, float) and not self.eps > 0:
            out.append(("eps", f"must be > 0 (or 'auto'), got {self.eps}"))
        if self.eta is not None and not self.eta > 0:
            out.append(("eta", f"must be > 0, got {self.eta}"))
        if self.lambda_0 is not None and self.lambda_0 < 0:
            out.append(("lambda_0", f"must be >= 0, got {self.lambda_0}"))
        if self.lambda_max is not None and self.lambda_0 is not None and self.lambda_max < self.lambda_0:
            out.append(("lambda_max", f"must be >= lambda_0 ({self.lambda_0}), got {self.lambda_max}"))
        if self.calibration_rollouts < 1:
            out.append(("calibration_rollouts", f"must be >= 1, got {self.calibration_rollouts}"))
        if self.floor_rollouts < 1:
            out.append(("floor_rollouts", f"must be >= 1, got {self.floor_rollouts}"))
        if not self.eps_auto_factor > 0:
            out.append(("eps_auto_factor", f"must be > 0, got {self.eps_auto_factor}"))
        return out


@dataclass(frozen=True)
class ShapedAdvantages:
    """Shaped token advantages (None when only measuring) and the rollout's statistics, identical on every rank
    after the reductions."""

    advantages: torch.Tensor | None
    discrepancy: float | None
    penalty_abs_mean: float
    penalty_share: float


def shape_advantages(
    batch: TokenBatch,
    seq_advantages: torch.Tensor | None,
    settings: DCGRPOSettings,
    lam: float,
    eps: float,
    seq_reduce: Reducer = local_reduce,
    batch_reduce: Reducer = local_reduce,
) -> ShapedAdvantages:
    """``A~[i, t] = A_i - penalty(c[i, t])`` for per-sequence advantages ``A_i`` (``[N]``; GRPO's normalised reward),
    flat over tokens, and ``C_bar`` of this rollout. ``seq_advantages=None`` only measures ``C_bar``.

    The penalty applies to trained tokens only (``m = 1``): untrained positions (tool output, padding) carry no
    meaningful rollout log-prob (slime stores 0.0 there) and keep ``A_i`` [ours].

    ``discrepancy`` (``C_bar``) is None when no sequence of the global batch has a trained token.
    ``penalty_share = mean|penalty| / max(mean|A|, 1e-8)`` over trained tokens shows a penalty that swamps the task.
    """
    form = settings.penalty_form
    m = batch.mask
    c = token_signal(batch, settings.signal).mul_(m)
    columns = [m, c]
    penalized = c
    if seq_advantages is not None and form == "centered":
        penalized = (c - eps).mul_(m)
        columns.append(penalized.abs())
    elif seq_advantages is not None and form == "hinge":
        penalized = (c - eps).clamp_min_(0.0)
        columns.append(penalized)
    sums = seq_reduce(batch.segments.sum(*columns), "sum")
    counts = sums[:, 0]
    valid = (counts > 0).to(sums.dtype)
    seq_mean_c = sums[:, 1] / counts.clamp_min(1.0)
    pen_abs = abs(lam) * sums[:, -1]
    adv_abs = torch.zeros_like(counts) if seq_advantages is None else seq_advantages.abs().to(sums.dtype) * counts
    totals = torch.stack([valid.sum(), (seq_mean_c * valid).sum(), counts.sum(), sums[:, 1].sum(), pen_abs.sum(),
                          adv_abs.sum()]).double()
    n_valid, sum_seq_c, n_tokens, sum_c, sum_pen, sum_adv = batch_reduce(totals, "sum").tolist()
    shaped = None
    if seq_advantages is not None:
        shaped = batch.segments.expand(seq_advantages.to(c.dtype)).add_(penalized, alpha=-lam)
    if n_valid == 0:
        return ShapedAdvantages(shaped, None, 0.0, 0.0)
    c_bar = sum_seq_c / n_valid if settings.aggregation == "seq_mean" else sum_c / n_tokens
    pen_mean = sum_pen / n_tokens if seq_advantages is not None else 0.0
    return ShapedAdvantages(shaped, c_bar, pen_mean, pen_mean / max(sum_adv / n_tokens, 1e-8))


class LagrangeController:
    """The multiplier ``lambda`` and the budget ``eps`` of DC-GRPO, updated once per rollout by dual ascent.

    ``settings`` must be resolved (no ``None`` among lambda_0, eta, eps, lambda_max): see ``config.load_config``.
    """

    def __init__(self, settings: DCGRPOSettings) -> None:
        missing = [k for k in ("lambda_0", "eta", "eps", "lambda_max") if getattr(settings, k) is None]
        if missing:
            raise ValueError(f"DC-GRPO settings are not resolved: {missing} (set the architecture or the values)")
        self.settings = settings
        self.auto = settings.eps == "auto"
        self.lam = 0.0 if self.auto else float(settings.lambda_0)
        self.eps: float | None = None if self.auto else float(settings.eps)
        self.observed: list[float] = []
        self.floor: float | None = None
        self.rollouts = 0
        self.skipped = 0

    @property
    def calibrating(self) -> bool:
        """True while ``eps: auto`` is still measuring (lambda is 0)."""
        return self.eps is None

    @property
    def shaping_lambda(self) -> float:
        """The multiplier that shapes the current rollout's advantages."""
        if self.calibrating:
            return 0.0
        return float(self.settings.lambda_0) if self.settings.penalty_form == "fixed" else self.lam

    @property
    def window(self) -> int:
        return self.settings.calibration_rollouts if self.auto else self.settings.floor_rollouts

    def update(self, c_bar: float | None) -> None:
        """Record this rollout's ``C_bar`` and take one dual-ascent step (skipped when ``c_bar`` is None/NaN)."""
        if c_bar is None or not math.isfinite(c_bar):
            self.skipped += 1
            return
        s = self.settings
        self.rollouts += 1
        if len(self.observed) < self.window:
            self.observed.append(float(c_bar))
            if len(self.observed) == self.window:
                self._set_floor(statistics.median(self.observed))
                if self.auto:
                    return
        if self.calibrating or s.penalty_form == "fixed":
            return
        self.lam = min(max(self.lam + s.eta * (c_bar - self.eps), 0.0), s.lambda_max)

    def _set_floor(self, floor: float) -> None:
        s = self.settings
        self.floor = floor
        if self.auto:
            self.eps = s.eps_auto_factor * floor
            self.lam = float(s.lambda_0)
            log.info("DC-GRPO eps calibrated: eps = %.3g x median C_bar %.4g = %.4g", s.eps_auto_factor, floor,
                     self.eps)
        elif self.eps < floor:
            clamped = s.eps_auto_factor * floor
            log.warning(
                "DC-GRPO eps=%.4g is below the rollout engine's discrepancy floor %.4g (median C_bar of the first %d "
                "rollouts): the budget is infeasible and lambda would climb to lambda_max. %s",
                self.eps, floor, len(self.observed),
                f"eps_guard=clamp: using eps={clamped:.4g}." if s.eps_guard == "clamp" else "eps_guard=off: kept.",
            )
            if s.eps_guard == "clamp":
                self.eps = clamped

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {"lam": self.lam, "eps": self.eps, "observed": list(self.observed), "floor": self.floor,
                "rollouts": self.rollouts, "skipped": self.skipped}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by ``state_dict``."""
        self.lam = float(state["lam"])
        self.eps = None if state["eps"] is None else float(state["eps"])
        self.observed = [float(v) for v in state["observed"]]
        self.floor = None if state["floor"] is None else float(state["floor"])
        self.rollouts = int(state["rollouts"])
        self.skipped = int(state["skipped"])
