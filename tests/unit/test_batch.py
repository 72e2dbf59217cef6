"""TokenBatch adapters (lists, padded, flat), input validation and the non-finite guard."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from measure import discrepancy
from measure import metrics as mismatch_metrics
from measure import shaped as shape_advantages
from mismatch_ctrl.batch import Segments, TokenBatch
from mismatch_ctrl.correction import apply_correction
from mismatch_ctrl.dcgrpo import DCGRPOSettings
from mismatch_ctrl.errors import InputError
from mismatch_ctrl.hostguard import HostGuard
from mismatch_ctrl.presets import PRESETS

from .inputs import raw_batches

pytestmark = pytest.mark.filterwarnings("ignore:mismatch_ctrl. trained tokens with a NaN/inf:RuntimeWarning")


def pad(tensors, width, value):
    out = torch.full((len(tensors), width), value)
    for i, t in enumerate(tensors):
        out[i, :t.numel()] = t
    return out


def assert_same_batch(a: TokenBatch, b: TokenBatch):
    assert a.segments.sizes == b.segments.sizes
    for name in ("train_log_probs", "rollout_log_probs", "mask", "log_ratio", "nonfinite", "impossible"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@settings(max_examples=30, deadline=None)
@given(raw_batches(min_seqs=1), st.integers(0, 5))
def test_padded_with_lengths_equals_lists(raw, extra):
    width = max(raw.sizes) + extra
    # Padding holds garbage (NaN log-probs, mask 1) that `lengths` must cut away.
    padded = [pad(x, width, v) for x, v in ((raw.train, math.nan), (raw.rollout, -1.0), (raw.mask, 1.0))]
    from_padded = TokenBatch.from_padded(*padded, lengths=torch.tensor(raw.sizes))
    assert_same_batch(from_padded, raw.token_batch())


@settings(max_examples=30, deadline=None)
@given(raw_batches(min_seqs=1), st.integers(0, 5))
def test_padded_without_lengths_equals_lists_with_masked_padding(raw, extra):
    width = max(raw.sizes) + extra
    padded = [pad(x, width, v) for x, v in ((raw.train, -1.0), (raw.rollout, math.inf), (raw.mask, 0.0))]
    from_padded = TokenBatch.from_padded(*padded)
    assert from_padded.segments.sizes == (width,) * len(raw.sizes)
    as_lists = TokenBatch.from_lists(*(list(p) for p in padded))
    assert_same_batch(from_padded, as_lists)
    # The padding is masked out, so every per-sequence statistic equals the unpadded batch's.
    unpadded = raw.token_batch()
    for spec in PRESETS.values():
        a, b = apply_correction(spec, from_padded).metrics, apply_correction(spec, unpadded).metrics
        for name, values in b.per_sequence("mean").items():
            torch.testing.assert_close(a.per_sequence("mean")[name], values, msg=name)
    a, b = mismatch_metrics(from_padded).summarize(), mismatch_metrics(unpadded).summarize()
    assert a == pytest.approx(b, rel=1e-6, abs=1e-7)


def test_flat_build_rejects_wrong_token_count():
    with pytest.raises(InputError, match=r"rollout_log_probs must be a flat tensor of 5 tokens.*\(4,\)"):
        TokenBatch.build(Segments([2, 3]), torch.zeros(5), torch.zeros(4), torch.ones(5))
    with pytest.raises(InputError, match="mask must be a flat tensor"):
        TokenBatch.build(Segments([2, 3]), torch.zeros(5), torch.zeros(5), torch.ones(1, 5))


def test_negative_segment_length_is_rejected():
    with pytest.raises(InputError, match="lengths must be >= 0, got -1"):
        Segments([3, -1])


def test_length_mismatch_names_sample_and_both_lengths():
    train = [torch.zeros(3), torch.zeros(4), torch.zeros(2)]
    rollout = [torch.zeros(3), torch.zeros(5), torch.zeros(2)]
    masks = [torch.ones(3), torch.ones(4), torch.ones(2)]
    with pytest.raises(InputError, match=r"sample 1: train_log_probs has 4 tokens but rollout_log_probs has 5"):
        TokenBatch.from_lists(train, rollout, masks)


def test_list_count_mismatch_is_rejected():
    with pytest.raises(InputError, match="different numbers of samples"):
        TokenBatch.from_lists([torch.zeros(1)], [torch.zeros(1), torch.zeros(1)], [torch.ones(1)])


def test_padded_lengths_out_of_range_are_rejected():
    x = torch.zeros(2, 3)
    with pytest.raises(InputError, match="lengths must give 2 values in \\[0, 3\\]"):
        TokenBatch.from_padded(x, x, x, lengths=[1, 4])
    with pytest.raises(InputError, match="padded inputs must all be \\[B, T\\]"):
        TokenBatch.from_padded(x, torch.zeros(2, 4), x)


BAD = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("where", ["train", "rollout"])
def test_nonfinite_trained_token_is_masked_and_counted(bad, where):
    train = [torch.tensor([-0.5, -1.0]), torch.tensor([-0.2, -0.1, -3.0])]
    rollout = [torch.tensor([-0.6, -1.1]), torch.tensor([-0.2, -0.3, -2.0])]
    (train if where == "train" else rollout)[1][2] = bad
    masks = [torch.ones(2), torch.ones(3)]
    batch = TokenBatch.from_lists(train, rollout, masks)
    assert batch.mask.tolist() == [1, 1, 1, 1, 0]
    assert batch.nonfinite.tolist() == [0, 1] and batch.nonfinite_tokens == 1
    assert bool(torch.isfinite(batch.log_ratio).all())
    summary = mismatch_metrics(batch).summarize()
    assert summary["nonfinite_tokens"] == 1 and summary["trained_tokens"] == 4
    assert all(math.isfinite(v) for v in summary.values())
    # The dropped token does not move the statistics of its sequence: same as leaving it out.
    clean = TokenBatch.from_lists([train[0], train[1][:2]], [rollout[0], rollout[1][:2]], [masks[0], masks[1][:2]])
    clean_summary = mismatch_metrics(clean).summarize()
    for name, value in clean_summary.items():
        if name != "nonfinite_tokens":
            assert summary[name] == pytest.approx(value, rel=1e-6), name
    for spec in PRESETS.values():
        result = apply_correction(spec, batch)
        assert bool(torch.isfinite(result.weights).all()) and float(result.weights[4]) == 0.0
        assert all(math.isfinite(v) for v in result.metrics.summarize().values())
    shaped = shape_advantages(batch, torch.ones(batch.num_seqs), DCGRPOSettings(), 0.5, 0.01)
    assert bool(torch.isfinite(shaped.advantages).all()) and math.isfinite(shaped.discrepancy)


@pytest.mark.parametrize("bad", BAD)
def test_nonfinite_policy_error_names_the_sample(bad):
    train = [torch.zeros(0), torch.tensor([-0.5, -1.0]), torch.tensor([-0.2, -0.1, -3.0])]
    rollout = [torch.zeros(0), torch.tensor([-0.6, -1.1]), torch.tensor([-0.2, bad, -2.0])]
    masks = [torch.zeros(0), torch.ones(2), torch.ones(3)]
    with pytest.raises(InputError, match=r"sample 2: non-finite log-prob at response token 1.*nonfinite: mask"):
        TokenBatch.from_lists(train, rollout, masks, nonfinite="error")


def test_impossible_log_probs_are_dropped_and_counted_and_rounding_reads_as_zero():
    """A log-prob of 0.5 (p = 1.65) is impossible: dropped like a NaN and counted in both counters; 4e-4 is rounding
    of a near-certain token (<= LOG_PROB_TOLERANCE): kept as 0. The statistics equal those without the dropped
    token, and the warning says what happened."""
    train = [torch.tensor([-0.5, 4e-4]), torch.tensor([-0.2, 0.5, -3.0])]
    rollout = [torch.tensor([-0.6, -1e-3]), torch.tensor([-0.2, -0.3, 2e-4])]
    masks = [torch.ones(2), torch.ones(3)]
    with pytest.warns(RuntimeWarning, match="impossible"):
        batch = TokenBatch.from_lists(train, rollout, masks)
    assert batch.mask.tolist() == [1, 1, 1, 0, 1]
    assert batch.nonfinite.tolist() == [0, 1] and batch.impossible.tolist() == [0, 1]
    assert batch.train_log_probs.tolist()[1] == 0.0 and batch.rollout_log_probs.tolist()[4] == 0.0
    assert bool((batch.train_log_probs <= 0).all() and (batch.rollout_log_probs <= 0).all())
    expected = TokenBatch.from_lists([torch.tensor([-0.5, 0.0]), torch.tensor([-0.2, -3.0])],
                                     [torch.tensor([-0.6, -1e-3]), torch.tensor([-0.2, 0.0])], [torch.ones(2)] * 2)
    summary, clean = mismatch_metrics(batch).summarize(), mismatch_metrics(expected).summarize()
    assert summary["prob_diff_max"] <= 1.0 and summary["nonfinite_tokens"] == 1
    for name, value in clean.items():
        if name != "nonfinite_tokens":
            assert summary[name] == pytest.approx(value, rel=1e-6), name


def test_rounding_above_zero_costs_no_second_host_read_and_reads_as_zero():
    """Log-probs above 0 by at most LOG_PROB_TOLERANCE (an engine's rounding of a near-certain token) are clamped to 0
    after the one host read of the checks: the read already shows that nothing is dropped. An impossible value still
    costs the second read (which trained tokens to drop)."""
    train = [torch.tensor([-0.5, 4e-4]), torch.tensor([-0.2, -0.1, -3.0])]
    rollout = [torch.tensor([-0.6, -1e-3]), torch.tensor([-0.2, -0.3, 2e-4])]
    masks = [torch.ones(2), torch.ones(3)]
    with HostGuard() as guard:
        batch = TokenBatch.from_lists(train, rollout, masks)
    assert guard.syncs == 1 and not batch.dropped
    assert batch.train_log_probs.tolist()[1] == 0.0 and batch.rollout_log_probs.tolist()[4] == 0.0
    assert batch.mask.tolist() == [1.0] * 5 and batch.nonfinite.tolist() == batch.impossible.tolist() == [0, 0]
    for bad, counter in ((0.5, "impossible"), (math.nan, "nonfinite"), (-math.inf, "nonfinite")):
        train[1][1] = bad  # beside the rounding: which trained tokens to drop takes the second read
        with HostGuard() as guard, pytest.warns(RuntimeWarning, match="dropped"):
            batch = TokenBatch.from_lists(train, rollout, masks)
        assert guard.syncs == 2 and batch.dropped and getattr(batch, counter).tolist() == [0, 1], bad


def test_impossible_log_prob_with_the_error_policy_names_the_sample():
    train = [torch.tensor([-0.5]), torch.tensor([-0.2, -0.1, 3.0])]
    rollout = [torch.tensor([-0.6]), torch.tensor([-0.2, -0.3, -1.0])]
    with pytest.raises(InputError, match=r"sample 1: impossible log-prob \(above 0\) at response token 2 "
                                         r"\(train_log_probs=3.0, rollout_log_probs=-1.0\)"):
        TokenBatch.from_lists(train, rollout, [torch.ones(1), torch.ones(3)], nonfinite="error")


@pytest.mark.parametrize("value", [2, -1, 0.5, math.nan])
def test_loss_mask_values_other_than_0_and_1_are_an_error(value):
    masks = [torch.ones(2), torch.tensor([1.0, 0.0, value])]
    with pytest.raises(InputError, match=r"sample 1: loss mask value other than 0/1 at response token 2 "
                                         rf"\(loss_masks={value:g}\); loss masks must be 0 or 1"):
        TokenBatch.from_lists([torch.zeros(2), torch.zeros(3)], [torch.zeros(2), torch.zeros(3)], masks)
    batch = TokenBatch.from_lists([torch.zeros(2)], [torch.zeros(2)], [torch.tensor([True, False])])
    assert batch.mask.tolist() == [1.0, 0.0]


def test_per_sample_entries_must_be_tensors():
    with pytest.raises(InputError, match="sample 1: rollout_log_probs must be a tensor, got list"):
        TokenBatch.from_lists([torch.zeros(1)] * 2, [torch.zeros(1), [0.0]], [torch.ones(1)] * 2)


@pytest.mark.parametrize("nonfinite", ["mask", "error"])
def test_nonfinite_values_at_masked_out_positions_are_ignored(nonfinite):
    train = [torch.tensor([-0.5, math.nan, -1.0])]
    rollout = [torch.tensor([-0.6, -0.1, -math.inf])]
    masks = [torch.tensor([1.0, 0.0, 0.0])]
    batch = TokenBatch.from_lists(train, rollout, masks, nonfinite=nonfinite)
    assert batch.nonfinite_tokens == 0
    assert batch.mask.tolist() == [1, 0, 0]
    summary = mismatch_metrics(batch).summarize()
    assert summary["training_log_ppl"] == pytest.approx(0.5)
    assert summary["rollout_log_ppl"] == pytest.approx(0.6)
    assert all(math.isfinite(v) for v in summary.values())


def test_empty_batch():
    batch = TokenBatch.from_lists([], [], [])
    assert batch.num_seqs == 0 and batch.segments.num_tokens == 0
    summary = mismatch_metrics(batch).summarize()
    assert summary["valid_sequences"] == 0 and summary["trained_tokens"] == 0
    assert all(v == 0.0 for v in summary.values())
    for spec in PRESETS.values():
        result = apply_correction(spec, batch)
        assert result.weights.shape == (0,) and result.mask.shape == (0,)
        assert all(v == 0.0 for v in result.metrics.summarize().values())
    shaped = shape_advantages(batch, torch.zeros(0), DCGRPOSettings(), 0.5, 0.01)
    assert shaped.advantages.shape == (0,) and shaped.discrepancy is None


def test_batch_without_trained_tokens():
    train = [torch.tensor([-0.5, -1.0]), torch.zeros(0), torch.tensor([-3.0])]
    rollout = [torch.tensor([-0.6, -1.4]), torch.zeros(0), torch.tensor([-1.0])]
    batch = TokenBatch.from_lists(train, rollout, [torch.zeros(2), torch.zeros(0), torch.zeros(1)])
    summary = mismatch_metrics(batch).summarize()
    assert summary.pop("sequences") == 3 and summary["valid_sequences"] == 0
    assert all(v == 0.0 for v in summary.values())
    for spec in PRESETS.values():
        result = apply_correction(spec, batch)
        assert bool((result.weights == 0).all()) and bool((result.mask == 0).all())
        assert all(math.isfinite(v) for v in result.metrics.summarize().values())
    shaped = shape_advantages(batch, torch.tensor([1.0, 1.0, -1.0]), DCGRPOSettings(), 0.5, 0.01)
    assert shaped.discrepancy is None and shaped.penalty_share == 0.0
    assert discrepancy(batch) is None


def test_segment_sums_are_differentiable_and_exact_across_block_boundaries():
    from mismatch_ctrl.batch import BLOCK, Segments

    sizes = [0, 3, BLOCK - 3, BLOCK, 2 * BLOCK + 5, 1, 0, 3 * BLOCK]
    segments = Segments(sizes)
    x = torch.randn(segments.num_tokens, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(len(sizes), dtype=torch.float64)
    got = segments.sum(x)[:, 0]
    expected = torch.stack([piece.sum() for piece in x.detach().split(sizes)])
    torch.testing.assert_close(got, expected)
    (got * weights).sum().backward()
    torch.testing.assert_close(x.grad, segments.expand(weights))
    maxima = segments.max_rows(x.detach().unsqueeze(0))[:, 0]
    empty = torch.tensor(-math.inf, dtype=torch.float64)
    torch.testing.assert_close(maxima, torch.stack([p.max() if p.numel() else empty for p in x.detach().split(sizes)]))
