"""DC-GRPO's dual ascent (:mod:`mismatch_ctrl.dcgrpo`): the multiplier ``lambda`` and the budget ``eps``, with
``eps: auto``, the infeasible-budget guard and the drift guard; its state and how it is validated on resume."""

from __future__ import annotations

import logging
import math
import statistics
from typing import Any, Mapping

from ..batch import LOG_RATIO_BOUND
from ..errors import StateError
from ..state import count, either, list_of, literal, nonnegative, number, optional, positive, validated
from ..signals import SIGNAL_MAX
from .settings import EPS_MAX, DCGRPOSettings

log = logging.getLogger("mismatch_ctrl.dcgrpo")
"""The logger of DC-GRPO's warnings (``analyze``'s replay silences it)."""


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


def infeasible_budget_text(eps: float, floor: float, rollouts: int, s: DCGRPOSettings) -> str:
    """The infeasible-budget warning, logged once per run when the floor is measured: the numbers, why the budget
    cannot be met, what the guard does about it and what the user can do (ALGORITHMS.md section 2)."""
    why = (f"DC-GRPO eps={eps:.4g} is below the rollout engine's discrepancy floor {floor:.4g} (median C_bar of the "
           f"first {rollouts} rollouts, before RL moves the policy): no policy meets that budget; unguarded, lambda "
           f"climbs to lambda_max={s.lambda_max:g} and DC-GRPO acts as a constant penalty.")
    if s.eps_guard == "clamp":
        act = f"eps_guard=clamp: using eps={s.eps_auto_factor * floor:.4g} ({s.eps_auto_factor:g} x the floor)."
    else:
        act = "eps_guard=off: kept."
    return f"{why}\n  {act} To choose eps: eps: auto, or an eps above the floor (mismatch-ctrl analyze measures it)."


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
            log.warning(infeasible_budget_text(self.eps, floor, len(self.observed), s))
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
        highest = s.eps_auto_factor * SIGNAL_MAX[s.signal]
        if state["eps"] is not None and state["eps"] > max(highest, saved_setting if saved_setting != "auto" else 0):
            raise StateError(f"{where}.eps: {state['eps']:g} is above {highest:.4g}, the most the guards can lift eps "
                             f"to (eps_auto_factor x the largest C_bar of signal {s.signal}): the file was edited")
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
