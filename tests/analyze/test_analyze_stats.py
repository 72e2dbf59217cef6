"""Per-rollout statistics of ``analyze_dumps`` against direct computation (tests/reference.py: Python loops over
sequences and tokens, double precision) on dumps the tests write."""

import math

import pytest
import torch

import reference as ref
from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.presets import PRESETS

from .synthetic import make_rollout, write_run

SECTION_6 = ("training_log_ppl", "rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff", "kl", "k3_kl",
             "prob_diff_mean", "prob_diff_max", "logprob_abs_diff", "trained_tokens", "nonfinite_tokens")
BIN = 1.06  # relative width of a log-histogram bin (sketch.py: 1.059)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Six rollouts: one with a -inf rollout log-prob, one without the training recompute, one with no truncation
    record at all (neither dump)."""
    directory = tmp_path_factory.mktemp("run")
    g = torch.Generator().manual_seed(7)
    truth = [make_rollout(i, g, samples=10, noise=0.02 * (i + 1), nonfinite=i == 1) for i in range(6)]
    truth[3].omit = {"log_probs"}
    truth[4].omit = {"truncated"}
    write_run(directory, truth[:4] + truth[5:])
    write_run(directory, truth[4:5], rollout_dumps=False)
    result = analyze_dumps(directory, AnalyzeOptions(progress=False, max_response_len=20))
    return truth, result


def seqs(r):
    return ref.prepare(r.train, r.rollout, r.masks)


def test_section_6_metrics_match_direct_computation(run):
    truth, result = run
    rows = {row["rollout_id"]: row for row in result["rollouts"]}
    for r in truth:
        row = rows[r.rollout_id]
        if "log_probs" in r.omit:
            assert row["train_log_probs"] is False and "prob_diff_mean" not in row and "rejection" not in row
            per_seq = [-ref.masked_mean(x.tolist(), m.tolist()) for x, m in zip(r.rollout, r.masks)]
            assert row["rollout_log_ppl"] == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-6)
            continue
        s = seqs(r)
        want = ref.summarize([ref.mismatch_metrics(x) for x in s], [x.count for x in s])
        for name in SECTION_6:
            assert row[name] == pytest.approx(want[name], rel=1e-4, abs=1e-7), (r.rollout_id, name)
    assert rows[1]["nonfinite_tokens"] == 1.0


def test_prob_diff_distribution_matches_order_statistics_and_counts(run):
    truth, result = run
    rows = {row["rollout_id"]: row for row in result["rollouts"]}
    pooled = []
    for r in truth:
        if "log_probs" in r.omit:
            continue
        values = [v for x in seqs(r) for v, w in zip(ref.token_signal(x, "prob_diff"), x.mask) if w > 0]
        pooled += values
        row = rows[r.rollout_id]
        for q in (0.5, 0.9, 0.99):
            exact = max(ref.order_statistic(values, q), 1e-8)
            assert exact / BIN <= row["prob_diff_quantiles"][f"p{100 * q:g}"] <= exact * BIN
        for t in (0.01, 0.1, 0.5):
            assert row["prob_diff_tail"][f">{t:g}"] == pytest.approx(sum(v > t for v in values) / len(values))
    pooled_row = result["prob_diff_pooled"]
    assert pooled_row["tokens"] == len(pooled)
    exact = ref.order_statistic(pooled, 0.9)
    assert exact / BIN <= pooled_row["quantiles"]["p90"] <= exact * BIN
    assert pooled_row["tail"][">0.01"] == pytest.approx(sum(v > 0.01 for v in pooled) / len(pooled))


def test_lengths_truncation_and_rewards(run):
    truth, result = run
    rows = {row["rollout_id"]: row for row in result["rollouts"]}
    for r in truth:
        row = rows[r.rollout_id]
        assert row["samples"] == len(r.lengths)
        assert row["mean_response_length"] == pytest.approx(sum(r.lengths) / len(r.lengths))
        assert row["reward_mean"] == pytest.approx(sum(r.raw) / len(r.raw))
        if r.rollout_id == 4:  # neither dump records truncation: --max-response-len decides
            assert row["truncation_source"] == "max_response_len"
            assert row["truncation_rate"] == pytest.approx(sum(n >= 20 for n in r.lengths) / len(r.lengths))
        else:
            assert row["truncation_source"] == "dump"
            assert row["truncation_rate"] == pytest.approx(sum(r.truncated) / len(r.lengths))
    assert result["max_response_len"] == {"value": 20, "source": "--max-response-len"}


def test_preset_rejections_match_the_reference_correction(run):
    truth, result = run
    rows = {row["rollout_id"]: row for row in result["rollouts"]}
    means = {name: [] for name in PRESETS if name != "none"}
    for r in truth:
        if "log_probs" in r.omit:
            continue
        s = seqs(r)
        counts = [x.count for x in s]
        for name in means:
            _, _, per_seq = ref.correction(PRESETS[name], s)
            tokens = sum(p["rejected_tokens"] for p in per_seq) / sum(counts)
            rejected = [p["rejected_seq_fraction"] for p in per_seq]  # 0 for a sequence without trained tokens
            got = rows[r.rollout_id]["rejection"][name]
            assert got["tokens"] == pytest.approx(tokens, abs=1e-6), (r.rollout_id, name)
            assert got["sequences"] == pytest.approx(sum(rejected) / len(rejected), abs=1e-6), (r.rollout_id, name)
            means[name].append(tokens)
    assert any(max(v) > 0 for v in means.values())  # the data exercises rejection
    for name, values in means.items():
        assert result["presets"][name]["tokens_mean"] == pytest.approx(sum(values) / len(values), abs=1e-6)
        assert result["presets"][name]["tokens_max"] == pytest.approx(max(values), abs=1e-6)


def test_result_is_strict_json(run):
    import json

    _, result = run
    text = json.dumps(result, allow_nan=False)
    assert not math.isnan(json.loads(text)["rollouts"][0]["prob_diff_mean"])


def test_training_log_ppl_without_rollout_log_probs(tmp_path):
    """A custom generate function that records no rollout log-probs: the training engine's side is still reported."""
    g = torch.Generator().manual_seed(8)
    truth = make_rollout(0, g)
    truth.omit = {"rollout_log_probs"}
    write_run(tmp_path, [truth], rollout_dumps=False)
    (row,) = analyze_dumps(tmp_path, AnalyzeOptions(progress=False))["rollouts"]
    per_seq = [-ref.masked_mean(x.tolist(), m.tolist()) for x, m in zip(truth.train, truth.masks)]
    assert row["rollout_log_probs"] is False and "rollout_log_ppl" not in row and "prob_diff_mean" not in row
    assert row["training_log_ppl"] == pytest.approx(sum(per_seq) / len(per_seq), rel=1e-6)
