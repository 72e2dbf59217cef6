"""The ``dcgrpo:`` section of the method YAML: DC-GRPO's settings, their meaning and their valid values (the formulas
are in :mod:`mismatch_ctrl.dcgrpo`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Literal, get_args

from ..signals import SIGNAL_MAX, Signal

PenaltyForm = Literal["lagrangian", "centered", "hinge", "fixed"]
Aggregation = Literal["seq_mean", "token_mean"]
DriftGuard = Literal["persistent", "saturated", "off"]
ZeroAdvantage = Literal["penalise", "skip"]
NO_CAP = "none"
PENALTY_FORMS: tuple[str, ...] = get_args(PenaltyForm)
PENALTY_MAX = 3.4028234663852886e38 / 2**24
"""The largest penalty ``lambda c`` a token may carry [ours]: the largest float32 over 2^24, so that the loss's sums
over the tokens of a batch (slime sums per sequence, then over the micro-batch) stay finite in float32."""
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
        elif self.lambda_max is not None and self.lambda_max * SIGNAL_MAX[self.signal] > PENALTY_MAX:
            out.append(("lambda_max", f"must be at most {PENALTY_MAX / SIGNAL_MAX[self.signal]:.4g} with signal "
                                      f"{self.signal} (whose c reaches {SIGNAL_MAX[self.signal]:.4g}), got "
                                      f"{self.lambda_max:g}: a penalty lambda c beyond {PENALTY_MAX:.3g} per token "
                                      "overflows the loss's float32 sums"))
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
