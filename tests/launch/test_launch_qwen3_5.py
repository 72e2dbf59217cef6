"""The third profile, Qwen3.5-35B-A3B (``qwen3_5_35b_a3b``): a multimodal checkpoint read through its
``text_config``, a shared expert the engine rules and the memory estimate count, and its layouts judged by the same
engine rules as the other profiles (expert shards against FP8 blocks, EP against the experts, heads against TP,
context lengths)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from launch_harness import FP8_QUANTIZATION, HF_CONFIGS, Sandbox, split_submit

from mismatch_ctrl.launch.layout import Layout, engine_problems
from mismatch_ctrl.launch.memory import parameter_counts
from mismatch_ctrl.launch.model_shape import ModelShape
from mismatch_ctrl.launch.profiles import PROFILES

SHAPE = PROFILES["qwen3_5_35b_a3b"].shape
SCRIPT = "qwen3_5_35b_dcgrpo.sh"


def test_the_checkpoints_text_config_gives_the_profiles_shape():
    config = {**HF_CONFIGS["qwen3_5_35b_a3b"], "quantization_config": dict(FP8_QUANTIZATION)}
    shape = ModelShape.from_hf_config(config, "config.json")
    assert shape == SHAPE
    assert (shape.context_length, shape.shared_expert_intermediate_size, shape.weight_block_size) == (
        262144, 512, (128, 128))


def loadable(tp: int, ep: int) -> bool:
    """Independently: an engine of TP ``tp`` and EP ``ep`` loads the FP8 checkpoint when each rule holds."""
    moe_tp = tp // ep if tp % ep == 0 else 0
    return (moe_tp > 0 and 16 % tp == 0 and (2 % tp == 0 or tp % 2 == 0) and 256 % ep == 0
            and (512 // moe_tp) % 128 == 0 and 512 % tp == 0 and (512 // tp) % 128 == 0
            and (16 // tp * 256) % 128 == 0 and (max(1, 2 // tp) * 256) % 128 == 0)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("ep", [1, 2, 4, 8])
def test_engine_layouts_are_judged_as_an_independent_reading_of_the_rules(tp, ep):
    layout = Layout(tp=2, ep=8, rollout_gpus_per_engine=tp, rollout_ep=ep)
    assert (engine_problems(layout, SHAPE, "profile") == []) == loadable(tp, ep)


@pytest.mark.parametrize("env, messages", [
    ({"ROLLOUT_GPUS_PER_ENGINE": "8", "ROLLOUT_EP": "1"},
     ["each expert's moe_intermediate_size 512 is split over moe_tp = 8 / 1 = 8 into shards of 64, not a multiple of "
      "the FP8 weight block 128", "set ROLLOUT_EP to 2 or 4 or 8",
      "the shared expert's shared_expert_intermediate_size 512 over the engine TP = 8 gives shards of 64, not a "
      "multiple of the FP8 weight block 128", "set ROLLOUT_GPUS_PER_ENGINE to one of 1, 2, 4"]),
    ({"ROLLOUT_GPUS_PER_ENGINE": "8", "ROLLOUT_EP": "8"}, ["shared_expert_intermediate_size 512 over the engine TP"]),
    ({"EP": "3"}, ["EP x ETP x PP = 3 x 1 x 1 = 3 must divide the GPUs", "EP = 3 must divide the experts of the model "
                                                           "(--num-experts) = 256"]),
    ({"TP": "3"}, ["TP = 3 must divide the attention heads of the model = 16"]),
    ({"MAX_RESPONSE_LEN": "262144", "EVAL_INTERVAL": "0"}, ["262144"]),
])
def test_a_layout_the_engines_refuse_is_refused_with_the_numbers(sandbox: Sandbox, env, messages):
    result = sandbox.run(SCRIPT, "--dry-run", env=env)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    for message in messages:
        assert message in result.stderr, result.stderr


def test_the_dry_run_on_the_checkpoint_passes_and_its_longer_context_is_used(sandbox: Sandbox):
    env = {**sandbox.make_cluster("qwen3_5_35b_a3b"), "MAX_RESPONSE_LEN": "65536"}  # past Qwen3's 40960
    result = sandbox.run(SCRIPT, "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    assert f"engine layout checked on the model shape FP8_HF_DIR={env['FP8_HF_DIR']}/config.json" in result.stderr
    _, train = split_submit(result.command())
    assert train[train.index("--spec"):train.index("--spec") + 3] == [
        "--spec", "slime_plugins.models.qwen3_5", "get_qwen3_5_spec"]
    assert train[train.index("--sglang-ep-size") + 1] == "4"
    assert train[train.index("--moe-shared-expert-intermediate-size") + 1] == "512"


def test_a_checkpoint_whose_shared_expert_differs_from_the_model_args_is_refused(sandbox: Sandbox):
    env = sandbox.make_cluster("qwen3_5_35b_a3b")
    config_path = f"{env['FP8_HF_DIR']}/config.json"
    config = json.loads(open(config_path).read())
    config["text_config"]["shared_expert_intermediate_size"] = 1024
    open(config_path, "w").write(json.dumps(config))
    result = sandbox.run(SCRIPT, "--dry-run", env=env)
    assert result.returncode == 2
    assert "shared_expert_intermediate_size 1024, MODEL_ARGS_FILE says 512 (--moe-shared-expert-intermediate-size)" \
        in result.stderr


def test_the_shared_expert_is_counted_once_per_moe_layer():
    without = parameter_counts(replace(SHAPE, shared_expert_intermediate_size=0))
    counts = parameter_counts(SHAPE)
    assert counts.dense - without.dense == 40 * 3 * 2048 * 512 and counts.expert == 40 * 256 * 3 * 2048 * 512
    assert 33e9 < counts.total < 35e9  # ~35B with the vision tower and the Gated DeltaNet layers, not modelled
