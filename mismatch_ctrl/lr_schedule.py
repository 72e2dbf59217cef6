"""Length-triggered learning-rate decay (ALGORITHMS.md section 4; paper 002, "Beyond Precision").

Schedule, with t the training iteration (= rollout id, from 0):

    lr_t = max(lr_0 * 0.5 ** k(t), lr_min),  lr_min = 0.1 lr_0,  k(t) = 0 before the first halving at h,
    then 1 + floor((t - h) / T_d)

``T_d`` is given (``period``), and then ``h = T_d``: halvings at T_d, 2 T_d, ... [paper]; or derived from the
response-length surge, ``T_d = round(1.8 s)`` with ``s`` the surge onset [paper: 4B surge ~110 -> best T_d 204;
8B surge ~90 -> 160]; then ``h = max(T_d, detection step)``: a surge detected after T_d has passed halves at once.

Surge detector [ours; the paper gives no detection code]: ``L_t`` = mean response length of rollout t. Short mean
``S_t`` = trimmed mean of the last ``w`` rollouts (drop the min and the max when w >= 5); baseline ``B`` = median of
the ``W`` rollouts ending ``g`` rollouts earlier, frozen at the trigger. Trigger when ``S_t / B >= r`` and
``S_t - B >= max(min_increase_tokens, min_increase_fraction * max_length)`` for ``m`` consecutive rollouts; onset
``s`` = first rollout of that rise with ``S / B >= onset_ratio``. When truncation caps the ratio (``r B`` close to the
maximum length) the threshold becomes ``max(min(r, 0.9 max_length / B), onset_ratio)``, logged as
``surge_ratio_threshold``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping

from .errors import ConfigError, StateError
from .state import count, list_of, mapping, nonnegative, optional, positive, validated

TRUNCATION_HEADROOM = 0.9
"""Fraction of the maximum response length a mean length can plausibly reach (used to cap the trigger ratio)."""


@dataclass(frozen=True)
class SurgeSettings:
    """The ``lr_decay.surge:`` section."""

    short_window: int = 5
    baseline_window: int = 20
    gap: int = 10
    ratio: float = 2.0
    onset_ratio: float = 1.3
    min_increase_tokens: float = 300.0
    min_increase_fraction: float = 0.05
    consecutive: int = 3
    warmup: int = 0
    period_multiplier: float = 1.8

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        out = []
        for key in ("short_window", "baseline_window", "consecutive"):
            if getattr(self, key) < 1:
                out.append((key, f"must be >= 1, got {getattr(self, key)}"))
        for key in ("gap", "warmup"):
            if getattr(self, key) < 0:
                out.append((key, f"must be >= 0, got {getattr(self, key)}"))
        if not self.onset_ratio > 1:
            out.append(("onset_ratio", f"must be > 1, got {self.onset_ratio}"))
        if self.ratio < self.onset_ratio:
            out.append(("ratio", f"must be >= onset_ratio ({self.onset_ratio}), got {self.ratio}"))
        if not self.period_multiplier > 0:
            out.append(("period_multiplier", f"must be > 0, got {self.period_multiplier}"))
        for key in ("min_increase_tokens", "min_increase_fraction"):
            if not getattr(self, key) >= 0:
                out.append((key, f"must be >= 0 (the least rise over the baseline that counts as a surge), got "
                                 f"{getattr(self, key)}"))
        return out

    def first_trigger(self) -> int:
        """The first rollout (counted from the detector's first) at which the detector can trigger: its baseline
        window ends ``gap`` rollouts back (and ``warmup`` has passed), then ``consecutive`` rising rollouts."""
        return max(self.baseline_window + self.gap - 1, self.warmup) + self.consecutive - 1


@dataclass(frozen=True)
class LengthDecaySettings:
    """The ``lr_decay:`` section: ``period`` is a number of rollouts or ``auto`` (from the surge detector)."""

    enabled: bool = False
    period: int | Literal["auto"] = "auto"
    factor: float = 0.5
    min_scale: float = 0.1
    surge: SurgeSettings = field(default_factory=SurgeSettings)

    def problems(self) -> list[tuple[str, str]]:
        """(key, message) pairs for every invalid value; the config loader raises on the first."""
        out = []
        if isinstance(self.period, int) and self.period < 1:
            out.append(("period", f"must be >= 1 rollout or 'auto', got {self.period}"))
        if not 0 < self.factor < 1:
            out.append(("factor", f"must be in (0, 1), got {self.factor}"))
        if not 0 < self.min_scale < 1:
            out.append(("min_scale", f"must be in (0, 1), got {self.min_scale}: the learning rate never falls below "
                                     "min_scale x --lr, so 1 would leave lr_decay inert"))
        return out


def decay_scale(step: int, period: int | None, first: int | None = None, factor: float = 0.5,
                min_scale: float = 0.1) -> float:
    """LR multiplier at ``step``: ``max(factor ** k, min_scale)`` with halvings at ``first, first + period, ...``.

    ``first`` defaults to ``period``; ``period=None`` means no decay (1.0).
    """
    if period is None:
        return 1.0
    first = period if first is None else first
    halvings = 0 if step < first else 1 + (step - first) // period
    return max(factor ** halvings, min_scale)


class SurgeDetector:
    """Detects the response-length surge from one mean length per rollout; see the module docstring."""

    def __init__(self, settings: SurgeSettings) -> None:
        self.settings = settings
        self.start: int | None = None
        self.lengths: list[float] = []
        self.short_means: list[float] = []
        self.baseline: float | None = None
        self.ratio: float | None = None
        self.threshold: float = settings.ratio
        self.streak = 0
        self.onset: int | None = None
        self.triggered_at: int | None = None

    @property
    def triggered(self) -> bool:
        return self.triggered_at is not None

    def _short_mean(self) -> float:
        window = self.lengths[-self.settings.short_window:]
        if len(window) >= 5:
            window = sorted(window)[1:-1]
        return sum(window) / len(window)

    def update(self, step: int, mean_length: float, max_length: float | None = None) -> None:
        """Observe the mean response length of rollout ``step`` (consecutive steps)."""
        s = self.settings
        if self.start is None:
            self.start = step
        self.lengths.append(float(mean_length))
        self.short_means.append(self._short_mean())
        i = len(self.lengths) - 1
        if self.triggered:
            self.ratio = self.short_means[-1] / self.baseline if self.baseline else None
            return
        end = i - s.gap
        if end + 1 < s.baseline_window or i < s.warmup:
            return
        self.baseline = statistics.median(self.lengths[end + 1 - s.baseline_window:end + 1])
        if self.baseline <= 0:
            self.ratio = None
            return
        short = self.short_means[-1]
        self.ratio = short / self.baseline
        self.threshold = s.ratio
        min_increase = s.min_increase_tokens
        if max_length:
            min_increase = max(min_increase, s.min_increase_fraction * max_length)
            self.threshold = max(min(s.ratio, TRUNCATION_HEADROOM * max_length / self.baseline), s.onset_ratio)
        rising = self.ratio >= self.threshold and short - self.baseline >= min_increase
        self.streak = self.streak + 1 if rising else 0
        if self.streak >= s.consecutive:
            self.triggered_at = step
            j = i
            while j > 0 and self.short_means[j - 1] / self.baseline >= s.onset_ratio:
                j -= 1
            self.onset = self.start + j

    STATE = {"start": optional(count), "lengths": list_of(nonnegative), "short_means": list_of(nonnegative),
             "baseline": optional(nonnegative), "ratio": optional(nonnegative), "threshold": positive,
             "streak": count, "onset": optional(count), "triggered_at": optional(count)}

    def state_dict(self) -> dict[str, Any]:
        """A snapshot (lists copied: later updates do not change it)."""
        return {k: list(v) if isinstance(v, list) else v for k, v in ((k, getattr(self, k)) for k in self.STATE)}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "surge") -> None:
        """Restore a snapshot taken by ``state_dict`` (state protocol of :mod:`mismatch_ctrl.state`): the length
        history is required, a detector cannot resume from nothing; the streak, the onset and the trigger lie within
        it."""
        state = validated(state, self.STATE, where)
        lengths, start, onset, triggered = len(state["lengths"]), state["start"], state["onset"], state["triggered_at"]
        if len(state["short_means"]) != lengths or (start is None) != (not lengths):
            raise StateError(f"{where}.short_means: {len(state['short_means'])} entries for {lengths} "
                             f"lengths (start {start}): the history is inconsistent")
        if state["streak"] > lengths:
            raise StateError(f"{where}.streak: {state['streak']} rising rollouts in a history of {lengths}: the "
                             "history is inconsistent")
        if triggered is not None and (onset is None or state["baseline"] is None):
            raise StateError(f"{where}.triggered_at: {triggered} without an onset and a baseline")
        if onset is not None and not (triggered is not None and start <= onset <= triggered < start + lengths):
            raise StateError(f"{where}.onset: onset {onset} and trigger {triggered} do not lie in order within the "
                             f"history of rollouts {start} to {start + lengths - 1 if lengths else None}: the history "
                             "is inconsistent")
        for key, value in state.items():
            setattr(self, key, value)


class LengthTriggeredLR:
    """The LR multiplier of the length-decay schedule, with the surge detector when ``period: auto`` (``detector``,
    or a new one from ``settings.surge``)."""

    def __init__(self, settings: LengthDecaySettings, detector: SurgeDetector | None = None) -> None:
        self.settings = settings
        self.detector = (detector or SurgeDetector(settings.surge)) if settings.period == "auto" else None

    def observe(self, step: int, mean_length: float, max_length: float | None = None) -> None:
        """Feed the mean response length of rollout ``step`` to the detector (no-op with a manual period)."""
        if self.detector is not None:
            self.detector.update(step, mean_length, max_length)

    @property
    def period(self) -> int | None:
        """``T_d`` in rollouts, or None while no surge has been detected."""
        if self.detector is None:
            return int(self.settings.period)
        if self.detector.onset is None:
            return None
        return max(1, round(self.settings.surge.period_multiplier * self.detector.onset))

    def scale(self, step: int) -> float:
        """The LR multiplier for the optimizer steps of rollout ``step``."""
        period = self.period
        if period is None:
            return 1.0
        first = period if self.detector is None else max(period, self.detector.triggered_at)
        return decay_scale(step, period, first, self.settings.factor, self.settings.min_scale)

    STATE = {"detector": optional(mapping)}

    def state_dict(self) -> dict[str, Any]:
        """A JSON-serialisable snapshot of the state (restored exactly by ``load_state_dict``)."""
        return {"detector": None if self.detector is None else self.detector.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any], where: str = "lr_decay") -> None:
        """Restore a snapshot taken by ``state_dict`` (state protocol of :mod:`mismatch_ctrl.state`)."""
        state = validated(state, self.STATE, where)
        if (state["detector"] is None) != (self.detector is None):
            raise StateError(f"{where}.detector: the saved state does not match lr_decay.period (manual vs auto); "
                             "keep the period setting fixed across a resume")
        if self.detector is not None:
            self.detector.load_state_dict(state["detector"], f"{where}.detector")


def scale_scheduled_groups(groups: Any, scheduler: Any, max_lr: float, min_lr: float, scale: float,
                           settings: str) -> None:
    """Apply the factor ``scale`` under megatron-core's ``OptimizerParamScheduler`` (slime's, and verl's Megatron
    engine's): every param group gets ``max_lr * scale`` and ``min_lr * scale`` as its own ``max_lr`` / ``min_lr``,
    which ``get_lr(group)`` reads before the scheduler's (megatron-core 0.16 ``optimizer_param_scheduler.py:215-
    223``), and ``lr = scheduler.get_lr(group)``; the scheduler's own state is never touched. A group with its own
    schedule (``default_config`` false) is refused, naming the adapter's ``settings`` the factor scales."""
    for group in groups:
        if group.get("default_config", True) is False:
            raise ConfigError("lr_decay: a param group has its own LR schedule (megatron param-group overrides); "
                              f"the length-decay factor can only scale the default {settings} schedule")
        group["max_lr"] = max_lr * scale
        group["min_lr"] = min_lr * scale
        group["lr"] = scheduler.get_lr(group)
