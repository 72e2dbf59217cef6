"""Mismatch metrics (ALGORITHMS.md section 6): every per-sequence value and the batch summary against the reference."""

import pytest
import torch
from hypothesis import given, settings

import reference as ref
from measure import metrics as mismatch_metrics
from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.metrics import KINDS, SeqMetrics, broadcast_means, token_shaped

from .inputs import random_batch, raw_batches

NAMES = {"training_log_ppl", "rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff", "kl", "k3_kl", "prob_diff_mean",
         "logprob_abs_diff", "prob_diff_max", "log_ppl_diff_max", "log_ppl_diff_min", "trained_tokens",
         "nonfinite_tokens"}


def per_sequence(metrics: SeqMetrics) -> dict[str, torch.Tensor]:
    return {name: values for kind in KINDS for name, values in metrics.per_sequence(kind).items()}


@settings(max_examples=40, deadline=None)
@given(raw_batches())
def test_per_sequence_metrics_match_reference(raw):
    got = per_sequence(mismatch_metrics(raw.token_batch()))
    assert set(got) == NAMES
    rows = [ref.mismatch_metrics(s) for s in raw.seqs()]
    for name in NAMES:
        expected = torch.tensor([row[name] for row in rows], dtype=torch.float64)
        torch.testing.assert_close(got[name].double(), expected, rtol=1e-5, atol=2e-6, msg=name)


@settings(max_examples=40, deadline=None)
@given(raw_batches())
def test_summary_matches_reference(raw):
    seqs = raw.seqs()
    expected = ref.summarize([ref.mismatch_metrics(s) for s in seqs], [s.count for s in seqs])
    got = mismatch_metrics(raw.token_batch()).summarize()
    assert set(got) == NAMES | {"sequences", "valid_sequences"}
    for name in NAMES | {"sequences", "valid_sequences"}:
        assert got[name] == pytest.approx(expected.get(name, 0.0), rel=1e-5, abs=2e-6), name


def test_sequences_without_trained_tokens_count_zero_in_means():
    # ALGORITHMS.md section 1: C_i = sum_t m c / max(sum_t m, 1), averaged over all sequences (slime's
    # sum_of_sample_mean over the number of samples); the masked-out tokens' values never enter.
    train = [torch.tensor([-1.0, -3.0]), torch.tensor([-9.0, -9.0]), torch.zeros(0)]
    rollout = [torch.tensor([-1.5, -2.0]), torch.tensor([-1.0, -1.0]), torch.zeros(0)]
    masks = [torch.ones(2), torch.zeros(2), torch.zeros(0)]
    summary = mismatch_metrics(TokenBatch.from_lists(train, rollout, masks)).summarize()
    assert summary["valid_sequences"] == 1 and summary["sequences"] == 3
    assert summary["training_log_ppl"] == pytest.approx(2.0 / 3)
    assert summary["rollout_log_ppl"] == pytest.approx(1.75 / 3)
    assert summary["kl"] == pytest.approx(0.25 / 3) and summary["log_ppl_abs_diff"] == pytest.approx(0.25 / 3)
    assert summary["logprob_abs_diff"] == pytest.approx(0.75 / 3)
    assert summary["log_ppl_diff_max"] == pytest.approx(0.25) == summary["log_ppl_diff_min"]


def test_sequence_mean_is_a_mean_over_sequences_not_tokens():
    # One long sequence with no mismatch, one short one with a large mismatch: sequences weigh equally.
    train = [torch.full((9,), -1.0), torch.tensor([-1.0])]
    rollout = [torch.full((9,), -1.0), torch.tensor([-2.0])]
    summary = mismatch_metrics(TokenBatch.from_lists(train, rollout, [torch.ones(9), torch.ones(1)])).summarize()
    assert summary["logprob_abs_diff"] == pytest.approx(0.5)
    assert summary["trained_tokens"] == 10


@settings(max_examples=20, deadline=None)
@given(raw_batches(min_seqs=1))
def test_token_shaped_metrics_average_back_to_the_summary(raw):
    """slime's default reducer (per-sequence mean, then mean over all sequences) recovers the summary: for every mean
    metric (token values or per-sequence values at the tokens) and every batch value (the value at every token,
    read back over the sequences with trained tokens)."""
    batch = raw.token_batch()
    metrics = mismatch_metrics(batch)
    broadcast = broadcast_means([metrics])
    expanded = metrics.stats.at_tokens([v for _, v in broadcast], torch.float32)
    shaped = token_shaped([metrics], torch.float32, dict(zip((name for name, _ in broadcast), expanded)))
    summary = metrics.summary
    assert set(shaped) == NAMES - {"trained_tokens", "nonfinite_tokens"}
    seqs = raw.seqs()
    valid = [i for i, s in enumerate(seqs) if s.count > 0]
    for name, tokens in shaped.items():
        assert tokens.shape == (batch.segments.num_tokens,)
        rows = batch.segments.split(tokens)
        sample_means = [ref.masked_mean(rows[i].tolist(), seqs[i].mask) for i in valid]
        # A mean metric reads as itself; a batch value as itself times the fraction of samples with trained tokens.
        n = len(seqs) if name in metrics.names("mean") else len(valid)
        recovered = sum(sample_means) / n if valid else 0.0
        assert recovered == pytest.approx(summary[name] if valid else 0.0, rel=1e-5, abs=1e-6), name


def test_prob_diff_max_ignores_masked_tokens():
    raw = random_batch(seed=3, num_seqs=4, noise=0.5, empty=0.0)
    masks = [torch.zeros_like(m) for m in raw.mask]
    masks[2][0] = 1.0
    batch = TokenBatch.from_lists(raw.train, raw.rollout, masks)
    expected = abs(float(raw.train[2][0].exp() - raw.rollout[2][0].exp()))
    assert mismatch_metrics(batch).summarize()["prob_diff_max"] == pytest.approx(expected, rel=1e-6)
