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
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

from .batch import TokenBatch

Signal = Literal["prob_diff", "log_diff", "ratio_diff", "k3"]
SIGNALS: tuple[str, ...] = get_args(Signal)


def token_signal(batch: TokenBatch, signal: Signal = "prob_diff") -> torch.Tensor:
    """The per-token discrepancy ``c[t]`` of ``batch`` (fp32, ``[T]``, not masked)."""
    if signal == "prob_diff":
        return torch.exp(batch.train_log_probs).sub_(torch.exp(batch.rollout_log_probs)).abs_()
    if signal == "log_diff":
        return batch.log_ratio.abs()
    if signal == "ratio_diff":
        return torch.exp(batch.log_ratio).sub_(1.0).abs_()
    if signal == "k3":
        return k3(batch.log_ratio)
    raise ValueError(f"unknown discrepancy signal {signal!r}; choose one of {SIGNALS}")


def k3(log_ratio: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """K3 estimator ``exp(l) - 1 - l`` (non-negative), token-wise; ``expm1`` keeps it accurate and >= 0 for small l.
    ``out`` receives the result if given."""
    return torch.expm1(log_ratio, out=out).sub_(log_ratio)
