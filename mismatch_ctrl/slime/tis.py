"""``--custom-tis-function-path mismatch_ctrl.slime.hooks.rollout_correction`` (SLIME.md section 2).

slime calls it per micro-batch (twice with ``--recompute-loss-function``) on the last pipeline stage with CP-local
``pg_loss`` / log-probs and full-length ``loss_masks``, whenever ``--get-mismatch-metrics`` or ``--use-tis`` is set.
It returns ``(pg_loss, full-length masks, token-shaped metrics)``; slime logs each metric as ``train/<key>``, averaged
per sample then over the batch, with the original masks. The hook changes no state.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from ..correction import apply_correction
from ..errors import InputError
from ..metrics import mismatch_metrics
from ._groups import topology
from .advantage import METRIC_PREFIX
from .layout import LocalLayout
from .runtime import get_runtime


def rollout_correction(
    args: Any,
    *,
    pg_loss: torch.Tensor,
    train_log_probs: Sequence[torch.Tensor],
    rollout_log_probs: Sequence[torch.Tensor],
    loss_masks: Sequence[torch.Tensor],
    total_lengths: Sequence[int],
    response_lengths: Sequence[int],
    **kwargs: Any,
) -> tuple[torch.Tensor, list[torch.Tensor], dict[str, torch.Tensor]]:
    """Apply the configured IS/RS correction (or none) to ``pg_loss`` and report the mismatch metrics."""
    runtime = get_runtime(args)
    topo = topology()
    layout = LocalLayout(total_lengths, response_lengths, topo)
    batch = layout.batch(train_log_probs, rollout_log_probs, loss_masks, runtime.config.nonfinite)
    if pg_loss.numel() != batch.segments.num_tokens:
        raise InputError(f"pg_loss has {pg_loss.numel()} tokens but the samples' log-probs have "
                         f"{batch.segments.num_tokens}")
    metrics = mismatch_metrics(batch, topo.seq_reduce)
    spec = runtime.controllers.correction()
    keep = batch.mask
    if spec.active:
        correction = apply_correction(spec, batch, topo.seq_reduce)
        metrics.update(correction.metrics)
        keep = correction.mask
        pg_loss = torch.where(keep > 0, pg_loss * correction.weights.to(pg_loss.dtype), torch.zeros_like(pg_loss))
    elif batch.nonfinite_tokens:
        pg_loss = torch.where(keep > 0, pg_loss, torch.zeros_like(pg_loss))
    masks = layout.full_masks(loss_masks, keep) if spec.active or batch.nonfinite_tokens else list(loss_masks)
    token_metrics = {METRIC_PREFIX + name: value.to(pg_loss.dtype)
                     for name, value in metrics.token_shaped(batch.segments).items()}
    return pg_loss, masks, token_metrics
