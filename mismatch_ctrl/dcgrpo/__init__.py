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
with ``C_bar`` the mean over all N sequences of the batch of the per-sequence token mean
``C_i = sum_t m c / max(sum_t m, 1)`` (``seq_mean``; a sequence without trained tokens counts 0) or the global token
mean (``token_mean``). A batch without any trained token has no ``C_bar``: the dual update is skipped [ours].

``eps: auto`` [ours]: the first K rollouts run with ``lambda = 0``; then ``eps = 1.1 median(C_bar)`` and
``lambda = lambda_0``. Infeasible-budget guard [ours]: ``floor`` = median ``C_bar`` of the first 3 rollouts (the
calibration window with ``eps: auto``); if ``eps < floor``, warn and, with ``eps_guard: clamp``, use ``1.1 floor``.

Safeties for a floor that drifts [ours; docs/algorithms.md, DC-GRPO]. The paper's method is
``drift_guard: off``, ``penalty_cap: none``, ``zero_advantage: penalise`` (``configs/methods/dcgrpo_paper.yaml``).

- ``drift_guard``: a streak is W = ``drift_window`` consecutive dual updates that pressed on lambda: each ended at
  ``lambda_max`` (``saturated``) or each had ``C_bar > eps`` (``persistent``: lambda rose every time). When a streak
  completes and the violation did not halve (median ``C_bar - eps`` of its last ``W // 2`` rollouts above half the
  median of its first ``W // 2``), the budget is infeasible for the policy as it is now: ``eps <- max(eps, 1.1 median
  C_bar)`` over the streak and ``lambda <- lambda_0``; the lift is logged and counted (``drift_guard_lifts``). A
  streak whose violation halved slides on by one rollout. The violations are measured against the eps in force, so
  any change of eps (the floor guard's clamp, a resume with another eps, a lift) starts a new streak.
- ``penalty_cap: kappa``: the multiplier that shapes a rollout is ``min(lambda, kappa mean|A| / mean|c~|)`` over the
  trained tokens of the global batch (``c~`` the penalty per unit lambda), so ``mean|penalty| <= kappa mean|A|``.
- ``zero_advantage: skip``: sequences whose baseline advantage is exactly 0 (GRPO groups whose rewards are all equal)
  are not penalised: the penalty is then never the only signal of an update.
"""

from .controller import C_BAR_MAX, LagrangeController, budget, log, measured_c_bar
from .settings import (EPS_MAX, NO_CAP, PENALTY_FORMS, PENALTY_MAX, Aggregation, DCGRPOSettings, DriftGuard,
                       PenaltyForm, ZeroAdvantage)
from .shaping import ShapedAdvantages, shape_advantages, shaping_columns

__all__ = ["C_BAR_MAX", "EPS_MAX", "NO_CAP", "PENALTY_FORMS", "PENALTY_MAX", "Aggregation", "DCGRPOSettings",
           "DriftGuard", "LagrangeController", "PenaltyForm", "ShapedAdvantages", "ZeroAdvantage", "budget", "log",
           "measured_c_bar", "shape_advantages", "shaping_columns"]
