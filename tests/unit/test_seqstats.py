"""The per-sequence machinery: segment reductions and broadcasts against per-sequence loops, the statistics table
(columns by name, written once), batch totals over ranks, and a number of tensor operations that does not depend on
the number of sequences."""

from collections import Counter

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from fake_group import FakeGroup, run_ranks
from mismatch_ctrl.batch import BLOCK, Segments, TokenBatch
from mismatch_ctrl.correction import CorrectionPlan, correction_columns
from mismatch_ctrl.dcgrpo import DCGRPOSettings, shape_advantages, shaping_columns
from mismatch_ctrl.dist import local_gather
from mismatch_ctrl.metrics import METRIC_COLUMNS, TOKEN_COLUMNS, broadcast_means, mismatch_metrics, token_shaped
from mismatch_ctrl.presets import PRESETS
from mismatch_ctrl import seqstats
from mismatch_ctrl.seqstats import (CHUNK_BYTES, BatchTotals, Columns, SeqStats,
                                   default_chunk_tokens, reduce_batch)

from .inputs import random_batch

sizes_lists = st.lists(st.one_of(st.sampled_from([0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK]),
                                 st.integers(0, 700)), max_size=12)


@settings(max_examples=60, deadline=None)
@given(sizes_lists, st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_segment_reductions_and_broadcast_match_per_sequence_loops(sizes, k, seed):
    g = torch.Generator().manual_seed(seed)
    segments = Segments(sizes)
    rows = torch.randn(k, segments.num_tokens, generator=g, dtype=torch.float64)
    sums, maxima = segments.sum_rows(rows), segments.max_rows(rows)
    assert sums.shape == maxima.shape == (len(sizes), k)
    for i, piece in enumerate(rows.split(sizes, dim=1) if sizes else []):
        torch.testing.assert_close(sums[i], piece.sum(1))
        expected = piece.amax(1) if piece.shape[1] else torch.full((k,), -torch.inf, dtype=torch.float64)
        assert torch.equal(maxima[i], expected)
    values = torch.randn(k, len(sizes), generator=g)
    expected = torch.repeat_interleave(values, torch.tensor(sizes, dtype=torch.long), dim=1)
    assert torch.equal(segments.expand(values), expected)
    assert torch.equal(segments.expand(values[0]), expected[0])


def test_segment_sums_are_differentiable():
    segments = Segments([3, 0, BLOCK + 5, 2 * BLOCK])
    x = torch.randn(segments.num_tokens, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(4, dtype=torch.float64)
    (segments.sum(x, 2 * x)[:, 1] * weights).sum().backward()
    torch.testing.assert_close(x.grad, 2 * segments.expand(weights))


def test_a_column_two_consumers_request_is_written_and_reduced_once():
    calls = Counter()

    def writer(name):
        def write(t, out):
            calls[name] += 1
            torch.mul(t.log_ratio, t.mask, out=out)
        return write

    shared = writer("shared")
    columns = Columns({"shared": shared}, {"shared": shared}) | Columns({"shared": shared, "own": writer("own")})
    stats = SeqStats.build(random_batch(seed=1, num_seqs=5).token_batch(), columns)
    assert calls == {"shared": 1, "own": 1}
    assert set(stats.index) == {"trained", "shared", "own", "nonfinite"} and set(stats.max_index) == {"shared"}
    np.testing.assert_allclose(stats.sum("shared"), stats.sum("own"))


def test_batch_totals_add_sums_and_take_maxima_over_ranks_in_one_gather():
    group = FakeGroup(3)

    def rank(r):
        totals = BatchTotals()
        totals.add("sum", "counts", [r, 10.0 * r])
        totals.add("max", "top", [float(r), -float(r)])  # the second entry is a minimum, negated
        return {name: values.tolist() for name, values in totals.reduce(group.gather(r)).items()}

    for reduced in run_ranks(3, rank, [group]):
        assert reduced == {"counts": [3.0, 30.0], "top": [2.0, 0.0]}
    assert group.rounds == 1
    with pytest.raises(ValueError, match="added twice"):
        totals = BatchTotals()
        totals.add("sum", "x", [1.0])
        totals.add("sum", "x", [1.0])


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def hook_core(batch: TokenBatch) -> int:
    """The tensor operations of the two hooks' core (the hooks also convert slime's lists): the TIS hook's
    statistics, metrics, ``geo_rs_token_tis`` correction and token outputs; the advantage hook's statistics, metrics
    and DC-GRPO shaping."""
    spec, settings = PRESETS["geo_rs_token_tis"], DCGRPOSettings(enabled=True)
    counter = OpCounter()
    with counter:
        stats = SeqStats.build(batch, METRIC_COLUMNS | TOKEN_COLUMNS | correction_columns(spec))
        metrics, plan = mismatch_metrics(stats), CorrectionPlan(spec, stats)
        reduce_batch(local_gather, metrics, plan)
        broadcast = broadcast_means([metrics, plan.metrics])
        rows = plan.sequence_rows()
        tokens = stats.at_tokens([*rows, *(v for _, v in broadcast)], torch.float32)
        plan.finish(tokens[:len(rows)], token_outputs=True)
        token_shaped([metrics, plan.metrics], torch.float32, dict(zip((n for n, _ in broadcast), tokens[len(rows):])))
        stats = SeqStats.build(batch, METRIC_COLUMNS | shaping_columns(settings, 0.005))
        metrics, shaped = mismatch_metrics(stats), shape_advantages(stats, torch.ones(batch.num_seqs), settings, 0.1,
                                                                    0.005)
        reduce_batch(local_gather, metrics, shaped)
    return counter.count


def packed_batch(num_seqs: int, tokens: int, seed: int) -> TokenBatch:
    """About ``tokens`` tokens packed from ``num_seqs`` responses of random lengths, ~10% of them untrained."""
    g = torch.Generator().manual_seed(seed)
    sizes = (torch.rand(num_seqs, generator=g) * 2 * tokens / num_seqs).long().clamp_min(1).tolist()
    raw = random_batch(seed=seed, num_seqs=num_seqs, max_len=1, empty=0.0)  # values only; the layout is set below
    train = torch.cat(raw.train).repeat(sum(sizes))[:sum(sizes)]
    rollout = torch.cat(raw.rollout).repeat(sum(sizes))[:sum(sizes)]
    return TokenBatch.build(Segments(sizes), train, rollout, (torch.rand(sum(sizes), generator=g) < 0.9).float())


def test_the_number_of_tensor_operations_does_not_depend_on_the_number_of_sequences():
    """Deterministic, not timed: 8, 64 and 256 sequences of one micro-batch of tokens dispatch the same number of
    operations (benchmarks/bench_hooks.py reports the hooks' counts against their targets)."""
    assert len({hook_core(packed_batch(n, 20480, seed=n)) for n in (8, 64, 256)}) == 1


def test_off_cpu_the_number_of_tensor_operations_does_not_depend_on_the_number_of_tokens(monkeypatch):
    """Issue 18 item 13: on a GPU a call is one chunk, so 20k and 300k tokens dispatch the same operations; on a CPU
    the cache-sized chunks (4 MB: ~70k tokens of the TIS hook's columns) add operations. The GPU path is the one
    taken for any device type outside ``CHUNKED_DEVICES``; emptying it takes that path on this CPU."""
    small, large = packed_batch(64, 20_000, seed=1), packed_batch(64, 300_000, seed=2)
    assert hook_core(large) > hook_core(small)  # chunked on the CPU
    monkeypatch.setattr(seqstats, "CHUNKED_DEVICES", frozenset())
    assert hook_core(large) == hook_core(small)


def test_batches_are_chunked_by_cache_size_on_a_cpu_and_whole_elsewhere():
    rows, size = 17, 4
    most = CHUNK_BYTES // (rows * size) // BLOCK * BLOCK
    for total in (0, 1, BLOCK, most, most + 1, 300_000, 2_000_003):
        assert default_chunk_tokens(torch.device("cuda"), total, rows, size) == max(total, 1)
        chunk = default_chunk_tokens(torch.device("cpu"), total, rows, size)
        if total <= most:
            assert chunk == most  # one chunk of whole blocks
            continue
        chunks = -(-total // chunk)
        assert chunk * rows * size <= CHUNK_BYTES and chunks == -(-total // most)  # the fewest that fit
        assert chunks * chunk - total < chunks  # about equal shares of the tokens


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(1, 12), st.sampled_from([1, 128, 256, 300]))
def test_chunked_statistics_equal_the_single_chunk_ones(seed, num_seqs, chunk):
    """A batch written and reduced in chunks of tokens gives the same table and the same kept rows."""
    batch = random_batch(seed=seed, num_seqs=num_seqs, max_len=300).token_batch()
    spec, settings = PRESETS["geo_rs_token_tis"], DCGRPOSettings(enabled=True, penalty_form="hinge")
    columns = METRIC_COLUMNS | TOKEN_COLUMNS | correction_columns(spec) | shaping_columns(settings, 0.01)
    whole, chunked = SeqStats.build(batch, columns), SeqStats.build(batch, columns, chunk_tokens=chunk)
    assert whole.index == chunked.index and whole.max_index == chunked.max_index
    np.testing.assert_allclose(chunked.table, whole.table, rtol=1e-5, atol=1e-5)
    if batch.segments.num_tokens > -(-chunk // BLOCK) * BLOCK:  # several chunks (of whole blocks)
        assert set(chunked.rows) == columns.keep
    for name, row in chunked.rows.items():
        assert torch.equal(row, whole.rows[name]), name


def test_metrics_without_token_rows_are_broadcast():
    """Chunked statistics keep only the rows consumers compute with; the other mean metrics still come out as
    token-shaped tensors that slime's per-sample mean turns into the per-sequence values."""
    raw = random_batch(seed=4, num_seqs=6, max_len=60, empty=0.0)
    batch = raw.token_batch()
    metrics = mismatch_metrics(SeqStats.build(batch, METRIC_COLUMNS, chunk_tokens=BLOCK))
    reduce_batch(local_gather, metrics)
    broadcast = broadcast_means([metrics])
    assert {name for name, _ in broadcast} == set(metrics.names("mean"))
    tokens = metrics.stats.at_tokens([v for _, v in broadcast], torch.float32)
    shaped = token_shaped([metrics], torch.float32, dict(zip((name for name, _ in broadcast), tokens)))
    for name, values in metrics.per_sequence("mean").items():
        means = [float((x * m).sum() / m.sum().clamp_min(1)) for x, m in zip(batch.segments.split(shaped[name]),
                                                                            batch.segments.split(batch.mask))]
        np.testing.assert_allclose(means, (values * metrics.stats.valid).numpy(), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
