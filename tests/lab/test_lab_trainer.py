"""The lab's GRPO loop through the slime hooks: a tiny end-to-end run over seeds, determinism, routing flips and
replay, DC-GRPO's architecture defaults and dual ascent, the CLI."""

import json
import math
from pathlib import Path

import pytest
import torch

from mismatch_ctrl import cli
from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.lab.sweeps import run as lab_run
from mismatch_ctrl.lab.training.methods import RunSpec, method_names, method_section
from mismatch_ctrl.lab.model.policy import PolicyConfig, TinyPolicy
from mismatch_ctrl.lab.sweeps.run import rewrite_report, run_lab
from mismatch_ctrl.lab.model.tasks import make_task
from mismatch_ctrl.lab.training.settings import LabSettings
from mismatch_ctrl.lab.training.summary import collapse_step
from mismatch_ctrl.lab.training.trainer import Trainer, group_normalize, policy_loss
from mismatch_ctrl.lab.model.warmup import WarmupConfig
from mismatch_ctrl.slime.runtime import get_runtime

TINY = dict(steps=4, prompts_per_step=4, samples_per_prompt=4, eval_every=2, eval_prompts=16)


def random_policy_state(kind: str = "dense", std: float | None = None) -> dict:
    shape = dict(d_model=32, n_layers=1, n_heads=2, d_ff=64) if kind == "dense" else \
        dict(d_model=32, n_layers=2, n_heads=2, d_ff=16, n_experts=4, top_k=2)
    policy = TinyPolicy(PolicyConfig.for_task(make_task("add"), **shape), seed=1)
    if std is not None:  # large weights: peaked distributions and decisive routers
        with torch.no_grad():
            for name, param in policy.named_parameters():
                if name.endswith("weight") and param.dim() >= 2:
                    param.normal_(0.0, std, generator=torch.Generator().manual_seed(2))
    return {"policy_config": policy.config.to_dict(), "state_dict": policy.state_dict()}


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_tiny_lab_run_over_two_seeds_writes_metrics_aggregate_plots_report_and_analyzable_dumps(tmp_path):
    warmup = WarmupConfig(d_model=32, n_layers=1, d_ff=16, steps=3, max_steps=3, batch_size=16,
                          min_sample_accuracy=0.0, eval_prompts=8, eval_samples=1)
    runs = [RunSpec.parse("grpo@none", "e4m3", 8), RunSpec.parse("dcgrpo", "e4m3", 8),
            RunSpec.parse("geo_mis@e5m2+r3", "e4m3", 8)]
    result = run_lab(runs, LabSettings(**TINY, dump_details=True), tmp_path, jobs=2, cache_dir=tmp_path / "cache",
                     show_progress=False, warmup=warmup, seeds=(0, 1))
    report = result.report.read_text()
    for spec in runs:
        assert f"`{spec.label}`" in report
        for seed in (0, 1):
            rows = records(tmp_path / spec.label / f"seed{seed}" / "metrics.jsonl")
            assert [r["step"] for r in rows] == list(range(TINY["steps"]))
            for row in rows:
                assert all(math.isfinite(v) for v in row.values() if isinstance(v, float)), row
                assert {"routing_flip_fraction", "routing_flip_fraction_layer0", "discrepancy_flipped",
                        "discrepancy_unflipped"} <= set(row)
            if spec.quant == "none" or spec.replay:
                assert all(r["routing_flip_fraction"] == 0 for r in rows)
    assert {p.name for p in result.plots} >= {"overview.png", "reward.png", "eval_accuracy.png", "discrepancy.png",
                                              "lambda.png", "routing_flip_fraction.png", "rejected_fraction.png"}
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in result.plots)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and len(summary["runs"]) == 2 * len(runs)
    per_seed = {(r["label"], r["seed"]): r for r in summary["runs"]}
    for spec in runs:
        aggregated = summary["aggregate"][spec.label]["metrics"]["final_acc_engine"]
        values = [per_seed[(spec.label, seed)]["final_acc_engine"] for seed in (0, 1)]
        assert aggregated["values"] == values and aggregated["mean"] == pytest.approx(sum(values) / 2)
    assert per_seed[("grpo@none", 0)]["discrepancy_max"] < 1e-5 < per_seed[("dcgrpo@e4m3", 0)]["discrepancy_mean"]
    dcgrpo = records(tmp_path / "dcgrpo@e4m3" / "seed1" / "metrics.jsonl")
    assert all("lambda" in r and "train/mismatch_ctrl/k3_kl" in r for r in dcgrpo)
    assert all("train/mismatch_ctrl/rejected_token_fraction" in r
               for r in records(tmp_path / "geo_mis@e5m2+r3" / "seed0" / "metrics.jsonl"))
    again = rewrite_report(tmp_path)
    assert [(s["label"], s["seed"]) for s in again.summaries] == [(r["label"], r["seed"]) for r in summary["runs"]]
    assert again.summaries == summary["runs"] and "mismatch-ctrl lab" in again.report.read_text()
    analysis = analyze_dumps(tmp_path / "dcgrpo@e4m3" / "seed1" / "dump",
                             AnalyzeOptions(architecture="moe", progress=False))
    assert [r["rollout_id"] for r in analysis["rollouts"]] == list(range(TINY["steps"]))
    replayed = [r["prob_diff_mean"] for r in analysis["rollouts"]]
    assert replayed == pytest.approx([r["discrepancy"] for r in dcgrpo], rel=1e-5)


def test_same_seed_gives_the_same_metrics_and_another_seed_does_not(tmp_path):
    state = random_policy_state()

    def run(seed: int, name: str) -> list[dict]:
        trainer = Trainer(RunSpec.parse("token_tis", "e4m3"), LabSettings(**TINY, seed=seed, policy="dense"), state,
                          tmp_path / name)
        trainer.run()
        return [{k: v for k, v in r.items() if k != "seconds"} for r in records(tmp_path / name / "metrics.jsonl")]

    first, again, other = run(3, "a"), run(3, "b"), run(4, "c")
    assert first == again
    assert first != other


def test_dcgrpo_lambda_rises_while_the_engine_discrepancy_is_above_eps(tmp_path):
    # eps = 1e-4 far below an e5m2 engine's discrepancy, guard off: each rollout adds eta (C_bar - eps) > 0, eta = 10.
    trainer = Trainer(RunSpec.parse("dcgrpo_tight_noguard", "e5m2"), LabSettings(**TINY, policy="dense"),
                      random_policy_state(), tmp_path)
    trainer.run()
    rows = records(tmp_path / "metrics.jsonl")
    for row, following in zip(rows, rows[1:]):
        assert row["discrepancy"] > row["eps"] == 1e-4
        assert following["lambda"] == pytest.approx(row["lambda"] + 10 * (row["discrepancy"] - row["eps"]), rel=1e-6)
        assert following["lambda"] > row["lambda"]


def test_routing_flips_zero_without_quant_and_with_replay_positive_with_e4m3(tmp_path):
    state = random_policy_state("moe", std=0.15)
    settings = LabSettings(**{**TINY, "steps": 2, "prompts_per_step": 8})
    flips = {}
    for text in ("grpo@none", "grpo@e4m3", "grpo@e4m3+r3", "grpo@none+r3"):
        spec = RunSpec.parse(text, "e4m3", 4)
        Trainer(spec, settings, state, tmp_path / text).run()
        rows = records(tmp_path / text / "metrics.jsonl")
        flips[text] = [r["routing_flip_fraction"] for r in rows]
        if text == "grpo@none+r3":  # R3 with an exact engine: the trainer's log-probs are the engine's
            assert all(r["discrepancy"] < 1e-6 for r in rows)
    assert flips["grpo@none"] == flips["grpo@e4m3+r3"] == flips["grpo@none+r3"] == [0.0, 0.0]
    assert all(f > 0.005 for f in flips["grpo@e4m3"])


@pytest.mark.parametrize("kind, experts, defaults", [("moe", 4, (0.05, 0.005)), ("dense", 0, (0.1, 0.0037))])
def test_lab_dcgrpo_resolves_the_architecture_defaults_like_the_hooks(tmp_path, kind, experts, defaults):
    trainer = Trainer(RunSpec.parse("dcgrpo", "e4m3", experts), LabSettings(**TINY, policy=kind),
                      random_policy_state(kind), tmp_path)
    assert trainer.args.num_experts == experts
    config = get_runtime(trainer.args).config
    assert config.architecture == kind and (config.dcgrpo.lambda_0, config.dcgrpo.eps) == defaults
    data, rollout, _, _ = trainer.rollout_data(0)
    from mismatch_ctrl.slime import hooks

    hooks.advantages(trainer.args, data)
    assert data["mismatch_ctrl/lambda"][0] == defaults[0]
    with pytest.raises(ValueError, match="weights are of a"):
        Trainer(RunSpec.parse("grpo", "e4m3"), LabSettings(**TINY, policy="moe"), random_policy_state("dense"),
                tmp_path / "x")


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
    assert RunSpec.parse("grpo@e5m2+r3", "e4m3", 8) == RunSpec("grpo", "e5m2", True)
    assert RunSpec.parse("dcgrpo+r3", "e4m3", 8).label == "dcgrpo@e4m3+r3"
    with pytest.raises(ValueError, match="needs a mixture-of-experts"):
        RunSpec.parse("grpo+r3", "e4m3", 0)


def test_cli_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["lab", "--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in ("--methods", "--steps", "--quant", "--policy", "--lr", "--seeds", "--preset", "--out",
                 "--dump-details", "--cache-dir"):
        assert flag in help_text


@pytest.mark.parametrize("args, message", [
    (["--lr", "inf"], "argument --lr: expected a finite number > 0 and at most 10, got 'inf'"),
    (["--lr", "1e300"], "argument --lr: expected a finite number > 0 and at most 10, got '1e300'"),
    (["--lr", "nan"], "argument --lr"),
    (["--lr", "-1e-3"], "argument --lr"),
    (["--methods", "grpo,grpo"], "--methods: each run once, got grpo@e4m3 more than once"),
    (["--methods", "grpo@none,grpo", "--quant", "e4m3,none"], "--methods: each run once, got grpo@none more"),
    (["--methods", "grpo,nope"], "--methods: unknown lab method 'nope'"),
    (["--methods", "configs/methods/dcgrpo.yaml"], "(a method is named without folder and .yaml: dcgrpo)"),
    (["--prompts", "5000"], "argument --prompts: at most 4096 prompts per rollout, got 5000"),
    (["--methods", "grpo@"], "--methods: run 'grpo@': nothing after '@'"),
    (["--samples", "300"], "argument --samples: expected 2 to 256 samples per prompt"),
    (["--methods", ","], "--methods: give at least one"),
    (["--methods", "grpo+r3", "--policy", "dense"], "--methods: run 'grpo+r3': routing replay"),
    (["--policy", "sparse"], "argument --policy: unknown policy 'sparse'"),
    (["--seeds", "a,b"], "argument --seeds"),
    (["--seeds", "0,0"], "argument --seeds: expected distinct"),
    (["--seeds", "-1"], "argument --seeds"),
    (["--seeds", ""], "argument --seeds"),
    (["--quant", "e9m9"], "argument --quant: quant mode: unknown 'e9m9'; choose one of none, bf16, fp16, e4m3-w, "
                          "e4m3, e5m2-w, e5m2, nvfp4, mxfp4, int4 or tempX"),
    (["--quant", "e4m3,,nope"], "argument --quant: quant mode: unknown 'nope'"),
    (["--quant", "none,e4m3,none"], "argument --quant: each engine once"),
    (["--quant", "temp0"], "argument --quant: quant mode 'temp0': 'temp0' needs an engine temperature from 0.001 to "
                           "1000"),
    (["--quant", "tempfast"], "needs an engine temperature from"),
    (["--quant", "temp1e300"], "argument --quant: quant mode 'temp1e300': 'temp1e300' needs an engine temperature"),
    (["--quant", "none+router"], "+router needs a quantised engine"),
    (["--quant", "e4m3+turbo"], "suffix 'turbo' is not +router, +tempX or +train-P"),
    (["--num-steps-per-rollout", "0"], "argument --num-steps-per-rollout: must be an integer >= 1, got '0'"),
    (["--num-steps-per-rollout", "3"], "must be a multiple of num_steps_per_rollout x micro_batches (3 x 2)"),
    (["--device", "tpu"], "argument --device: expected one of ['cpu', 'cuda'], got 'tpu'"),
    (["--task", "foo"], "argument --task: invalid choice"),
    (["--steps", "0"], "argument --steps"),
    (["--samples", "1"], "argument --samples"),
    (["--cache-dir", "FILE"], "argument --cache-dir: 'FILE' exists and is not a directory"),
    (["--out", "FILE"], "argument --out"),
])
def test_cli_bad_input_exits_2_naming_the_flag_before_the_warm_up(tmp_path, monkeypatch, capsys, args, message):
    def no_warmup(*_, **__):
        raise AssertionError("the warm-up must not start")

    monkeypatch.setattr(lab_run, "warmup_policy", no_warmup)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "FILE").write_text("x")
    try:
        code = cli.main(["lab", *args])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_presets_fill_unset_options_and_flags_override_them():
    from mismatch_ctrl.lab.sweeps.options import LAB_DEFAULTS, LAB_PRESETS, POLICY_DEFAULTS, resolve

    parser = cli.build_parser()
    assert resolve(parser.parse_args(["lab"])) == LAB_DEFAULTS
    edge = resolve(parser.parse_args(["lab", "--preset", "e5m2-edge", "--lr", "2e-3", "--seeds", "7"]))
    assert edge["quant"] == "e5m2" and edge["methods"] == LAB_PRESETS["e5m2-edge"]["methods"]
    assert edge["lr"] == 2e-3 and edge["seeds"] == (7,) and edge["steps"] == LAB_DEFAULTS["steps"]
    gpu_moe = cli.lab_plan(parser.parse_args(["lab", "--preset", "gpu-moe"]))[1]
    assert gpu_moe.lr == 1e-4 and gpu_moe.optimizer_steps == 4  # 1e-3 wrecks moe-large (docs/lab-offpolicy.md)
    large = resolve(parser.parse_args(["lab", "--policy", "moe-large"]))  # its own lr unless a flag says otherwise
    assert large["lr"] == POLICY_DEFAULTS["moe-large"]["lr"] != LAB_DEFAULTS["lr"]
    assert resolve(parser.parse_args(["lab", "--policy", "moe-large", "--lr", "2e-3"]))["lr"] == 2e-3
    assert resolve(parser.parse_args(["lab", "--preset", "e5m2-edge", "--policy", "moe-large"]))["lr"] == 1e-4
    assert resolve(parser.parse_args(["lab", "--policy", "dense"]))["lr"] == LAB_DEFAULTS["lr"]
    for name, preset in LAB_PRESETS.items():  # every preset's runs parse for its policy
        o = resolve(parser.parse_args(["lab", "--preset", name]))
        assert set(preset) <= set(LAB_DEFAULTS)
        RunSpec.expand(o["methods"].split(","), o["quant"].split(","), 8)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of cuda on a machine without CUDA")
def test_cli_refuses_cuda_without_a_gpu_and_auto_picks_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(lab_run, "warmup_policy", lambda *_, **__: pytest.fail("the warm-up must not start"))
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["lab", "--device", "cuda", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "argument --device: cuda requested but torch finds no CUDA GPU" in capsys.readouterr().err
    assert cli.build_parser().parse_args(["lab"]).device == "auto"
    assert cli.lab_plan(cli.build_parser().parse_args(["lab", "--preset", "gpu-moe"]))[1].device == "cpu"
    settings = LabSettings(device="cuda", policy="dense")  # a GPU run's settings still read back (--report-only)
    with pytest.raises(ValueError, match="device: cuda requested"):
        Trainer(RunSpec.parse("grpo", "e4m3"), settings, random_policy_state(), tmp_path)
    with pytest.raises(ValueError, match="device: expected one of"):
        LabSettings(device="gpu")


def test_help_lists_every_engine_and_method_unbroken(capsys):
    from mismatch_ctrl.lab.model.quant import QUANT_MODES

    with pytest.raises(SystemExit):
        cli.main(["lab", "--help"])
    words = set(capsys.readouterr().out.replace(",", " ").replace("(", " ").replace(")", " ").replace(";", " ").split())
    assert set(QUANT_MODES) <= words
    assert set(method_names()) <= words
    assert {"tempX", "+router", "--num-steps-per-rollout", "--device"} <= words


def test_runs_are_methods_times_doses_and_a_pinned_method_keeps_its_engine():
    runs = RunSpec.expand(["grpo", "token_tis@e4m3", "dcgrpo+r3"], ["none", "nvfp4+router", "temp1.05"], 8)
    assert [r.label for r in runs] == [
        "grpo@none", "grpo@nvfp4+router", "grpo@temp1.05", "token_tis@e4m3",
        "dcgrpo@none+r3", "dcgrpo@nvfp4+router+r3", "dcgrpo@temp1.05+r3"]
    assert RunSpec.parse("grpo@e4m3+temp1.50", "none").quant == "e4m3+temp1.5"
    with pytest.raises(ValueError, match="at least one engine"):
        RunSpec.expand(["grpo"], [" "])


@pytest.mark.parametrize("k", [1, 4])
def test_num_steps_per_rollout_is_the_number_of_optimizer_steps(tmp_path, k):
    settings = LabSettings(**{**TINY, "steps": 2}, policy="dense", optimizer_steps=k)
    trainer = Trainer(RunSpec.parse("grpo", "e4m3"), settings, random_policy_state(), tmp_path)
    trainer.run()
    steps = {int(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {2 * k}
    assert settings.global_batch_size == 16 // k
    with pytest.raises(ValueError, match="num_steps_per_rollout .* must be >= 1"):
        LabSettings(optimizer_steps=0)


def test_a_blown_up_policy_is_reported_collapsed_not_a_sampler_traceback(tmp_path):
    # A policy whose LM head holds an infinity (what a learning rate that blows up the weights ends in): every logit
    # row holds inf or NaN. The sampler ends those responses with EOS instead of torch.multinomial raising, counts
    # them, and the run finishes with a finite summary that says it collapsed at the first rollout.
    state = random_policy_state("moe")
    state["state_dict"]["lm_head.weight"][7] = math.inf
    settings = LabSettings(**{**TINY, "steps": 3, "eval_every": 1}, policy="moe")
    with pytest.warns(RuntimeWarning, match="nonfinite_tokens"):  # the hooks drop and count the NaN log-probs
        summary = Trainer(RunSpec.parse("grpo", "e4m3", 4), settings, state, tmp_path).run()
    rows = records(tmp_path / "metrics.jsonl")
    assert [r["engine_nonfinite_fraction"] for r in rows] == [1.0, 1.0, 1.0]
    assert all(r["response_length"] == 1.0 for r in rows)
    assert summary["engine_nonfinite_fraction"] == 1.0 and summary["collapse_step"] == 0
    assert all(math.isfinite(v) for v in summary.values() if isinstance(v, float)), summary


def test_auto_runs_only_a_large_policy_on_cuda(monkeypatch):
    """``--device auto``: CUDA for a policy of at least CUDA_MIN_PARAMETERS when torch finds a GPU, else the CPU."""
    from mismatch_ctrl.lab.training.settings import CUDA_MIN_PARAMETERS, auto_device

    assert auto_device("moe-large", "add") == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    sizes = {kind: TinyPolicy(PolicyConfig.of_kind(kind, make_task("add"))).num_parameters()
             for kind in ("dense", "moe", "moe-large")}
    assert sizes["moe-large"] >= CUDA_MIN_PARAMETERS > max(sizes["moe"], sizes["dense"])
    assert {kind: auto_device(kind, "add") for kind in sizes} == {"dense": "cpu", "moe": "cpu", "moe-large": "cuda"}
