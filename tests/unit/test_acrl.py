"""ACRL-style band controller (our interpretation, ALGORITHMS.md section 5): D, the band update, the clip weights."""

import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from measure import discrepancy as sequence_level_discrepancy
from mismatch_ctrl.acrl import ACRLSettings, BandController
from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.correction import apply_correction
from mismatch_ctrl.sketch import BINS, HIGH, LOW

from .inputs import raw_batches

BIN_RATIO = (HIGH / LOW) ** (1 / BINS)


@settings(max_examples=60, deadline=None)
@given(raw_batches(max_seqs=25))
def test_discrepancy_is_the_median_of_per_sequence_mean_abs_log_ratio(raw):
    d = sequence_level_discrepancy(raw.token_batch())
    per_seq = sorted(min(max(x, LOW), HIGH) for x in ref.sequence_discrepancies(raw.seqs()))
    if not per_seq:
        assert d is None
        return
    # The histogram returns a value in the bin of the lower median (odd counts: the median itself).
    n = len(per_seq)
    lower, upper = per_seq[(n - 1) // 2], per_seq[n // 2]
    tol = BIN_RATIO * (1 + 1e-6)
    assert lower / tol <= d <= upper * tol
    if n % 2:
        assert d == pytest.approx(lower, rel=BIN_RATIO - 1)


def test_discrepancy_ignores_sequences_without_trained_tokens():
    # Per-sequence mean |l|: 0.1, 0.2, 0.3 (trained) and 5.0 (all masked; would move the median if counted).
    l = [0.1, 0.2, 0.3, 5.0]
    train = [torch.full((3,), -1.0 + x) for x in l]
    rollout = [torch.full((3,), -1.0) for _ in l]
    masks = [torch.ones(3), torch.ones(3), torch.ones(3), torch.zeros(3)]
    d = sequence_level_discrepancy(TokenBatch.from_lists(train, rollout, masks))
    assert d == pytest.approx(0.2, rel=BIN_RATIO - 1)


@st.composite
def band_cases(draw):
    settings_ = ACRLSettings(
        enabled=True, c_0=draw(st.sampled_from([0.1, 1.0, 3.0])), c_min=0.05, c_max=4.0,
        band_low=draw(st.sampled_from([0.5, 0.7])), band_high=draw(st.sampled_from([1.2, 1.5])),
        shrink=draw(st.sampled_from([0.5, 0.8])), grow=draw(st.sampled_from([1.25, 2.0])),
        reference=draw(st.sampled_from([None, 0.01])), calibration_rollouts=draw(st.integers(1, 5)))
    ds = draw(st.lists(st.one_of(st.none(), st.floats(1e-4, 0.05)), max_size=40))
    return settings_, ds


def band_trace(ctrl: BandController, ds) -> list[float]:
    out = []
    for d in ds:
        ctrl.update(d)
        out.append(ctrl.c)
    return out


@settings(max_examples=60, deadline=None)
@given(band_cases())
def test_band_controller_matches_loop_reference(case):
    s, ds = case
    expected = ref.band_trajectory(ds, s.c_0, s.c_min, s.c_max, s.band_low, s.band_high, s.shrink, s.grow,
                                   s.reference, s.calibration_rollouts)
    assert band_trace(BandController(s), ds) == expected


def test_band_shrinks_above_and_grows_below_within_limits():
    ctrl = BandController(ACRLSettings(enabled=True, calibration_rollouts=3))
    band_trace(ctrl, [0.01, 0.03, 0.02])
    assert ctrl.reference == 0.02 and ctrl.c == 1.0
    assert band_trace(ctrl, [0.02, 0.031, 0.05]) == pytest.approx([1.0, 0.8, 0.64])  # 1.5 x 0.02 = 0.03
    assert band_trace(ctrl, [0.5] * 30)[-1] == 0.05
    assert band_trace(ctrl, [0.0139, 0.0141]) == pytest.approx([0.0625, 0.0625])  # 0.7 x 0.02 = 0.014
    assert band_trace(ctrl, [0.001] * 40)[-1] == 4.0


def test_correction_clips_token_ratios_to_the_band():
    ctrl = BandController(ACRLSettings(enabled=True, c_0=0.25))
    spec = ctrl.correction()
    assert (spec.is_level, spec.is_mode) == ("token", "clip")
    assert spec.is_bounds == pytest.approx((0.8, 1.25))
    l = torch.tensor([-1.0, -0.1, 0.0, 0.1, 0.5])
    batch = TokenBatch.from_lists([l - 1.0], [torch.full((5,), -1.0)], [torch.ones(5)])
    weights = apply_correction(spec, batch).weights
    torch.testing.assert_close(weights, l.exp().clamp(0.8, 1.25))


@settings(max_examples=30, deadline=None)
@given(band_cases(), st.integers(0, 40))
def test_state_round_trips_through_json_and_continues_identically(case, cut):
    s, ds = case
    original = BandController(s)
    band_trace(original, ds[:cut])
    restored = BandController(s)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    assert band_trace(restored, ds[cut:]) == band_trace(original, ds[cut:])
