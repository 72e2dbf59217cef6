"""Mismatch metrics with slime/verl names (ALGORITHMS.md section 6), as functions of the sequence statistics.

Every metric is first a per-sequence value. A *mean* metric is averaged over all sequences of the batch, a sequence
without trained tokens counting 0 (ALGORITHMS.md section 1, ``max(sum_t m, 1)``; slime's ``sum_of_sample_mean``
divided by the number of samples); a *max* / *min* metric takes the extreme over the sequences that have trained
tokens; a *total* metric sums over all sequences. Batch values are global over the data-parallel ranks (and complete
over context-parallel shards, as the statistics are).

Per sequence i, with masked means ``E_i[x] = sum_t m x / max(sum_t m, 1)``:

- ``training_log_ppl = -E_i[lp_train]``, ``rollout_log_ppl = -E_i[lp_roll]``
- ``log_ppl_diff = E_i[lp_roll] - E_i[lp_train]`` (= ``kl``, the direct estimator ``E[lp_roll - lp_train]``),
  ``log_ppl_abs_diff = |log_ppl_diff|``; ``log_ppl_diff_max`` / ``log_ppl_diff_min``: its extremes over sequences
- ``k3_kl = E_i[rho - 1 - l]``, ``logprob_abs_diff = E_i[|l|]``
- ``prob_diff_mean = E_i[|p_train - p_roll|]`` (the DC-GRPO signal), ``prob_diff_max = max_t m |p_train - p_roll|``
- totals: ``trained_tokens``, ``nonfinite_tokens`` (log-probs dropped by the non-finite guard).

Token form (what slime's TIS hook must return: one token-shaped tensor per metric, which slime averages per sample
over the sample's trained tokens, then over samples; SLIME.md section 6), see :func:`token_shaped`:

- a mean metric that is a per-sequence token mean returns its token values (``-lp_train`` at trained tokens for
  ``training_log_ppl``): slime's per-sample mean of them *is* the per-sequence value;
- any other mean metric (``log_ppl_abs_diff``, per-sequence decisions) returns its per-sequence value at each of the
  sequence's tokens;
- a batch value (max, min, diagnostics) is that value at every token: after slime's averaging it reads as the value
  (times the fraction of samples with trained tokens), per micro-batch, averaged over the step's micro-batches.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import torch

from . import host
from .dist import Gather, local_gather
from .seqstats import BatchTotals, Columns, Reduced, SeqStats, Tokens, reduce_batch
from .signals import SIGNAL_COLUMNS

KINDS = ("mean", "max", "min", "total")


def _neg_lp_train(t: Tokens, out: torch.Tensor) -> None:
    torch.mul(t.train, t.mask, out=out).neg_()


def _neg_lp_roll(t: Tokens, out: torch.Tensor) -> None:
    torch.mul(t.rollout, t.mask, out=out).neg_()


def _kl(t: Tokens, out: torch.Tensor) -> None:
    torch.sub(t.rollout, t.train, out=out).mul_(t.mask)


METRIC_COLUMNS = Columns(
    sums={"neg_lp_train": _neg_lp_train, "neg_lp_roll": _neg_lp_roll, "k3": SIGNAL_COLUMNS["k3"],
          "prob_diff": SIGNAL_COLUMNS["prob_diff"], "log_diff": SIGNAL_COLUMNS["log_diff"]},
    maxima={"prob_diff": SIGNAL_COLUMNS["prob_diff"]},
)
"""The columns :func:`mismatch_metrics` reads."""
TOKEN_COLUMNS = Columns(tokens={"kl": _kl})
"""The token values of ``kl`` / ``log_ppl_diff`` (per sequence the difference of the two log-ppl means; a token output
only, for the TIS hook)."""
TOKEN_MEANS = {"training_log_ppl": "neg_lp_train", "rollout_log_ppl": "neg_lp_roll", "log_ppl_diff": "kl", "kl": "kl",
               "k3_kl": "k3", "prob_diff_mean": "prob_diff", "logprob_abs_diff": "log_diff"}
"""Mean metrics that are per-sequence token means of a column."""


class SeqMetrics:
    """Per-sequence metric values of one batch (float64 tensors on the batch's device), in blocks
    ``(names, values [N, k])`` by how they aggregate (mean, max, min, total), with the token rows of mean metrics that
    are token means. After the batch reduction (:meth:`add_to` / :meth:`read`, or :meth:`summarize`) ``values`` holds
    the batch values as 0-d tensors (on the device, or on the host if the reduction was fetched), plus ``sequences``,
    ``valid_sequences`` (those with trained tokens) and any batch-only value a consumer adds (e.g. the correction's
    diagnostics); :attr:`summary` gives them as floats. :meth:`per_sequence` gives the per-sequence values by name."""

    def __init__(self, stats: SeqStats, label: str) -> None:
        self.stats = stats
        self.label = label
        self.blocks: dict[str, list[tuple[tuple[str, ...], torch.Tensor]]] = {kind: [] for kind in KINDS}
        self.rows: dict[str, torch.Tensor] = {}
        self.values: dict[str, torch.Tensor] = {}
        self.on_host = False

    def add(self, kind: str, names: tuple[str, ...], values: torch.Tensor,
            rows: Mapping[str, torch.Tensor] | None = None) -> None:
        """Add metrics ``names`` with per-sequence ``values`` (``[N, len(names)]``, or ``[N]`` for one name) and,
        for mean metrics that are token means, their token values ``rows``."""
        self.blocks[kind].append((names, values.reshape(self.stats.num_seqs, len(names)).double()))
        self.rows.update(rows or {})

    def names(self, kind: str) -> list[str]:
        """The names of the ``kind`` metrics, in order."""
        return [name for block, _ in self.blocks[kind] for name in block]

    def _matrix(self, kind: str) -> torch.Tensor:
        blocks = [values for _, values in self.blocks[kind]]
        return torch.cat(blocks, 1) if blocks else self.stats.table.new_zeros(self.stats.num_seqs, 0)

    def per_sequence(self, kind: str) -> dict[str, torch.Tensor]:
        """The per-sequence values (``[N]`` tensors) of the ``kind`` metrics (one of :data:`KINDS`), by name."""
        return {name: values[:, k] for names, values in self.blocks[kind] for k, name in enumerate(names)}

    def add_to(self, totals: BatchTotals) -> None:
        """The counts of sequences and of valid ones, the sums of the mean metrics (0 for a sequence without trained
        tokens), the totals, and the maxima and (negated) minima over valid sequences (``-inf`` where there is none)."""
        valid = self.stats.valid
        totals.add("sum", f"{self.label}.sums", torch.cat([
            valid.new_full((1,), float(self.stats.num_seqs)), valid.sum(0, keepdim=True),
            valid @ self._matrix("mean"), self._matrix("total").sum(0)]))
        extremes = torch.cat([self._matrix("max"), -self._matrix("min")], 1)
        if extremes.shape[1]:
            masked = torch.where(valid[:, None] > 0, extremes, -math.inf)
            totals.add("max", f"{self.label}.extremes", masked.amax(0) if self.stats.num_seqs else
                       masked.new_full((extremes.shape[1],), -math.inf))

    def read(self, reduced: Reduced) -> None:
        """The batch values from the reduced totals (0 for a max / min without any valid sequence)."""
        sums = reduced[f"{self.label}.sums"]
        n_seqs, n_valid = sums[0], sums[1]
        means, totals = self.names("mean"), self.names("total")
        mean_values = torch.where(n_valid > 0, sums[2:2 + len(means)] / n_seqs, 0.0)
        self.values.update(zip(means, mean_values.unbind(0)))
        self.values.update(zip(totals, sums[2 + len(means):].unbind(0)))
        self.values.update(sequences=n_seqs, valid_sequences=n_valid)
        maxima, minima = self.names("max"), self.names("min")
        if maxima or minima:
            extremes = reduced[f"{self.label}.extremes"]
            found = extremes > -math.inf
            self.values.update(zip(maxima, torch.where(found, extremes, 0.0)[:len(maxima)].unbind(0)))
            self.values.update(zip(minima, torch.where(found, -extremes, 0.0)[len(maxima):].unbind(0)))
        self.on_host = reduced.on_host

    @property
    def summary(self) -> dict[str, float]:
        """The batch values as floats (one host transfer unless the reduction was fetched)."""
        values = [v.item() for v in self.values.values()] if self.on_host else host.fetch(*self.values.values())
        return dict(zip(self.values, values))

    def summarize(self, gather: Gather = local_gather) -> dict[str, float]:
        """The batch values, reduced on their own by one ``gather`` over the data-parallel ranks and fetched."""
        reduce_batch(gather, self, fetch=True)
        return self.summary


def mismatch_metrics(stats: SeqStats) -> SeqMetrics:
    """The section-6 mismatch metrics of a batch whose statistics include :data:`METRIC_COLUMNS`."""
    metrics = SeqMetrics(stats, "mismatch")
    training, rollout = stats.mean("neg_lp_train"), stats.mean("neg_lp_roll")
    log_ppl_diff = training - rollout
    means = {"training_log_ppl": training, "rollout_log_ppl": rollout, "log_ppl_diff": log_ppl_diff,
             "kl": log_ppl_diff, "k3_kl": stats.mean("k3"), "prob_diff_mean": stats.mean("prob_diff"),
             "logprob_abs_diff": stats.mean("log_diff")}
    metrics.add("mean", tuple(means), torch.stack(list(means.values()), 1), stats.token_rows(TOKEN_MEANS))
    metrics.add("mean", ("log_ppl_abs_diff",), log_ppl_diff.abs())
    metrics.add("max", ("prob_diff_max", "log_ppl_diff_max"),
                torch.stack([stats.max("prob_diff").clamp_min(0.0), log_ppl_diff], 1))
    metrics.add("min", ("log_ppl_diff_min",), log_ppl_diff)
    metrics.add("total", ("trained_tokens", "nonfinite_tokens"), torch.stack([stats.counts, stats.sum("nonfinite")], 1))
    return metrics


def broadcast_means(parts: Sequence[SeqMetrics],
                    dropped: torch.Tensor | None = None) -> list[tuple[str, torch.Tensor]]:
    """The mean metrics of ``parts`` whose token form is their per-sequence value at each token (see the module
    docstring), with those values; with ``dropped`` (see :func:`token_shaped`) every mean metric."""
    return [(name, values[:, k]) for part in parts for names, values in part.blocks["mean"]
            for k, name in enumerate(names) if dropped is not None or name not in part.rows]


def token_shaped(parts: Sequence[SeqMetrics], dtype: torch.dtype, broadcast: Mapping[str, torch.Tensor],
                 dropped: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Every metric of ``parts`` as a token-shaped ``[T]`` tensor of ``dtype`` (see the module docstring), after the
    batch reduction; ``broadcast`` holds the tokens of :func:`broadcast_means`.

    ``dropped`` marks tokens slime counts as trained that the non-finite guard removed: there a token-mean metric
    holds its per-sequence value, so that slime's per-sample mean over its own masks is unchanged."""
    stats = parts[0].stats
    rows = {name: row for part in parts for name, row in part.rows.items()}
    out = {name: rows[name] if name not in broadcast else
           torch.where(dropped, broadcast[name], rows[name]) if dropped is not None and name in rows else
           broadcast[name] for part in parts for name in part.names("mean")}
    totals = {name for part in parts for name in part.names("total")} | {"sequences", "valid_sequences"}
    constants = {name: value for part in parts for name, value in part.values.items()
                 if name not in out and name not in totals}
    if constants:
        values = torch.stack(list(constants.values())).to(dtype)
        out.update(zip(constants, values.unsqueeze(1).expand(len(constants), stats.segments.num_tokens).unbind(0)))
    return out
