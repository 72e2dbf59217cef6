"""Megatron MODEL_ARGS: slime's lists (the 8B one with the rotary flag in its current spelling), and consistent with
the Hugging Face configs of the models."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes"

# docs/slime-integration.md section 8 (slime scripts/models/qwen3-30B-A3B.sh at 624b824a).
QWEN3_30B_A3B = [
    "--disable-bias-linear",
    "--qk-layernorm",
    "--group-query-attention",
    "--num-attention-heads",
    "32",
    "--num-query-groups",
    "4",
    "--kv-channels",
    "128",
    "--num-layers",
    "48",
    "--hidden-size",
    "2048",
    "--ffn-hidden-size",
    "6144",
    "--normalization",
    "RMSNorm",
    "--position-embedding-type",
    "rope",
    "--norm-epsilon",
    "1e-6",
    "--rotary-percent",
    "1.0",
    "--swiglu",
    "--untie-embeddings-and-output-weights",
    "--vocab-size",
    "151936",
    "--rotary-base",
    "1000000",
    "--moe-ffn-hidden-size",
    "768",
    "--moe-router-score-function",
    "softmax",
    "--moe-token-dispatcher-type",
    "alltoall",
    "--moe-router-topk",
    "8",
    "--moe-layer-freq",
    "[1]*48",
    "--num-experts",
    "128",
    "--moe-grouped-gemm",
    "--moe-token-drop-policy",
    "probs",
    "--moe-router-dtype",
    "fp32",
    "--moe-permute-fusion",
    "--moe-aux-loss-coeff",
    "0",
]
# slime scripts/models/qwen3-8B.sh at 624b824a (its rotary base default, 1000000, written out).
QWEN3_8B = [
    "--swiglu",
    "--num-layers",
    "36",
    "--hidden-size",
    "4096",
    "--ffn-hidden-size",
    "12288",
    "--num-attention-heads",
    "32",
    "--group-query-attention",
    "--num-query-groups",
    "8",
    "--position-embedding-type",
    "rope",
    "--disable-bias-linear",
    "--normalization",
    "RMSNorm",
    "--norm-epsilon",
    "1e-6",
    "--rotary-base",
    "1000000",
    "--vocab-size",
    "151936",
    "--kv-channels",
    "128",
    "--qk-layernorm",
    "--untie-embeddings-and-output-weights",
]

# Hugging Face config.json values of Qwen/Qwen3-30B-A3B and Qwen/Qwen3-8B, and the Megatron flag each one sets.
HF_TO_MEGATRON = {
    "num_hidden_layers": "--num-layers",
    "hidden_size": "--hidden-size",
    "intermediate_size": "--ffn-hidden-size",
    "num_attention_heads": "--num-attention-heads",
    "num_key_value_heads": "--num-query-groups",
    "head_dim": "--kv-channels",
    "vocab_size": "--vocab-size",
    "rope_theta": "--rotary-base",
    "rms_norm_eps": "--norm-epsilon",
    "moe_intermediate_size": "--moe-ffn-hidden-size",
    "num_experts": "--num-experts",
    "num_experts_per_tok": "--moe-router-topk",
}
HF_QWEN3_30B_A3B = {
    "num_hidden_layers": 48,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-6,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
}
HF_QWEN3_8B = {
    "num_hidden_layers": 36,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-6,
}


def _model_args(script: Path) -> list[str]:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("bash not available")
    result = subprocess.run(
        [bash, "-c", 'set -eu; source "$1"; printf "%s\\n" "${MODEL_ARGS[@]}"', "bash", str(script)],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.splitlines()


def _flag_values(args: list[str]) -> dict[str, str | None]:
    values: dict[str, str | None] = {}
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[index + 1] if index + 1 < len(args) else None
            values[arg] = None if following is None or following.startswith("--") else following
    return values


@pytest.mark.parametrize(
    ("script", "expected", "hf_config"),
    [("qwen3_30b_a3b/model.sh", QWEN3_30B_A3B, HF_QWEN3_30B_A3B), ("qwen3_8b/model.sh", QWEN3_8B, HF_QWEN3_8B)],
)
def test_model_args_match_slime_and_hf_config(script, expected, hf_config):
    args = _model_args(RECIPES / script)
    assert args == expected
    flags = _flag_values(args)
    for hf_key, value in hf_config.items():
        assert float(flags[HF_TO_MEGATRON[hf_key]]) == value, hf_key
    assert "--untie-embeddings-and-output-weights" in flags  # tie_word_embeddings is false for both models


def test_every_30b_layer_is_moe():
    flags = _flag_values(_model_args(RECIPES / "qwen3_30b_a3b/model.sh"))
    expression = ast.parse(flags["--moe-layer-freq"], mode="eval")  # Megatron evaluates this list expression
    assert eval(compile(expression, "moe-layer-freq", "eval"), {"__builtins__": {}}) == [1] * 48
