"""Which rule changed DC-GRPO's eps, and on what evidence, observed on the controller around each update.

:class:`EpsWatch` takes a snapshot of a :class:`~mismatch_ctrl.dcgrpo.LagrangeController` before its update and
compares it with the controller after: the controller itself is not touched. One update changes eps by at most one
of these rules (a change of eps starts a new drift-guard streak, so no lift follows a clamp in the same update;
docs/algorithms.md section 2):

- ``calibration``: ``eps: auto`` measured its window, eps = factor x median C_bar (the floor);
- ``infeasible_budget``: the floor was measured, the chosen eps was below it and ``eps_guard: clamp`` raised it to
  factor x floor;
- ``drift_guard``: a streak of ``drift_window`` updates pressed on lambda (``persistent``: C_bar > eps each time;
  ``saturated``: lambda at lambda_max each time) without halving the violation; eps = max(eps, factor x median C_bar
  of the streak) and lambda back to lambda_0.

Each change is a JSON-able dict ``{"rollout_id", "old_eps", "new_eps", "guard", "evidence"}``; ``evidence`` holds the
numbers the rule acted on (for the drift guard its mode, the streak's rollouts, median C_bar, the violation of each
half of the streak, lambda before the update and lambda_max).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from ..dcgrpo import LagrangeController

CALIBRATION, INFEASIBLE_BUDGET, DRIFT_GUARD = "calibration", "infeasible_budget", "drift_guard"


@dataclass(frozen=True)
class _Before:
    """What the controller held before an update."""

    eps: float | None
    floor: float | None
    lam: float
    lifts: int
    streak: tuple[float, ...]
    rollouts: int


class EpsWatch:
    """Records every eps change of one controller: call :meth:`before` before its update and :meth:`after` after."""

    def __init__(self, controller: LagrangeController) -> None:
        self.controller = controller
        self.changes: list[dict[str, Any]] = []
        self._updated: list[int] = []
        """Ids of the rollouts whose C_bar the controller took (the drift guard's streak is a suffix of them)."""
        self._before: _Before | None = None

    def before(self) -> None:
        """Snapshot the controller before its update."""
        c = self.controller
        self._before = _Before(c.eps, c.floor, c.lam, c.lifts, tuple(c.streak), c.rollouts)

    def after(self, rollout_id: int, c_bar: float | None) -> list[dict[str, Any]]:
        """The eps change of the update of ``rollout_id`` (whose ``C_bar`` the update took), as a list of none or
        one; it is also appended to :attr:`changes`."""
        if self._before is None:
            raise RuntimeError("EpsWatch.after() without before(): take the snapshot before the update")
        b, c, s = self._before, self.controller, self.controller.settings
        self._before = None
        if c.rollouts == b.rollouts:
            return []
        found: list[dict[str, Any]] = []
        if b.floor is None and c.floor is not None:
            window = {"median_c_bar": c.floor, "factor": s.eps_auto_factor, "measured_rollouts": c.window}
            if c.auto:
                found.append(self._change(rollout_id, None, c.eps, CALIBRATION, window))
            elif b.eps < c.floor and s.eps_guard == "clamp":
                found.append(self._change(rollout_id, b.eps, c.eps, INFEASIBLE_BUDGET, window))
        if c.lifts > b.lifts:  # never after a calibration or a clamp: an eps change starts a new streak
            evidence = self._drift_evidence(b, rollout_id, c_bar)
            found.append(self._change(rollout_id, b.eps, c.eps, DRIFT_GUARD, evidence))
        self._updated.append(rollout_id)
        self.changes += found
        return found

    def _drift_evidence(self, b: _Before, rollout_id: int, c_bar: float) -> dict[str, Any]:
        """The streak the drift guard lifted eps on (the updates before this one that it held, and this one), judged
        against the eps in force when it fired."""
        s = self.controller.settings
        streak = [*b.streak, c_bar]
        rollouts = [*self._updated[len(self._updated) - len(b.streak):], rollout_id]
        half = s.drift_window // 2
        return {"mode": s.drift_guard, "window": s.drift_window, "rollouts": rollouts,
                "median_c_bar": statistics.median(streak), "factor": s.eps_auto_factor,
                "violation_first_half": statistics.median(streak[:half]) - b.eps,
                "violation_last_half": statistics.median(streak[-half:]) - b.eps,
                "lambda_before": b.lam, "lambda_max": s.lambda_max}

    @staticmethod
    def _change(rollout_id: int, old: float | None, new: float, guard: str, evidence: dict[str, Any]
                ) -> dict[str, Any]:
        return {"rollout_id": rollout_id, "old_eps": old, "new_eps": new, "guard": guard, "evidence": evidence}
