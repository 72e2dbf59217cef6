"""The additive log-histogram: quantiles within one bin of the exact order statistic; sums of histograms pool data."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from mismatch_ctrl.sketch import BINS, HIGH, LOW, histogram_quantiles, log_histogram

BIN_RATIO = (HIGH / LOW) ** (1 / BINS)
QS = [0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]

positive = st.floats(-7.5, 1.9).map(lambda e: 10.0 ** e)  # log-uniform over most of [LOW, HIGH]
values_lists = st.lists(st.one_of(positive, st.just(0.0), st.floats(150.0, 1e4)), min_size=1, max_size=60)


def assert_within_one_bin(got: float, exact: float) -> None:
    exact = min(max(exact, LOW), HIGH)
    tol = BIN_RATIO * (1 + 1e-9)
    assert exact / tol <= got <= exact * tol, (got, exact)


@settings(max_examples=80, deadline=None)
@given(values_lists)
def test_quantiles_are_within_one_bin_of_the_exact_order_statistic(values):
    got = histogram_quantiles(log_histogram(torch.tensor(values, dtype=torch.float64)), QS)
    for q, value in zip(QS, got):
        assert_within_one_bin(value, ref.order_statistic(values, q))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(positive, st.integers(0, 4)), min_size=1, max_size=30))
def test_integer_weights_equal_repetition(pairs):
    values = torch.tensor([v for v, _ in pairs], dtype=torch.float64)
    weights = torch.tensor([w for _, w in pairs], dtype=torch.float64)
    repeated = torch.tensor([v for v, w in pairs for _ in range(w)], dtype=torch.float64)
    assert np.array_equal(log_histogram(values, weights), log_histogram(repeated))


@settings(max_examples=40, deadline=None)
@given(values_lists, values_lists)
def test_histograms_of_shards_sum_to_the_histogram_of_the_union(a, b):
    ta, tb = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    assert np.array_equal(log_histogram(ta) + log_histogram(tb), log_histogram(torch.cat([ta, tb])))


def test_median_of_known_values():
    (median,) = histogram_quantiles(log_histogram(torch.tensor([0.01, 0.02, 0.03, 0.5, 2.0])), [0.5])
    assert_within_one_bin(median, 0.03)
    assert median == pytest.approx(0.03, rel=BIN_RATIO - 1)


def test_underflow_overflow_and_empty():
    assert histogram_quantiles(log_histogram(torch.zeros(5)), [0.5]) == [LOW]
    assert histogram_quantiles(log_histogram(torch.full((5,), 1e6)), [0.5]) == [HIGH]
    counts = log_histogram(torch.tensor([0.0, 1e6, 1.0]))
    assert counts[0] == 1 and counts[-1] == 1 and counts.sum() == 3
    assert all(math.isnan(q) for q in histogram_quantiles(log_histogram(torch.zeros(0)), [0.0, 0.5]))
    zero_weight = log_histogram(torch.tensor([1.0, 2.0]), torch.zeros(2))
    assert math.isnan(histogram_quantiles(zero_weight, [0.5])[0])
