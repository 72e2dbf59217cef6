"""Unit tests of the launcher core (mismatch_ctrl.launch): model shapes, layout rules, memory estimate, settings,
command assembly. The engines' rules are restated here from their sources (see layout.py) as independent arithmetic."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace

import pytest

from launch_harness import HF_CONFIGS, REPO, model_args
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.launch.command import format_command, train_args
from mismatch_ctrl.launch.layout import Layout, engine_problems, trainer_problems, valid_rollout_eps
from mismatch_ctrl.launch.memory import GB, estimate, parameter_counts
from mismatch_ctrl.launch.model_shape import (MegatronModel, ModelShape, inspect_checkpoint, read_model_args,
                                              shape_mismatches)
from mismatch_ctrl.launch.profiles import PROFILES
from mismatch_ctrl.launch.settings import Settings

SHAPE_30B = PROFILES["qwen3_30b_a3b"].shape
SHAPE_8B = PROFILES["qwen3_8b"].shape


def profile_layout(name: str, **changes: int) -> Layout:
    p = PROFILES[name]
    return replace(Layout(tp=p.tp, ep=p.ep, rollout_gpus_per_engine=p.rollout_gpus_per_engine,
                          rollout_ep=p.rollout_ep), **changes)


def megatron(name: str) -> MegatronModel:
    return MegatronModel(tuple(model_args(name)))


# -- model shapes ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PROFILES))
def test_recorded_shapes_are_the_checkpoints_and_agree_with_the_megatron_args(name: str) -> None:
    config = {**HF_CONFIGS[name], "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    assert ModelShape.from_hf_config(config, "config.json") == PROFILES[name].shape
    assert shape_mismatches(PROFILES[name].shape, read_model_args(REPO / "recipes" / name / "model.sh")) == []


def test_dense_layers_of_a_moe_config_follow_qwen3_moe() -> None:
    config = {**HF_CONFIGS["qwen3_30b_a3b"], "num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [1]}
    # Layers 0..7: MoE where (i + 1) % 2 == 0 and i not in mlp_only_layers -> 3, 5, 7 (layer 1 is forced dense).
    assert ModelShape.from_hf_config(config, "c").dense_layers == 5


def test_a_config_without_a_needed_number_names_file_and_key() -> None:
    config = {k: v for k, v in HF_CONFIGS["qwen3_30b_a3b"].items() if k != "moe_intermediate_size"}
    with pytest.raises(ConfigError, match=r"/ckpt/config.json has moe_intermediate_size = None"):
        ModelShape.from_hf_config(config, "/ckpt/config.json")


def test_mismatches_between_checkpoint_and_megatron_args_are_named() -> None:
    shape = replace(SHAPE_30B, num_hidden_layers=36, moe_intermediate_size=1536)
    assert shape_mismatches(shape, megatron("qwen3_30b_a3b")) == [
        "num_hidden_layers 36, MODEL_ARGS_FILE says 48 (--num-layers)",
        "moe_intermediate_size 1536, MODEL_ARGS_FILE says 768 (--moe-ffn-hidden-size)"]


def test_inspect_checkpoint_reports_a_json_list_without_a_traceback(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps([1, 2]))
    report = inspect_checkpoint(tmp_path, "fp8", "FP8_HF_DIR", megatron("qwen3_30b_a3b"))
    assert report.shape is None
    assert len(report.problems) == 1 and "FP8_HF_DIR" in report.problems[0]
    assert f"{tmp_path}/config.json is a JSON list" in report.problems[0]


def test_model_args_with_a_non_integer_are_a_config_error(tmp_path) -> None:
    path = tmp_path / "model.sh"
    path.write_text("MODEL_ARGS=(--num-layers 48 --num-experts many)\n")
    with pytest.raises(ConfigError, match="--num-experts 'many', not a non-negative integer"):
        read_model_args(path)
    path.write_text("OTHER=(1)\n")
    with pytest.raises(ConfigError, match="does not define a MODEL_ARGS array"):
        read_model_args(path)
    path.write_text("OTHER=(1)\necho hello\n")
    with pytest.raises(ConfigError, match=r"does not define a MODEL_ARGS array \(its last output: hello\)"):
        read_model_args(path)


def test_a_model_args_file_that_bash_cannot_run_is_named_with_bash_s_last_line(tmp_path) -> None:
    path = tmp_path / "model.sh"
    # not UTF-8 before a long error, and the file's own output after it
    path.write_bytes(b"echo \xff\xfe >&2\n" + b"x" * 300 + b"_not_a_command\necho done\n")
    with pytest.raises(ConfigError) as raised:
        read_model_args(path)
    message = str(raised.value)
    assert message.startswith(f"MODEL_ARGS_FILE={path} does not define a MODEL_ARGS array (bash: ")
    assert "line 2: xxx" in message and message.endswith("...)")  # its last line from the start, clipped at the end


# -- layout rules ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PROFILES))
def test_every_profile_layout_is_accepted(name: str) -> None:
    layout = profile_layout(name)
    assert trainer_problems(layout, megatron(name)) == []
    assert engine_problems(layout, PROFILES[name].shape, "profile") == []
    assert engine_problems(replace(layout, num_nodes=2), PROFILES[name].shape, "profile") == []


def expert_shard_loads(tp: int, ep: int, shape: ModelShape) -> bool:
    """SGLang 0.5.15.post1, restated: moe_tp = tp // ep; FusedMoE asserts E % ep and I_e % moe_tp; Fp8MoEMethod
    needs (I_e / moe_tp) % block_n == 0 and, when tp > 1, % block_k == 0 (both 128 here)."""
    if tp % ep or shape.num_experts % ep or shape.moe_intermediate_size % (tp // ep):
        return False
    return (shape.moe_intermediate_size // (tp // ep)) % 128 == 0


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_valid_rollout_eps_match_the_restated_rule(tp: int) -> None:
    expected = [ep for ep in range(1, tp + 1) if expert_shard_loads(tp, ep, SHAPE_30B)]
    assert valid_rollout_eps(tp, SHAPE_30B) == expected
    assert {1: [1], 2: [1, 2], 4: [2, 4], 8: [4, 8]}[tp] == expected  # 768 = 6 x 128


@pytest.mark.parametrize("tp, shard", [(4, 192), (8, 96)])
def test_engines_without_expert_parallelism_are_rejected_with_the_numbers(tp: int, shard: int) -> None:
    layout = profile_layout("qwen3_30b_a3b", rollout_gpus_per_engine=tp, rollout_ep=1)
    [message] = engine_problems(layout, SHAPE_30B, "the test")
    for fragment in (f"ROLLOUT_GPUS_PER_ENGINE = {tp} GPUs with ROLLOUT_EP = 1", f"moe_tp = {tp} / 1 = {tp}",
                     f"shards of {shard}", "FP8 weight block 128", "Fp8MoEMethod.create_weights",
                     "set ROLLOUT_EP to " + " or ".join(map(str, valid_rollout_eps(tp, SHAPE_30B))),
                     "[model shape: the test]"):
        assert fragment in message, (fragment, message)


def test_engine_ep_must_divide_the_experts_and_the_engine() -> None:
    layout = profile_layout("qwen3_30b_a3b", gpus_per_node=6, rollout_gpus_per_engine=6, rollout_ep=3)
    assert any("num_experts 128 is not divisible by ROLLOUT_EP = 3" in line
               for line in engine_problems(layout, SHAPE_30B, "s"))
    layout = profile_layout("qwen3_30b_a3b", rollout_ep=8)
    assert any("ROLLOUT_EP = 8 must divide the engine TP = ROLLOUT_GPUS_PER_ENGINE = 4" in line
               for line in engine_problems(layout, SHAPE_30B, "s"))


def test_a_smaller_block_size_from_the_checkpoint_changes_the_verdict() -> None:
    # block 64: 768 / 4 = 192 = 3 x 64 loads without EP; the rule reads the checkpoint's block, not a constant.
    layout = profile_layout("qwen3_30b_a3b", rollout_ep=1)
    assert engine_problems(layout, replace(SHAPE_30B, weight_block_size=(64, 64)), "s") == []
    assert engine_problems(layout, replace(SHAPE_30B, weight_block_size=None), "s") == []  # BF16 engines: no rule


def test_dense_mlp_and_attention_shards_follow_the_fp8_linear_rule() -> None:
    llama_like = replace(SHAPE_8B, intermediate_size=11008)  # 11008 / 4 = 2752 = 21.5 x 128
    lines = engine_problems(Layout(tp=2, rollout_gpus_per_engine=4), llama_like, "s")
    assert any("intermediate_size 11008 over the engine TP = 4 gives shards of 2752" in line
               and "set ROLLOUT_GPUS_PER_ENGINE to one of 1, 2" in line for line in lines), lines
    small_heads = replace(SHAPE_8B, head_dim=64, num_key_value_heads=4)  # k/v shard at TP8: one head = 64 columns
    lines = engine_problems(Layout(tp=2, rollout_gpus_per_engine=8), small_heads, "s")
    assert any("the k/v shard of an engine of TP 8 is 64 columns" in line for line in lines), lines


def test_engine_heads_and_placement() -> None:
    lines = engine_problems(Layout(gpus_per_node=6, rollout_gpus_per_engine=6, rollout_ep=2), SHAPE_30B, "s")
    assert any("attention heads 32 are not divisible by the engine TP = ROLLOUT_GPUS_PER_ENGINE = 6" in line
               for line in lines)
    assert any("KV heads 4 are neither a multiple nor a divisor of the engine TP = 6" in line for line in lines)
    lines = engine_problems(Layout(gpus_per_node=6, rollout_gpus_per_engine=4, rollout_ep=4), SHAPE_30B, "s")
    assert any("ROLLOUT_GPUS_PER_ENGINE = 4 must divide GPUS_PER_NODE (engines must not straddle nodes) = 6"
               in line for line in lines)
    # A 16-GPU engine over two whole nodes, EP16: 8 experts per GPU, whole 768-column experts.
    assert engine_problems(Layout(num_nodes=2, rollout_gpus_per_engine=16, rollout_ep=16), SHAPE_30B, "s") == []


def test_trainer_rules_of_megatron() -> None:
    model = megatron("qwen3_30b_a3b")
    assert any(line.startswith("EP x ETP x PP = 16 x 1 x 1 = 16 must divide the GPUs")
               for line in trainer_problems(profile_layout("qwen3_30b_a3b", ep=16), model))
    assert any("EP = 3 must divide the experts of the model (--num-experts) = 128" in line
               for line in trainer_problems(profile_layout("qwen3_30b_a3b", ep=3, num_nodes=3), model))
    # Megatron 1dcf0daf allows query groups that divide TP (KV replication): TP8 with 4 groups is fine.
    assert trainer_problems(profile_layout("qwen3_30b_a3b", tp=8), model) == []
    groups12 = MegatronModel(("--num-attention-heads", "48", "--num-query-groups", "12", "--num-layers", "4"))
    assert any("TP = 8 must be a multiple or a divisor of the query groups of the model = 12" in line
               for line in trainer_problems(Layout(tp=8, global_batch_size=8), groups12))
    assert any("the data-parallel size (GPUs / (TP x PP x CP)) = 12 must divide GLOBAL_BATCH_SIZE = 128" in line
               for line in trainer_problems(profile_layout("qwen3_30b_a3b", num_nodes=3), model))


# -- memory --------------------------------------------------------------------------------------------------------

def test_parameter_counts_by_hand() -> None:
    # Qwen3-30B-A3B, tensor by tensor: q, k, v, o, q_norm, k_norm, two RMSNorms per layer.
    attention = 2048 * 4096 + 2048 * 512 + 2048 * 512 + 4096 * 2048 + 128 + 128 + 2048 + 2048
    router = 2048 * 128
    dense = 151936 * 2048 * 2 + 48 * (attention + router) + 2048
    expert = 48 * 128 * (768 * 2048 + 768 * 2048 + 2048 * 768)
    counts = parameter_counts(SHAPE_30B)
    assert (counts.dense, counts.expert) == (dense, expert)
    assert 30.4e9 < counts.total < 30.6e9  # "30.5B parameters" in Qwen's model card
    # Qwen3-8B: gate, up, down per layer, no experts.
    attention = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 128 + 128 + 4096 + 4096
    assert parameter_counts(SHAPE_8B).dense == 151936 * 4096 * 2 + 36 * (attention + 3 * 4096 * 12288) + 4096
    assert 8.1e9 < parameter_counts(SHAPE_8B).total < 8.3e9  # "8.2B"


def test_memory_estimate_of_the_30b_profile_by_hand() -> None:
    profile = PROFILES["qwen3_30b_a3b"]
    result = estimate(SHAPE_30B, profile_layout("qwen3_30b_a3b"), max_tokens_per_gpu=20480, cpu_offload=True,
                      sglang_mem_fraction=0.7, gpu_memory_gb=80)
    counts = parameter_counts(SHAPE_30B)
    per_gpu = counts.dense / 2 + counts.expert / 8  # TP2 for dense, EP8 for experts
    assert result.weights == pytest.approx(2 * per_gpu)
    assert result.gradients == pytest.approx(4 * per_gpu)
    assert result.optimizer == 0
    # One node holds all 8 shards: CPU Adam 16 B per parameter, plus slime's pinned BF16 copy of each rank's shard.
    assert result.host_adam_per_node == pytest.approx(16 * counts.total)
    assert result.host_pinned_per_node == pytest.approx(2 * per_gpu * 8)
    assert 540 * GB < result.host_per_node < 570 * GB and result.fp8_weight_cache == 0  # "about 550 GB per node"
    assert result.checkpoints == pytest.approx(20480 * 48 * 2048 * 2 / 2)
    routed = 2 * 8 * (2 * 2048 + 3 * 768)  # imbalance 2 x top-8 x (dispatch in/out + fc1 + act)
    assert result.layer == pytest.approx(20480 * 4 * (2048 + 2 * (32 + 4) * 128 / 2 + routed / 2))
    assert result.logits == pytest.approx(20480 * 12 * 151936 / 2)
    assert result.total == pytest.approx(2 * per_gpu + 4 * per_gpu + result.checkpoints + result.layer
                                         + result.logits + 8 * GB)
    assert result.total < 80 * GB and not result.warnings()
    assert profile.optimizer_cpu_offload
    on_gpu = estimate(SHAPE_30B, profile_layout("qwen3_30b_a3b"), max_tokens_per_gpu=20480, cpu_offload=False,
                      sglang_mem_fraction=0.7, gpu_memory_gb=80)
    assert on_gpu.optimizer == pytest.approx(12 * counts.total / 8)
    assert on_gpu.total > 80 * GB and "OPTIMIZER_CPU_OFFLOAD=1" in on_gpu.warnings()[0]
    fp8 = estimate(SHAPE_30B, profile_layout("qwen3_30b_a3b"), max_tokens_per_gpu=20480, cpu_offload=True,
                   sglang_mem_fraction=0.7, gpu_memory_gb=80, fp8_training=True)
    assert fp8.total - result.total == pytest.approx(fp8.fp8_weight_cache) == pytest.approx(2 * per_gpu)
    # SGLang TP4: FP8 bytes for all but the BF16 embeddings and output layer.
    assert result.rollout_weights == pytest.approx((counts.total - counts.embedding + 2 * counts.embedding) / 4)


def test_memory_estimate_of_the_8b_profile_fits() -> None:
    result = estimate(SHAPE_8B, profile_layout("qwen3_8b"), max_tokens_per_gpu=16384, cpu_offload=False,
                      sglang_mem_fraction=0.7, gpu_memory_gb=80)
    assert result.optimizer == pytest.approx(12 * parameter_counts(SHAPE_8B).total / 8)
    per_gpu = parameter_counts(SHAPE_8B).total / 2  # dense, TP2
    assert result.total < 80 * GB and result.host_adam_per_node == 0
    assert result.host_per_node == pytest.approx(2 * per_gpu * 8)  # the pinned copy only


# -- settings and command ------------------------------------------------------------------------------------------

GIVEN = {"METHOD": "dcgrpo", "MODEL": "qwen3_30b_a3b", "REPO_ROOT": str(REPO), "PYTHON": "python3"}


def test_settings_defaults_follow_the_profile_and_earlier_settings() -> None:
    s = Settings({"METHOD": "geo_mis", "DATA_DIR": "/d", "TRAIN_PRECISION": "fp8", "ROLLOUT_EP": ""}, GIVEN)
    assert s["MODEL_DIR"] == "/root/Qwen3-30B-A3B" and s["ROLLOUT_EP"] == "4" and s["TP"] == "2"
    assert s["RUN_NAME"] == "qwen3_30b_a3b_geo_mis_fp8train" == s["WANDB_GROUP"]
    assert s["SAVE_DIR"] == "/root/runs/qwen3_30b_a3b_geo_mis_fp8train" == s["LOAD_DIR"]
    assert s["PROMPT_DATA"] == "/d/dapo-math-17k.jsonl"
    assert s["METHOD_CONFIG"] == f"{REPO}/configs/methods/geo_mis.yaml"
    with pytest.raises(ConfigError, match="MODEL=llama is unknown"):
        Settings({"MODEL": "llama"}, GIVEN)


def test_settings_problems_name_variable_and_value() -> None:
    s = Settings({"TP": "0", "ROUTING_REPLAY": "yes", "SGLANG_MEM_FRACTION": "1.5", "PASS_ENV": "1BAD UNSET_X"}, GIVEN)
    assert s.problems() == [
        "TP=0 must be a positive integer", "ROUTING_REPLAY=yes must be 0 or 1",
        "SGLANG_MEM_FRACTION=1.5 must be a number in (0, 1)", "PASS_ENV holds '1BAD', which is not a variable name",
        "PASS_ENV names UNSET_X, which is not set in this environment"]


def test_train_args_of_the_fp8_aligned_run_and_the_engine_flags() -> None:
    model = megatron("qwen3_30b_a3b")
    bf16 = train_args(Settings({"RUN_NAME": "run"}, GIVEN), model, [])
    fp8 = train_args(Settings({"TRAIN_PRECISION": "fp8", "RUN_NAME": "run"}, GIVEN), model, ["--x"])
    assert [w for w in fp8 if w not in bf16] == ["--transformer-impl", "transformer_engine", "--fp8-format", "e4m3",
                                                 "--fp8-recipe", "blockwise", "--x"]
    assert bf16[bf16.index("--sglang-ep-size") + 1] == "4"
    dense = train_args(Settings({"MODEL": "qwen3_8b"}, GIVEN), megatron("qwen3_8b"), [])
    assert "--sglang-ep-size" not in dense and "--expert-model-parallel-size" not in dense


def test_format_command_round_trips_through_the_shell() -> None:
    words = ["ray", "job", "submit", "--runtime-env-json", '{"a":"b c"}', "--", "python3", "it's", "--x", "[1]*48"]
    assert shlex.split(format_command(words).replace("\\\n", " ")) == words
    assert format_command(["a", "--b"]) == "a --b"


def test_every_layout_rule_rejects_with_its_numbers() -> None:
    """One failing case per rule not covered above (the rules restated in layout.py's docstring)."""
    model = megatron("qwen3_30b_a3b")
    assert any(line.startswith("TP x PP x CP = 2 x 1 x 3 = 6 must divide the GPUs")
               for line in trainer_problems(profile_layout("qwen3_30b_a3b", cp=3), model))
    assert any("PP = 5 must divide the layers of the model = 48" in line
               for line in trainer_problems(profile_layout("qwen3_30b_a3b", pp=5, tp=1, ep=1, num_nodes=5), model))
    dense = MegatronModel(("--num-attention-heads", "32", "--num-layers", "4"))
    assert any("the model is dense (no --num-experts): EP and ETP must be 1 (got EP=2 ETP=1)" in line
               for line in trainer_problems(Layout(ep=2), dense))
    # A multi-node engine must span whole nodes: 12 GPUs over nodes of 8.
    assert any("GPUS_PER_NODE = 8 must divide ROLLOUT_GPUS_PER_ENGINE (multi-node engines use whole nodes) = 12"
               in line for line in engine_problems(Layout(num_nodes=3, rollout_gpus_per_engine=12, rollout_ep=4),
                                                   SHAPE_30B, "s"))
    # FusedMoE: moe_intermediate_size must split evenly over moe_tp, block or not.
    odd = replace(SHAPE_30B, moe_intermediate_size=770, weight_block_size=None)
    assert any("moe_intermediate_size 770 is not divisible by moe_tp = 4 / 1 = 4" in line
               for line in engine_problems(Layout(rollout_gpus_per_engine=4, rollout_ep=1), odd, "s"))
    # Dense MLP: intermediate_size must split evenly over the engine TP.
    uneven = replace(SHAPE_8B, intermediate_size=12290, weight_block_size=None)
    assert any("intermediate_size 12290 is not divisible by the engine TP = 4" in line
               for line in engine_problems(Layout(tp=2, rollout_gpus_per_engine=4), uneven, "s"))
    # o_proj's input shard (the q shard's width) against block_k: heads 32 x head_dim 128 / TP 8 = 512 columns.
    wide_k = replace(SHAPE_8B, weight_block_size=(128, 384))
    assert any("the o_proj input shard of an engine of TP 8 is 512 columns, not a multiple of the FP8 weight block "
               "384" in line for line in engine_problems(Layout(tp=2, rollout_gpus_per_engine=8), wide_k, "s"))


@pytest.mark.parametrize("change, needle", [
    ({"mlp_only_layers": 5}, "mlp_only_layers = 5; expected a list of layer indices"),
    ({"num_attention_heads": 0}, "num_attention_heads = 0; expected an integer >= 1"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step = 0; expected an integer >= 1"),
])
def test_a_malformed_config_is_a_config_error_not_a_traceback(change, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        ModelShape.from_hf_config({**HF_CONFIGS["qwen3_30b_a3b"], **change}, "c")
