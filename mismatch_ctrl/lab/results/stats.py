"""Numbers over seeds: mean, spread and a 95% interval of the mean, and the rules for calling a difference.

The interval is Student's t interval of the mean, ``mean +- t(0.975, n-1) * s / sqrt(n)`` with ``s`` the sample
standard deviation (n - 1 in the denominator). Two methods differ in a quantity when the interval of their paired
per-seed differences excludes 0 and has a width (``paired``, ``sign``: the lab's methods of one seed start from the
same warm-up, so pairing removes the spread of the starting policies). One seed gives no interval and never a
difference.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""97.5% quantiles of Student's t for 1..30 degrees of freedom (standard tables)."""


def t_quantile_975(df: int) -> float:
    """97.5% quantile of Student's t with ``df`` >= 1 degrees of freedom; beyond 30 the normal 1.96 plus a 1/df
    correction through the tabled 2.042 at 30 (error < 0.003)."""
    if df < 1:
        raise ValueError(f"df must be >= 1, got {df}")
    return T_975[df - 1] if df <= len(T_975) else 1.96 + (T_975[-1] - 1.96) * len(T_975) / df


@dataclass(frozen=True)
class Spread:
    """Values of one quantity over seeds: their count, mean, sample standard deviation (0 for one value), min, max,
    and the 95% t interval of the mean [low, high] (None for one value)."""

    values: tuple[float, ...]
    mean: float
    std: float
    min: float
    max: float
    low: float | None
    high: float | None

    @property
    def n(self) -> int:
        return len(self.values)

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "values": list(self.values), "n": self.n}


def spread(values: Iterable[float]) -> Spread:
    """The ``Spread`` of at least one finite value."""
    xs = tuple(float(v) for v in values)
    if not xs:
        raise ValueError("spread: no values")
    if not all(math.isfinite(x) for x in xs):
        raise ValueError(f"spread: values must be finite, got {xs[:8]}")
    n = len(xs)
    mean = sum(xs) / n
    if n == 1:
        return Spread(xs, mean, 0.0, xs[0], xs[0], None, None)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    half = t_quantile_975(n - 1) * std / math.sqrt(n)
    return Spread(xs, mean, std, min(xs), max(xs), mean - half, mean + half)


def sign(s: Spread) -> int:
    """+1 / -1 when the interval lies entirely above / below 0, else 0: also without an interval, and for an interval
    of zero width (every value the same: accuracies move in steps of 1/256, so two seeds can give one difference by
    chance, and a spread of 0 measures no spread at all)."""
    if s.low is None or s.high is None or s.std == 0:
        return 0
    return 1 if s.low > 0 else -1 if s.high < 0 else 0


def differences(a: dict[int, float], b: dict[int, float]) -> dict[int, float]:
    """a[seed] - b[seed] for the seeds both have, in seed order."""
    return {k: a[k] - b[k] for k in sorted(set(a) & set(b))}


def paired(a: dict[int, float], b: dict[int, float]) -> Spread | None:
    """``Spread`` of the ``differences`` a[seed] - b[seed] (None if no seed has both)."""
    found = differences(a, b)
    return spread(found.values()) if found else None


def aggregate(rows: Sequence[dict[str, object]], keys: Sequence[str]) -> dict[str, Spread]:
    """``Spread`` of each key over the rows (one row per seed); rows where a key is None or absent are skipped and
    keys without any value are left out."""
    out = {}
    for key in keys:
        values = [row[key] for row in rows if row.get(key) is not None]
        if values:
            out[key] = spread(values)  # type: ignore[arg-type]
    return out
