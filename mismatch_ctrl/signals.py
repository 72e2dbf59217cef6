"""Token-level discrepancy signals between the training engine and the rollout engine (ALGORITHMS.md section 1).

With ``l = lp_train - lp_roll`` (clamped to [-20, 20]) and ``rho = exp(l)``:

=============  ==========================  ==========================================================
name           token value ``c[t]``        source
=============  ==========================  ==========================================================
``prob_diff``  ``|p_train - p_roll|``      DC-GRPO's signal [paper, 001: sections 4 and conclusion]
``log_diff``   ``|l|``                     slime's ``train_rollout_logprob_abs_diff``
``ratio_diff`` ``|rho - 1|``               multiplicative drift
``k3``         ``rho - 1 - l`` (>= 0)      K3 estimator of KL
=============  ==========================  ==========================================================

:data:`SIGNAL_COLUMNS` writes each signal, masked, as a named column of the sequence statistics
(:mod:`mismatch_ctrl.seqstats`); :func:`token_signal` returns it unmasked.
"""

from __future__ import annotations

import math
from typing import Literal, get_args

import torch

from .batch import LOG_RATIO_BOUND, TokenBatch
from .seqstats import Tokens, Writer

Signal = Literal["prob_diff", "log_diff", "ratio_diff", "k3"]
SIGNALS: tuple[str, ...] = get_args(Signal)


def _prob_diff(t: Tokens, out: torch.Tensor) -> None:
    torch.sub(t.p_train, t.p_roll, out=out).abs_().mul_(t.mask)


def _log_diff(t: Tokens, out: torch.Tensor) -> None:
    torch.abs(t.log_ratio, out=out).mul_(t.mask)


def _ratio_diff(t: Tokens, out: torch.Tensor) -> None:
    torch.abs(t.expm1, out=out).mul_(t.mask)


def _k3(t: Tokens, out: torch.Tensor) -> None:
    k3(t.log_ratio, out, t.expm1).mul_(t.mask)


SIGNAL_MAX: dict[str, float] = {"prob_diff": 1.0, "log_diff": LOG_RATIO_BOUND,
                                 "ratio_diff": math.expm1(LOG_RATIO_BOUND),
                                 "k3": math.expm1(LOG_RATIO_BOUND) - LOG_RATIO_BOUND}
"""The largest token value ``c[t]`` of each signal: log-ratios are clamped to ``[-LOG_RATIO_BOUND, LOG_RATIO_BOUND]``
(``rho - 1`` and K3 are largest at the upper bound)."""

SIGNAL_COLUMNS: dict[str, Writer] = {"prob_diff": _prob_diff, "log_diff": _log_diff, "ratio_diff": _ratio_diff,
                                     "k3": _k3}
"""Column writers ``c[t] m[t]`` of every signal, by signal name."""


def token_signal(batch: TokenBatch, signal: Signal = "prob_diff") -> torch.Tensor:
    """The per-token discrepancy ``c[t]`` of ``batch`` (fp32, ``[T]``, not masked)."""
    if signal not in SIGNAL_COLUMNS:
        raise ValueError(f"unknown discrepancy signal {signal!r}; choose one of {SIGNALS}")
    out = torch.empty_like(batch.log_ratio)
    SIGNAL_COLUMNS[signal](Tokens(torch.ones_like(batch.mask), batch.log_ratio, batch.train_log_probs,
                                  batch.rollout_log_probs), out)
    return out


def k3(log_ratio: torch.Tensor, out: torch.Tensor | None = None, expm1: torch.Tensor | None = None) -> torch.Tensor:
    """K3 estimator ``exp(l) - 1 - l`` (non-negative), token-wise; ``expm1`` keeps it accurate and >= 0 for small l
    (pass ``expm1(l)`` if already computed). ``out`` receives the result if given."""
    if expm1 is None:
        return torch.expm1(log_ratio, out=out).sub_(log_ratio)
    return torch.sub(expm1, log_ratio, out=out)
