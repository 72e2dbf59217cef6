"""The surge task's records and their analysis: mismatch by length (``length_stats``) and the surge measures
(``results.surge``), each against a straightforward per-sequence implementation."""

import numpy as np
import pytest
import torch

from mismatch_ctrl.lab.results import surge
from mismatch_ctrl.lab.training.length_stats import length_buckets


def _random_rollout(generator, n=40, width=9):
    lengths = torch.randint(1, width + 1, (n,), generator=generator)
    lengths[0] = 0  # an empty response is left out
    mask = torch.arange(width) < lengths[:, None]
    rollout = -torch.rand(n, width, generator=generator) * 3
    train = rollout + 0.2 * torch.randn(n, width, generator=generator)
    return train.masked_fill(~mask, 0.0), rollout.masked_fill(~mask, 0.0), mask


def _per_sequence(train, rollout, mask):
    rows = []
    for p, q, m in zip(train.tolist(), rollout.tolist(), mask.tolist()):
        n = sum(m)
        if n == 0:
            continue
        d = [a - b for a, b, keep in zip(p, q, m) if keep]
        c = sum(abs(np.exp(a) - np.exp(b)) for a, b, keep in zip(p, q, m) if keep) / n
        rows.append((n, c, max(abs(x) for x in d), sum(d), abs(sum(d))))
    return rows


def test_length_buckets_match_a_per_sequence_loop():
    train, rollout, mask = _random_rollout(torch.Generator().manual_seed(0))
    train[3, 0] = float("nan")  # a blown-up sequence is left out
    got = length_buckets(train, rollout, mask)
    rows = [r for i, r in enumerate(_per_sequence(train, rollout, mask)) if i != 2]  # row 3 is the 3rd non-empty
    assert got["length"] == sorted({float(r[0]) for r in rows})
    for j, length in enumerate(got["length"]):
        picked = [r for r in rows if r[0] == length]
        assert got["count"][j] == len(picked)
        for k, key in enumerate(("discrepancy_sum", "max_abs_log_ratio_sum", "log_ratio_sum", "abs_log_ratio_sum")):
            assert got[key][j] == pytest.approx(sum(r[k + 1] for r in picked), rel=1e-5, abs=1e-6)
    with pytest.raises(ValueError, match="one shape"):
        length_buckets(train, rollout[:, :3], mask)


def test_within_rollout_slope_is_least_squares_with_one_intercept_per_rollout():
    generator = torch.Generator().manual_seed(1)
    records, xs, ys, groups = [], [], [], []
    for step in range(5):
        train, rollout, mask = _random_rollout(generator)
        records.append({"step": step, "length_buckets": length_buckets(train, rollout, mask)})
        for row in _per_sequence(train, rollout, mask):
            xs.append(row[0])
            ys.append(row[3])
            groups.append(step)
    design = np.column_stack([np.array(xs, float)] + [np.array(groups) == g for g in range(5)]).astype(float)
    expected = np.linalg.lstsq(design, np.array(ys), rcond=None)[0][0]
    assert surge.within_rollout_slope(records, "log_ratio_sum") == pytest.approx(expected, rel=1e-6)
    assert surge.within_rollout_slope([{"step": 0, "length_buckets": {
        "length": [3.0], "count": [4.0], "log_ratio_sum": [1.0]}}], "log_ratio_sum") is None


def test_bucket_means_pool_the_run_by_length():
    records = [{"step": 0, "length_buckets": {"length": [2.0, 7.0], "count": [3.0, 1.0], "x": [0.3, 0.5]}},
               {"step": 1, "length_buckets": {"length": [2.0, 16.0], "count": [1.0, 2.0], "x": [0.1, 1.0]}}]
    assert surge.bucket_means(records, "x") == [pytest.approx(0.1), None, pytest.approx(0.5), None,
                                                pytest.approx(0.5)]


def test_doubling_surged_detector_and_lr_cuts():
    flat, rise = [2.0] * 40, [2.0 + 6.0 * min(1.0, t / 10) for t in range(60)]
    records = [{"step": t, "response_length": v} for t, v in enumerate(flat + rise)]
    found = surge.doubling(surge.lengths(records), 20)
    # by brute force over the trailing 5-rollout means
    smooth = [float(np.mean((flat + rise)[max(0, t - 4):t + 1])) for t in range(100)]
    best = max(smooth[b] / smooth[a] for b in range(100) for a in range(max(0, b - 20), b))
    assert found.ratio == pytest.approx(best) and found.ratio == pytest.approx(4.0)
    assert surge.surged(records) and not surge.surged(records, factor=4.5)
    assert not surge.surged([{"step": t, "response_length": 2.0 + t / 50} for t in range(100)])
    assert surge.detector(records) == (None, None)
    records[50].update(surge_triggered=1.0, surge_onset=44.0)
    records[51].update(surge_triggered=1.0, surge_onset=44.0)
    assert surge.detector(records) == (44, 50)
    scales = [1.0] * 60 + [0.5] * 20 + [0.25] * 20
    assert surge.lr_cuts([{"step": t, "lr_scale": s} for t, s in enumerate(scales)]) == [60, 80]


def test_within_rollout_difference_pairs_long_and_short_of_one_rollout():
    records = [{"step": 0, "length_buckets": {"length": [2.0, 7.0, 9.0], "count": [2.0, 1.0, 1.0],
                                              "x": [0.2, 0.5, 0.7]}},
               {"step": 1, "length_buckets": {"length": [2.0], "count": [1.0], "x": [0.5]}},  # no scratchpad: skipped
               {"step": 2, "length_buckets": {"length": [1.0, 12.0], "count": [1.0, 2.0], "x": [0.3, 0.2]}}]
    # rollout 0: 0.6 - 0.1; rollout 2: 0.1 - 0.3
    assert surge.within_rollout_difference(records, "x") == pytest.approx((0.5 - 0.2) / 2)
    assert surge.within_rollout_difference(records[1:2], "x") is None


def test_length_profile_is_the_mean_per_exact_length():
    records = [{"step": 0, "length_buckets": {"length": [2.0, 7.0], "count": [3.0, 1.0], "x": [0.3, 0.5]}},
               {"step": 1, "length_buckets": {"length": [2.0], "count": [1.0], "x": [0.5]}}]
    assert surge.length_profile(records, "x") == {2: pytest.approx(0.2), 7: pytest.approx(0.5)}
    assert surge.length_profile(records, "x", min_count=2) == {2: pytest.approx(0.2)}


def test_before_after_uses_the_windows_around_the_detector():
    records = [{"step": t, "discrepancy": 0.01 if t < 30 else 0.03} for t in range(100)]
    assert surge.before_after(records) is None
    records[40].update(surge_triggered=1.0, surge_onset=30)
    assert surge.before_after(records, window=10) == (pytest.approx(0.01), pytest.approx(0.03))


def test_a_digitsum_run_logs_the_mismatch_by_length_and_its_report_has_the_surge(tmp_path):
    from mismatch_ctrl.lab.model.warmup import WarmupConfig
    from mismatch_ctrl.lab.sweeps.run import run_lab
    from mismatch_ctrl.lab.training.methods import RunSpec
    from mismatch_ctrl.lab.training.settings import LabSettings

    warmup = WarmupConfig(task="digitsum", d_model=32, n_layers=1, d_ff=16, steps=3, max_steps=3, batch_size=16,
                          min_sample_accuracy=0.0, eval_prompts=8, eval_samples=1, corrupt_frac=0.0)
    runs = [RunSpec.parse("length_decay", "e4m3", 8), RunSpec.parse("grpo_lr_half", "e4m3", 8),
            RunSpec.parse("geo_rs_nvfp4@nvfp4", "e4m3", 8)]
    settings = LabSettings(task="digitsum", steps=3, prompts_per_step=4, samples_per_prompt=4, eval_every=2,
                           eval_prompts=8)
    result = run_lab(runs, settings, tmp_path, jobs=1, cache_dir=tmp_path / "cache", show_progress=False,
                     warmup=warmup, seeds=(0,))
    for run in result.table:
        assert len(run.records) == 3
        for record in run.records:
            buckets = record["length_buckets"]
            assert sum(buckets["count"]) == 16 and 0.0 <= record["scratch_fraction"] <= 1.0
            lengths = [float(n) for n in buckets["length"]]
            assert sum(n * c for n, c in zip(lengths, buckets["count"])) == pytest.approx(
                16 * record["response_length"])
    half = next(run for run in result.table if run.method == "grpo_lr_half")
    assert [r["lr_scale"] for r in half.records] == [1.0, 0.5, 0.5]  # halved from rollout 1 on, through the hook
    assert [r["train/lr"] for r in half.records] == pytest.approx([1e-3, 5e-4, 5e-4])
    report = result.report.read_text()
    assert "## The response-length surge" in report and "## The mismatch against response length" in report
    assert (tmp_path / "plots" / "surge.png").is_file() and "![surge](plots/surge.png)" in report
    assert "![mismatch_by_length](plots/mismatch_by_length.png)" in report


def test_surge_lines_count_surges_onsets_and_cuts():
    from mismatch_ctrl.lab.results.surge_report import surge_lines
    from mismatch_ctrl.lab.results.table import Run, RunTable

    def run(seed, rise_at, cut_at=None):
        records = []
        for t in range(100):
            record = {"step": t, "response_length": 2.0 if t < rise_at else 9.0, "discrepancy": 0.01,
                      "lr_scale": 0.5 if cut_at is not None and t >= cut_at else 1.0,
                      "length_buckets": {"length": [2.0, 9.0], "count": [3.0, 1.0], "discrepancy_sum": [0.03, 0.02],
                                         "max_abs_log_ratio_sum": [0.3, 0.2], "log_ratio_sum": [0.0, 0.1],
                                         "abs_log_ratio_sum": [0.3, 0.2]}}
            if t >= rise_at + 5:
                record.update(surge_triggered=1.0, surge_onset=float(rise_at))
            records.append(record)
        summary = {"label": "length_decay@e4m3", "method": "length_decay", "quant": "e4m3", "replay": False,
                   "seed": seed, "settings": {}}
        return Run(summary, records)

    lines = surge_lines(RunTable.of([run(70, 40, 72), run(71, 50, 90), run(72, 200)]))
    row = next(line for line in lines if line.startswith("| `length_decay@e4m3` | 3 |"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[5:] == ["2/3", "2/3", "45 (40-50)", "50 (45-55)", "81 (72-90)"]


def test_training_estimate_from_the_measured_cost_per_rollout():
    from mismatch_ctrl.lab.sweeps.budget import ROLLOUT_SECONDS, training_estimate

    line = training_estimate("digitsum", "moe", 140 * 100, 140, 16)
    assert line is not None and "140 runs" in line and "16 jobs" in line
    low, high = (140 * 100 * seconds / 16 / 60 for seconds in ROLLOUT_SECONDS["digitsum"])
    assert f"about {low:.0f}-{high:.0f} min with" in line  # the range the two measured CPUs give
    assert "2 jobs" in training_estimate("add", "dense", 200, 2, 8)  # never more jobs than runs
    assert "with 1 job on" in training_estimate("add", "moe", 40, 1, 2)
    assert "about 8-18 s with" in training_estimate("add", "moe", 40, 1, 1)  # 40 x 0.2 and 40 x 0.45
    assert "about 40 s-2 min with" in training_estimate("add", "moe", 200, 1, 1)  # 40 s and 90 s: two units
    assert "about 1.5-3.4 h with" in training_estimate("add", "moe", 27000, 1, 1)
    assert training_estimate("reverse-long", "moe", 100, 1, 1) is None  # no measured cost: no line
    assert training_estimate("add", "moe-large", 100, 1, 1) is None
    assert training_estimate("add", "moe", 0, 0, 2) is None
