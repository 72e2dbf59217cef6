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

Safeties for a floor that drifts [ours; issue 17, ALGORITHMS.md section 2]. The paper's method is
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

from __future__ import annotations

import dataclasses
import json
import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Literal, Mapping, get_args

import torch

from .batch import LOG_RATIO_BOUND
from .errors import StateError
from .seqstats import BatchTotals, Columns, Reduced, SeqStats, Tokens
from .signals import SIGNAL_COLUMNS, Signal
from .state import count, either, list_of, literal, nonnegative, number, optional, positive, validated

log = logging.getLogger(__name__)

PenaltyForm = Literal["lagrangian", "centered", "hinge", "fixed"]
Aggregation = Literal["seq_mean", "token_mean"]
DriftGuard = Literal["persistent", "saturated", "off"]
ZeroAdvantage = Literal["penalise", "skip"]
NO_CAP = "none"
PENALTY_FORMS: tuple[str, ...] = get_args(PenaltyForm)
EPS_MAX = 1.0
"""Upper bound (exclusive) of a numeric ``eps`` for every signal [ours]: ``prob_diff`` never exceeds 1, and a mean
``|log ratio|``, ``|rho - 1|`` or K3 of 1 is a broken engine, not a budget."""


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
    drift_guard: DriftGuard = "persistent"
    drift_window: int = 10
    penalty_cap: float | Literal["none"] = 1.0
    zero_advantage: ZeroAdvantage = "skip"

    HELP = {
        "enabled": "shape GRPO advantages by the discrepancy penalty and run dual ascent on lambda",
        "signal": "token discrepancy c: prob_diff |p_train - p_rollout| (paper), log_diff, ratio_diff, k3",
        "penalty_form": "lagrangian A - lambda c (paper), centered, hinge, fixed (Dual-GRPO: lambda_0, no update)",
        "aggregation": "C_bar over the batch: seq_mean (mean of per-sequence means) or token_mean",
        "lambda_0": "initial multiplier (architecture default)",
        "eta": "dual step size: lambda += eta (C_bar - eps) each rollout (architecture default)",
        "eps": "discrepancy budget (architecture default) or auto (1.1 x median C_bar of the first rollouts)",
        "lambda_max": "upper clip of lambda [ours]",
        "calibration_rollouts": "rollouts measured by eps: auto, with lambda 0 [ours]",
        "eps_auto_factor": "eps = factor x median C_bar (eps: auto, the floor guard, the drift guard) [ours]",
        "eps_guard": "clamp: raise eps to 1.1 x the engine's floor when it is below it; off: the paper [ours]",
        "floor_rollouts": "rollouts whose median C_bar is the floor the eps guard checks [ours]",
        "drift_guard": "lift eps to the drifted floor when a streak of pressing updates does not halve the violation: "
                       "persistent (C_bar > eps every update), saturated (lambda at lambda_max), off (paper) [ours]",
        "drift_window": "length W of the drift guard's streak, in rollouts [ours]",
        "penalty_cap": "largest mean|penalty| / mean|A| over trained tokens (lowers the shaping lambda); none: the "
                       "paper [ours]",
        "zero_advantage": "skip: no penalty on sequences whose advantage is 0 (groups with equal rewards); penalise: "
                          "the paper [ours]",
    }
    """One line per key: what it does, and which value is the paper's (``mismatch-ctrl check-config`` prints it)."""

    def explain(self) -> list[str]:
        """``key: value  # what it does`` for every key (``mismatch-ctrl check-config``)."""
        pairs = [f"{f.name}: {json.dumps(getattr(self, f.name))}" for f in dataclasses.fields(self)]
        width = max(map(len, pairs))
        return [f"{pair:<{width}}  # {self.HELP[f.name]}" for pair, f in zip(pairs, dataclasses.fields(self))]

    @property
    def cap(self) -> float | None:
        """``penalty_cap`` as a number, None without a cap."""
        return None if self.penalty_cap == NO_CAP else float(self.penalty_cap)

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        out = []
        if isinstance(self.eps, float) and not 0 < self.eps < EPS_MAX:
            out.append(("eps", f"must be > 0 and < {EPS_MAX} (or 'auto'), got {self.eps}: C_bar of a working stack is "
                               "about 1e-3 to 1e-2 and |p_train - p_rollout| <= 1, so eps >= 1 keeps lambda at 0 and "
                               "DC-GRPO off; measure it with mismatch-ctrl analyze or use eps: auto"))
        if self.eta is not None and not self.eta > 0:
            out.append(("eta", f"must be > 0, got {self.eta}"))
        if self.lambda_0 is not None and self.lambda_0 < 0:
            out.append(("lambda_0", f"must be >= 0, got {self.lambda_0}"))
        if self.lambda_max is not None and not self.lambda_max > 0:
            out.append(("lambda_max", f"must be > 0 (lambda is clipped to [0, lambda_max]), got {self.lambda_max}"))
        elif self.lambda_max is not None and self.lambda_0 is not None and self.lambda_max < self.lambda_0:
            out.append(("lambda_max", f"must be >= lambda_0 ({self.lambda_0}), got {self.lambda_max}"))
        if self.calibration_rollouts < 1:
            out.append(("calibration_rollouts", f"must be >= 1, got {self.calibration_rollouts}"))
        if self.floor_rollouts < 1:
            out.append(("floor_rollouts", f"must be >= 1, got {self.floor_rollouts}"))
        if not self.eps_auto_factor > 1:
            out.append(("eps_auto_factor", f"must be > 1, got {self.eps_auto_factor}: eps is set to factor x the "
                                           "measured discrepancy floor (eps: auto, the floor guard's clamp, the drift "
                                           "guard's lift); at or below the floor the budget is infeasible and lambda "
                                           "climbs to lambda_max"))
        if self.drift_window < 2:
            out.append(("drift_window", f"must be >= 2 (the guard compares the two halves of the window), got "
                                        f"{self.drift_window}"))
        if self.cap is not None and not self.cap > 0:
            out.append(("penalty_cap", f"must be > 0 (the largest mean|penalty| / mean|A|), or 'none' for no cap "
                                       f"(the paper), got {self.penalty_cap}"))
        return out


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


def budget(value: Any) -> float:
    """A state check of the configured ``eps``: in ``(0, EPS_MAX)``, as the configuration requires."""
    out = positive(value)
    if not out < EPS_MAX:
        raise ValueError(f"must be < {EPS_MAX:g} (a mean discrepancy of {EPS_MAX:g} or more is a broken engine, not a "
                         f"budget), got {out:g}")
    return out


C_BAR_MAX = math.exp(LOG_RATIO_BOUND)
"""The largest ``C_bar`` any signal gives: log-ratios are clamped to ``[-20, 20]``, so ``|rho - 1|`` and K3 stay below
``exp(20)``; ``prob_diff`` below 1 and ``|log ratio|`` below 20."""


def measured_c_bar(value: Any) -> float:
    """A state check: a measured ``C_bar`` (calibration, floor, drift streak), in ``[0, C_BAR_MAX]``."""
    out = nonnegative(value)
    if not out <= C_BAR_MAX:
        raise ValueError(f"must be <= exp({LOG_RATIO_BOUND:g}) = {C_BAR_MAX:.4g}, the largest discrepancy a signal "
                         f"measures, got {out:g}")
    return out


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
        self.streak: list[float] = []
        """``C_bar`` of the consecutive dual updates that pressed on lambda (the drift guard's streak)."""
        self.lifts = 0

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
                eps = self.eps
                self._set_floor(statistics.median(self.observed))
                if self.eps != eps:
                    self.streak.clear()  # its violations were measured against the old eps
                if self.auto:
                    return
        if self.calibrating or s.penalty_form == "fixed":
            return
        self.lam = min(max(self.lam + s.eta * (c_bar - self.eps), 0.0), s.lambda_max)
        if s.drift_guard != "off":
            self._watch(c_bar)

    def _watch(self, c_bar: float) -> None:
        """The drift guard: lift eps to the floor the policy has drifted to when pressing on lambda does not bring
        the violation down (module docstring)."""
        s = self.settings
        pressed = self.lam >= s.lambda_max if s.drift_guard == "saturated" else c_bar > self.eps
        if not pressed:
            self.streak.clear()
            return
        self.streak.append(c_bar)
        if len(self.streak) < s.drift_window:
            return
        half = s.drift_window // 2
        first = statistics.median(self.streak[:half]) - self.eps
        last = statistics.median(self.streak[-half:]) - self.eps
        if last <= 0.5 * first:
            self.streak.pop(0)
            return
        floor = statistics.median(self.streak)
        lifted = max(self.eps, s.eps_auto_factor * floor)
        log.warning(
            "DC-GRPO drift guard (%s): lambda has been pressed for %d rollouts (now %.4g, lambda_max %.4g) and the "
            "violation C_bar - eps did not halve (%.4g -> %.4g): the discrepancy floor has drifted above eps. eps "
            "%.4g -> %.4g (%.3g x median C_bar %.4g), lambda -> lambda_0=%.4g. Lift %d.", s.drift_guard,
            len(self.streak), self.lam, s.lambda_max, first, last, self.eps, lifted, s.eps_auto_factor, floor,
            s.lambda_0, self.lifts + 1)
        self.eps, self.lam = lifted, float(s.lambda_0)
        self.lifts += 1
        self.streak.clear()
        self._warn_if_no_budget("the drift guard's lift")

    def _set_floor(self, floor: float) -> None:
        s = self.settings
        self.floor = floor
        if self.auto:
            self.eps = s.eps_auto_factor * floor
            self.lam = float(s.lambda_0)
            log.info("DC-GRPO eps calibrated: eps = %.3g x median C_bar %.4g = %.4g", s.eps_auto_factor, floor,
                     self.eps)
            self._warn_if_no_budget("eps: auto")
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
                self._warn_if_no_budget("the infeasible-budget guard")

    def _warn_if_no_budget(self, source: str) -> None:
        if self.eps >= EPS_MAX:
            log.warning("DC-GRPO eps = %.4g (set by %s) is no budget (>= %g): the rollout engine's discrepancy is that "
                        "of a broken engine, and DC-GRPO cannot act; check the engine with mismatch-ctrl analyze",
                        self.eps, source, EPS_MAX)

    STATE = {"lam": number, "eps": optional(nonnegative), "eps_setting": either(literal("auto"), budget),
             "observed": list_of(measured_c_bar), "floor": optional(measured_c_bar), "rollouts": count,
             "skipped": count, "streak": list_of(measured_c_bar), "lifts": count}

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {"lam": self.lam, "eps": self.eps, "eps_setting": self.settings.eps, "observed": list(self.observed),
                "floor": self.floor, "rollouts": self.rollouts, "skipped": self.skipped,
                "streak": list(self.streak), "lifts": self.lifts}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "dcgrpo") -> None:
        """Restore a snapshot taken by ``state_dict``, validated against the current settings (state protocol of
        :mod:`mismatch_ctrl.state`).

        - ``lam`` outside ``[0, lambda_max]`` of the current settings is clipped, with a warning naming both values.
        - ``eps``: a changed numeric eps applies from now on, with a warning naming both values (the infeasible-budget
          guard checks it against the saved floor); a switch between ``auto`` and a number is an error, because the
          saved run either has no calibration to resume or would keep an eps the configuration no longer asks for.
        - the calibration window (``calibration_rollouts`` / ``floor_rollouts``) must be the one of the saved run, and
          the ``observed`` ``C_bar`` are the first of its ``rollouts``; a numeric run's ``eps`` is never below its
          ``eps_setting`` (the guards only raise it).
        - the drift guard's streak keeps its newest ``drift_window - 1`` rollouts (a shorter window may fire at the
          next update), with a warning when that drops some; a changed eps starts a new streak.
        """
        s = self.settings
        state = validated(state, self.STATE, where)
        saved_setting = state["eps_setting"]
        if (saved_setting == "auto") != self.auto:
            raise StateError(f"{where}.eps_setting: the saved run used eps {saved_setting!r} but the configuration "
                             f"has eps {s.eps!r}; a switch between 'auto' and a number cannot be resumed: resume with "
                             "the run's eps setting")
        if state["eps"] is None and not self.auto:
            raise StateError(f"{where}.eps: null (still calibrating) although the saved run used eps {saved_setting}")
        observed, floor = len(state["observed"]), state["floor"]
        fits = observed < self.window if floor is None else observed == self.window
        if not fits or (self.auto and (state["eps"] is None) != (floor is None)):
            key = "calibration_rollouts" if self.auto else "floor_rollouts"
            raise StateError(f"{where}.observed: {observed} rollouts observed and floor {floor} do not fit "
                             f"dcgrpo.{key} = {self.window} of the configuration: keep {key} as it was when the run "
                             "started")
        if observed != min(state["rollouts"], self.window):
            raise StateError(f"{where}.rollouts: {state['rollouts']} rollouts updated the controller but {observed} "
                             f"C_bar were observed (the first {self.window} of them are kept): the state is "
                             "inconsistent; the file was edited")
        if saved_setting != "auto" and state["eps"] < saved_setting:
            raise StateError(f"{where}.eps: {state['eps']:g} is below the run's eps {saved_setting:g}, which the "
                             "infeasible-budget and drift guards only ever raise: the file was edited")
        if floor is not None and floor != statistics.median(state["observed"]):
            raise StateError(f"{where}.floor: {floor:g} is not the median {statistics.median(state['observed']):g} of "
                             "the observed C_bar it was measured from: the file was edited")
        keep = s.drift_window - 1
        if len(state["streak"]) > keep:
            log.warning("%s.streak: %d rollouts saved, more than drift_window - 1 = %d of the configuration: kept "
                        "the newest %d", where, len(state["streak"]), keep, keep)
        self.observed, self.floor = state["observed"], state["floor"]
        self.rollouts, self.skipped = state["rollouts"], state["skipped"]
        self.streak, self.lifts = state["streak"][-keep:], state["lifts"]
        self.eps = state["eps"]
        if not self.auto and saved_setting != s.eps:
            log.warning("%s: eps changed from %.4g (saved run) to %.4g (configuration): %.4g applies from now on",
                        where, saved_setting, s.eps, s.eps)
            self.eps = float(s.eps)
            if self.floor is not None:
                self._set_floor(self.floor)
            if self.eps != state["eps"]:
                self.streak = []  # its violations were measured against the saved eps
        elif self.eps is not None:
            self._warn_if_no_budget(f"the saved run, {where}")
        self.lam = state["lam"]
        if not 0.0 <= self.lam <= s.lambda_max:
            clipped = min(max(self.lam, 0.0), s.lambda_max)
            log.warning("%s: saved lambda %.6g is outside [0, lambda_max=%.6g] of the configuration: clipped to %.6g",
                        where, self.lam, s.lambda_max, clipped)
            self.lam = clipped
