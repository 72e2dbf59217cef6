"""Seed aggregation on known numbers, the differences the report claims, and the plots' series and legends."""

import math
import warnings

import pytest

from mismatch_ctrl.lab.results.stats import aggregate, paired, sign, spread, t_quantile_975
from mismatch_ctrl.lab.results.plots import _series, band, curves_of, far_below, informative, twins, write_plots
from mismatch_ctrl.lab.results.groups import aggregate_runs
from mismatch_ctrl.lab.results.table import RunTable


def test_spread_of_known_numbers():
    s = spread([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.std, s.min, s.max) == (3, 2.0, 1.0, 1.0, 3.0)
    half = 4.303 / math.sqrt(3)  # t(0.975, 2) * s / sqrt(n)
    assert s.low == pytest.approx(2.0 - half) and s.high == pytest.approx(2.0 + half)
    s = spread([0.5, 0.7, 0.6, 0.8, 0.4])
    assert s.mean == pytest.approx(0.6) and s.std == pytest.approx(math.sqrt(0.025))
    assert s.high - s.mean == pytest.approx(2.776 * math.sqrt(0.025) / math.sqrt(5))
    one = spread([0.25])
    assert (one.mean, one.std, one.low, one.high) == (0.25, 0.0, None, None)
    assert spread([4.0, 4.0]).low == spread([4.0, 4.0]).high == 4.0
    assert t_quantile_975(1) == 12.706 and t_quantile_975(30) == 2.042
    assert 1.96 < t_quantile_975(1000) < 1.97
    with pytest.raises(ValueError, match="no values"):
        spread([])
    with pytest.raises(ValueError, match="finite"):
        spread([1.0, float("nan")])


def summary(label, method, quant, seed, acc, reward=0.3, late=0.01, replay=False, collapse=None):
    return {"label": label, "method": method, "quant": quant, "replay": replay, "seed": seed,
            "initial_acc_engine": 0.6, "final_acc_engine": acc, "late_acc_engine": acc, "acc_change_engine": acc - 0.6,
            "best_acc_engine": acc, "final_acc_fp32": acc, "late_acc_fp32": acc, "final_reward": reward,
            "late_reward": reward, "discrepancy_mean": late, "discrepancy_first": late, "discrepancy_last": late,
            "discrepancy_max": late, "routing_flip_fraction": None if quant == "none" else 0.04,
            "discrepancy_flipped": None, "discrepancy_unflipped": None, "seconds_per_step": 0.2,
            "collapse_step": collapse}


def test_aggregate_runs_per_label_and_paired_differences():
    rows = []
    table = [(0.60, 0.40, 0.45, 0.43), (0.62, 0.42, 0.50, 0.47), (0.61, 0.41, 0.40, 0.45)]
    for seed, (none, grpo, dcgrpo, tis) in enumerate(table):
        rows += [summary("grpo@none", "grpo", "none", seed, none, late=0.0),
                 summary("grpo@e4m3", "grpo", "e4m3", seed, grpo),
                 summary("dcgrpo@e4m3", "dcgrpo", "e4m3", seed, dcgrpo, collapse=5 if seed == 1 else None),
                 summary("token_tis@e4m3", "token_tis", "e4m3", seed, tis)]
    result = aggregate_runs(RunTable.from_summaries(rows))
    assert list(result) == ["grpo@none", "grpo@e4m3", "dcgrpo@e4m3", "token_tis@e4m3"]
    entry = result["grpo@e4m3"]
    assert entry["seeds"] == [0, 1, 2] and entry["spreads"]["late_acc_engine"].mean == pytest.approx(0.41)
    assert entry["spreads"]["late_acc_engine"].values == (0.40, 0.42, 0.41)
    assert entry["by_seed"]["late_acc_engine"] == {0: 0.40, 1: 0.42, 2: 0.41}
    assert "routing_flip_fraction" not in result["grpo@none"]["spreads"]
    assert result["dcgrpo@e4m3"]["collapses"] == 1
    assert aggregate([{"x": None}, {"x": 1.0}], ["x", "y"])["x"].n == 1
    assert paired({0: 1.0, 1: 2.0}, {1: 0.5, 2: 9.0}).values == (1.5,) and paired({0: 1.0}, {1: 1.0}) is None
    assert sign(spread([0.1, 0.2, 0.15])) == 1 and sign(spread([0.3])) == 0
    # a zero-width interval (two seeds with one difference by chance) claims nothing
    assert sign(spread([-0.074, -0.074])) == 0 and sign(spread([-0.07, -0.074])) == -1


def test_series_band_and_twins():
    records = [{"step": 0, "eval_acc_engine": 0.5, "reward": 0.1}, {"step": 1, "reward": 0.3},
               {"step": 2, "reward": 0.5, "final_eval_acc_engine": 0.7}]
    assert _series(records, "eval_acc_engine", 1) == ([0, 3], [0.5, 0.7])  # final evaluation drawn after rollout 2
    assert _series(records, "reward", 2) == ([0, 1, 2], [0.1, pytest.approx(0.2), pytest.approx(0.4)])
    assert _series(records, "lambda", 1) == ([], [])
    x, mean, low, high = band([([0, 1, 2], [1.0, 2.0, 3.0]), ([0, 2], [3.0, 5.0])])
    assert (x, mean, low, high) == ([0, 2], [2.0, 4.0], [1.0, 3.0], [3.0, 5.0])
    curves = [("a", ([0, 1], [1.0, 2.0])), ("b", ([0, 1], [1.0, 2.5])), ("c", ([0, 1], [1.0, 2.0]))]
    assert twins(curves) == {"c": "a"}


def test_plots_of_one_dense_run_skip_absent_quantities_without_legend_warnings(tmp_path):
    records = [{"step": s, "reward": 0.0, "discrepancy": 0.01, "train/lr": 1e-3, "response_length": 4.0,
                **({"eval_acc_engine": 0.5} if s == 0 else {})} for s in range(4)]
    records[-1]["final_eval_acc_engine"] = 0.6
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        paths = write_plots({"grpo@e4m3": {0: records}}, tmp_path)
    names = {p.stem for p in paths}
    assert names == {"overview", "reward", "eval_accuracy", "discrepancy"}  # outcomes always; a flat lr: no panel
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in paths)


def test_a_panel_without_information_is_left_out_and_the_routing_split_shares_one_panel(tmp_path):
    def records(flips, lr=1e-3):
        rows = [{"step": s, "reward": 0.1 * s, "discrepancy": 0.01 if flips else 1e-7, "train/lr": lr,
                 "routing_flip_fraction": 0.05 if flips else 0.0, "discrepancy_flipped": 0.05 if flips else None,
                 "discrepancy_unflipped": 0.01 if flips else 1e-7, "train/mismatch_ctrl/rejected_token_fraction": 0.0,
                 **({"eval_acc_engine": 0.5} if s == 0 else {})} for s in range(4)]
        rows[-1]["final_eval_acc_engine"] = 0.6
        return rows

    runs = {"grpo@none": {0: records(False), 1: records(False)}, "grpo@e4m3": {0: records(True), 1: records(True)},
            "token_tis@e4m3": {0: records(True), 1: records(True)}}
    names = {p.stem for p in write_plots(runs, tmp_path)}
    assert "lr" not in names and "rejected_fraction" not in names  # the same constant in every run
    assert {"discrepancy_by_routing", "routing_flip_fraction", "reward_by_run", "eval_accuracy_by_run"} <= names
    assert "discrepancy_flipped" not in names and "discrepancy_unflipped" not in names
    runs["length_decay@e4m3"] = {0: records(True, lr=5e-4), 1: records(True, lr=5e-4)}
    assert "lr" in {p.stem for p in write_plots(runs, tmp_path)}  # two learning rates: the panel says something
    curves = curves_of(runs, "reward", 2)
    label, smooth, raw = curves[0]
    assert label == "grpo@none" and raw[1] == [0.0, 0.1, 0.2, pytest.approx(0.3)]
    assert smooth[1] == [0.0, pytest.approx(0.05), pytest.approx(0.15), pytest.approx(0.25)]
    assert informative([("a", smooth)]) and not informative([("a", ([0, 1], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]))])


def test_runs_far_below_the_others_get_their_own_strip_on_a_log_panel():
    def curve(low, high):
        return ([0, 1], [low, high], [low, low], [high, high]), ([0, 1], [low, high], [low, low], [high, high])

    fp8 = [("grpo@e4m3", *curve(0.010, 0.012)), ("grpo@e5m2", *curve(0.02, 0.03))]
    exact = [("grpo@none", *curve(1e-7, 2e-7))]
    assert far_below(fp8 + exact) == {"grpo@none"}
    assert far_below(fp8) == set()
    assert far_below(fp8 + [("bf16", *curve(1e-5, 5e-5))]) == {"bf16"}  # top 5e-5 x 100 < 0.010: two decades
    assert far_below(fp8 + [("bf16", *curve(1e-3, 2e-3))]) == set()  # within two decades: one axis
