"""Configuration errors (exit 2, a message naming the variable, no command) and --help."""

from __future__ import annotations

import subprocess
import sys

import pytest

from launch_harness import LAUNCHERS, REPO, Sandbox

# (launcher, environment, fragments the error must contain)
LAYOUT_ERRORS = {
    "ep8_on_6_gpus": ("qwen3_30b_dcgrpo.sh", {"GPUS_PER_NODE": "6"},
                      ["EP x ETP x PP = 8 x 1 x 1 = 8 must divide", "= 6", "GPUS_PER_NODE"]),
    "rollout_engine_on_6_gpus": ("qwen3_30b_dcgrpo.sh", {"GPUS_PER_NODE": "6"},
                                 ["ROLLOUT_GPUS_PER_ENGINE = 4 must divide"]),
    "partial_optimizer_step": ("qwen3_30b_grpo.sh", {"ROLLOUT_BATCH_SIZE": "60"},
                               ["60 x 8 = 480 must be a multiple of GLOBAL_BATCH_SIZE = 128"]),
    "tp_not_dividing_heads": ("qwen3_30b_dcgrpo.sh", {"TP": "3", "GPUS_PER_NODE": "6", "EP": "2"},
                              ["TP = 3 must divide the attention heads of the model = 32"]),
    # The issue's engine layouts: SGLang's FP8 MoE weight creation refuses them at load (see layout.py).
    "engine_tp4_without_ep": ("qwen3_30b_dcgrpo.sh", {"ROLLOUT_EP": "1"},
                              ["ROLLOUT_GPUS_PER_ENGINE = 4", "ROLLOUT_EP = 1", "moe_intermediate_size 768",
                               "moe_tp = 4 / 1 = 4", "shards of 192", "FP8 weight block 128",
                               "set ROLLOUT_EP to 2 or 4"]),
    "engine_tp8_without_ep": ("qwen3_30b_token_tis.sh", {"ROLLOUT_GPUS_PER_ENGINE": "8", "ROLLOUT_EP": "1"},
                              ["moe_tp = 8 / 1 = 8", "shards of 96", "set ROLLOUT_EP to 4 or 8"]),
    "engine_ep_not_dividing_experts": ("qwen3_30b_dcgrpo.sh", {"ROLLOUT_GPUS_PER_ENGINE": "6", "ROLLOUT_EP": "3",
                                                               "GPUS_PER_NODE": "6", "EP": "2"},
                                       ["num_experts 128 is not divisible by ROLLOUT_EP = 3"]),
    "engine_ep_not_dividing_engine": ("qwen3_30b_dcgrpo.sh", {"ROLLOUT_EP": "8"},
                                      ["ROLLOUT_EP = 8 must divide the engine TP = ROLLOUT_GPUS_PER_ENGINE = 4"]),
    "engine_ep_on_dense": ("qwen3_8b_dcgrpo.sh", {"ROLLOUT_EP": "2"}, ["ROLLOUT_EP = 2 needs a MoE model"]),
    "trainer_ep_not_dividing_gpus": ("qwen3_30b_dcgrpo.sh", {"EP": "16"},
                                     ["EP x ETP x PP = 16 x 1 x 1 = 16 must divide the GPUs", "= 8"]),
    "precision_unknown": ("qwen3_30b_fp8_aligned.sh", {"TRAIN_PRECISION": "fp4"},
                          ["TRAIN_PRECISION=fp4 must be one of bf16, fp8, fp16"]),
    "ep_does_not_divide_experts": ("qwen3_30b_dcgrpo.sh", {"EP": "3", "GPUS_PER_NODE": "6", "NUM_NODES": "2"},
                                   ["EP = 3 must divide the experts", "= 128"]),
    "global_batch_not_split_over_dp": ("qwen3_30b_dcgrpo.sh", {"NUM_NODES": "3"},
                                       ["data-parallel size (GPUs / (TP x PP x CP)) = 12 must divide",
                                        "GLOBAL_BATCH_SIZE = 128"]),
    "expert_parallel_on_dense": ("qwen3_8b_dcgrpo.sh", {"EP": "2"}, ["is dense", "EP and ETP must be 1"]),
    "routing_replay_on_dense": ("qwen3_8b_dcgrpo.sh", {"ROUTING_REPLAY": "1"}, ["ROUTING_REPLAY=1 needs a MoE"]),
    "unknown_model": ("qwen3_30b_dcgrpo.sh", {"MODEL": "qwen3_14b"}, ["MODEL=qwen3_14b is unknown", "qwen3_8b"]),
    "not_a_number": ("qwen3_30b_dcgrpo.sh", {"NUM_NODES": "two"}, ["NUM_NODES=two must be a positive integer"]),
    "zero_gpus": ("qwen3_30b_dcgrpo.sh", {"GPUS_PER_NODE": "0"}, ["GPUS_PER_NODE=0 must be a positive integer"]),
    # TP and EVAL_INTERVAL set train.py flags: a traceback from the duplicate-flag check before
    "tp_not_a_number": ("qwen3_30b_dcgrpo.sh", {"TP": "abc"}, ["TP=abc must be a positive integer"]),
    "eval_interval_not_integer": ("qwen3_30b_dcgrpo.sh", {"EVAL_INTERVAL": "1.5"},
                                  ["EVAL_INTERVAL=1.5 must be 0 (off) or a positive integer"]),
    "eval_interval_leading_zero": ("qwen3_30b_dcgrpo.sh", {"EVAL_INTERVAL": "08"},  # refused as PP=08 is
                                   ["EVAL_INTERVAL=08 must be 0 (off) or a positive integer"]),
    "pp_leading_zero": ("qwen3_30b_dcgrpo.sh", {"PP": "08"}, ["PP=08 must be a positive integer"]),
    "flag_not_boolean": ("qwen3_30b_dcgrpo.sh", {"ROUTING_REPLAY": "yes"}, ["ROUTING_REPLAY=yes must be 0 or 1"]),
    "unknown_method": ("qwen3_30b_dcgrpo.sh", {"METHOD": "dcgrpoo"},
                       ["dcgrpoo.yaml does not exist", "dcgrpo_length_decay", "geo_mis"]),
    "pass_env_unset": ("qwen3_30b_dcgrpo.sh", {"PASS_ENV": "NOT_SET_ANYWHERE"}, ["PASS_ENV names NOT_SET_ANYWHERE"]),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_ERRORS))
def test_configuration_errors_stop_before_any_command(sandbox: Sandbox, case: str) -> None:
    script, env, fragments = LAYOUT_ERRORS[case]
    result = sandbox.run(script, "--dry-run", env=env)
    assert result.returncode == 2, (result.returncode, result.stderr)
    errors = [line for line in result.stderr.splitlines() if "configuration error" in line or ": error: " in line]
    assert any(all(fragment in line for fragment in fragments) for line in errors), result.stderr
    assert result.stdout == ""


def test_the_layout_issue_example_is_a_valid_two_node_layout(sandbox: Sandbox) -> None:
    """The counterpart of the errors above: 2 nodes x 8 GPUs with EP8, TP2 and 4-GPU engines is fine."""
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={"NUM_NODES": "2"})
    assert result.returncode == 0, result.stderr
    assert "trainer TP2 x PP1 x CP1 -> DP8; 4 SGLang engines x 4 GPUs (TP4, EP4: moe_tp 1)" in result.stderr


def test_unknown_option_is_a_usage_error(sandbox: Sandbox) -> None:
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dryrun")
    assert result.returncode == 2
    assert "unknown option '--dryrun'" in result.stderr


@pytest.mark.parametrize("script", ["qwen3_30b_dcgrpo.sh", "qwen3_8b_dcgrpo.sh"])
def test_help_lists_every_variable_with_its_default(sandbox: Sandbox, script: str) -> None:
    method, model, run = LAUNCHERS[script]
    hf_name = {"qwen3_30b_a3b": "Qwen3-30B-A3B", "qwen3_8b": "Qwen3-8B"}[model]
    result = sandbox.run(script, "--help", env={"NUM_NODES": "4"})
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for default in (f"METHOD={method}", f"MODEL={model}", f"MODEL_DIR=/root/{hf_name}",
                    f"FP8_HF_DIR=/root/{hf_name}-FP8", f"TORCH_DIST_DIR=/root/{hf_name}_torch_dist",
                    f"SAVE_DIR=/root/runs/{run}", "DATA_DIR=/root/data", "SLIME_DIR=/root/slime",
                    "MEGATRON_DIR=/root/Megatron-LM", "NUM_NODES=1", "GPUS_PER_NODE=8",
                    "RAY_ADDRESS=http://127.0.0.1:8265", "NUM_ROLLOUT=", "ROUTING_REPLAY=0", "METHOD_CONFIG=",
                    "EVAL_CONFIG=", "PYTHON=", "TP=2", "ROLLOUT_GPUS_PER_ENGINE=", "GLOBAL_BATCH_SIZE=128",
                    "WANDB_PROJECT=", "TENSORBOARD_DIR=", "PASS_ENV=", "DATA_ARGS=", "TRAIN_PRECISION=bf16",
                    f"RUN_NAME={run}", f"ROLLOUT_EP={4 if model == 'qwen3_30b_a3b' else 1}", "GPU_MEMORY_GB=80"):
        assert f"    {default}" in text, default
    assert "[now: 4]" in text  # the NUM_NODES override is shown
    assert "calibrate eps with and without it" in text  # R3 removes the routing part of the mismatch
    for mode in ("--dry-run", "--prepare"):
        assert mode in text


def test_a_broken_method_yaml_is_rejected_by_check_config(slow_runs) -> None:
    _, result, env = slow_runs.get("broken_method_yaml")
    assert result.returncode == 2, result.stderr
    assert f"METHOD_CONFIG={env['METHOD_CONFIG']} is invalid" in result.stderr
    assert "bogus_setting" in result.stderr  # check-config names the key
    assert result.stdout == ""


def test_the_dry_run_refuses_a_method_the_hook_init_would_refuse_for_the_run(slow_runs) -> None:
    """issue 23 item 6: one rule (config.inert_settings) in check-config, the dry run and on_megatron_init."""
    _, result, env = slow_runs.get("inert_method_for_the_run")
    assert result.returncode == 2, result.stderr
    assert f"METHOD_CONFIG={env['METHOD_CONFIG']} is invalid" in result.stderr
    assert "calibration_rollouts = 10 without a reference, but --num-rollout is 5" in result.stderr


def test_the_dry_run_refuses_a_method_block_beside_mismatch_ctrl(slow_runs) -> None:
    """The rule check-config and on_megatron_init apply (config.refuse_misplaced), before a cluster starts."""
    _, result, env = slow_runs.get("misplaced_method_block")
    assert result.returncode == 2, result.stderr
    assert f"METHOD_CONFIG={env['METHOD_CONFIG']} is invalid" in result.stderr
    assert "dcgrpo: mismatch_ctrl's own key at the top level" in result.stderr and "indent it under" in result.stderr


@pytest.mark.parametrize("module", ["mismatch_ctrl.launch", "mismatch_ctrl.launch.imports"])
def test_the_core_commands_have_help(module: str) -> None:
    done = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m " + module), done.stderr


def test_the_core_without_a_method_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "mismatch_ctrl.launch", "--default", "MODEL=qwen3_8b", "--",
                           "--dry-run"], cwd=REPO, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 2
    assert "METHOD is not set" in done.stderr


def test_a_python_without_torch_defers_the_method_check(sandbox: Sandbox) -> None:
    """A laptop's python3 + PyYAML: --dry-run works and says the method YAML was not validated; a launch refuses."""
    no_torch = sandbox.root / "python-no-torch"
    no_torch.write_text(f"""#!/bin/bash
if [ "$1" = -m ] && [ "$2" = mismatch_ctrl ]; then
  echo "ModuleNotFoundError: No module named 'torch'" >&2
  exit 1
fi
exec {sys.executable} "$@"
""")
    no_torch.chmod(0o755)
    dry = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={"PYTHON": str(no_torch)})
    assert dry.returncode == 0, dry.stderr
    assert "warning (an error at launch): METHOD_CONFIG=" in dry.stderr and "has no torch" in dry.stderr
    launch = sandbox.run("qwen3_30b_dcgrpo.sh", env={"PYTHON": str(no_torch)})
    assert launch.returncode == 2 and "configuration error: METHOD_CONFIG=" in launch.stderr


def test_a_num_rollout_that_is_no_integer_is_named_once_not_as_a_broken_method(sandbox: Sandbox) -> None:
    """The method is checked without the run length, not given a value check-config would refuse as a usage error
    ('METHOD_CONFIG=... is invalid: usage: ...')."""
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", env={"NUM_ROLLOUT": "abc"})
    assert result.returncode == 2
    assert "NUM_ROLLOUT=abc must be a positive integer" in result.stderr
    assert "METHOD_CONFIG" not in result.stderr
    assert all("--num-rollout" not in call for call in sandbox.check_config_calls())
