"""Token discrepancy signals (ALGORITHMS.md section 1) against the reference, the [-20, 20] clamp and K3 >= 0."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.signals import SIGNALS, k3, token_signal

from .inputs import raw_batches


def flat(rows):
    return torch.tensor([x for row in rows for x in row], dtype=torch.float64)


@settings(max_examples=40, deadline=None)
@given(raw_batches(), st.sampled_from(SIGNALS))
def test_signal_matches_reference(raw, signal):
    batch = raw.token_batch()
    expected = flat([ref.token_signal(s, signal) for s in raw.seqs()])
    torch.testing.assert_close(token_signal(batch, signal).double(), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("lp_train, lp_roll, l", [(-1.0, -40.0, 20.0), (-40.0, -1.0, -20.0), (-3.0, -3.5, 0.5)])
def test_log_ratio_is_clamped_before_exp(lp_train, lp_roll, l):
    batch = TokenBatch.from_lists([torch.tensor([lp_train])], [torch.tensor([lp_roll])], [torch.ones(1)])
    assert float(batch.log_ratio[0]) == pytest.approx(l)
    got = {s: float(token_signal(batch, s)[0]) for s in SIGNALS}
    assert got["log_diff"] == pytest.approx(abs(l))
    assert got["ratio_diff"] == pytest.approx(abs(math.exp(l) - 1.0), rel=1e-6)
    assert got["k3"] == pytest.approx(math.exp(l) - 1.0 - l, rel=1e-6)
    # prob_diff compares probabilities, which need no clamp.
    assert got["prob_diff"] == pytest.approx(abs(math.exp(lp_train) - math.exp(lp_roll)), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-20.0, 20.0, width=32), min_size=1, max_size=50))
def test_k3_is_nonnegative_and_accurate(values):
    l = torch.tensor(values, dtype=torch.float32)
    got = k3(l)
    assert bool((got >= 0).all())
    expected = torch.tensor([math.expm1(x) - x for x in values], dtype=torch.float64)
    # fp32 rounding of expm1(l) ~ |l| * 6e-8 is the only error left (exp(l) - 1 - l in fp32 errs by 6e-8 absolute).
    assert bool(((got.double() - expected).abs() <= 1e-6 * expected + 2e-7 * l.double().abs()).all())


def test_unknown_signal_is_rejected():
    batch = TokenBatch.from_lists([torch.zeros(1)], [torch.zeros(1)], [torch.ones(1)])
    with pytest.raises(ValueError, match="unknown discrepancy signal 'kl'"):
        token_signal(batch, "kl")
