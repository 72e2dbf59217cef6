"""ACRL-style band controller: OUR INTERPRETATION of the ACRL blog post (000), not the authors' code.

The post states the mechanism in prose only: measure the sequence-level discrepancy, use it as the reference to
adjust token-level gradient ratios, two-sided (neither let it grow into collapse nor shrink it to zero).
Our reading (ALGORITHMS.md section 5):

- token weights ``w[t] = clamp(rho[t], 1 / (1 + c), 1 + c)``;
- once per rollout, ``D`` = batch median of the per-sequence mean ``|l|``; ``D_ref`` = median of ``D`` over the first
  ``calibration_rollouts`` rollouts (or given as ``reference``);
- if ``D > band_high D_ref``: ``c <- max(shrink c, c_min)``; if ``D < band_low D_ref``: ``c <- min(grow c, c_max)``.

The controller updates ``c`` from the rollout's own ``D`` before that rollout trains, so the band that weights a
rollout's tokens already reacts to it [ours].
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


from .batch import TokenBatch
from .correction import CorrectionSpec
from .dist import Reducer, local_reduce
from .sketch import global_quantiles


@dataclass(frozen=True)
class ACRLSettings:
    """The ``acrl:`` section (our interpretation of ACRL)."""

    enabled: bool = False
    c_0: float = 1.0
    c_min: float = 0.05
    c_max: float = 4.0
    band_low: float = 0.7
    band_high: float = 1.5
    shrink: float = 0.8
    grow: float = 1.25
    reference: float | None = None
    calibration_rollouts: int = 10

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        out = []
        if not 0 < self.c_min <= self.c_0 <= self.c_max:
            out.append(("c_0", f"need 0 < c_min <= c_0 <= c_max, got {self.c_min}, {self.c_0}, {self.c_max}"))
        if not 0 < self.band_low < 1 < self.band_high:
            out.append(("band_low", f"need 0 < band_low < 1 < band_high, got {self.band_low}, {self.band_high}"))
        if not 0 < self.shrink < 1:
            out.append(("shrink", f"must be in (0, 1), got {self.shrink}"))
        if not self.grow > 1:
            out.append(("grow", f"must be > 1, got {self.grow}"))
        if self.reference is not None and not self.reference > 0:
            out.append(("reference", f"must be > 0 or null, got {self.reference}"))
        if self.calibration_rollouts < 1:
            out.append(("calibration_rollouts", f"must be >= 1, got {self.calibration_rollouts}"))
        return out


def sequence_level_discrepancy(batch: TokenBatch, seq_reduce: Reducer = local_reduce,
                               batch_reduce: Reducer = local_reduce) -> float | None:
    """``D``: median over all sequences with trained tokens of the per-sequence mean ``|l|`` (None if none)."""
    m = batch.mask
    sums = seq_reduce(batch.segments.sum(m, batch.log_ratio.abs() * m), "sum")
    counts = sums[:, 0]
    seq_mean = sums[:, 1] / counts.clamp_min(1.0)
    (median,) = global_quantiles(seq_mean, [0.5], batch_reduce, weights=(counts > 0).double())
    return None if median != median else median


class BandController:
    """The half-width ``c`` of the ACRL clip band, updated once per rollout (our interpretation)."""

    def __init__(self, settings: ACRLSettings) -> None:
        self.settings = settings
        self.c = settings.c_0
        self.reference = settings.reference
        self.observed: list[float] = []
        self.last: float | None = None

    def correction(self) -> CorrectionSpec:
        """The token-level IS clip ``[1 / (1 + c), 1 + c]`` for the current ``c``."""
        return CorrectionSpec(is_level="token", is_mode="clip", is_low=1.0 / (1.0 + self.c), is_high=1.0 + self.c)

    def update(self, d: float | None) -> None:
        """Observe this rollout's ``D`` and move ``c`` if ``D`` left the band around ``D_ref``."""
        if d is None:
            return
        s = self.settings
        self.last = d
        if self.reference is None:
            self.observed.append(d)
            if len(self.observed) == s.calibration_rollouts:
                self.reference = statistics.median(self.observed)
            return
        if d > s.band_high * self.reference:
            self.c = max(s.shrink * self.c, s.c_min)
        elif d < s.band_low * self.reference:
            self.c = min(s.grow * self.c, s.c_max)

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {"c": self.c, "reference": self.reference, "observed": list(self.observed), "last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a snapshot taken by ``state_dict``."""
        self.c = float(state["c"])
        self.reference = None if state["reference"] is None else float(state["reference"])
        self.observed = [float(v) for v in state["observed"]]
        self.last = None if state["last"] is None else float(state["last"])
