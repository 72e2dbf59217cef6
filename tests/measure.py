"""The core's per-batch computations one at a time, for the tests: each builds the sequence statistics it reads and
reduces its batch numbers (the hooks build one table and reduce once for all of them; the results are the same)."""

from __future__ import annotations

import torch

from mismatch_ctrl.acrl import ACRL_COLUMNS, SequenceDiscrepancy
from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.dcgrpo import DCGRPOSettings, ShapedAdvantages, shape_advantages, shaping_columns
from mismatch_ctrl.dist import LOCAL, Reducers
from mismatch_ctrl.metrics import METRIC_COLUMNS, SeqMetrics, mismatch_metrics
from mismatch_ctrl.seqstats import SeqStats, reduce_batch


def metrics(batch: TokenBatch, reducers: Reducers = LOCAL) -> SeqMetrics:
    """The mismatch metrics of ``batch``, per sequence and (``summary``) over the batch."""
    out = mismatch_metrics(SeqStats.build(batch, METRIC_COLUMNS, reducers))
    reduce_batch(reducers.batch, out)
    return out


def shaped(batch: TokenBatch, seq_advantages: torch.Tensor | None, settings: DCGRPOSettings, lam: float, eps: float,
           reducers: Reducers = LOCAL) -> ShapedAdvantages:
    """DC-GRPO shaping of ``batch`` with its batch values."""
    out = shape_advantages(SeqStats.build(batch, shaping_columns(settings, eps), reducers), seq_advantages, settings,
                           lam, eps)
    reduce_batch(reducers.batch, out)
    return out


def discrepancy(batch: TokenBatch, reducers: Reducers = LOCAL) -> float | None:
    """ACRL's ``D`` of ``batch``."""
    out = SequenceDiscrepancy(SeqStats.build(batch, ACRL_COLUMNS, reducers))
    reduce_batch(reducers.batch, out)
    return out.value
