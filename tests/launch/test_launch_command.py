"""The `--dry-run` command of every launcher: flags and values that matter, checkpoints, hooks, runtime env."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launch_harness import (HF_CONFIGS, HOOKS, KNOWN_TRAIN_FLAGS, LAUNCHERS, MODELS, REPO, Sandbox, contains_run,
                            model_args, options, ray_option, split_submit)

# slime 624b824a loss.py vanilla_tis_function: clamp(exp(old - rollout), tis_clip_low=0, tis_clip=2); the token_tis
# preset (truncate at 2) through our TIS hook is the same weight, so the aligned baseline needs no --use-tis.
FP8_TRAINING = ["--transformer-impl", "transformer_engine", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise"]
CUDA_GRAPH_BATCH_SIZES = ["1", "2", "4", "8", *map(str, range(16, 257, 8))]

# What the issue asks of the Qwen3-30B-A3B runs (and slime spells so).
EXPECTED_30B = {
    "--tensor-model-parallel-size": ["2"], "--sequence-parallel": [], "--expert-model-parallel-size": ["8"],
    "--expert-tensor-parallel-size": ["1"], "--pipeline-model-parallel-size": ["1"], "--context-parallel-size": ["1"],
    "--rollout-num-gpus-per-engine": ["4"], "--sglang-ep-size": ["4"], "--colocate": [],
    "--sglang-cuda-graph-bs-decode": CUDA_GRAPH_BATCH_SIZES,
    "--optimizer-cpu-offload": [], "--overlap-cpu-optimizer-d2h-h2d": [], "--use-precision-aware-optimizer": [],
    "--rollout-batch-size": ["64"], "--n-samples-per-prompt": ["8"], "--global-batch-size": ["128"],
    "--rollout-max-response-len": ["8192"], "--rollout-temperature": ["1"], "--lr": ["1e-6"],
    "--eps-clip": ["0.2"], "--eps-clip-high": ["0.28"], "--advantage-estimator": ["grpo"],
    "--get-mismatch-metrics": [], "--custom-rm-path": ["recipes.qwen3_30b_a3b.reward.rm"],
    "--input-key": ["prompt"], "--label-key": ["label"], "--apply-chat-template": [], "--rollout-shuffle": [],
    "--actor-num-nodes": ["1"], "--actor-num-gpus-per-node": ["8"], "--num-gpus-per-node": ["8"],
    "--eval-config": [str(REPO / "recipes" / "qwen3_30b_a3b" / "eval_light.yaml")], "--eval-interval": ["50"],
    "--use-dynamic-batch-size": [], "--recompute-granularity": ["full"],
    **{flag: [path] for flag, path in HOOKS.items()},
}
ABSENT_BY_DEFAULT = ("--use-kl-loss", "--kl-loss-coef", "--kl-coef", "--use-rollout-routing-replay", "--use-tis",
                     "--use-rollout-logprobs", "--use-wandb", "--use-tensorboard", "--skip-eval-before-train",
                     "--fp8-format", "--fp8-recipe", "--transformer-impl", "--sglang-cuda-graph-bs", "--fp16")


def single_values(found: dict[str, list[list[str]]]) -> dict[str, list[str]]:
    """flag -> its values, asserting that no launcher flag is given twice (argparse would silently keep the last)."""
    repeated = [flag for flag, uses in found.items() if len(uses) > 1]
    assert not repeated, f"flags given more than once: {repeated}"
    return {flag: uses[0] for flag, uses in found.items()}


@pytest.mark.parametrize("script", sorted(LAUNCHERS))
def test_each_launcher_selects_its_method_and_model(sandbox: Sandbox, script: str) -> None:
    method, model, run = LAUNCHERS[script]
    facts = MODELS[model]
    optional = {"WANDB_PROJECT": "p", "WANDB_TEAM": "t", "TENSORBOARD_DIR": "/tb", "SKIP_EVAL_BEFORE_TRAIN": "1"}
    if facts["num_experts"]:
        optional["ROUTING_REPLAY"] = "1"
    result = sandbox.run(script, "--dry-run", env=optional)  # default paths: none exists, so warnings, exit 0
    assert result.returncode == 0, result.stderr

    _, train = split_submit(result.command())
    found = options(train)
    unknown = sorted(set(found) - KNOWN_TRAIN_FLAGS)
    assert not unknown, f"flags not checked against slime/Megatron: {unknown}"
    values = single_values(found)
    config = REPO / "configs" / "methods" / f"{method}.yaml"
    assert config.is_file()
    assert values["--custom-config-path"] == [str(config)]
    assert values["--get-mismatch-metrics"] == [] and values["--custom-tis-function-path"]  # slime requires both
    for flag, path in HOOKS.items():
        assert values[flag] == [path]
    fp16 = script == "qwen3_30b_fp16_aligned.sh"  # FP16 alignment serves the BF16 checkpoint, in float16
    assert values["--hf-checkpoint"] == [f"/root/{facts['hf_name']}" + ("" if fp16 else "-FP8")]
    assert ("--fp16" in values) == fp16
    assert values["--ref-load"] == [f"/root/{facts['hf_name']}_torch_dist"]
    assert values["--save"] == [f"/root/runs/{run}"]  # baselines never share a checkpoint dir
    assert contains_run(train, model_args(model))
    # SGLang engines of a MoE model shard experts with expert parallelism (FP8 block 128: see layout.py).
    assert values.get("--sglang-ep-size") == (["4"] if facts["num_experts"] else None)
    assert values["--sglang-cuda-graph-bs-decode"] == CUDA_GRAPH_BATCH_SIZES
    fp8_training = script == "qwen3_30b_fp8_aligned.sh"
    assert contains_run(train, FP8_TRAINING) == fp8_training
    env_vars = json.loads(ray_option(split_submit(result.command())[0], "--runtime-env-json"))["env_vars"]
    assert ("NVTE_FP8_BLOCK_SCALING_FP32_SCALES" in env_vars) == fp8_training
    # The method YAML was validated with the model's architecture (Megatron --num-experts) and the run's length.
    assert sandbox.check_config_calls() == [["-m", "mismatch_ctrl", "check-config", str(config), "--num-rollout",
                                             "500", "--num-experts", str(facts["num_experts"])]]


def test_8b_uses_the_dense_layout(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster("qwen3_8b")
    result = sandbox.run("qwen3_8b_dcgrpo.sh", "--dry-run", env=cluster)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    # check-config resolves the architecture from Megatron's --num-experts: 0 selects the dense DC-GRPO defaults.
    assert [call[-2:] for call in sandbox.check_config_calls()] == [["--num-experts", "0"]]

    _, train = split_submit(result.command())
    values = single_values(options(train))
    assert values["--tensor-model-parallel-size"] == ["2"]
    assert values["--sequence-parallel"] == []
    assert values["--rollout-num-gpus-per-engine"] == ["2"]
    assert "--num-experts" not in values and "--sglang-ep-size" not in values
    assert "--expert-model-parallel-size" not in values and "--expert-tensor-parallel-size" not in values
    assert "--optimizer-cpu-offload" not in values
    assert values["--hf-checkpoint"] == [cluster["FP8_HF_DIR"]] and cluster["FP8_HF_DIR"].endswith("Qwen3-8B-FP8")
    assert values["--ref-load"] == [cluster["TORCH_DIST_DIR"]]
    assert contains_run(train, model_args("qwen3_8b"))


def test_environment_overrides(sandbox: Sandbox) -> None:
    env = {"NUM_NODES": "2", "METHOD": "geo_mis", "ROUTING_REPLAY": "1", "WANDB_PROJECT": "mc", "WANDB_TEAM": "lab",
           "TENSORBOARD_DIR": "/tb", "OPTIMIZER_CPU_OFFLOAD": "0", "EVAL_INTERVAL": "0", "NUM_ROLLOUT": "7",
           "RAY_ADDRESS": "http://10.0.0.1:8265", "LR": "2e-6", "PASS_ENV": "RECIPE_RM_WORKERS",
           "RECIPE_RM_WORKERS": "4", "NCCL_NVLS_ENABLE": "1"}
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", "--", "--sglang-kv-cache-dtype", "fp8_e4m3", env=env)
    assert result.returncode == 0, result.stderr

    ray_part, train = split_submit(result.command())
    assert ray_option(ray_part, "--address") == "http://10.0.0.1:8265"
    env_vars = json.loads(ray_option(ray_part, "--runtime-env-json"))["env_vars"]
    assert env_vars["TENSORBOARD_DIR"] == "/tb"
    assert env_vars["RECIPE_RM_WORKERS"] == "4"
    assert env_vars["NCCL_NVLS_ENABLE"] == "1"
    values = single_values(options(train))
    assert values["--actor-num-nodes"] == ["2"]
    assert values["--actor-num-gpus-per-node"] == ["8"]
    assert values["--custom-config-path"] == [str(REPO / "configs" / "methods" / "geo_mis.yaml")]
    assert values["--save"] == ["/root/runs/qwen3_30b_a3b_geo_mis"]
    assert values["--use-rollout-routing-replay"] == []
    assert values["--use-wandb"] == [] and values["--wandb-project"] == ["mc"] and values["--wandb-team"] == ["lab"]
    assert values["--wandb-group"] == ["qwen3_30b_a3b_geo_mis"]
    assert values["--use-tensorboard"] == []
    assert values["--num-rollout"] == ["7"]
    assert values["--lr"] == ["2e-6"]
    for flag in ("--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer",
                 "--eval-config", "--eval-interval"):
        assert flag not in values, flag
    assert train[-2:] == ["--sglang-kv-cache-dtype", "fp8_e4m3"]  # arguments after -- come last, so they win


def test_nvls_auto_follows_nvlink(sandbox: Sandbox, monkeypatch) -> None:
    """A launch decides NCCL_NVLS_ENABLE=auto from `nvidia-smi topo -m`; a dry run shows auto and runs no GPU tool
    (tests/bad_input/test_bad_input_launch.py)."""
    from mismatch_ctrl.launch.command import nvls_enable

    monkeypatch.setenv("PATH", str(sandbox.bin))
    nvls = []
    for nvlink in (True, False):
        sandbox.add_nvidia_smi(nvlink=nvlink)
        nvls.append(nvls_enable("auto"))
    assert nvls == ["1", "0"]
    ray_part, _ = split_submit(sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run").command())
    assert json.loads(ray_option(ray_part, "--runtime-env-json"))["env_vars"]["NCCL_NVLS_ENABLE"] == "auto"


def test_dry_run_on_a_laptop_warns_about_every_missing_path(sandbox: Sandbox) -> None:
    missing = sandbox.root / "nowhere"
    env = {"SLIME_DIR": f"{missing}/slime", "MEGATRON_DIR": f"{missing}/Megatron-LM", "FP8_HF_DIR": f"{missing}/fp8",
           "TORCH_DIST_DIR": f"{missing}/td", "DATA_DIR": f"{missing}/data"}
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    for name in ("SLIME_DIR", "MEGATRON_DIR", "FP8_HF_DIR", "TORCH_DIST_DIR", "PROMPT_DATA", "aime24.jsonl",
                 "olympiadbench.jsonl"):
        assert any(name in line for line in warnings), name
    assert result.command()[:3] == ["ray", "job", "submit"]
    assert not sandbox.calls("ray")


def test_dry_run_refuses_an_fp8_dir_whose_shape_differs_unless_allowed(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster(fp8_quantized=False)
    config = Path(cluster["FP8_HF_DIR"]) / "config.json"
    config.write_text(config.read_text().replace('"num_hidden_layers": 48', '"num_hidden_layers": 36'))
    refused = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=cluster)
    assert refused.returncode == 2 and refused.stdout == ""
    assert any("configuration error" in line and "num_hidden_layers 36, MODEL_ARGS_FILE says 48" in line
               and "ALLOW_MODEL_SHAPE_MISMATCH=1" in line for line in refused.stderr.splitlines()), refused.stderr
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={**cluster, "ALLOW_MODEL_SHAPE_MISMATCH": "1"})
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert any("FP8_HF_DIR" in line and "no quantization_config" in line and "[128, 128]" in line
               for line in warnings), result.stderr
    assert "MODEL_ARGS_FILE says 48" not in result.stderr


@pytest.mark.parametrize("launcher, checkpoint, kind, fits", [
    ("qwen3_30b_dcgrpo.sh", "qwen3_8b", "dense", "MODEL=qwen3_8b (launch/qwen3_8b_dcgrpo.sh)"),
    ("qwen3_8b_dcgrpo.sh", "qwen3_30b_a3b", "MoE", "MODEL=qwen3_30b_a3b (launch/qwen3_30b_dcgrpo.sh)")])
def test_a_checkpoint_of_the_other_kind_is_refused_with_the_launcher_to_use(sandbox: Sandbox, launcher, checkpoint,
                                                                            kind, fits) -> None:
    cluster = sandbox.make_cluster()
    (Path(cluster["FP8_HF_DIR"]) / "config.json").write_text(json.dumps(
        {**HF_CONFIGS[checkpoint], "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}))
    for allow in ("0", "1"):  # the override covers differing numbers, never the other kind of model
        result = sandbox.run(launcher, "--dry-run", env={**cluster, "ALLOW_MODEL_SHAPE_MISMATCH": allow})
        assert result.returncode == 2 and result.stdout == "", result.stderr
        errors = [line for line in result.stderr.splitlines() if "configuration error" in line]
        assert len(errors) == 1 and f"the checkpoint is {kind}" in errors[0] and fits in errors[0], result.stderr
        assert "ROLLOUT_EP" not in result.stderr  # no advice that would make the wrong checkpoint pass


@pytest.mark.parametrize("name, value", [("LR", "abc"), ("ROLLOUT_TEMPERATURE", "hot"), ("EPS_CLIP", "foo"),
                                         ("EPS_CLIP_HIGH", "-0.1"), ("LR", "nan"), ("ROLLOUT_TEMPERATURE", "0")])
def test_numeric_settings_are_validated_before_any_command(sandbox: Sandbox, name, value) -> None:
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={name: value})
    assert result.returncode == 2 and result.stdout == ""
    assert f"configuration error: {name}={value} must be a finite number > 0" in result.stderr


@pytest.mark.parametrize("extra, variable", [(["--lr", "1e-5"], "LR"), (["--rollout-temperature=0.7"],
                                                                       "ROLLOUT_TEMPERATURE"),
                                             (["--num-rollout", "9"], "NUM_ROLLOUT")])
def test_arguments_after_the_separator_may_not_repeat_the_launchers_flags(sandbox: Sandbox, extra, variable) -> None:
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", "--", *extra)
    assert result.returncode == 2 and result.stdout == ""
    flag = extra[0].partition("=")[0]
    assert f"{flag} after -- duplicates a flag the launcher passes to train.py: set {variable} instead" in result.stderr
    ok = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", "--", "--seed", "7")
    assert ok.returncode == 0 and ok.command()[-2:] == ["--seed", "7"]


def test_dry_run_warns_about_a_wrong_block_size(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster()
    config = Path(cluster["FP8_HF_DIR"]) / "config.json"
    config.write_text(config.read_text().replace("[128, 128]", "[64, 64]"))
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=cluster)
    assert result.returncode == 0, result.stderr
    assert "weight_block_size [64, 64]; expected fp8 and [128, 128]" in result.stderr


def cluster_with_tracker(sandbox: Sandbox, content: bytes | None) -> tuple[dict[str, str], Path]:
    """A prepared cluster whose LOAD_DIR holds ``latest_checkpointed_iteration.txt`` with ``content`` (a directory of
    that name for None); and the tracker's path."""
    cluster = sandbox.make_cluster()
    tracker = sandbox.root / "cluster" / "runs" / "run" / "latest_checkpointed_iteration.txt"
    tracker.parent.mkdir(parents=True)
    tracker.mkdir() if content is None else tracker.write_bytes(content)
    return cluster, tracker


@pytest.mark.parametrize("content, shown", [
    (b"39", "resume: LOAD_DIR={load} holds iteration 39"),
    (b"release\n", "LOAD_DIR={load} holds a release checkpoint: slime loads it, the controllers start afresh"),
])
def test_resume_is_reported(sandbox: Sandbox, content, shown) -> None:
    cluster, tracker = cluster_with_tracker(sandbox, content)
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=cluster)
    assert result.returncode == 0, result.stderr
    assert shown.format(load=tracker.parent) in result.stderr


@pytest.mark.parametrize("content, shown", [
    (b"abc\n", "holds 'abc', not a checkpoint iteration"),
    (b"", "holds '', not a checkpoint iteration"),
    (b"\xff\xfe", "not a checkpoint iteration"),  # not UTF-8: was a UnicodeDecodeError
    (None, "not a regular file"),  # a directory of that name
])
def test_a_tracker_the_hooks_would_refuse_is_named_before_the_job_starts(sandbox: Sandbox, content, shown) -> None:
    cluster, tracker = cluster_with_tracker(sandbox, content)
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=cluster)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert f"warning (an error at launch): LOAD_DIR={tracker.parent} (train.py's --load): {tracker}: " in \
        result.stderr
    assert shown in result.stderr
    assert "resume: LOAD_DIR" not in result.stderr and "fresh start: LOAD_DIR" not in result.stderr
    result = sandbox.run("qwen3_30b_dcgrpo.sh", env=cluster)
    assert result.returncode == 1 and shown in result.stderr and "nothing was submitted" in result.stderr


def test_30b_dcgrpo_command_on_a_prepared_cluster(slow_runs) -> None:
    _, result, cluster = slow_runs.get("real_check_30b")
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr
    # The real check-config validated the method YAML for a MoE model (128 experts from the recipe's model args).
    assert "architecture moe" in result.stderr

    argv = result.command()
    assert argv[:3] == ["ray", "job", "submit"]
    ray_part, train = split_submit(argv)
    assert ray_option(ray_part, "--address") == "http://127.0.0.1:8265"
    assert argv[argv.index("--") + 2] == f"{cluster['SLIME_DIR']}/train.py"
    env_vars = json.loads(ray_option(ray_part, "--runtime-env-json"))["env_vars"]
    assert env_vars["PYTHONPATH"].split(":") == [cluster["MEGATRON_DIR"], cluster["SLIME_DIR"], str(REPO)]
    assert env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert env_vars["DATA_DIR"] == cluster["DATA_DIR"]  # eval.yaml resolves ${oc.env:DATA_DIR} in the driver
    assert env_vars["NCCL_NVLS_ENABLE"] == "auto"  # decided by a launch, not by a dry run

    values = single_values(options(train))
    for flag, expected in EXPECTED_30B.items():
        assert values.get(flag) == expected, (flag, values.get(flag))
    for flag in ABSENT_BY_DEFAULT:
        assert flag not in values, flag
    # SGLang serves the FP8 Hugging Face checkpoint; Megatron trains from the BF16 torch_dist one.
    assert values["--hf-checkpoint"] == [cluster["FP8_HF_DIR"]]
    assert values["--ref-load"] == [cluster["TORCH_DIST_DIR"]]
    assert values["--load"] == values["--save"] == [cluster["SAVE_DIR"]]
    assert int(values["--save-interval"][0]) > 0
    assert cluster["MODEL_DIR"] not in train
    assert values["--prompt-data"] == [f"{cluster['DATA_DIR']}/dapo-math-17k.jsonl"]
    assert values["--custom-config-path"] == [str(REPO / "configs" / "methods" / "dcgrpo.yaml")]
    steps, remainder = divmod(64 * 8, int(values["--global-batch-size"][0]))
    assert (steps, remainder) == (4, 0)
    assert contains_run(train, model_args("qwen3_30b_a3b"))


def test_engine_rules_read_the_fp8_checkpoint(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster()
    config = Path(cluster["FP8_HF_DIR"]) / "config.json"
    ok = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=cluster)
    assert ok.returncode == 0, ok.stderr
    assert f"engine layout checked on the model shape FP8_HF_DIR={cluster['FP8_HF_DIR']}/config.json" in ok.stderr
    # A checkpoint whose experts are 704 wide (5.5 blocks): no EP of a 4-GPU engine loads it, whatever the profile says.
    config.write_text(config.read_text().replace('"moe_intermediate_size": 768', '"moe_intermediate_size": 704'))
    bad = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={**cluster, "ALLOW_MODEL_SHAPE_MISMATCH": "1"})
    assert bad.returncode == 2 and bad.stdout == ""
    assert any("moe_intermediate_size 704 is split over moe_tp = 4 / 4 = 1 into shards of 704" in line
               and "no ROLLOUT_EP works with this engine size" in line
               and f"[model shape: FP8_HF_DIR={config}]" in line for line in bad.stderr.splitlines()), bad.stderr


def test_an_fp8_config_that_is_not_an_object_falls_back_to_the_profile(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster()
    (Path(cluster["FP8_HF_DIR"]) / "config.json").write_text("[1, 2, 3]")
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env=cluster)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert any("warning" in line and "FP8_HF_DIR" in line and "config.json is a JSON list" in line
               for line in result.stderr.splitlines()), result.stderr
    assert "engine layout checked on the model shape recorded in profile qwen3_30b_a3b" in result.stderr


def test_dry_run_prints_the_memory_estimate(sandbox: Sandbox) -> None:
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "memory per training GPU ~59.8 GB of 80.0" in result.stderr  # tests/launch/test_launch_core.py by hand
    assert "host RAM per node ~558.8 GB: slime's pinned copy of the actor weights 70.3 + CPU Adam 488.5" in \
        result.stderr
    assert "exceeds GPU_MEMORY_GB" not in result.stderr
    on_gpu = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={"OPTIMIZER_CPU_OFFLOAD": "0"})
    assert on_gpu.returncode == 0  # an estimate warns, it does not refuse
    assert "warning: the estimated training memory ~105.6 GB per GPU exceeds GPU_MEMORY_GB = 80" in on_gpu.stderr


def test_the_fp8_aligned_baseline_changes_only_the_training_precision(sandbox: Sandbox) -> None:
    runs = {script: sandbox.run(script, "--dry-run") for script in ("qwen3_30b_token_tis.sh",
                                                                    "qwen3_30b_fp8_aligned.sh")}
    args = {}
    for script, result in runs.items():
        assert result.returncode == 0, result.stderr
        args[script] = split_submit(result.command())[1]
    aligned, token_tis = args["qwen3_30b_fp8_aligned.sh"], args["qwen3_30b_token_tis.sh"]
    assert contains_run(aligned, FP8_TRAINING)
    # Beyond the FP8 flags, only the run's own checkpoint directory differs: same data, eval, layout, correction.
    assert [w for w in aligned if w not in FP8_TRAINING] == [
        w.replace("qwen3_30b_a3b_token_tis", "qwen3_30b_a3b_token_tis_fp8train") for w in token_tis]
    assert "FP8 blockwise e4m3 (Transformer Engine) compute" in runs["qwen3_30b_fp8_aligned.sh"].stderr


def test_dry_run_estimates_what_evaluation_costs(sandbox: Sandbox) -> None:
    light = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run")
    assert light.returncode == 0, light.stderr
    # eval_light.yaml: (30 + 30 + 40) x 8 + 500 + 272 + 675 = 2,247 responses of up to 8,192 tokens; 500 // 50 + 1
    # evaluations; training 500 x 64 x 8 x 8,192 tokens at most.
    evaluation, training = 2247 * 8192 * 11, 500 * 64 * 8 * 8192
    share = round(100 * evaluation / (evaluation + training))
    assert (f"evaluation (EVAL_PROTOCOL=light): 2,247 responses of up to 8,192 tokens per evaluation, 11 evaluations: "
            f"at most {evaluation / 1e9:.2f}B tokens, {share}% of the run's generated tokens") in light.stderr
    assert "evaluation would generate" not in light.stderr and share <= 10
    full = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={"EVAL_PROTOCOL": "full"})
    assert full.returncode == 0
    assert "8,988 responses of up to 32,768 tokens per evaluation, 26 evaluations" in full.stderr
    assert "warning: evaluation would generate 79% of the run's tokens" in full.stderr
    train = options(split_submit(full.command())[1])
    assert train["--eval-config"] == [[str(REPO / "recipes" / "qwen3_30b_a3b" / "eval.yaml")]]
    assert train["--eval-interval"] == [["20"]]
    bad = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={"EVAL_PROTOCOL": "paper"})
    assert bad.returncode == 2 and "EVAL_PROTOCOL=paper must be light or full" in bad.stderr
