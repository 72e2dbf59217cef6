"""The lab's GRPO loop through the slime hooks: a tiny end-to-end run, determinism, DC-GRPO's dual ascent, the CLI."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.lab.methods import RunSpec, method_names, method_section
from mismatch_ctrl.lab.policy import PolicyConfig, TinyPolicy
from mismatch_ctrl.lab.run import run_lab
from mismatch_ctrl.lab.task import make_task
from mismatch_ctrl.lab.trainer import LabSettings, Trainer, collapse_step, group_normalize, policy_loss
from mismatch_ctrl.lab.warmup import WarmupConfig

TINY = dict(steps=4, prompts_per_step=4, samples_per_prompt=4, eval_every=2, eval_prompts=16)


def random_policy_state(task: str = "add") -> dict:
    policy = TinyPolicy(PolicyConfig.for_task(make_task(task), d_model=32, n_layers=1, n_heads=2, d_ff=64), seed=1)
    return {"policy_config": policy.config.to_dict(), "state_dict": policy.state_dict()}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tiny_lab_run_writes_finite_metrics_plots_report_and_analyzable_dumps(tmp_path):
    warmup = WarmupConfig(d_model=32, n_layers=1, d_ff=64, steps=3, max_steps=3, batch_size=16,
                          min_sample_accuracy=0.0, eval_prompts=8, eval_samples=1)
    runs = [RunSpec.parse("grpo@none", "e4m3"), RunSpec.parse("dcgrpo", "e4m3"), RunSpec.parse("geo_mis", "e5m2")]
    result = run_lab(runs, LabSettings(**TINY, dump_details=True), tmp_path, jobs=2, cache_dir=tmp_path / "cache",
                     show_progress=False, warmup=warmup)
    report = result.report.read_text()
    for spec in runs:
        assert f"`{spec.label}`" in report
        rows = records(tmp_path / spec.label / "metrics.jsonl")
        assert [r["step"] for r in rows] == list(range(TINY["steps"]))
        for row in rows:
            assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
    assert {p.name for p in result.plots} >= {"overview.png", "reward.png", "eval_accuracy.png", "discrepancy.png",
                                              "lambda.png", "lr.png", "response_length.png", "rejected_fraction.png"}
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in result.plots)
    summaries = {s["label"]: s for s in json.loads((tmp_path / "summary.json").read_text())}
    assert summaries["grpo@none"]["discrepancy_max"] < 1e-5 < summaries["dcgrpo@e4m3"]["discrepancy_mean"]
    dcgrpo = records(tmp_path / "dcgrpo@e4m3" / "metrics.jsonl")
    assert all("lambda" in r and "train/mismatch_ctrl/k3_kl" in r for r in dcgrpo)
    assert all("train/mismatch_ctrl/rejected_token_fraction" in r for r in records(tmp_path / "geo_mis@e5m2" /
                                                                                    "metrics.jsonl"))
    analysis = analyze_dumps(tmp_path / "dcgrpo@e4m3" / "dump", AnalyzeOptions(architecture="dense", progress=False))
    assert [r["rollout_id"] for r in analysis["rollouts"]] == list(range(TINY["steps"]))
    recorded = [r["discrepancy"] for r in dcgrpo]
    replayed = [r["prob_diff_mean"] for r in analysis["rollouts"]]
    assert replayed == pytest.approx(recorded, rel=1e-5)


def test_same_seed_gives_the_same_metrics_and_another_seed_does_not(tmp_path):
    state = random_policy_state()

    def run(seed: int, name: str) -> list[dict]:
        trainer = Trainer(RunSpec.parse("token_tis", "e4m3"), LabSettings(**TINY, seed=seed), state, tmp_path / name)
        trainer.run()
        return [{k: v for k, v in r.items() if k != "seconds"} for r in records(tmp_path / name / "metrics.jsonl")]

    first, again, other = run(3, "a"), run(3, "b"), run(4, "c")
    assert first == again
    assert first != other


def test_dcgrpo_lambda_rises_while_the_engine_discrepancy_is_above_eps(tmp_path):
    # eps = 1e-4 far below an e5m2 engine's discrepancy, guard off: each rollout adds eta (C_bar - eps) > 0, eta = 10.
    trainer = Trainer(RunSpec.parse("dcgrpo_tight_noguard", "e5m2"), LabSettings(**TINY), random_policy_state(),
                      tmp_path)
    trainer.run()
    rows = records(tmp_path / "metrics.jsonl")
    for row, following in zip(rows, rows[1:]):
        assert row["discrepancy"] > row["eps"] == 1e-4
        assert following["lambda"] == pytest.approx(row["lambda"] + 10 * (row["discrepancy"] - row["eps"]), rel=1e-6)
        assert following["lambda"] > row["lambda"]


def test_grpo_pieces_match_slime():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    normalised = group_normalize(rewards, 4)
    first = rewards[:4]
    torch.testing.assert_close(normalised[:4], (first - first.mean()) / (first.std() + 1e-6))
    assert torch.equal(normalised[4:], torch.zeros(4))
    ppo_kl = torch.tensor([0.0, -0.5, 0.5])  # ratios 1, e^0.5, e^-0.5
    advantages = torch.tensor([1.0, 1.0, -1.0])
    ratio = torch.exp(-ppo_kl)
    expected = torch.stack([-advantages * ratio, -advantages * ratio.clamp(0.8, 1.28)]).amax(0)
    torch.testing.assert_close(policy_loss(ppo_kl, advantages, 0.2, 0.28), expected)


def test_collapse_step():
    assert collapse_step([0.4] * 30, 5) is None
    assert collapse_step([0.4] * 10 + [0.0] * 20, 5) == 12  # the 5-step mean drops below 0.2 at step 12
    assert collapse_step([0.4] * 10 + [0.0] * 5 + [0.4] * 15, 5) is None  # recovered
    assert collapse_step([0.05] * 10 + [0.0] * 10, 5) is None  # never learned anything


def test_every_lab_method_builds_a_valid_config():
    for name in method_names():
        assert method_section(name)["name"] == name
        RunSpec.parse(name, "e4m3")
    with pytest.raises(ValueError, match="unknown lab method 'nope'"):
        RunSpec.parse("nope", "e4m3")


def test_cli_help_and_bad_method():
    help_text = subprocess.run([sys.executable, "-m", "mismatch_ctrl", "lab", "--help"], capture_output=True,
                               text=True, check=True).stdout
    for flag in ("--methods", "--steps", "--quant", "--lr", "--seed", "--out", "--dump-details"):
        assert flag in help_text
    bad = subprocess.run([sys.executable, "-m", "mismatch_ctrl", "lab", "--methods", "grpo,nope"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown lab method 'nope'" in bad.stderr
    cases = ((["--quant", "e9m9"], "quant mode: unknown 'e9m9'"), (["--task", "foo"], "task: unknown 'foo'"),
             (["--methods", ","], "give at least one METHOD"))
    for args, message in cases:
        bad = subprocess.run([sys.executable, "-m", "mismatch_ctrl", "lab", *args], capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr, (args, bad.stderr)
