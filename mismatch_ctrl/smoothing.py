"""Smoothing of a series over rollouts, shared by every plot of the package (``analyze``'s and the lab's)."""

from __future__ import annotations


def moving_average(values: list[float], window: int) -> list[float]:
    """Trailing mean of the last ``window`` values (fewer at the start)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out
