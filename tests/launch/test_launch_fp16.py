"""TRAIN_PRECISION=fp16 (FP16 precision alignment, Qi et al. 2025): the baseline launcher, what it serves and
passes, its memory and rollout-cost estimate, and each preflight rule of ``mismatch_ctrl.launch.precision``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch_harness import FP8_QUANTIZATION, REPO, Sandbox, needs_the_recipe_imports, options, split_submit
from slime_parsers import write_parsers
from mismatch_ctrl.launch.main import served_checkpoint, engine_shape
from mismatch_ctrl.launch.memory import GB, estimate, rollout_cost_lines
from mismatch_ctrl.launch.model_shape import read_model_args
from mismatch_ctrl.launch.layout import Layout
from mismatch_ctrl.launch.precision import precision_problems
from mismatch_ctrl.launch.profiles import PROFILES
from mismatch_ctrl.launch.settings import Settings

GIVEN = {"METHOD": "grpo", "MODEL": "qwen3_30b_a3b", "REPO_ROOT": str(REPO), "PYTHON": "python3"}
SHAPE_30B = PROFILES["qwen3_30b_a3b"].shape


def settings(precision: str, **env: str) -> Settings:
    return Settings({"TRAIN_PRECISION": precision, **env}, GIVEN)


def test_the_fp16_baseline_changes_only_the_training_precision(sandbox: Sandbox) -> None:
    env = sandbox.make_cluster()
    runs = {script: sandbox.run(script, "--dry-run", env=env) for script in ("qwen3_30b_grpo.sh",
                                                                            "qwen3_30b_fp16_aligned.sh")}
    for result in runs.values():
        assert result.returncode == 0, result.stderr
    grpo, fp16 = (split_submit(runs[script].command())[1] for script in runs)
    # --fp16, the BF16 checkpoint served instead of the FP8 one, and the run's own checkpoint directory: no more.
    expected = [w.replace(env["FP8_HF_DIR"], env["MODEL_DIR"]) for w in grpo]
    assert [w for w in fp16 if w != "--fp16"] == expected and fp16.count("--fp16") == 1
    assert options(fp16)["--hf-checkpoint"] == [[env["MODEL_DIR"]]]
    stderr = runs["qwen3_30b_fp16_aligned.sh"].stderr
    assert f"rollouts on {env['MODEL_DIR']} (BF16 weights served in float16)" in stderr
    assert "FP16 (Megatron --fp16 with dynamic loss scaling) compute" in stderr
    assert f"engine layout checked on the model shape MODEL_DIR={env['MODEL_DIR']}/config.json" in stderr
    assert "warning" not in stderr, stderr  # the FP8 checkpoint is neither needed nor asked for


def test_fp16_alignment_refuses_a_quantised_checkpoint_as_the_served_model(sandbox: Sandbox) -> None:
    env = sandbox.make_cluster()
    env["MODEL_DIR"] = env["FP8_HF_DIR"]  # an FP8 checkpoint where FP16 alignment serves the BF16 one
    result = sandbox.run("qwen3_30b_fp16_aligned.sh", "--dry-run", env=env)
    assert result.returncode == 2 and not result.stdout, result.stderr
    assert "declares a quantization_config (quant_method 'fp8')" in result.stderr
    assert "Point MODEL_DIR at the BF16 Hugging Face checkpoint" in result.stderr


def test_fp16_prepare_converts_no_fp8_checkpoint(sandbox: Sandbox) -> None:
    env = sandbox.make_cluster(prepared=False)
    result = sandbox.run("qwen3_30b_fp16_aligned.sh", "--prepare", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert "# [fp8] skip: FP8_HF_DIR=" in result.stdout and "TRAIN_PRECISION=fp16 serves MODEL_DIR" in result.stdout
    assert "convert_hf_to_fp8.py" not in result.stdout and "convert_hf_to_torch_dist.py" in result.stdout


def test_a_missing_bf16_model_is_named_for_fp16(sandbox: Sandbox) -> None:
    env = sandbox.make_cluster()
    env["MODEL_DIR"] = str(Path(env["MODEL_DIR"]) / "absent")
    result = sandbox.run("qwen3_30b_fp16_aligned.sh", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert f"warning (an error at launch): MODEL_DIR={env['MODEL_DIR']} does not exist; TRAIN_PRECISION=fp16 " \
           "serves the BF16 model from there" in result.stderr


def test_the_served_shape_has_no_fp8_blocks_with_fp16(tmp_path: Path) -> None:
    model = read_model_args(str(REPO / "recipes" / "qwen3_30b_a3b" / "model.sh"))
    s = settings("fp16", MODEL_DIR=str(tmp_path / "absent"))
    shape, source = engine_shape(s, served_checkpoint(s, model))
    assert shape.weight_block_size is None and shape.num_experts == 128 and "MODEL_DIR=" in source
    s = settings("bf16", FP8_HF_DIR=str(tmp_path / "absent"))
    assert engine_shape(s, served_checkpoint(s, model))[0].weight_block_size == (128, 128)


def test_fp16_memory_and_rollout_cost_by_hand() -> None:
    layout = Layout(tp=2, ep=8, rollout_gpus_per_engine=4, rollout_ep=4)
    terms = dict(max_tokens_per_gpu=20480, cpu_offload=True, sglang_mem_fraction=0.7, gpu_memory_gb=80)
    fp16, fp8 = estimate(SHAPE_30B, layout, **terms, rollout_precision="FP16"), estimate(SHAPE_30B, layout, **terms)
    # Qwen3-30B-A3B: attention/layer 2048*32*128*2 + 2*2048*4*128 + 2*128 + 2*2048 = 18,878,720; embeddings
    # 151,936 * 2048 * 2 = 622,329,856; N = 622,329,856 + 48 * 18,878,720 + 48 * 2048 * 128 + 2048
    # + 48 * 128 * 3 * 2048 * 768 = 30,532,122,624.
    n, embeddings = 30_532_122_624, 622_329_856
    assert fp16.rollout_weights == pytest.approx(2 * n / 4)
    assert fp8.rollout_weights == pytest.approx(((n - embeddings) + 2 * embeddings) / 4)
    assert fp16.total == fp8.total and fp16.host_per_node == fp8.host_per_node  # the trainer's terms are the same
    per_token = 2 * 48 * 1 * 128 * 2  # K and V, 48 layers, 4 KV heads over TP4, head_dim 128, 2 bytes
    assert fp16.kv_bytes_per_token == per_token
    (line,) = rollout_cost_lines(fp16, fp8)
    kv16, kv8 = 56e9 - 2 * n / 4, 56e9 - ((n - embeddings) + 2 * embeddings) / 4
    assert f"weights {2 * n / 4 / GB:.1f} against {fp8.rollout_weights / GB:.1f} GB per GPU" in line
    assert f"({kv16 / per_token / 1e6:.2f}M against {kv8 / per_token / 1e6:.2f}M tokens per engine)" in line
    assert "up to ~2x" in line and "estimate, not measured" in line
    with pytest.raises(ValueError, match="rollout_precision"):
        estimate(SHAPE_30B, layout, **terms, rollout_precision="FP4")


# -- the rules of mismatch_ctrl.launch.precision, one case each that breaks it and one that keeps it --------------

@pytest.mark.parametrize("precision, extra, fragment", [
    ("bf16", ["--fp16"], "--fp16 after -- picks the training precision behind TRAIN_PRECISION=bf16's back"),
    ("fp16", ["--bf16"], "--bf16 after -- picks the training precision"),
    ("fp16", ["--sglang-dtype", "bfloat16"], "slime sets dtype float16 itself and ignores --sglang-dtype"),
    ("bf16", ["--sglang-dtype=float16"], "a float16 engine against a BF16/FP8 trainer"),
    ("fp16", ["--sglang-quantization", "fp8"], "--sglang-quantization after -- quantises the rollout engines"),
    ("fp16", ["--sglang-kv-cache-dtype", "fp8_e4m3"], "--sglang-kv-cache-dtype fp8_e4m3 after -- stores the"),
    ("fp16", ["--fp8-format", "e4m3"], "--fp8-format after -- runs Transformer Engine's low-precision GEMMs"),
    ("fp16", ["--loss-scale", "1024"], "the first float16 overflow stops the run"),
    ("fp16", ["--use-torch-fsdp2"], "is not supported with --fp16"),
    ("bf16", ["--initial-loss-scale", "65536"], "Megatron reads only with --fp16"),
    ("fp8", ["--hysteresis=4"], "--hysteresis after -- is a dynamic loss-scaling setting"),
    ("bf16", ["--fp16-lm-cross-entropy"], "--fp16-lm-cross-entropy after -- needs --fp16"),
])
def test_each_precision_rule_refuses_its_case(tmp_path, precision, extra, fragment) -> None:
    problems = precision_problems(settings(precision, MODEL_DIR=str(tmp_path)), extra)
    assert len(problems) == 1 and fragment in problems[0], problems


@pytest.mark.parametrize("precision, extra", [
    ("fp16", ["--initial-loss-scale", "65536", "--hysteresis", "4", "--loss-scale-window", "500"]),
    ("fp16", ["--sglang-kv-cache-dtype", "auto", "--fp16-lm-cross-entropy"]),
    ("bf16", ["--loss-scale", "1"]),  # a constant scale is Megatron's with bf16 too
    ("fp16", ["--fp16"]),  # the launcher's own flag: the duplicate-flag check names it
    ("bf16", ["--sglang-kv-cache-dtype", "fp8_e4m3", "--fp8-format", "e4m3"]),
])
def test_what_each_precision_allows(tmp_path, precision, extra) -> None:
    assert precision_problems(settings(precision, MODEL_DIR=str(tmp_path)), extra) == []


def test_the_served_checkpoint_rule_reads_model_dir(tmp_path) -> None:
    config = {"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert precision_problems(settings("fp16", MODEL_DIR=str(tmp_path)), []) == []
    (tmp_path / "config.json").write_text(json.dumps({**config, "quantization_config": FP8_QUANTIZATION}))
    (problem,) = precision_problems(settings("fp16", MODEL_DIR=str(tmp_path)), [])
    assert "declares a quantization_config (quant_method 'fp8')" in problem and str(tmp_path) in problem
    assert precision_problems(settings("bf16", MODEL_DIR=str(tmp_path)), []) == []  # bf16 serves FP8_HF_DIR


def test_a_refused_flag_ends_the_launch_before_the_command(sandbox: Sandbox) -> None:
    result = sandbox.run("qwen3_30b_fp16_aligned.sh", "--dry-run", "--", "--sglang-kv-cache-dtype", "fp8_e4m3",
                         env=sandbox.make_cluster())
    assert result.returncode == 2 and not result.stdout
    assert "configuration error: --sglang-kv-cache-dtype fp8_e4m3 after --" in result.stderr


def test_run_names_and_help_name_the_precision() -> None:
    assert settings("fp16")["RUN_NAME"] == "qwen3_30b_a3b_grpo_fp16" and settings("fp16").rollout_checkpoint == \
        "MODEL_DIR"
    assert settings("bf16").rollout_checkpoint == "FP8_HF_DIR" == settings("fp8").rollout_checkpoint
    assert settings("fp16").problems() == []


@pytest.mark.parametrize("extra, error", [
    (["--initial-loss-scale", "65536"], None),  # Megatron's flag, read as written: submitted
    (["--initial-loss-scal", "65536"], "--initial-loss-scal after -- is not a flag of slime at SLIME_DIR="),
])
def test_the_fp16_launch_reads_its_flags_through_slimes_parsers(sandbox: Sandbox, extra, error) -> None:
    """The full launch (not --dry-run): preflight, the flags after -- through slime's three parsing functions
    (stand-ins that know --fp16 and --initial-loss-scale, tests/launch/slime_parsers.py), then ray job submit."""
    needs_the_recipe_imports()
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_ray(reachable=True, cluster_gpus=8)
    env = sandbox.make_cluster()
    write_parsers(Path(env["SLIME_DIR"]), Path(env["MEGATRON_DIR"]))
    result = sandbox.run("qwen3_30b_fp16_aligned.sh", "--", *extra, env=env)
    submits = [call for call in sandbox.calls("ray") if call[:2] == ["job", "submit"]]
    if error is None:
        assert result.returncode == 0 and len(submits) == 1, result.stderr
        assert "--fp16" in submits[0] and submits[0][submits[0].index("--hf-checkpoint") + 1] == env["MODEL_DIR"]
    else:
        assert result.returncode == 1 and error in result.stderr and not submits, result.stderr


def test_a_dense_checkpoint_as_the_served_model_is_named_as_the_bf16_one(sandbox: Sandbox) -> None:
    env = sandbox.make_cluster()
    env["MODEL_DIR"] = sandbox.make_cluster("qwen3_8b")["MODEL_DIR"]
    result = sandbox.run("qwen3_30b_fp16_aligned.sh", "--dry-run", env=env)
    assert result.returncode == 2 and "MODEL_DIR: the checkpoint is dense" in result.stderr
    assert "point MODEL_DIR at the BF16 checkpoint of MODEL=qwen3_30b_a3b" in result.stderr
