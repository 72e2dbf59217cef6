"""The response-length surge of lab runs and the mismatch against response length, from the runs' records (runs of a
task with ``length_records``: ``--task digitsum``).

- **Length**: the rollout-mean response length ``response_length`` (paper 002, "Beyond Precision", Figure 6: the
  average response length over training). **Surged**: its trailing 5-rollout mean at least doubles within
  ``fraction`` (20%) of the run's rollouts (``doubling``).
- **Onset**: what the project's surge detector (``lr_schedule.SurgeDetector``, run by the advantage hook in every
  lab run) logged: ``surge_onset`` from the rollout it triggered on (``surge_triggered``). **LR cuts**: rollouts whose
  logged ``lr_scale`` is below the previous rollout's (``length_decay`` halves every ``T_d = round(1.8 x onset)``).
- **Mismatch against length** [ours], from the per-length sums of ``training.length_stats``: per run the least-squares
  slope of a sequence's ``c`` (its share of ``C_bar``), max |log ratio| and sequence log-ratio on its length, with
  one intercept per rollout (``within_rollout_slope``: sequences are compared only with sequences of the same
  rollout, i.e. the same policy, so the drift of training does not enter); per length bucket, the mean over the run;
  and ``C_bar`` of the rollouts before the onset against after the trigger (``before_after``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...smoothing import moving_average

Records = Sequence[Mapping[str, Any]]

SMOOTH = 5
"""Rollouts in the trailing mean of the length (the surge detector's short window)."""
SURGE_FRACTION = 0.2
"""A surge doubles the length within this share of the run's rollouts (docs/lab-surge.md)."""
WINDOW = 20
"""Rollouts on each side of the surge in ``before_after``."""
BUCKETS = ((1, 2), (3, 6), (7, 10), (11, 14), (15, None))
"""Response-length buckets of the mismatch table: direct answers (<= 2 tokens) to long scratchpads."""
QUANTITIES = {"discrepancy_sum": "c (share of C_bar)", "max_abs_log_ratio_sum": "max |log ratio|",
              "log_ratio_sum": "sequence log-ratio", "abs_log_ratio_sum": "|sequence log-ratio|"}
"""The per-sequence quantities of ``length_buckets`` and their names."""


@dataclass(frozen=True)
class Doubling:
    """The largest rise of the smoothed length within a span: from rollout ``start`` to ``end``, ``ratio`` =
    smoothed length at ``end`` / at ``start``."""

    start: int
    end: int
    ratio: float


def lengths(records: Records) -> list[float]:
    """The rollout-mean response length of each rollout."""
    return [float(r["response_length"]) for r in records]


def doubling(series: Sequence[float], span: int, window: int = SMOOTH) -> Doubling | None:
    """The largest ratio ``m[t2] / m[t1]`` with ``0 < t2 - t1 <= span`` of the trailing ``window``-rollout mean ``m``
    of ``series`` (None for fewer than two values)."""
    smooth = moving_average(list(series), window)
    best: Doubling | None = None
    for end in range(1, len(smooth)):
        low = min(range(max(0, end - span), end), key=lambda t: smooth[t])
        if smooth[low] > 0 and (best is None or smooth[end] / smooth[low] > best.ratio):
            best = Doubling(low, end, smooth[end] / smooth[low])
    return best


def surged(records: Records, fraction: float = SURGE_FRACTION, factor: float = 2.0) -> bool:
    """Whether the smoothed length at least doubles (``factor``) within ``fraction`` of the run's rollouts."""
    found = doubling(lengths(records), max(1, round(fraction * len(records))))
    return found is not None and found.ratio >= factor


def detector(records: Records) -> tuple[int | None, int | None]:
    """(onset, trigger rollout) as the surge detector logged them; (None, None) when it never triggered."""
    for record in records:
        if record.get("surge_triggered"):
            return int(record["surge_onset"]), int(record["step"])
    return None, None


def lr_cuts(records: Records) -> list[int]:
    """The rollouts whose logged ``lr_scale`` is below the previous rollout's (the first below 1.0 included)."""
    cuts, previous = [], 1.0
    for record in records:
        scale = record.get("lr_scale", 1.0)
        if scale < previous:
            cuts.append(int(record["step"]))
        previous = scale
    return cuts


def _moments(bucket: Mapping[str, Sequence[float]], key: str) -> tuple[float, float, float, float, float]:
    """N, sum x, sum y, sum x^2, sum x y of one rollout's sequences (x = length, y = the quantity)."""
    xs, ns, ys = bucket["length"], bucket["count"], bucket[key]
    return (sum(ns), sum(n * x for n, x in zip(ns, xs)), sum(ys), sum(n * x * x for n, x in zip(ns, xs)),
            sum(x * y for x, y in zip(xs, ys)))


def within_rollout_slope(records: Records, key: str) -> float | None:
    """Least-squares slope of a sequence's ``key`` quantity on its response length, one intercept per rollout:
    ``sum_r S_xy(r) / sum_r S_xx(r)`` with ``S_xx(r) = sum x^2 - (sum x)^2 / N`` and ``S_xy(r) = sum x y - sum x sum y
    / N`` over rollout r's sequences. None when no rollout has two lengths."""
    sxx = sxy = 0.0
    for record in records:
        bucket = record.get("length_buckets")
        if not bucket or not bucket["length"]:
            continue
        n, x, y, xx, xy = _moments(bucket, key)
        sxx += xx - x * x / n
        sxy += xy - x * y / n
    return sxy / sxx if sxx > 1e-12 else None


def within_rollout_difference(records: Records, key: str, short: tuple[int, int] = (1, 2),
                              long: tuple[int, int] = (7, 14)) -> float | None:
    """Mean over the rollouts that sampled both, of (mean ``key`` of its sequences with lengths in ``long``) minus
    (the same in ``short``): scratchpads against direct answers of the same policy. None when no rollout has both."""
    gaps = []
    for record in records:
        bucket = record.get("length_buckets") or {"length": []}
        sides = []
        for low, high in (long, short):
            picked = [j for j, x in enumerate(bucket["length"]) if low <= x <= high]
            count = sum(bucket["count"][j] for j in picked)
            sides.append(sum(bucket[key][j] for j in picked) / count if count else None)
        if None not in sides:
            gaps.append(sides[0] - sides[1])
    return sum(gaps) / len(gaps) if gaps else None


def bucket_means(records: Records, key: str, buckets: Sequence[tuple[int, int | None]] = BUCKETS
                 ) -> list[float | None]:
    """Per length bucket ``(low, high)`` (inclusive; high None: no bound), the mean of ``key`` over the run's
    sequences of that length (None where the run has none)."""
    totals = [[0.0, 0.0] for _ in buckets]
    for record in records:
        bucket = record.get("length_buckets") or {"length": []}
        for j, x in enumerate(bucket["length"]):
            for total, (low, high) in zip(totals, buckets):
                if x >= low and (high is None or x <= high):
                    total[0] += bucket["count"][j]
                    total[1] += bucket[key][j]
    return [total[1] / total[0] if total[0] else None for total in totals]


def length_profile(records: Records, key: str, min_count: int = 1) -> dict[int, float]:
    """Per response length, the mean of ``key`` over the run's sequences of that length (lengths with fewer than
    ``min_count`` sequences left out)."""
    totals: dict[int, list[float]] = {}
    for record in records:
        bucket = record.get("length_buckets") or {"length": []}
        for j, x in enumerate(bucket["length"]):
            total = totals.setdefault(int(x), [0.0, 0.0])
            total[0] += bucket["count"][j]
            total[1] += bucket[key][j]
    return {x: total[1] / total[0] for x, total in sorted(totals.items()) if total[0] >= max(min_count, 1)}


def before_after(records: Records, key: str = "discrepancy", window: int = WINDOW) -> tuple[float, float] | None:
    """Mean of the logged ``key`` (default ``C_bar``) over the ``window`` rollouts before the detector's onset and
    over the ``window`` rollouts from its trigger on; None when it never triggered or a side has no value."""
    onset, trigger = detector(records)
    if onset is None or trigger is None:
        return None
    sides = [[r[key] for r in records if lo <= r["step"] < hi and r.get(key) is not None and math.isfinite(r[key])]
             for lo, hi in ((onset - window, onset), (trigger, trigger + window))]
    if not all(sides):
        return None
    before, after = (sum(side) / len(side) for side in sides)
    return before, after
