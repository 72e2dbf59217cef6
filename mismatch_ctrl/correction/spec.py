"""The settings of a rollout correction (:mod:`mismatch_ctrl.correction`): the IS and RS stages, their levels, modes
and bounds, and which values are refused."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

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
