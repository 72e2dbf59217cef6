"""Rollout correction (ALGORITHMS.md section 3): weights, modified mask and metrics of every preset and of random
explicit specs against the reference; batch normalisation; all-rejected batches."""

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.correction import LEVELS, MODES, NORMALIZE_MIN_MEAN, CorrectionSpec, apply_correction
from mismatch_ctrl.presets import PRESETS

from .inputs import random_batch, raw_batches


@st.composite
def specs(draw) -> CorrectionSpec:
    """Valid explicit specs (the combinations the config accepts)."""
    is_high = draw(st.sampled_from([1.001, 1.05, 1.5, 2.0, 5.0]))
    rs_level = draw(st.sampled_from([None, *LEVELS]))
    rs_low = draw(st.sampled_from([None, 0.5, 0.9, 0.99, 0.999]))
    rs_high = draw(st.sampled_from([None, 1.001, 1.01, 1.1, 2.0]))
    if rs_level is not None and rs_low is None and rs_high is None:
        rs_high = 1.01
    return CorrectionSpec(
        is_level=draw(st.sampled_from([None, *LEVELS])),
        is_mode=draw(st.sampled_from(MODES)),
        is_low=draw(st.sampled_from([None, 0.0, 0.2, 0.5, 0.95]).filter(lambda x: x is None or x < is_high)),
        is_high=is_high,
        rs_level=rs_level,
        rs_low=rs_low if rs_level else None,
        rs_high=rs_high if rs_level else None,
        rs_k3_max=draw(st.sampled_from([None, 1e-5, 1e-3, 0.1])),
        veto=draw(st.sampled_from([None, 1e-4, 0.1, 0.5])),
        batch_normalize=draw(st.booleans()),
    )


def flat(rows):
    return torch.tensor([x for row in rows for x in row], dtype=torch.float64)


def check_against_reference(spec: CorrectionSpec, raw) -> None:
    batch = raw.token_batch()
    result = apply_correction(spec, batch)
    seqs = raw.seqs()
    weights, keep, rows = ref.correction(spec, seqs)
    assert torch.equal(result.mask.double(), flat(keep))
    torch.testing.assert_close(result.weights.double(), flat(weights), rtol=1e-4, atol=1e-6)
    got = {**result.metrics.per_sequence("mean"), **result.metrics.per_sequence("total")}
    assert set(got) == (set(rows[0]) if rows else set(got))
    for name, values in got.items():
        expected = torch.tensor([row[name] for row in rows], dtype=torch.float64)
        torch.testing.assert_close(values.double(), expected, rtol=1e-4, atol=1e-6, msg=name)
    summary = result.metrics.summary
    expected = ref.summarize(rows, [s.count for s in seqs])
    for name, value in expected.items():
        assert summary[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    for name, value in ref.correction_diagnostics(weights, keep, seqs).items():
        assert summary[name] == pytest.approx(value, rel=1e-4, abs=1e-6), name
    # Invariants: rejection only removes tokens; weights live on the kept tokens and are finite.
    assert bool((result.mask <= batch.mask).all())
    assert bool((result.weights[result.mask == 0] == 0).all())
    assert bool(torch.isfinite(result.weights).all()) and bool((result.weights >= 0).all())
    assert not result.weights.requires_grad


@pytest.mark.parametrize("preset", sorted(PRESETS))
@settings(max_examples=15, deadline=None)
@given(raw=raw_batches())
def test_preset_matches_reference(preset, raw):
    check_against_reference(PRESETS[preset], raw)


@settings(max_examples=80, deadline=None)
@given(specs(), raw_batches())
def test_explicit_spec_matches_reference(spec, raw):
    check_against_reference(spec, raw)


def test_presets_are_the_documented_definitions():
    p = PRESETS
    assert (p["token_tis"].is_level, p["token_tis"].is_mode, p["token_tis"].is_high) == ("token", "truncate", 2.0)
    assert (p["token_mis"].is_level, p["token_mis"].is_mode, p["token_mis"].is_bounds) == ("token", "mask", (0.5, 2.0))
    assert (p["seq_tis"].is_level, p["seq_tis"].is_mode, p["seq_tis"].is_high) == ("sequence", "truncate", 2.0)
    assert (p["seq_mis"].is_level, p["seq_mis"].is_mode, p["seq_mis"].is_bounds) == ("sequence", "mask", (0.0, 2.0))
    geo = (p["geo_mis"].rs_level, p["geo_mis"].rs_low, p["geo_mis"].rs_high, p["geo_mis"].veto)
    assert geo == ("geometric", 0.999, 1.001, 1e-4) and p["geo_mis"].is_level is None
    combo = p["geo_rs_token_tis"]
    assert (combo.rs_level, combo.rs_low, combo.rs_high, combo.veto) == ("geometric", 0.999, 1.001, 1e-4)
    assert (combo.is_level, combo.is_mode, combo.is_high) == ("token", "truncate", 2.0)
    assert p["k3_rs"].rs_k3_max == 0.01 and p["k3_rs"].is_level is None and p["k3_rs"].rs_level is None
    assert not p["none"].active


def test_geometric_level_is_length_normalised():
    # Two sequences with the same per-token log-ratio 0.0002 but lengths 4 and 400: the sequence-level ratios are
    # exp(0.0008) (inside [0.999, 1.001]) and exp(0.08) (outside); the geometric ratio exp(0.0002) is inside for both.
    l = 0.0002
    train = [torch.full((n,), -1.0 + l) for n in (4, 400)]
    rollout = [torch.full((n,), -1.0) for n in (4, 400)]
    masks = [torch.ones(4), torch.ones(400)]
    batch = TokenBatch.from_lists(train, rollout, masks)
    geo = apply_correction(PRESETS["geo_mis"], batch)
    assert bool((geo.mask == 1).all())
    seq = apply_correction(CorrectionSpec(rs_level="sequence", rs_low=0.999, rs_high=1.001), batch)
    assert seq.mask.tolist() == [1.0] * 4 + [0.0] * 400


def test_veto_rejects_the_whole_sequence():
    train = [torch.tensor([-1.0, -12.0, -1.0]), torch.tensor([-1.0, -1.0])]
    rollout = [torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-1.0, -1.0])]
    batch = TokenBatch.from_lists(train, rollout, [torch.ones(3), torch.ones(2)])
    result = apply_correction(CorrectionSpec(veto=1e-4), batch)
    assert result.mask.tolist() == [0, 0, 0, 1, 1]
    assert result.metrics.per_sequence("mean")["veto_seq_fraction"].tolist() == [1.0, 0.0]
    assert result.metrics.per_sequence("mean")["catastrophic_token_fraction"].tolist() == pytest.approx([1 / 3, 0.0])


@pytest.mark.parametrize("level", LEVELS)
@settings(max_examples=15, deadline=None)
@given(raw=raw_batches(min_seqs=1))
def test_batch_normalisation_gives_mean_one(level, raw):
    """Without rejection the kept weights are the IS weights of the trained tokens (sequences): mean 1 after
    normalisation, unless their mean was at most slime's threshold (then they stay as they are)."""
    spec = CorrectionSpec(is_level=level, is_mode="truncate", is_high=2.0, batch_normalize=True)
    batch = raw.token_batch()
    result = apply_correction(spec, batch)
    plain = apply_correction(dataclasses.replace(spec, batch_normalize=False), batch)
    kept = result.mask > 0
    if not bool(kept.any()):
        return

    def mean(weights: torch.Tensor) -> float:
        if level == "token":
            return float(weights[kept].double().mean())
        per_seq = [w[m > 0] for w, m in zip(batch.segments.split(weights), batch.segments.split(result.mask))]
        return float(torch.stack([w[0] for w in per_seq if w.numel()]).double().mean())

    if mean(plain.weights) > NORMALIZE_MIN_MEAN:
        assert mean(result.weights) == pytest.approx(1.0, rel=1e-5)
    else:
        assert torch.equal(result.weights, plain.weights)


REJECT_ALL = {
    "geo_mis": PRESETS["geo_mis"],
    "geo_rs_token_tis": PRESETS["geo_rs_token_tis"],
    "k3_rs": PRESETS["k3_rs"],
    "token_mis_normalised": CorrectionSpec(is_level="token", is_mode="mask", is_low=0.5, is_high=2.0,
                                           batch_normalize=True),
    "seq_mis_normalised": CorrectionSpec(is_level="sequence", is_mode="mask", is_high=2.0, batch_normalize=True),
    "veto_with_token_tis": CorrectionSpec(is_level="token", is_high=2.0, veto=0.9, batch_normalize=True),
}


@pytest.mark.parametrize("name", sorted(REJECT_ALL))
def test_all_rejected_batch_gives_zero_loss_and_finite_metrics(name):
    # Every trained token is off by a factor e^3 (either direction), so every band, veto and k3 test rejects it.
    g = torch.Generator().manual_seed(0)
    sizes = [5, 0, 7, 3]
    rollout = [-torch.rand(n, generator=g) for n in sizes]
    sign = [torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0) for n in sizes]
    train = [r - 3.0 * s.abs() for r, s in zip(rollout, sign)]
    masks = [torch.ones(n) for n in sizes]
    masks[3] = torch.zeros(3)
    batch = TokenBatch.from_lists(train, rollout, masks)
    result = apply_correction(REJECT_ALL[name], batch)
    assert bool((result.weights == 0).all()) and bool((result.mask == 0).all())
    pg_loss = torch.randn(batch.segments.num_tokens, generator=g)
    assert float((pg_loss * result.weights).sum()) == 0.0
    summary = result.metrics.summarize()
    assert all(math.isfinite(v) for v in summary.values())
    # Every trained sequence is fully rejected; the two without trained tokens count 0 in the mean.
    assert summary["valid_sequences"] == 2 and summary["sequences"] == 4
    assert summary["rejected_token_fraction"] == 0.5 and summary["is_weight_mean"] == 0.0
    assert summary["rejected_tokens"] == 12.0


def test_rejected_tokens_of_a_random_batch_are_counted():
    raw = random_batch(seed=11, num_seqs=16, noise=0.1, empty=0.0)
    result = apply_correction(PRESETS["token_mis"], raw.token_batch())
    summary = result.metrics.summarize()
    rejected = float((raw.token_batch().mask - result.mask).sum())
    assert rejected > 0 and summary["rejected_tokens"] == rejected


def test_diagnostics_of_known_weights():
    """token_tis (truncate at 2) on ratios 1, e (-> 2), 0.5 and 1, 1: w = 1, 2, 0.5, 1, 1 over five trained tokens."""
    l = [0.0, 1.0, math.log(0.5), 0.0, 0.0]
    train = [torch.tensor(l[:3]) - 1.0, torch.tensor(l[3:]) - 1.0]
    rollout = [torch.full((3,), -1.0), torch.full((2,), -1.0)]
    batch = TokenBatch.from_lists(train, rollout, [torch.ones(3), torch.ones(2)])
    summary = apply_correction(PRESETS["token_tis"], batch).metrics.summary
    s1, s2 = 5.5, 7.25
    assert summary["is_ess"] == pytest.approx(s1 * s1 / (5 * s2))
    assert summary["chi2_token"] == pytest.approx(5 * s2 / s1**2 - 1)
    seq = [3.5 / 3, 1.0]  # mean token weight per sequence
    ess_seq = sum(seq) ** 2 / (2 * sum(w * w for w in seq))
    assert summary["is_ess_seq"] == pytest.approx(ess_seq) and summary["chi2_seq"] == pytest.approx(1 / ess_seq - 1)
    assert (summary["is_weight_min"], summary["is_weight_max"]) == pytest.approx((0.5, 2.0))


def test_rejections_are_attributed_to_their_stage():
    """Sequence 0 has a catastrophic token (veto), 1 a geometric ratio outside the RS band, 2 one token of ten outside
    the IS mask band [0.5, 2] (token level; its geometric ratio e^0.08 is inside the RS band), 3 nothing: each stage
    reports what it rejects itself."""
    spec = CorrectionSpec(is_level="token", is_mode="mask", is_low=0.5, is_high=2.0, rs_level="geometric",
                          rs_low=0.9, rs_high=1.1, veto=1e-4)
    l = [[0.0, -12.0, 12.0], [0.5, 0.5, 0.5], [0.8] + [0.0] * 9, [0.0, 0.0]]
    train = [torch.tensor(x) - 13.0 for x in l]
    rollout = [torch.full((len(x),), -13.0) for x in l]
    result = apply_correction(spec, TokenBatch.from_lists(train, rollout, [torch.ones(len(x)) for x in l]))
    mean = {k: v.tolist() for k, v in result.metrics.per_sequence("mean").items()}
    assert mean["veto_seq_fraction"] == [1.0, 0.0, 0.0, 0.0]
    assert mean["rs_rejected_seq_fraction"] == [0.0, 1.0, 0.0, 0.0]
    assert mean["rs_rejected_token_fraction"] == [0.0, 1.0, 0.0, 0.0]
    assert mean["tis_rejected_token_fraction"] == pytest.approx([2 / 3, 0.0, 0.1, 0.0])
    assert "tis_rejected_seq_fraction" not in mean  # a token-level stage rejects no sequence
    assert mean["rejected_seq_fraction"] == [1.0, 1.0, 0.0, 0.0]
    assert mean["rejected_token_fraction"] == pytest.approx([1.0, 1.0, 0.1, 0.0])
