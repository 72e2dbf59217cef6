"""Quantiles that combine across ranks by a sum: a fixed log-spaced histogram [ours].

A median over all sequences of a data-parallel batch is not additive; a histogram with fixed bin edges is. Values
in ``[low, high]`` fall into ``bins`` log-spaced bins (relative width ``(high / low) ** (1 / bins)``; 1.059 with the
defaults); values below ``low`` (zeros included) fall into an underflow bin reported as ``low``, values above
``high`` into an overflow bin reported as ``high``. Quantiles interpolate geometrically inside a bin.
"""

from __future__ import annotations

import itertools
import math
from typing import Sequence

import torch

LOW, HIGH, BINS = 1e-8, 1e2, 400


def log_histogram(values: torch.Tensor, weights: torch.Tensor | None = None, low: float = LOW, high: float = HIGH,
                  bins: int = BINS) -> torch.Tensor:
    """Counts ``[bins + 2]`` (float64; underflow, bins, overflow) of non-negative finite ``values``, optionally
    weighted, on the values' device (a fixed-size scatter: no host synchronisation)."""
    values = values.double()
    position = torch.floor((torch.log(values.clamp_min(low * 0.5)) - math.log(low)) * (bins / math.log(high / low)))
    index = torch.where(values > high, bins + 1, position.clamp(-1, bins - 1) + 1).long()
    weights = torch.ones_like(values) if weights is None else weights.to(values)
    return values.new_zeros(bins + 2).index_add_(0, index, weights)


def histogram_quantiles(counts: Sequence[float], qs: list[float], low: float = LOW,
                        high: float = HIGH) -> list[float]:
    """Quantiles ``qs`` (in [0, 1]) of the counts of a :func:`log_histogram` (or of their sums over ranks), on the
    host; NaN for an empty histogram."""
    per_bin = [float(c) for c in counts]
    bins = len(per_bin) - 2
    cum = list(itertools.accumulate(per_bin))
    total = cum[-1]
    if total <= 0:
        return [math.nan for _ in qs]
    step = (math.log(high) - math.log(low)) / bins
    out = []
    for q in qs:
        target = q * total
        # The first non-empty bin that reaches the target (for q = 0: the bin of the minimum, not the empty underflow).
        k = next(i for i, c in enumerate(cum) if c >= target - 1e-9 * total and per_bin[i] > 0)
        if k == 0:
            out.append(low)
        elif k == bins + 1:
            out.append(high)
        else:
            below = cum[k - 1]
            frac = (target - below) / max(cum[k] - below, 1e-300)
            out.append(math.exp(math.log(low) + (k - 1 + min(max(frac, 0.0), 1.0)) * step))
    return out
