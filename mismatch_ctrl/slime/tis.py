"""``--custom-tis-function-path mismatch_ctrl.slime.hooks.rollout_correction`` (SLIME.md section 2).

slime calls it per micro-batch (twice with ``--recompute-loss-function``) on the last pipeline stage with CP-local
``pg_loss`` / log-probs and full-length ``loss_masks``, whenever ``--get-mismatch-metrics`` or ``--use-tis`` is set.
It returns ``(pg_loss, full-length masks, token-shaped metrics)``; slime logs each metric as ``train/<key>``, averaged
per sample then over the batch, with the original masks. The hook changes no state.

One call builds one statistics table (metrics and correction together) and makes two collectives: a gather over the
CP group and one over the DP group, the latter for the batch values (means, diagnostics, batch normalisation). Its one
host synchronisation is the input check (:meth:`~mismatch_ctrl.batch.TokenBatch.build`, which also reads whether
``pg_loss`` is NaN/inf at a trained token, or at any: slime's masked sum turns NaN x 0 into NaN, so the hook zeroes
it at untrained tokens); the table, the batch values, the weights and the metrics stay on the device (slime reduces
the token-shaped metrics itself). A DP collective here is safe because every DP rank calls the hook equally often,
in the same order, in every train step
(slime 624b824a): ``build_dp_schedule`` gives every DP rank the same number of micro-batches per step
(``slime/utils/dp_schedule.py:25-27``, ``num_mbs_per_rank = K // dp_size`` at :187-189 after aligning K to a multiple
of ``dp_size``); ``RolloutManager._split_train_data_by_dp`` ships that same ``num_microbatches`` list to every DP rank
(``slime/ray/rollout.py:773-815``); ``train`` runs the same steps on every rank (``backends/megatron_utils/model.py``
:827-840), each ``train_one_step`` one ``forward_backward_func`` over ``num_microbatches`` (:647-656) whose loss
function calls this hook once per micro-batch on the last stage (``loss.py:1050-1078``), and a second time in the
backward pass under ``--recompute-loss-function`` (``loss.py:1339-1340``), alike on every rank. The batch the values
are global over is therefore one micro-batch slot: the k-th micro-batch of every DP rank.

With ``torch_compile: true`` the device work between the input check and the weighting of ``pg_loss``
(:func:`correction`: the table, the metrics, the correction, both gathers) runs as one compiled graph
(:mod:`mismatch_ctrl.compiled`), its gathers bound to the current groups (:meth:`~mismatch_ctrl.dist.Reducers.bound`),
on every call with samples, the rare ones too (tokens dropped by the guard, a NaN/inf ``pg_loss``), so that every
rank makes the same collectives; once compiling has failed (or past its recompile limit) it runs eager.

Token form of the metrics (see :mod:`mismatch_ctrl.metrics`), as slime reads them after its per-sample and per-batch
averaging: a mean metric reads as its batch mean over the micro-batch slot's samples; a batch value (``*_max``,
``*_min``, ``is_ess*``, ``chi2_*``) as that value times the fraction of samples with trained tokens, averaged over the
step's micro-batches.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from .. import host
from ..batch import Segments, TokenBatch, flat_cat
from ..compiled import compiled
from ..correction import CorrectionPlan, CorrectionSpec, correction_columns
from ..dist import Reducers
from ..errors import InputError
from ..metrics import METRIC_COLUMNS, TOKEN_COLUMNS, broadcast_means, mismatch_metrics, token_shaped
from ..seqstats import Columns, SeqStats, reduce_batch
from ._groups import topology
from .advantage import METRIC_PREFIX
from .inputs import check_tis_inputs
from .layout import LocalLayout
from .runtime import get_runtime

NONFINITE_PG_LOSS = METRIC_PREFIX + "nonfinite_pg_loss_fraction"
NONFINITE_TOKENS = "nonfinite_token_fraction"
"""Trained tokens (by slime's loss masks) the guard dropped for a NaN/inf or impossible log-prob of either engine,
counted at every call: tokens can go bad in a later optimizer step of a rollout, after the advantage hook's count."""
PG_LOSS_OVERFLOW = METRIC_PREFIX + "pg_loss_overflow_fraction"
"""Trained tokens whose finite ``pg_loss`` times its IS weight overflowed to inf in the loss's dtype."""


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
    check_tis_inputs(pg_loss, train_log_probs, rollout_log_probs, loss_masks, total_lengths, response_lengths)
    topo = topology()
    layout = LocalLayout(total_lengths, response_lengths, topo)
    loss = pg_loss.detach()
    nonfinite_loss = (loss - loss).ne_(0)  # x - x is 0 for finite x, NaN for NaN and inf
    if loss.numel() != layout.num_tokens:
        raise InputError(f"pg_loss has {loss.numel()} tokens but the samples' responses have {layout.num_tokens} on "
                         "this rank (response_lengths, context-parallel share); slime passes one loss per response "
                         "token")
    batch = layout.batch(train_log_probs, rollout_log_probs, loss_masks, runtime.config.nonfinite,
                         watch=lambda mask: [nonfinite_loss.logical_and(mask > 0).sum(), nonfinite_loss.sum()],
                         device=pg_loss.device)
    count, everywhere = batch.watched  # tokens with a NaN/inf pg_loss: trained ones, all
    spec = runtime.controllers.correction()
    dropped, result = None, None
    if batch.dropped:  # this shard's guard dropped tokens: rare, so the extra work is no concern
        dropped = (flat_cat(layout.local_masks(loss_masks)) > 0) & (batch.mask == 0)
    if runtime.config.torch_compile and batch.num_seqs:
        result = _compiled_correction(
            batch.train_log_probs, batch.rollout_log_probs, batch.mask, batch.log_ratio, batch.nonfinite,
            batch.impossible, *batch.segments.index(), nonfinite_loss, dropped, pg_loss.dtype, spec,
            topo.reducers.bound())
    if result is not None:
        weights, keep, stacked, names = result
        metrics = dict(zip(names, stacked.unbind(0)))
    else:  # eager: torch_compile off, a batch without samples, or compiling not possible
        weights, keep, metrics = correction(batch, spec, topo.reducers, nonfinite_loss, pg_loss.dtype, dropped)
    if weights is not None:
        pg_loss = (pg_loss * weights.to(pg_loss.dtype)).masked_fill_(keep == 0, 0.0)  # rejected: 0, even where NaN
        overflow = torch.isinf(pg_loss.detach()).logical_and_(nonfinite_loss.logical_not())
        metrics[PG_LOSS_OVERFLOW] = overflow.to(metrics[NONFINITE_PG_LOSS].dtype)
    elif dropped is not None or everywhere > count:  # NaN at an untrained token: NaN x 0 in slime's loss
        pg_loss = pg_loss.masked_fill(keep == 0, 0.0)
    masks = layout.full_masks(loss_masks, keep) if spec.active or dropped is not None else list(loss_masks)
    if count and (spec.active or dropped is not None):
        (count,) = host.fetch(metrics[NONFINITE_PG_LOSS].sum(dtype=torch.float64))
    if count:
        runtime.warn_once("nonfinite_pg_loss", f"mismatch_ctrl: pg_loss is NaN/inf at {int(count)} trained token(s) "
                                               "of this micro-batch (finite log-probs of both engines there): "
                                               "slime's loss and gradients will be NaN; counted in "
                                               f"train/{NONFINITE_PG_LOSS} (check the learning rate and the "
                                               "policy's logits)")
    return pg_loss, masks, metrics


def correction(batch: TokenBatch, spec: CorrectionSpec, reducers: Reducers, nonfinite_loss: torch.Tensor,
               loss_dtype: torch.dtype, dropped: torch.Tensor | None = None
               ) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, torch.Tensor]]:
    """The device work of one call, without a host transfer and outside autograd: the statistics table, the metrics,
    the correction (``spec``, if active) and its batch values (two gathers, ``reducers``). Returns the token weights
    (None without a correction), the loss mask without the rejected tokens, and the token-shaped metrics by slime
    name, in the dtype of a ``loss_dtype`` loss.

    ``nonfinite_loss`` marks the tokens whose ``pg_loss`` is NaN/inf; ``dropped`` (see
    :func:`~mismatch_ctrl.metrics.token_shaped`) the trained tokens the guard dropped."""
    columns = METRIC_COLUMNS | TOKEN_COLUMNS | (correction_columns(spec) if spec.active else Columns())
    stats = SeqStats.build(batch, columns, reducers)
    metrics = mismatch_metrics(stats)
    plan = CorrectionPlan(spec, stats) if spec.active else None
    reduce_batch(reducers.batch, metrics, plan)
    parts = [metrics, plan.metrics] if plan is not None else [metrics]
    rows = plan.sequence_rows() if plan is not None else []
    broadcast = broadcast_means(parts, dropped)
    dtype = batch.mask.dtype
    tokens = stats.at_tokens([*rows, *(v for _, v in broadcast)], dtype)
    weights, keep = None, batch.mask
    if plan is not None:
        weighted = plan.finish(tokens[:len(rows)], token_outputs=True)
        weights, keep = weighted.weights, weighted.mask
    token_metrics = token_shaped(parts, dtype, dict(zip((name for name, _ in broadcast), tokens[len(rows):])), dropped)
    token_metrics["nonfinite_pg_loss_fraction"] = nonfinite_loss.logical_and(keep > 0).to(dtype)
    token_metrics[NONFINITE_TOKENS] = dropped.to(dtype) if dropped is not None else torch.zeros_like(batch.mask)
    # In pg_loss's dtype, except float16: its range (65504) would turn a weight or k3 of exp(20) into inf.
    out = torch.float32 if loss_dtype == torch.float16 else loss_dtype
    return weights, keep, {METRIC_PREFIX + name: value.to(out) for name, value in token_metrics.items()}


@compiled
def _compiled_correction(train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor, log_ratio: torch.Tensor,
                         nonfinite: torch.Tensor, impossible: torch.Tensor, index: torch.Tensor,
                         index_sizes: list[int], nonfinite_loss: torch.Tensor, dropped: torch.Tensor | None,
                         loss_dtype: torch.dtype, spec: CorrectionSpec, reducers: Reducers
                         ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, tuple[str, ...]]:
    """:func:`correction` of a checked batch from its tensors and its uploaded layout
    (:meth:`~mismatch_ctrl.batch.Segments.index`), as one compiled graph (``torch_compile: true``;
    :mod:`mismatch_ctrl.compiled`); the metrics stacked in one ``[M, T]`` tensor, with their names (a graph's every
    output costs host work on each call). Dropped tokens (``dropped`` not None) compile a graph of their own."""
    segments = Segments.of_index(index, index_sizes, mask.shape[0])
    batch = TokenBatch(segments, train, rollout, mask, log_ratio, nonfinite, impossible)
    weights, keep, metrics = correction(batch, spec, reducers, nonfinite_loss, loss_dtype, dropped)
    return weights, keep, torch.stack(list(metrics.values())), tuple(metrics)
