"""``EpsWatch``: every change of eps that a DC-GRPO controller makes, attributed to the rule that made it, observed
around ``LagrangeController.update`` without changing what the controller does."""

import statistics

import pytest

from mismatch_ctrl.analyze.eps_changes import CALIBRATION, DRIFT_GUARD, INFEASIBLE_BUDGET, EpsWatch
from mismatch_ctrl.analyze.report import eps_change_text
from mismatch_ctrl.dcgrpo import DCGRPOSettings, LagrangeController


def controller(**kw) -> LagrangeController:
    base = dict(enabled=True, lambda_0=0.1, eta=1.0, eps=0.01, lambda_max=1.0)
    return LagrangeController(DCGRPOSettings(**{**base, **kw}))


def watched(ctrl: LagrangeController, c_bars: list[float | None], start: int = 0) -> list[dict]:
    """Feed ``c_bars`` (rollouts ``start``, ``start + 1``, ...) to ``ctrl`` under an :class:`EpsWatch`; its changes."""
    watch = EpsWatch(ctrl)
    for rollout_id, c in enumerate(c_bars, start):
        watch.before()
        ctrl.update(c)
        watch.after(rollout_id, c)
    return watch.changes


def test_watching_leaves_the_controller_as_it_would_be():
    c_bars = [0.05, 0.02, None, 0.2, 0.3, 0.25, 0.4]
    alone, seen = controller(floor_rollouts=3, drift_window=2), controller(floor_rollouts=3, drift_window=2)
    for c in c_bars:
        alone.update(c)
    watched(seen, c_bars)
    assert seen.state_dict() == alone.state_dict() and alone.lifts >= 1


def test_a_clamp_starts_a_new_streak_so_a_later_lift_rests_on_rollouts_after_it():
    """Rollout 1 halves the violation (the streak slides to [0.02]); rollout 2 completes the floor window (median 0.05:
    eps 0.01 is clamped to 0.055), which empties the streak (its violations were measured against eps 0.01) before
    0.2 starts a new one; rollout 3 completes it (violation 0.145 -> 0.245: eps -> 1.1 x 0.25)."""
    ctrl = controller(floor_rollouts=3, drift_window=2, eps_guard="clamp", drift_guard="persistent")
    changes = watched(ctrl, [0.05, 0.02, 0.2, 0.3])
    assert [(c["rollout_id"], c["guard"]) for c in changes] == [(2, INFEASIBLE_BUDGET), (3, DRIFT_GUARD)]
    clamp, lift = changes
    assert clamp["old_eps"] == 0.01 and clamp["new_eps"] == pytest.approx(1.1 * 0.05)
    assert clamp["evidence"] == {"median_c_bar": 0.05, "factor": 1.1, "measured_rollouts": 3}
    assert lift["old_eps"] == clamp["new_eps"] and lift["new_eps"] == pytest.approx(1.1 * 0.25) == ctrl.eps
    e = lift["evidence"]
    assert e["mode"] == "persistent" and e["window"] == 2 and e["rollouts"] == [2, 3]
    assert e["median_c_bar"] == pytest.approx(0.25)
    assert e["violation_first_half"] == pytest.approx(0.2 - 0.055)
    assert e["violation_last_half"] == pytest.approx(0.3 - 0.055)


def test_calibration_is_its_own_change_and_skipped_rollouts_are_not_in_a_streak():
    ctrl = controller(eps="auto", calibration_rollouts=3, drift_window=3, eta=0.1)
    changes = watched(ctrl, [0.01, 0.02, 0.03, 0.05, None, 0.06, 0.07], start=10)
    calibration, lift = changes
    assert calibration == {"rollout_id": 12, "old_eps": None, "new_eps": pytest.approx(1.1 * 0.02),
                           "guard": CALIBRATION,
                           "evidence": {"median_c_bar": 0.02, "factor": 1.1, "measured_rollouts": 3}}
    assert lift["guard"] == DRIFT_GUARD and lift["rollout_id"] == 16 and lift["evidence"]["rollouts"] == [13, 15, 16]
    assert lift["old_eps"] == calibration["new_eps"] and lift["new_eps"] == pytest.approx(1.1 * 0.06)
    text = eps_change_text(calibration)
    assert text == "Rollout 12: `eps: auto` set eps to 0.0220 = 1.1 x the median C_bar 0.0200 of the first 3 rollouts."


@pytest.mark.parametrize("mode", ["persistent", "saturated"])
def test_the_drift_guards_evidence_is_its_modes(mode):
    """Persistent: C_bar > eps fills the streak while lambda is far below lambda_max. Saturated: eta 100 pins lambda
    at lambda_max from the first update."""
    ctrl = controller(eps_guard="off", drift_window=4, drift_guard=mode, eta=1.0 if mode == "persistent" else 100.0)
    c_bars = [0.03, 0.04, 0.03, 0.05]
    lambdas = []
    watch = EpsWatch(ctrl)
    for k, c in enumerate(c_bars):
        lambdas.append(ctrl.lam)
        watch.before()
        ctrl.update(c)
        watch.after(k, c)
    (lift,) = watch.changes
    e = lift["evidence"]
    assert e["mode"] == mode and e["rollouts"] == [0, 1, 2, 3] and e["lambda_before"] == lambdas[-1]
    assert e["median_c_bar"] == pytest.approx(statistics.median(c_bars))
    text = eps_change_text(lift)
    assert text.startswith(f"Rollout 3: the drift guard (`drift_guard: {mode}`, window 4) lifted eps 0.0100 -> "
                           f"0.0385 = 1.1 x the streak's median C_bar")
    if mode == "persistent":
        assert e["lambda_before"] < 0.2
        assert "lambda_max 1.000" in text and "at lambda_max" not in text and "sat at" not in text
        assert "C_bar stayed above eps on the 4 updates of rollouts 0 to 3 (median C_bar 0.0350 against eps 0.0100)" \
            in text
    else:
        assert e["lambda_before"] == 1.0
        assert "lambda sat at lambda_max 1.000 on the 4 updates of rollouts 0 to 3" in text


def test_a_lift_that_keeps_eps_says_so():
    """An eta too small to move lambda off lambda_max (1 - 1e-30 x 0.04 rounds to 1) keeps a saturated streak going
    below eps; the violation -0.04 -> -0.01 did not halve, and 1.1 x the median 0.025 is below eps 0.05."""
    ctrl = controller(eps=0.05, lambda_0=1.0, eta=1e-30, eps_guard="off", drift_window=2, drift_guard="saturated")
    (lift,) = watched(ctrl, [0.01, 0.04])
    assert lift["guard"] == DRIFT_GUARD and lift["old_eps"] == lift["new_eps"] == 0.05 and ctrl.lifts == 1
    assert "lifted eps 0.0500 -> 0.0500 (1.1 x the streak's median C_bar is not above it: kept)" in \
        eps_change_text(lift)


def test_after_without_before_is_refused():
    with pytest.raises(RuntimeError, match="without before"):
        EpsWatch(controller()).after(0, 0.01)
