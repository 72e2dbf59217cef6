"""ControllerSet.step (the body of slime's advantage hook): composition of the controllers, and exact resume through
a JSON state round trip."""

import json

import pytest
import torch

import reference as ref
from mismatch_ctrl.config import build_config
from mismatch_ctrl.controllers import ControllerSet
from mismatch_ctrl.errors import StateError

from .inputs import random_batch, seq_advantages
from .test_lr_schedule import length_series

FULL = {"architecture": "moe", "dcgrpo": {"enabled": True, "eps": "auto", "calibration_rollouts": 3},
        "lr_decay": {"enabled": True, "surge": {"baseline_window": 5, "gap": 6}},
        "acrl": {"enabled": True, "calibration_rollouts": 2}, "correction": {"preset": "geo_mis"}}
LENGTHS = length_series(0, steps=40, start=15, ramp=4, factor=3.0)


def rollout(k: int):
    raw = random_batch(seed=100 + k, num_seqs=6, noise=0.002 * (1 + k % 4))
    return raw, *seq_advantages(raw, seed=k)


def run(controllers: ControllerSet, steps: range):
    out = []
    for k in steps:
        raw, advantages, _ = rollout(k)
        out.append(controllers.step(k, advantages, raw.token_batch(), [LENGTHS[k]], 4096.0))
    return out


def test_step_composes_metrics_shaping_dual_update_lr_and_band():
    config = build_config({**FULL, "dcgrpo": {"enabled": True, "eps": 0.004, "lambda_0": 0.3}})
    controllers = ControllerSet(config)
    lam_before = controllers.dcgrpo.lam
    raw, advantages, advantage_rows = rollout(0)
    step = controllers.step(0, advantages, raw.token_batch(), [1000.0], 4096.0)
    seqs = raw.seqs()
    shaped, c_bar, pen_mean, share = ref.shape_advantages(
        seqs, advantage_rows, "prob_diff", "lagrangian", "seq_mean", lam_before, 0.004)
    expected = torch.tensor([x for row in shaped for x in row])
    torch.testing.assert_close(step.advantages, expected, rtol=1e-5, atol=1e-6)
    m = step.metrics
    assert m["lambda"] == 0.3 and m["eps"] == 0.004
    assert m["discrepancy"] == pytest.approx(c_bar, rel=1e-5)
    assert m["violation"] == pytest.approx(c_bar - 0.004, rel=1e-4)
    assert m["lambda_next"] == pytest.approx(min(max(0.3 + (c_bar - 0.004), 0.0), 1.0), rel=1e-5)
    assert m["penalty_abs_mean"] == pytest.approx(pen_mean, rel=1e-5)
    assert m["penalty_share"] == pytest.approx(share, rel=1e-5)
    summary = ref.summarize([ref.mismatch_metrics(s) for s in seqs], [s.count for s in seqs])
    for name in ("prob_diff_mean", "kl", "k3_kl", "training_log_ppl", "trained_tokens"):
        assert m[name] == pytest.approx(summary[name], rel=1e-5, abs=1e-7), name
    assert m["lr_scale"] == 1.0 and m["mean_response_length"] == 1000.0
    assert m["acrl_c"] == 1.0 and "acrl_reference" not in m  # still calibrating the reference


def test_grpo_leaves_the_advantages_and_logs_no_multiplier():
    controllers = ControllerSet(build_config({}))
    raw, advantages, _ = rollout(1)
    step = controllers.step(0, advantages, raw.token_batch(), [500.0])
    assert step.advantages is None
    assert step.metrics["lr_scale"] == 1.0 and step.metrics["discrepancy"] > 0
    assert not {"lambda", "lambda_next", "eps", "violation", "penalty_share"} & set(step.metrics)
    assert controllers.step(1, advantages, None, [500.0]).metrics["lr_scale"] == 1.0


def test_eps_and_violation_are_not_logged_while_eps_auto_calibrates():
    dcgrpo = {"enabled": True, "eps": "auto", "calibration_rollouts": 2}
    config = build_config({"architecture": "moe", "dcgrpo": dcgrpo})
    controllers = ControllerSet(config)
    steps = run(controllers, range(3))
    for step in steps[:2]:
        assert step.metrics["eps_calibrating"] == 1.0 and step.metrics["lambda"] == 0.0
        assert "eps" not in step.metrics and "violation" not in step.metrics
    assert steps[2].metrics["eps"] == pytest.approx(1.1 * (steps[0].metrics["discrepancy"] +
                                                           steps[1].metrics["discrepancy"]) / 2)
    assert steps[2].metrics["violation"] == pytest.approx(steps[2].metrics["discrepancy"] - steps[2].metrics["eps"])


def test_missing_train_log_probs_are_refused_when_needed():
    controllers = ControllerSet(build_config({"architecture": "dense", "dcgrpo": {"enabled": True}}))
    with pytest.raises(ValueError, match="need the training engine's log-probs"):
        controllers.step(0, torch.zeros(3), None, [100.0])


@pytest.mark.parametrize("cut", [1, 3, 8, 20])
def test_state_round_trips_through_json_and_continues_identically(cut):
    config = build_config(FULL)
    original = ControllerSet(config)
    run(original, range(cut))
    restored = ControllerSet(config)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    for a, b in zip(run(original, range(cut, 30)), run(restored, range(cut, 30))):
        assert torch.equal(a.advantages, b.advantages)
        assert a.metrics == b.metrics
    assert restored.state_dict() == original.state_dict()
    # The run went through every phase: eps calibrated, surge detected, band reference set.
    assert original.dcgrpo.eps is not None and original.lr.detector.triggered and original.acrl.reference


def test_state_of_another_method_is_refused():
    dcgrpo_only = ControllerSet(build_config({"architecture": "moe", "dcgrpo": {"enabled": True}}))
    full = ControllerSet(build_config(FULL))
    with pytest.raises(StateError, match="state.acrl: the saved state has acrl disabled but the configuration has it "
                                         "enabled"):
        full.load_state_dict(dcgrpo_only.state_dict())
    with pytest.raises(StateError, match="state.dcgrpo.eps: missing"):
        dcgrpo_only.load_state_dict({**dcgrpo_only.state_dict(), "dcgrpo": {"lam": 0.1}})
