"""Length-triggered LR decay (ALGORITHMS.md section 4): the schedule, the surge detector on synthetic length traces,
the truncation cap and state round trips."""

import json

import pytest
import torch

import reference as ref
from mismatch_ctrl.errors import StateError
from mismatch_ctrl.lr_schedule import LengthDecaySettings, LengthTriggeredLR, SurgeSettings, decay_scale

MAX_LENGTH = 8192


def length_series(seed: int, steps: int = 1000, start: int = 110, ramp: int = 20, factor: float = 3.0,
                  base: float = 1000.0, noise: float = 0.05) -> list[float]:
    """Mean response length per rollout: flat ``base`` with relative noise, then a linear rise to ``factor x base``
    over ``ramp`` rollouts from ``start`` (steps=..., factor=1 for no surge)."""
    g = torch.Generator().manual_seed(seed)
    levels = [base * (1 + (factor - 1) * min(max((t - start) / ramp, 0.0), 1.0)) for t in range(steps)]
    return [level * (1 + noise * float(torch.randn((), generator=g))) for level in levels]


def feed(lr: LengthTriggeredLR, lengths, max_length=MAX_LENGTH, first_step: int = 0) -> None:
    for t, length in enumerate(lengths, start=first_step):
        lr.observe(t, length, max_length)


def test_manual_period_halves_every_period_down_to_the_floor():
    lr = LengthTriggeredLR(LengthDecaySettings(enabled=True, period=204))
    assert lr.detector is None and lr.period == 204
    expected = {0: 1.0, 203: 1.0, 204: 0.5, 300: 0.5, 407: 0.5, 408: 0.25, 611: 0.25, 612: 0.125, 815: 0.125,
                816: 0.1, 1020: 0.1, 5000: 0.1}
    assert {t: lr.scale(t) for t in expected} == expected
    assert [decay_scale(t, 204) for t in expected] == list(expected.values())
    assert all(lr.scale(t) == ref.lr_scale(t, 204, 204) for t in range(0, 1300))


def test_no_period_means_no_decay():
    assert decay_scale(10_000, None) == 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_surge_sets_the_period_from_its_onset(seed):
    lr = LengthTriggeredLR(LengthDecaySettings(enabled=True))
    lengths = length_series(seed)
    feed(lr, lengths[:100])
    assert lr.period is None and not lr.detector.triggered and lr.scale(99) == 1.0
    feed(lr, lengths[100:], first_step=100)
    d = lr.detector
    # Onset = first rollout whose trailing trimmed mean reaches 1.3 x baseline: the ramp crosses 1.3x at 113 and the
    # 5-rollout window lags ~2 more, so the detected onset trails the start of the rise (110) by a few rollouts.
    assert 110 <= d.onset <= 118
    assert 110 < d.triggered_at < 140 and d.threshold == 2.0
    assert lr.period == round(1.8 * d.onset)
    first = max(lr.period, d.triggered_at)
    scales = [lr.scale(t) for t in range(1500)]
    assert scales == [ref.lr_scale(t, lr.period, first) for t in range(1500)]
    changes = [t for t in range(1, 1500) if scales[t] != scales[t - 1]]
    assert changes == [first + k * lr.period for k in range(4)]
    assert scales[-1] == 0.1


def test_detection_after_the_period_has_passed_halves_at_once():
    # A long gap before the baseline window delays detection to rollout ~81, after T_d = round(1.8 x ~34).
    lr = LengthTriggeredLR(LengthDecaySettings(enabled=True, surge=SurgeSettings(gap=60)))
    feed(lr, length_series(0, steps=400, start=30, ramp=10))
    d = lr.detector
    assert d.triggered_at > lr.period == round(1.8 * d.onset)
    assert lr.scale(d.triggered_at - 1) == 1.0 and lr.scale(d.triggered_at) == 0.5
    assert lr.scale(d.triggered_at + lr.period - 1) == 0.5 and lr.scale(d.triggered_at + lr.period) == 0.25


@pytest.mark.parametrize("seed", [0, 1])
def test_noise_and_slow_drift_never_decay(seed):
    g = torch.Generator().manual_seed(seed)
    lengths = [1000 * (1 + 0.9 * t / 600) * (1 + 0.05 * float(torch.randn((), generator=g))) for t in range(600)]
    lr = LengthTriggeredLR(LengthDecaySettings(enabled=True))
    feed(lr, lengths)
    assert not lr.detector.triggered and lr.period is None
    assert all(lr.scale(t) == 1.0 for t in range(2000))


def test_truncation_cap_lowers_the_threshold():
    # From ~2000 to 1.9x: never 2x, because responses are truncated at 4096 tokens.
    lengths = length_series(0, steps=300, start=100, factor=1.9, base=2000.0, noise=0.03)
    uncapped = LengthTriggeredLR(LengthDecaySettings(enabled=True))
    feed(uncapped, lengths, max_length=None)
    assert not uncapped.detector.triggered and uncapped.detector.threshold == 2.0
    capped = LengthTriggeredLR(LengthDecaySettings(enabled=True))
    feed(capped, lengths, max_length=4096)
    d = capped.detector
    assert d.triggered
    assert d.threshold == pytest.approx(0.9 * 4096 / d.baseline) and 1.3 < d.threshold < 2.0


def test_threshold_never_drops_below_the_onset_ratio():
    lr = LengthTriggeredLR(LengthDecaySettings(enabled=True))
    feed(lr, [3000.0] * 40, max_length=4096)
    assert lr.detector.threshold == 1.3


@pytest.mark.parametrize("cut", [50, 115, 125, 300])
def test_state_round_trips_through_json_and_continues_identically(cut):
    settings = LengthDecaySettings(enabled=True)
    lengths = length_series(1, steps=400)
    original = LengthTriggeredLR(settings)
    feed(original, lengths[:cut])
    restored = LengthTriggeredLR(settings)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    for t in range(cut, len(lengths)):
        for lr in (original, restored):
            lr.observe(t, lengths[t], MAX_LENGTH)
        assert restored.scale(t) == original.scale(t)
    assert restored.state_dict() == original.state_dict() and restored.period == original.period


def test_manual_and_auto_states_do_not_mix():
    auto = LengthTriggeredLR(LengthDecaySettings(enabled=True))
    manual = LengthTriggeredLR(LengthDecaySettings(enabled=True, period=100))
    with pytest.raises(StateError, match="manual vs auto"):
        manual.load_state_dict(auto.state_dict())
    with pytest.raises(StateError, match="lr_decay.detector.bogus: unknown key"):
        auto.load_state_dict({"detector": {**auto.state_dict()["detector"], "bogus": 1}})
