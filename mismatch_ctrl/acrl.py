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

import logging
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping

from .correction import CorrectionSpec
from .errors import StateError
from .seqstats import BatchTotals, Columns, Reduced, SeqStats
from .signals import SIGNAL_COLUMNS
from .sketch import HIGH, histogram_quantiles, log_histogram
from .state import list_of, nonnegative, optional, positive, validated

log = logging.getLogger(__name__)


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


ACRL_COLUMNS = Columns({"log_diff": SIGNAL_COLUMNS["log_diff"]})
"""The column :class:`SequenceDiscrepancy` reads."""


class SequenceDiscrepancy:
    """``D``: median over all sequences with trained tokens of the per-sequence mean ``|l|`` (``value``; None if no
    sequence of the global batch has trained tokens), from a log-histogram summed over the data-parallel ranks
    (:mod:`mismatch_ctrl.sketch`: within one bin, ~6%, of the exact median), read on the host (reduce with
    ``fetch=True``)."""

    def __init__(self, stats: SeqStats) -> None:
        self.stats = stats
        self.value: float | None = None

    def add_to(self, totals: BatchTotals) -> None:
        stats = self.stats
        totals.add("sum", "acrl.histogram", log_histogram(stats.mean("log_diff"), stats.valid))

    def read(self, reduced: Reduced) -> None:
        (median,) = histogram_quantiles(reduced["acrl.histogram"].tolist(), [0.5])
        self.value = None if math.isnan(median) else median


def discrepancy(value: Any) -> float:
    """A state check: a ``D`` (or a median of them) as the histogram reports it, within ``[0, HIGH]`` (a saved one
    beyond is corrupt: ``D`` of clamped log-ratios never exceeds 20)."""
    out = nonnegative(value)
    if out > HIGH:
        raise ValueError(f"must be <= {HIGH:g} (D is a median per-sequence mean |log-ratio|), got {out:g}")
    return out


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

    STATE = {"c": positive, "reference": optional(lambda value: discrepancy(positive(value))),
             "observed": list_of(discrepancy), "last": optional(discrepancy)}

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {"c": self.c, "reference": self.reference, "observed": list(self.observed), "last": self.last}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "acrl") -> None:
        """Restore a snapshot taken by ``state_dict``, validated against the current settings (state protocol of
        :mod:`mismatch_ctrl.state`): ``c`` outside ``[c_min, c_max]`` is clipped with a warning naming both values;
        a ``reference`` given in the configuration replaces a different saved one, with a warning."""
        s = self.settings
        state = validated(state, self.STATE, where)
        if s.reference is None and state["reference"] is None and len(state["observed"]) >= s.calibration_rollouts:
            raise StateError(f"{where}.observed: {len(state['observed'])} rollouts observed without a reference, but "
                             f"acrl.calibration_rollouts is {s.calibration_rollouts}: keep it as it was when the run "
                             "started")
        self.observed, self.last, self.reference = state["observed"], state["last"], state["reference"]
        if s.reference is not None and state["reference"] != s.reference:
            log.warning("%s: reference changed from %s (saved run) to %.6g (configuration): %.6g applies from now on",
                        where, state["reference"], s.reference, s.reference)
            self.reference = s.reference
        self.c = state["c"]
        if not s.c_min <= self.c <= s.c_max:
            clipped = min(max(self.c, s.c_min), s.c_max)
            log.warning("%s: saved c %.6g is outside [c_min=%.6g, c_max=%.6g] of the configuration: clipped to %.6g",
                        where, self.c, s.c_min, s.c_max, clipped)
            self.c = clipped
