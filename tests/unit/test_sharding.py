"""Sharding invariance: context-parallel pieces of every sequence and data-parallel subsets of the sequences, combined
by the gathers (simulated in-process by fake_group), give the results of the unsharded batch."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import measure
from fake_group import FakeGroup, run_ranks
from mismatch_ctrl.correction import apply_correction
from mismatch_ctrl.dcgrpo import DCGRPOSettings
from mismatch_ctrl.dist import LOCAL, Reducers
from mismatch_ctrl.presets import PRESETS
from mismatch_ctrl.sketch import BINS, HIGH, LOW

from .inputs import random_batch, raw_batches, seq_advantages
from .test_correction import specs

BIN_RATIO = (HIGH / LOW) ** (1 / BINS)
DC_SETTINGS = [DCGRPOSettings(enabled=True, signal=s, penalty_form=f, aggregation=a)
               for s, f, a in [("prob_diff", "lagrangian", "seq_mean"), ("k3", "hinge", "token_mean"),
                               ("log_diff", "centered", "seq_mean")]]


def close(a, b, **kw):
    torch.testing.assert_close(a, b, rtol=kw.get("rtol", 1e-4), atol=kw.get("atol", 1e-5))


def run_core(raw, spec, dc, advantages, reducers=LOCAL):
    batch = raw.token_batch()
    metrics = measure.metrics(batch, reducers)
    return dict(metrics=metrics, summary=metrics.summary, correction=apply_correction(spec, batch, reducers),
                shaped=measure.shaped(batch, advantages, dc, 0.3, 0.004, reducers),
                discrepancy=measure.discrepancy(batch, reducers))


def cp_token_indices(sizes, parts: int, seed: int, zigzag: bool) -> list[list[torch.Tensor]]:
    """For each participant, the token indices it holds of every sequence: contiguous chunks with random (possibly
    empty) sizes; ``zigzag`` gives participant p chunks p and 2P-1-p of 2P (slime's CP layout)."""
    g = torch.Generator().manual_seed(seed)
    chunks = 2 * parts if zigzag else parts
    out: list[list[torch.Tensor]] = [[] for _ in range(parts)]
    for n in sizes:
        cuts = sorted(torch.randint(n + 1, (chunks - 1,), generator=g).tolist())
        bounds = [0, *cuts, n]
        pieces = [torch.arange(bounds[k], bounds[k + 1]) for k in range(chunks)]
        for p in range(parts):
            out[p].append(torch.cat([pieces[p], pieces[chunks - 1 - p]]) if zigzag else pieces[p])
    return out


def assert_summaries_equal(got, expected):
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name


def assert_discrepancy_equal(got, expected):
    if expected is None:
        assert got is None
    else:
        assert expected / BIN_RATIO <= got <= expected * BIN_RATIO


@settings(max_examples=25, deadline=None)
@given(raw=raw_batches(min_seqs=1), parts=st.integers(1, 4), seed=st.integers(0, 10**6), zigzag=st.booleans(),
       spec=st.one_of(st.sampled_from(sorted(PRESETS)).map(PRESETS.get), specs()), dc=st.sampled_from(DC_SETTINGS))
def test_context_parallel_pieces_match_the_unsharded_batch(raw, parts, seed, zigzag, spec, dc):
    advantages, _ = seq_advantages(raw, seed)
    full = run_core(raw, spec, dc, advantages)
    full_weights = full["correction"].weights.split(raw.sizes)
    full_mask = full["correction"].mask.split(raw.sizes)
    full_shaped = full["shaped"].advantages.split(raw.sizes)
    indices = cp_token_indices(raw.sizes, parts, seed, zigzag)
    group = FakeGroup(parts, timeout=5)

    def participant(p):
        piece = raw.piece(indices[p])
        return piece, run_core(piece, spec, dc, advantages, Reducers(seq=group.gather(p)))

    for p, (piece, out) in enumerate(run_ranks(parts, participant, [group])):
        for kind in ("mean", "max", "min", "total"):
            for name, values in full["metrics"].per_sequence(kind).items():
                close(out["metrics"].per_sequence(kind)[name], values)
        assert_summaries_equal(out["summary"], full["summary"])
        corr = out["correction"]
        for name, values in full["correction"].metrics.per_sequence("mean").items():
            close(corr.metrics.per_sequence("mean")[name], values)
        assert_summaries_equal(corr.metrics.summary, full["correction"].metrics.summary)
        pieces = [ix for ix in indices[p]]
        assert torch.equal(corr.mask, torch.cat([m[ix] for m, ix in zip(full_mask, pieces)]))
        close(corr.weights, torch.cat([w[ix] for w, ix in zip(full_weights, pieces)]))
        close(out["shaped"].advantages, torch.cat([a[ix] for a, ix in zip(full_shaped, pieces)]))
        for key in ("discrepancy", "penalty_abs_mean", "penalty_share"):
            expected = getattr(full["shaped"], key)
            got = getattr(out["shaped"], key)
            assert got is None if expected is None else got == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert_discrepancy_equal(out["discrepancy"], full["discrepancy"])


@settings(max_examples=25, deadline=None)
@given(raw=raw_batches(max_seqs=10), ranks=st.integers(1, 4), seed=st.integers(0, 10**6),
       spec=st.one_of(st.sampled_from(sorted(PRESETS)).map(PRESETS.get), specs()), dc=st.sampled_from(DC_SETTINGS))
def test_data_parallel_shards_match_the_unsharded_batch(raw, ranks, seed, spec, dc):
    """Batch normalisation included: it normalises over the data-parallel batch."""
    advantages, _ = seq_advantages(raw, seed)
    full = run_core(raw, spec, dc, advantages)
    owner = torch.randint(ranks, (len(raw.sizes),), generator=torch.Generator().manual_seed(seed)).tolist()
    shards = [[i for i, o in enumerate(owner) if o == r] for r in range(ranks)]  # some may be empty
    group = FakeGroup(ranks, timeout=5)

    def participant(r):
        shard = raw.select(shards[r])
        return run_core(shard, spec, dc, advantages[shards[r]], Reducers(batch=group.gather(r)))

    full_weights = full["correction"].weights.split(raw.sizes)
    for r, out in enumerate(run_ranks(ranks, participant, [group])):
        rows = torch.tensor(shards[r], dtype=torch.long)
        for kind in ("mean", "max", "min", "total"):
            for name, values in full["metrics"].per_sequence(kind).items():
                close(out["metrics"].per_sequence(kind)[name], values[rows])
        assert_summaries_equal(out["summary"], full["summary"])
        assert_summaries_equal(out["correction"].metrics.summary, full["correction"].metrics.summary)
        expected_weights = torch.cat([full_weights[i] for i in shards[r]]) if shards[r] else torch.zeros(0)
        close(out["correction"].weights, expected_weights)
        for key in ("discrepancy", "penalty_abs_mean", "penalty_share"):
            expected = getattr(full["shaped"], key)
            got = getattr(out["shaped"], key)
            assert got is None if expected is None else got == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert_discrepancy_equal(out["discrepancy"], full["discrepancy"])


def test_data_parallel_times_context_parallel_mesh():
    """2 DP x 2 CP ranks: the seq gather over the CP group of a DP rank, the batch gather over the DP group of a CP
    rank."""
    raw = random_batch(seed=5, num_seqs=9, noise=0.01)
    dc = DC_SETTINGS[0]
    spec = dataclasses.replace(PRESETS["geo_rs_token_tis"], batch_normalize=True)
    advantages, _ = seq_advantages(raw, 5)
    full = run_core(raw, spec, dc, advantages)
    shards = [[0, 2, 3, 7], [1, 4, 5, 6, 8]]
    cp_groups = [FakeGroup(2, timeout=5) for _ in range(2)]
    dp_groups = [FakeGroup(2, timeout=5) for _ in range(2)]

    def participant(rank):
        dp, cp = divmod(rank, 2)
        shard = raw.select(shards[dp])
        indices = cp_token_indices(shard.sizes, 2, seed=dp, zigzag=True)[cp]
        return run_core(shard.piece(indices), spec, dc, advantages[shards[dp]],
                        Reducers(seq=cp_groups[dp].gather(cp), batch=dp_groups[cp].gather(dp)))

    for out in run_ranks(4, participant, cp_groups + dp_groups):
        assert_summaries_equal(out["summary"], full["summary"])
        assert_summaries_equal(out["correction"].metrics.summary, full["correction"].metrics.summary)
        assert out["shaped"].discrepancy == pytest.approx(full["shaped"].discrepancy, rel=1e-5)
        assert out["shaped"].penalty_share == pytest.approx(full["shaped"].penalty_share, rel=1e-5)
        assert_discrepancy_equal(out["discrepancy"], full["discrepancy"])
        assert math.isfinite(out["summary"]["prob_diff_max"])
