"""The replay of ``analyze_dumps`` against the controllers themselves, fed the discrepancies computed directly."""

import statistics

import pytest
import torch

import reference as ref
from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.analyze.dumps import write_rollout_dump
from mismatch_ctrl.analyze.report import write_report
from mismatch_ctrl.config import load_config
from mismatch_ctrl.dcgrpo import LagrangeController
from mismatch_ctrl.formatting import fmt
from mismatch_ctrl.lr_schedule import SurgeDetector

from .synthetic import make_rollout, write_run


def c_bar(r):
    """C_bar of a rollout computed directly: mean over sequences of the per-sequence mean |p_train - p_rollout|."""
    s = ref.prepare(r.train, r.rollout, r.masks)
    return ref.shape_advantages(s, [[0.0] * n for n in r.lengths], "prob_diff", "lagrangian", "seq_mean", 0.0,
                                0.0)[1]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Twelve rollouts whose discrepancy grows; rollout 5 has no training recompute."""
    directory = tmp_path_factory.mktemp("run")
    g = torch.Generator().manual_seed(11)
    truth = [make_rollout(i, g, samples=6, max_len=16, noise=0.01 * (1 + i / 3)) for i in range(12)]
    truth[5].omit = {"log_probs"}
    write_run(directory, truth)
    method = directory / "method.yaml"
    method.write_text("mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n    calibration_rollouts: 4\n"
                      "    floor_rollouts: 2\n")
    return directory, method, truth, [None if "log_probs" in r.omit else c_bar(r) for r in truth]


def test_lambda_trajectory_is_the_controllers(run):
    directory, method, truth, c_bars = run
    result = analyze_dumps(directory, AnalyzeOptions(config=method, architecture="dense", eps=0.004, lambda_0=0.2,
                                                     eta=5.0, progress=False))
    settings = load_config(method, architecture="dense").dcgrpo
    rows = result["rollouts"]
    replayed = [row["replay"]["chosen"] for row in rows]
    assert [row["replay"]["chosen"] is None for row in rows] == [c is None for c in c_bars]
    for got, want in zip(replayed, c_bars):
        if want is not None:
            assert got["discrepancy"] == pytest.approx(want, rel=1e-4)

    direct = LagrangeController(settings.__class__(**{**settings.__dict__, "eps": 0.004, "lambda_0": 0.2,
                                                      "eta": 5.0}))
    for got, c in zip(replayed, c_bars):
        if got is not None:
            assert got["lambda"] == pytest.approx(direct.shaping_lambda, rel=1e-4, abs=1e-9)
            assert got["eps"] == pytest.approx(direct.eps)
        direct.update(c)
    expected = ref.lagrange_trajectory(c_bars, 0.2, 5.0, 0.004, 1.0, floor_window=2, drift_window=10,
                                       drift="persistent")
    assert [x["lambda"] for x in replayed if x] == pytest.approx(
        [lam for (lam, _), c in zip(expected, c_bars) if c is not None], rel=1e-4, abs=1e-9)
    summary = result["dcgrpo_replay"]
    assert summary["lambda_final"] == pytest.approx(expected[-1][0], rel=1e-4, abs=1e-9)
    assert summary["eps_final"] == pytest.approx(expected[-1][1], rel=1e-4)
    assert summary["rollouts_without_train_log_probs"] == 1
    judged = [(c, eps) for (_, eps), c in zip(expected, c_bars) if c is not None]
    assert summary["fraction_above_eps"] == pytest.approx(sum(c > eps for c, eps in judged) / len(judged))


def test_eps_auto_rule_and_its_spread(run):
    directory, method, truth, c_bars = run
    result = analyze_dumps(directory, AnalyzeOptions(config=method, progress=False))
    measured = [c for c in c_bars if c is not None]
    rec = result["recommendation"]
    assert rec["eps_auto"] == pytest.approx(1.1 * statistics.median(measured[:4]), rel=1e-4)
    windows = [1.1 * statistics.median(measured[i:i + 4]) for i in range(len(measured) - 3)]
    assert rec["window_spread"]["min"] == pytest.approx(min(windows), rel=1e-4)
    assert rec["window_spread"]["max"] == pytest.approx(max(windows), rel=1e-4)
    assert rec["eps_floor"] == pytest.approx(statistics.median(measured[:2]), rel=1e-4)
    assert rec["partial"] is False and rec["rollouts_measured"] == 11
    assert rec["arch_defaults"]["moe"]["eps"] == 0.005 and rec["arch_defaults"]["dense"]["eps"] == 0.0037
    auto = ref.lagrange_trajectory(c_bars, 0.05, 1.0, "auto", 1.0, calibration=4, drift_window=10, drift="persistent")
    assert [row["replay"]["auto"]["lambda"] for row in result["rollouts"] if row["replay"]["auto"]] == \
        pytest.approx([lam for (lam, _), c in zip(auto, c_bars) if c is not None], rel=1e-4, abs=1e-9)
    moe = next(x for x in rec["candidates"] if x["name"] == "moe default")
    assert moe["fraction_above"] == pytest.approx(sum(c > 0.005 for c in measured) / len(measured))


def test_surge_detector_verdict_and_period(tmp_path):
    """Rollout dumps only (no training log-probs): lengths 40 for 32 rollouts, then 120; max length 128."""
    g = torch.Generator().manual_seed(5)
    lengths = [40] * 32 + [120] * 36
    for i, n in enumerate(lengths):
        write_rollout_dump(tmp_path, i, [{"response_length": n + d, "status": "completed",
                                          "rollout_log_probs": (-torch.rand(n + d, generator=g)).tolist()}
                                         for d in (-2, 0, 2)])
    method = tmp_path / "surge.yaml"
    method.write_text("mismatch_ctrl:\n  lr_decay:\n    enabled: true\n    surge:\n      min_increase_tokens: 20\n")
    result = analyze_dumps(tmp_path, AnalyzeOptions(config=method, max_response_len=128, progress=False))
    settings = load_config(method).lr_decay.surge
    detector = SurgeDetector(settings)
    for i, n in enumerate(lengths):
        detector.update(i, n, 128)
    surge = result["surge"]
    assert detector.triggered and 32 <= detector.onset <= 34
    assert (surge["triggered_at"], surge["onset"]) == (detector.triggered_at, detector.onset)
    assert surge["T_d"] == round(1.8 * detector.onset) and surge["first_halving"] == max(surge["T_d"],
                                                                                          detector.triggered_at)
    assert surge["verdict"].startswith("surge detected")
    expected = [ref.lr_scale(i, surge["T_d"], surge["first_halving"]) for i in range(len(lengths))]
    assert surge["series"]["lr_scale"] == expected and min(expected) == 0.5
    assert result["counts"]["with_train_log_probs"] == 0 and result["recommendation"]["eps_auto"] is None
    assert all(row["rollout_log_ppl"] > 0 for row in result["rollouts"])


def test_too_few_rollouts_leave_the_detector_undecided(run):
    directory, method, truth, _ = run
    surge = analyze_dumps(directory, AnalyzeOptions(config=method, progress=False))["surge"]
    assert surge["verdict"].startswith("undecided: 12 rollouts, the detector needs at least 32")
    assert surge["T_d"] is None and surge["series"]["lr_scale"] == [1.0] * 12


@pytest.mark.parametrize("drift", ["saturated", "persistent"])
def test_replay_runs_the_drift_guard(run, tmp_path, drift, caplog):
    directory, _, truth, c_bars = run
    method = tmp_path / "pinned.yaml"
    method.write_text("mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n    eps_guard: off\n    floor_rollouts: 2\n"
                      f"    drift_window: 3\n    lambda_max: 0.3\n    drift_guard: {drift}\n"
                      "    calibration_rollouts: 2\n")  # the eps: auto replay lifts too
    with caplog.at_level("WARNING", logger="mismatch_ctrl.dcgrpo"):
        result = analyze_dumps(directory, AnalyzeOptions(config=method, architecture="dense", eps=0.0005, eta=50.0,
                                                         progress=False))
    logged = [r for r in caplog.records if r.name == "mismatch_ctrl.dcgrpo" and "drift guard" in r.getMessage()]
    auto_lifts = [row["rollout_id"] for row in result["rollouts"]
                  if row["replay"]["auto"] is not None and row["replay"]["auto"]["drift_guard_lifted"]]
    assert auto_lifts and len(logged) == len(result["dcgrpo_replay"]["drift_guard_lifts"])  # the chosen replay's
    expected = ref.lagrange_trajectory(c_bars, 0.1, 50.0, 0.0005, 0.3, floor_window=2, guard="off", drift_window=3,
                                       drift=drift)
    replayed = [row["replay"]["chosen"] for row in result["rollouts"]]
    assert [x["eps"] for x in replayed if x] == pytest.approx(
        [eps for (_, eps), c in zip(expected, c_bars) if c is not None], rel=1e-4)
    lifted = [k for k, ((_, before), (_, after)) in enumerate(zip(expected, expected[1:])) if after != before]
    summary = result["dcgrpo_replay"]
    assert lifted and summary["drift_guard_lifts"] == lifted
    assert summary["settings"]["drift_guard"] == drift and summary["eps_final"] == pytest.approx(expected[-1][1])
    report = write_report(result, tmp_path / "analysis").read_text()
    assert f"lifted eps after rollouts {', '.join(map(str, lifted))}" in report


@pytest.mark.parametrize("eta", [2.0, 50.0])
def test_report_names_each_eps_change_with_its_own_value_and_guard(run, tmp_path, eta):
    """eps 0.0005 is below the floor of the first 2 rollouts (the infeasible-budget guard clamps it at rollout 1);
    C_bar then grows past every eps, so the persistent drift guard lifts it again. With eta 2 lambda stays far below
    lambda_max; with eta 50 it reaches lambda_max before some lifts and not before others."""
    directory, _, truth, c_bars = run
    method = tmp_path / "clamp_then_drift.yaml"
    method.write_text("mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n    eps_guard: clamp\n    floor_rollouts: 2\n"
                      "    drift_window: 3\n    lambda_max: 0.3\n    drift_guard: persistent\n")
    result = analyze_dumps(directory, AnalyzeOptions(config=method, architecture="dense", eps=0.0005, eta=eta,
                                                     progress=False))
    expected = ref.lagrange_trajectory(c_bars, 0.1, eta, 0.0005, 0.3, floor_window=2, guard="clamp", drift_window=3,
                                       drift="persistent")
    steps = [(k, before, after) for k, ((_, before), (_, after)) in enumerate(zip(expected, expected[1:]))
             if after != before]
    changes = result["dcgrpo_replay"]["eps_changes"]
    assert [c["guard"] for c in changes] == ["infeasible_budget"] + ["drift_guard"] * (len(steps) - 1)
    assert len(steps) >= 3 and [c["rollout_id"] for c in changes] == [k for k, _, _ in steps]
    for change, (_, before, after) in zip(changes, steps):
        assert change["old_eps"] == pytest.approx(before, rel=1e-4)
        assert change["new_eps"] == pytest.approx(after, rel=1e-4)
    floor = statistics.median(c_bars[:2])
    assert changes[0]["new_eps"] == pytest.approx(1.1 * floor, rel=1e-4)
    assert changes[0]["evidence"]["median_c_bar"] == pytest.approx(floor, rel=1e-4)

    lines = write_report(result, tmp_path / "analysis").read_text().splitlines()
    said = [next(line for line in lines if line.startswith(f"- Rollout {c['rollout_id']}: ")) for c in changes]
    assert said[0].startswith(f"- Rollout {changes[0]['rollout_id']}: the infeasible-budget guard (`eps_guard: clamp`) "
                              f"raised eps 0.0005 -> {fmt(changes[0]['new_eps'], 4)} = 1.1 x the floor "
                              f"{fmt(floor, 4)} (median C_bar of the first 2 rollouts)")
    final = fmt(result["dcgrpo_replay"]["eps_final"], 4)
    assert final not in said[0] and f"-> {final} = 1.1 x the streak's median C_bar: " in said[-1]
    rows = {row["rollout_id"]: row["replay"]["chosen"] for row in result["rollouts"]}
    for change, line in zip(changes[1:], said[1:]):
        assert f"the drift guard (`drift_guard: persistent`, window 3) lifted eps {fmt(change['old_eps'], 4)} -> " \
               f"{fmt(change['new_eps'], 4)}" in line
        lam = change["evidence"]["lambda_before"]
        assert lam == pytest.approx(rows[change["rollout_id"]]["lambda"])
        assert "sat at" not in line and ("at lambda_max" in line) == (lam >= 0.3)
    reached = [c["evidence"]["lambda_before"] >= 0.3 for c in changes[1:]]
    assert not any(reached) if eta == 2.0 else any(reached) and not all(reached)


@pytest.mark.parametrize("without", [{2, 3}, set(range(6))])
def test_penalty_share_leaves_out_and_names_the_rollouts_without_rewards(tmp_path, without):
    """Train dumps without ``rewards`` give zero advantages: their penalty share is not measured, and the report says
    why instead of printing a bare '-'."""
    g = torch.Generator().manual_seed(12)
    truth = [make_rollout(i, g, samples=4, max_len=12, noise=0.02) for i in range(6)]
    for r in truth:
        if r.rollout_id in without:
            r.omit = {"rewards"}
    write_run(tmp_path, truth)
    method = tmp_path / "method.yaml"
    method.write_text("mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n    calibration_rollouts: 2\n")
    result = analyze_dumps(tmp_path, AnalyzeOptions(config=method, architecture="moe", progress=False))
    summary = result["dcgrpo_replay"]
    shares = [row["replay"]["chosen"]["penalty_share"] for row in result["rollouts"]]
    assert [share is None for share in shares] == [r.rollout_id in without for r in truth]
    assert summary["rollouts_without_rewards"] == len(without)
    report = write_report(result, tmp_path / "analysis").read_text()
    if len(without) == len(truth):
        assert summary["penalty_share_mean"] is None
        assert (f"the penalty share (|lambda c| / |A|) is not measured: the dumps of {len(truth)} rollout(s) hold "
                "no `rewards`") in report
    else:
        measured = [share for share in shares if share is not None]
        assert summary["penalty_share_mean"] == pytest.approx(sum(measured) / len(measured))
        assert (f"mean penalty share (|lambda c| / |A|) {fmt(summary['penalty_share_mean'])} over the rollouts whose "
                f"dumps hold rewards ({len(without)} without)") in report
