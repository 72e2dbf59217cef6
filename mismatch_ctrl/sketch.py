"""Quantiles that combine across ranks by a sum: a fixed log-spaced histogram [ours].

A median over all sequences of a data-parallel batch is not additive; a histogram with fixed bin edges is. Values
in ``[low, high]`` fall into ``bins`` log-spaced bins (relative width ``(high / low) ** (1 / bins)``; 1.059 with the
defaults); values below ``low`` (zeros included) fall into an underflow bin reported as ``low``, values above
``high`` into an overflow bin reported as ``high``. Quantiles interpolate geometrically inside a bin.
"""

from __future__ import annotations

import math

import torch

from .dist import Reducer, local_reduce

LOW, HIGH, BINS = 1e-8, 1e2, 400


def log_histogram(values: torch.Tensor, weights: torch.Tensor | None = None, low: float = LOW, high: float = HIGH,
                  bins: int = BINS) -> torch.Tensor:
    """Counts ``[bins + 2]`` (underflow, bins, overflow) of non-negative ``values``, optionally weighted."""
    pos = (torch.log(values.double().clamp_min(low * 0.5)) - math.log(low)) / (math.log(high) - math.log(low)) * bins
    inside = pos.floor().long().clamp(0, bins - 1) + 1
    index = torch.where(values < low, 0, torch.where(values > high, bins + 1, inside))
    w = torch.ones_like(values, dtype=torch.float64) if weights is None else weights.double()
    return torch.zeros(bins + 2, dtype=torch.float64, device=values.device).index_add_(0, index, w)


def histogram_quantiles(counts: torch.Tensor, qs: list[float], low: float = LOW, high: float = HIGH) -> list[float]:
    """Quantiles ``qs`` (in [0, 1]) of a :func:`log_histogram`; NaN for an empty histogram."""
    bins = counts.numel() - 2
    total = float(counts.sum())
    if total <= 0:
        return [math.nan for _ in qs]
    per_bin = counts.double().tolist()
    cum = torch.cumsum(counts.double(), 0).tolist()
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


def global_quantiles(values: torch.Tensor, qs: list[float], batch_reduce: Reducer = local_reduce,
                     weights: torch.Tensor | None = None) -> list[float]:
    """Quantiles of ``values`` pooled over all ranks (their histograms summed with ``batch_reduce``)."""
    return histogram_quantiles(batch_reduce(log_histogram(values, weights), "sum"), qs)
