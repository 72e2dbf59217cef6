"""DC-GRPO (ALGORITHMS.md section 2): advantage shaping against the reference, and the dual-ascent controller."""

import json
import logging
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import reference as ref
from measure import shaped as shape_advantages
from mismatch_ctrl.dcgrpo import PENALTY_FORMS, DCGRPOSettings, LagrangeController
from mismatch_ctrl.signals import SIGNALS

from .inputs import raw_batches, seq_advantages


@pytest.mark.parametrize("form", PENALTY_FORMS)
@pytest.mark.parametrize("aggregation", ["seq_mean", "token_mean"])
@settings(max_examples=15, deadline=None)
@given(raw=raw_batches(), signal=st.sampled_from(SIGNALS), lam=st.sampled_from([0.0, 0.05, 0.7, 3.0]),
       eps=st.sampled_from([1e-4, 0.005, 0.3]), cap=st.sampled_from(["none", 0.01, 0.5, 2.0]),
       zero=st.sampled_from(["penalise", "skip"]), zeros=st.integers(0, 2**16))
def test_shape_advantages_matches_reference(form, aggregation, raw, signal, lam, eps, cap, zero, zeros):
    advantages, advantage_rows = seq_advantages(raw, seed=len(raw.sizes))
    for i in range(len(raw.sizes)):  # GRPO groups whose rewards are all equal have advantage exactly 0
        if zeros >> (i % 16) & 1:
            advantages[i] = 0.0
            advantage_rows[i] = [0.0] * len(advantage_rows[i])
    s = DCGRPOSettings(enabled=True, signal=signal, penalty_form=form, aggregation=aggregation, penalty_cap=cap,
                       zero_advantage=zero)
    got = shape_advantages(raw.token_batch(), advantages, s, lam, eps)
    shaped, c_bar, pen_mean, share = ref.shape_advantages(raw.seqs(), advantage_rows, signal, form, aggregation,
                                                          lam, eps, None if cap == "none" else cap, zero == "skip")
    expected = torch.tensor([x for row in shaped for x in row], dtype=torch.float64)
    torch.testing.assert_close(got.advantages.double(), expected, rtol=1e-5, atol=1e-5)
    if c_bar is None:
        assert got.discrepancy is None and got.penalty_abs_mean == 0.0 and got.penalty_share == 0.0
    else:
        # prob_diff of fp32 probabilities near 1 carries up to ~2e-7 absolute rounding per token (two fp32 exps).
        pen_tol = 3e-7 * lam + 1e-8
        seqs = raw.seqs()
        adv_mean = sum(w * abs(a) for s, row in zip(seqs, advantage_rows) for w, a in zip(s.mask, row)) / \
            sum(s.count for s in seqs)
        assert got.discrepancy == pytest.approx(c_bar, rel=1e-5, abs=3e-7)
        assert got.penalty_abs_mean == pytest.approx(pen_mean, rel=1e-5, abs=pen_tol)
        assert got.penalty_share == pytest.approx(share, rel=1e-5, abs=pen_tol / max(adv_mean, 1e-8))


def test_shaping_subtracts_the_penalty_of_each_form():
    from mismatch_ctrl.batch import TokenBatch

    # prob_diff of the three tokens: |e^-1 - e^-1.2|, 0, |e^-0.1 - e^-0.5|; advantages 1, 1, -2.
    train, rollout = torch.tensor([-1.0, -2.0, -0.1]), torch.tensor([-1.2, -2.0, -0.5])
    batch = TokenBatch.from_lists([train[:2], train[2:]], [rollout[:2], rollout[2:]], [torch.ones(2), torch.ones(1)])
    c = (train.exp() - rollout.exp()).abs()
    per_seq = torch.tensor([1.0, -2.0])
    a = torch.tensor([1.0, 1.0, -2.0])
    eps, lam = 0.1, 0.5
    expected = {"lagrangian": a - lam * c, "fixed": a - lam * c, "centered": a - lam * (c - eps),
                "hinge": a - lam * (c - eps).clamp_min(0)}
    for form, want in expected.items():
        s = DCGRPOSettings(enabled=True, penalty_form=form, penalty_cap="none")
        torch.testing.assert_close(shape_advantages(batch, per_seq, s, lam, eps).advantages, want)
    seq_mean = float((c[:2].mean() + c[2]) / 2)
    token_mean = float(c.mean())
    assert shape_advantages(batch, per_seq, DCGRPOSettings(), lam, eps).discrepancy == pytest.approx(seq_mean)
    s = DCGRPOSettings(aggregation="token_mean")
    assert shape_advantages(batch, per_seq, s, lam, eps).discrepancy == pytest.approx(token_mean)
    shaped = shape_advantages(batch, per_seq, DCGRPOSettings(), lam, eps)
    assert shaped.penalty_abs_mean == pytest.approx(float((lam * c).mean()))
    assert shaped.penalty_share == pytest.approx(float((lam * c).mean() / a.abs().mean()))


def controller(**kw) -> LagrangeController:
    base = dict(enabled=True, lambda_0=0.1, eta=1.0, eps=0.01, lambda_max=1.0)
    return LagrangeController(DCGRPOSettings(**{**base, **kw}))


def run(ctrl: LagrangeController, c_bars) -> list[tuple[float, float | None]]:
    """(shaping lambda, eps) before each update, then after the last: the layout of reference.lagrange_trajectory."""
    out = []
    for c in c_bars:
        out.append((ctrl.shaping_lambda, ctrl.eps))
        ctrl.update(c)
    out.append((ctrl.shaping_lambda, ctrl.eps))
    return out


def test_lambda_rises_above_eps_and_saturates():
    ctrl = controller(drift_guard="off")
    trace = [lam for lam, _ in run(ctrl, [0.005] * 3 + [0.21] * 8)]
    assert trace[:4] == pytest.approx([0.1, 0.095, 0.09, 0.085])
    rising = trace[3:]
    assert all(b > a for a, b in zip(rising, rising[1:5])) and rising[1] == pytest.approx(0.285)
    assert rising[-4:] == [1.0] * 4 and max(trace) == 1.0
    assert ctrl.eps == 0.01  # the floor 0.005 is below eps: no guard action


def test_lambda_decays_to_zero_below_eps():
    ctrl = controller(lambda_0=0.5, eta=20.0)
    trace = [lam for lam, _ in run(ctrl, [0.0] * 6)]
    assert trace == pytest.approx([0.5, 0.3, 0.1, 0.0, 0.0, 0.0, 0.0])
    assert trace[-1] == 0.0


@st.composite
def lagrange_cases(draw):
    eps = draw(st.sampled_from(["auto", 0.001, 0.01, 0.05]))
    lambda_0 = draw(st.sampled_from([0.0, 0.05, 0.1]))
    kw = dict(lambda_0=lambda_0, eta=draw(st.sampled_from([0.5, 1.0, 10.0])), eps=eps,
              lambda_max=draw(st.sampled_from([lambda_0, 0.3, 1.0])),
              penalty_form=draw(st.sampled_from(PENALTY_FORMS)),
              calibration_rollouts=draw(st.integers(1, 6)), eps_guard=draw(st.sampled_from(["clamp", "off"])),
              floor_rollouts=draw(st.integers(1, 4)),
              drift_guard=draw(st.sampled_from(["saturated", "persistent", "off"])),
              drift_window=draw(st.integers(2, 7)))
    c = st.one_of(st.floats(0.0, 0.1), st.floats(0.2, 0.6), st.none(), st.just(math.nan))
    return kw, draw(st.lists(c, max_size=40))


@settings(max_examples=80, deadline=None)
@given(lagrange_cases())
def test_trajectory_matches_loop_reference(case):
    kw, c_bars = case
    got = run(controller(**kw), c_bars)
    expected = ref.lagrange_trajectory(
        c_bars, kw["lambda_0"], kw["eta"], kw["eps"], kw["lambda_max"], kw["penalty_form"],
        kw["calibration_rollouts"], 1.1, kw["eps_guard"], kw["floor_rollouts"],
        kw["drift_window"] if kw["drift_guard"] != "off" else None, kw["drift_guard"])
    assert got == expected


def test_eps_auto_calibrates_then_starts_at_lambda_0(caplog):
    ctrl = controller(eps="auto", calibration_rollouts=4, lambda_0=0.05)
    c_bars = [0.004, 0.008, 0.002, 0.006]
    with caplog.at_level(logging.INFO, logger="mismatch_ctrl.dcgrpo"):
        trace = run(ctrl, c_bars)
    assert [lam for lam, _ in trace[:4]] == [0.0] * 4 and all(e is None for _, e in trace[:4])
    assert ctrl.eps == pytest.approx(1.1 * 0.005) and ctrl.floor == pytest.approx(0.005)
    assert ctrl.shaping_lambda == 0.05 and not ctrl.calibrating
    assert "calibrated" in caplog.text
    ctrl.update(0.0155)
    assert ctrl.lam == pytest.approx(0.05 + 0.0155 - 0.0055)


@pytest.mark.parametrize("guard, eps_after", [("clamp", 1.1 * 0.025), ("off", 0.001)])
def test_infeasible_budget_guard(caplog, guard, eps_after):
    """One warning when the floor is measured, saying why (the numbers), what it means and what to do; none again
    over the rollouts after it (the explanation is once per run, not per rollout)."""
    ctrl = controller(eps=0.001, eps_guard=guard, drift_guard="off", lambda_max=2.0, eta=5.0)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl.dcgrpo"):
        for c in (0.02, 0.03, 0.025):
            ctrl.update(c)
        assert ctrl.floor == pytest.approx(0.025) and ctrl.eps == pytest.approx(eps_after)
        for _ in range(60):
            ctrl.update(0.025)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0]
    assert "eps=0.001 is below the rollout engine's discrepancy floor 0.025 (median C_bar of the first 3" in text
    assert "lambda climbs to lambda_max=2 and DC-GRPO acts as a constant penalty" in text  # what it means
    assert len(text.splitlines()) == 2  # why, then what is done and what to do
    assert "eps: auto, or an eps above the floor" in text  # what to do
    assert (f"eps_guard=clamp: using eps={1.1 * 0.025:.4g} (1.1 x the floor)" in text) == (guard == "clamp")
    assert ("eps_guard=off: kept" in text) == (guard == "off")
    assert ctrl.lam == (2.0 if guard == "off" else 0.0)  # unguarded at lambda_max, as it says; clamped: C_bar < eps


def test_no_guard_warning_when_eps_is_above_the_floor(caplog):
    ctrl = controller(eps=0.05)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl.dcgrpo"):
        for c in (0.02, 0.03, 0.025, 0.9):
            ctrl.update(c)
    assert not caplog.records and ctrl.eps == 0.05


def test_fixed_never_updates():
    ctrl = controller(penalty_form="fixed", lambda_0=0.2)
    trace = run(ctrl, [0.5, 0.0, 1.0, 0.3, 0.0])
    assert [lam for lam, _ in trace] == [0.2] * 6


@pytest.mark.parametrize("missing", [None, math.nan])
def test_missing_c_bar_is_skipped(missing):
    ctrl = controller()
    ctrl.update(0.05)
    before = ctrl.state_dict()
    ctrl.update(missing)
    after = ctrl.state_dict()
    assert after.pop("skipped") == before.pop("skipped") + 1
    assert after == before


def test_unresolved_settings_are_rejected():
    with pytest.raises(ValueError, match=r"not resolved: \['eps'\]"):
        LagrangeController(DCGRPOSettings(enabled=True, lambda_0=0.1, eta=1.0, lambda_max=1.0))


@settings(max_examples=30, deadline=None)
@given(lagrange_cases(), st.integers(0, 30))
def test_state_round_trips_through_json_and_continues_identically(case, cut):
    kw, c_bars = case
    cut = min(cut, len(c_bars))
    original = controller(**kw)
    run(original, c_bars[:cut])
    restored = controller(**kw)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    assert run(restored, c_bars[cut:]) == run(original, c_bars[cut:])
    assert restored.state_dict() == original.state_dict()


def test_an_eps_calibrated_to_zero_round_trips():
    """Engines that agree exactly (C_bar 0) calibrate eps: auto to 0; the state it writes must resume."""
    ran = controller(eps="auto", calibration_rollouts=1, lambda_0=0.0, lambda_max=0.0)
    run(ran, [0.0])
    assert ran.eps == 0.0
    restored = controller(eps="auto", calibration_rollouts=1, lambda_0=0.0, lambda_max=0.0)
    restored.load_state_dict(json.loads(json.dumps(ran.state_dict())))
    assert restored.state_dict() == ran.state_dict()


def ramp_then_plateau(start=0.003, top=0.07, ramp=40, plateau=60):
    """The drifting floor of issue 17: C_bar ramps linearly for ``ramp`` rollouts, then stays at ``top``."""
    return [start + (top - start) * k / (ramp - 1) for k in range(ramp)] + [top] * plateau


@pytest.mark.parametrize("arch", ["moe", "dense"])
def test_drift_guard_frees_a_multiplier_pinned_by_a_drifting_floor(caplog, arch):
    from mismatch_ctrl.config import arch_defaults

    values = arch_defaults(arch)["dcgrpo"]
    paper = controller(**values, drift_guard="off")
    guarded = controller(**values)
    assert guarded.settings.drift_guard == "persistent"  # the default
    stream = ramp_then_plateau()
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl.dcgrpo"):
        paper_trace, guarded_trace = run(paper, stream), run(guarded, stream)
    plateau = slice(41, None)  # lambda after each plateau update
    assert all(lam == values["lambda_max"] for lam, _ in paper_trace[50:])  # the paper's form stays pinned
    assert guarded.lifts >= 1 and "drift guard" in caplog.text
    assert max(lam for lam, _ in guarded_trace) < 0.3 * values["lambda_max"]  # the persistent guard acts early
    assert guarded_trace[-1][0] <= values["lambda_0"] and guarded.eps > 0.07  # eps above the plateau, lambda relaxed
    assert all(b <= a for (a, _), (b, _) in zip(guarded_trace[plateau], guarded_trace[plateau][1:]))
    assert guarded.eps <= 1.1 * 0.07 + 1e-12  # never above 1.1 x the highest floor it saw


def test_drift_guard_leaves_a_multiplier_that_is_bringing_the_violation_down():
    ctrl = controller(eps=0.01, lambda_0=1.0, drift_window=6, eps_guard="off", drift_guard="saturated")
    falling = [0.2, 0.15, 0.11, 0.08, 0.06, 0.04, 0.03, 0.025, 0.02, 0.018]  # lambda stays at 1.0 throughout
    trace = run(ctrl, falling)
    assert all(lam == 1.0 for lam, _ in trace) and ctrl.lifts == 0 and ctrl.eps == 0.01


def test_drift_guard_lifts_eps_only_upwards_and_restarts_its_window():
    ctrl = controller(eps=0.01, lambda_0=0.1, drift_window=4, eps_guard="off", drift_guard="saturated")
    run(ctrl, [0.6] * 4)  # lambda 0.1 -> 0.69 -> 1.0: 3 updates at lambda_max
    assert ctrl.lifts == 0 and ctrl.streak == [0.6, 0.6, 0.6]
    ctrl.update(0.6)
    assert ctrl.lifts == 1 and ctrl.eps == pytest.approx(0.66) and ctrl.lam == 0.1 and ctrl.streak == []


def test_persistent_drift_guard_lifts_before_lambda_saturates():
    ctrl = controller(eps=0.01, lambda_0=0.1, eta=1.0, drift_window=4, eps_guard="off", drift_guard="persistent")
    run(ctrl, [0.03, 0.04, 0.03])  # lambda rises by 0.02-0.03 a rollout: far from lambda_max
    assert ctrl.lifts == 0 and ctrl.streak == [0.03, 0.04, 0.03] and ctrl.lam < 0.2
    ctrl.update(0.05)
    assert ctrl.lifts == 1 and ctrl.eps == pytest.approx(1.1 * 0.035) and ctrl.lam == 0.1
    ctrl.update(0.02)  # below the lifted eps: lambda falls and no streak starts
    assert ctrl.streak == [] and ctrl.lam < 0.1


def test_the_floor_guards_clamp_starts_a_new_streak():
    """The streak measures violations against eps, so the clamp (eps 0.005 -> 1.1 x 0.010) empties it: the rollouts
    before it pressed on the old eps and sit below the new one (violation -0.003 -> 0.0008 would look like a drift)."""
    ctrl = controller(eps=0.005, lambda_0=0.1, floor_rollouts=3, drift_window=4, drift_guard="persistent")
    run(ctrl, [0.008, 0.010, 0.012])
    assert ctrl.eps == pytest.approx(0.011) and ctrl.streak == [0.012]
    ctrl.update(0.0115)
    assert ctrl.lifts == 0 and ctrl.streak == [0.012, 0.0115] and ctrl.eps == pytest.approx(0.011)


def test_a_resume_whose_eps_in_force_changes_starts_a_new_streak():
    saved = controller(eps=0.01, drift_window=4, drift_guard="persistent")
    run(saved, [0.03, 0.04, 0.05])  # the floor 0.04 clamps eps to 0.044 and empties the streak; 0.05 starts one
    assert saved.streak == [0.05] and saved.eps == pytest.approx(0.044)
    # eps 0.02 is clamped back to the same 0.044: the streak holds; eps 0.06 is above the floor and applies
    same, clamped, changed = (controller(eps=eps, drift_window=4, drift_guard="persistent")
                              for eps in (0.01, 0.02, 0.06))
    for resumed in (same, clamped, changed):
        resumed.load_state_dict(json.loads(json.dumps(saved.state_dict())))
    assert same.streak == clamped.streak == [0.05] and clamped.eps == saved.eps
    assert changed.streak == [] and changed.eps == 0.06


def test_cap_bounds_the_penalty_and_zero_advantage_sequences_can_be_spared():
    from mismatch_ctrl.batch import TokenBatch

    train = torch.tensor([-1.0, -2.0, -0.1, -0.3])
    rollout = torch.tensor([-1.5, -2.6, -0.7, -0.3])
    batch = TokenBatch.from_lists([train[:2], train[2:]], [rollout[:2], rollout[2:]], [torch.ones(2), torch.ones(2)])
    c = (train.exp() - rollout.exp()).abs()
    per_seq = torch.tensor([0.5, 0.0])
    a = torch.tensor([0.5, 0.5, 0.0, 0.0])
    lam = 5.0
    paper = shape_advantages(batch, per_seq, DCGRPOSettings(penalty_cap="none", zero_advantage="penalise"), lam, 0.0)
    torch.testing.assert_close(paper.advantages, a - lam * c)
    assert paper.penalty_share > 1 and not paper.capped
    skip = shape_advantages(batch, per_seq, DCGRPOSettings(penalty_cap="none"), lam, 0.0)
    torch.testing.assert_close(skip.advantages, a - lam * c * torch.tensor([1.0, 1.0, 0.0, 0.0]))
    capped = shape_advantages(batch, per_seq, DCGRPOSettings(penalty_cap=0.5), lam, 0.0)
    assert capped.capped and capped.lambda_shaping == pytest.approx(0.5 * float(a.mean()) / float(c[:2].sum() / 4))
    assert capped.penalty_share == pytest.approx(0.5)
    torch.testing.assert_close(capped.advantages, a - capped.lambda_shaping * c * torch.tensor([1.0, 1.0, 0.0, 0.0]))
    silent = shape_advantages(batch, torch.zeros(2), DCGRPOSettings(penalty_cap=0.5, zero_advantage="penalise"),
                              lam, 0.0)
    assert silent.lambda_shaping == 0.0 and torch.equal(silent.advantages, torch.zeros(4))


@pytest.mark.parametrize("key, value, message", [
    ("drift_window", 1, "must be >= 2"), ("penalty_cap", 0.0, "must be > 0"), ("penalty_cap", -1.0, "'none'")])
def test_new_settings_are_validated(key, value, message):
    problems = dict(DCGRPOSettings(**{key: value}).problems())
    assert message in problems[key]


def test_every_dcgrpo_key_is_explained():
    import dataclasses

    assert set(DCGRPOSettings.HELP) == {f.name for f in dataclasses.fields(DCGRPOSettings)}
    assert all("[ours]" in DCGRPOSettings.HELP[k] for k in ("drift_guard", "penalty_cap", "zero_advantage"))
