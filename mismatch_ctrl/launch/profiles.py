"""Per-model defaults of the launchers: the Hugging Face name, the parallel layout, memory settings and the model's
recorded shape (its ``config.json`` numbers, used until the FP8 checkpoint is on disk).

The layouts satisfy the rules in :mod:`.layout` on one node of 8 GPUs (``tests/launch`` checks every profile):

- ``qwen3_30b_a3b``: trainer TP2 + sequence parallel, EP8, ETP1, Adam on the CPU; rollout engines of 4 GPUs (TP4,
  as in the paper) with SGLang expert parallelism 4, so each engine holds whole experts (``moe_tp = 4 / 4 = 1``,
  768 intermediate columns per expert shard, six FP8 blocks of 128). Without EP the shard would be 768 / 4 = 192
  and SGLang's ``Fp8MoEMethod.create_weights`` refuses to load. slime's own FP8 recipes use EP = engine GPUs too.
- ``qwen3_8b``: dense; trainer TP2, rollout engines of 2 GPUs (TP2, 12288 / 2 = 6144 = 48 blocks).
- ``qwen3_5_35b_a3b``: MoE, 256 experts of 512 columns plus a shared expert of 512; trainer TP2 + sequence parallel,
  EP8, ETP1, Adam on the CPU (the parallel sizes of slime's ``scripts/run-qwen3.5-35B-A3B-sft.sh``); engines of 4
  GPUs with EP4 (``moe_tp`` 1: whole experts, four blocks each; EP 1 or 2 would fit too, 512 / 4 = 128 and 512 / 2 =
  256, but not an engine of 8 GPUs without EP, 64). The shared expert is split over the whole engine TP: 512 / 4 =
  128, one block; 8-GPU engines give 64 and are refused. 16 heads and 2 KV heads of 256: TP 1, 2, 4, 8 (KV heads
  replicated past 2). Not modelled by the rules or the memory estimate: the 30 Gated DeltaNet layers (counted as
  full-attention layers, and the gated query without its gate: ~0.5B parameters short of ~35B; their fixed
  recurrent state is counted as KV cache, so the KV-cache figure is pessimistic) and the checkpoint's vision tower.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_shape import CheckpointReport, MegatronModel, ModelShape


@dataclass(frozen=True)
class ModelProfile:
    """Defaults of one model; every field but ``hf_name``, ``shape`` and ``launcher`` (the script that trains it with
    DC-GRPO) is the default of a launcher setting."""

    hf_name: str
    shape: ModelShape
    launcher: str
    tp: int
    ep: int
    rollout_gpus_per_engine: int
    rollout_ep: int
    optimizer_cpu_offload: bool
    max_tokens_per_gpu: int

    @property
    def kind(self) -> str:
        return "MoE" if self.shape.is_moe else "dense"


# Shapes: the config.json of Qwen/Qwen3-30B-A3B-FP8 and Qwen/Qwen3-8B-FP8 (block [128, 128] e4m3). They agree with
# slime's scripts/models/qwen3-30B-A3B.sh and qwen3-8B.sh (recipes/<model>/model.sh), which tests/launch checks.
PROFILES: dict[str, ModelProfile] = {
    "qwen3_30b_a3b": ModelProfile(
        hf_name="Qwen3-30B-A3B", launcher="launch/qwen3_30b_dcgrpo.sh",
        shape=ModelShape(hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                         head_dim=128, intermediate_size=6144, vocab_size=151936, dense_layers=0, num_experts=128,
                         moe_intermediate_size=768, num_experts_per_tok=8, weight_block_size=(128, 128),
                         context_length=40960),
        tp=2, ep=8, rollout_gpus_per_engine=4, rollout_ep=4, optimizer_cpu_offload=True, max_tokens_per_gpu=20480),
    "qwen3_8b": ModelProfile(
        hf_name="Qwen3-8B", launcher="launch/qwen3_8b_dcgrpo.sh",
        shape=ModelShape(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=128, intermediate_size=12288, vocab_size=151936, dense_layers=36,
                         weight_block_size=(128, 128), context_length=40960),
        tp=2, ep=1, rollout_gpus_per_engine=2, rollout_ep=1, optimizer_cpu_offload=False, max_tokens_per_gpu=16384),
    # Qwen/Qwen3.5-35B-A3B(-FP8): text_config numbers as transformers' Qwen3_5MoeTextConfig defaults (its docstring:
    # "the Qwen3.5-35B-A3B style configuration"): hidden 2048, 40 layers, 16 heads, 2 KV heads, head_dim 256, 256
    # experts, top-8, moe and shared expert 512, vocab 248320; the model card: context 262,144 tokens natively
    # (max_position_embeddings; transformers' class default is 32768). They agree with slime's
    # scripts/models/qwen3.5-35B-A3B.sh (recipes/qwen3_5_35b_a3b/model.sh). Block [128, 128] as the Qwen -FP8
    # releases and slime's converter write it.
    "qwen3_5_35b_a3b": ModelProfile(
        hf_name="Qwen3.5-35B-A3B", launcher="launch/qwen3_5_35b_dcgrpo.sh",
        shape=ModelShape(hidden_size=2048, num_hidden_layers=40, num_attention_heads=16, num_key_value_heads=2,
                         head_dim=256, intermediate_size=0, vocab_size=248320, dense_layers=0, num_experts=256,
                         moe_intermediate_size=512, num_experts_per_tok=8, shared_expert_intermediate_size=512,
                         weight_block_size=(128, 128), context_length=262144),
        tp=2, ep=8, rollout_gpus_per_engine=4, rollout_ep=4, optimizer_cpu_offload=True, max_tokens_per_gpu=16384),
}


def checkpoint_kind_problems(report: CheckpointReport, variable: str, megatron: MegatronModel, model: str,
                             allow_mismatch: bool) -> list[str]:
    """A checkpoint of the other kind (dense for a MoE model profile, MoE for a dense one) is always an error naming
    the profiles and launchers of its kind; other differences from the model arguments (``report.mismatches``) are
    errors unless ``allow_mismatch``."""
    shape = report.shape
    if shape is None:
        return []
    if shape.is_moe != megatron.is_moe:
        kind = "MoE" if shape.is_moe else "dense"
        fits = [f"MODEL={name} ({profile.launcher})" for name, profile in PROFILES.items()
                if profile.shape.is_moe == shape.is_moe]
        return [f"{variable}: the checkpoint is {kind} ({shape.num_experts} experts, {shape.num_hidden_layers} layers, "
                f"hidden size {shape.hidden_size}) but MODEL={model} trains a {'MoE' if megatron.is_moe else 'dense'} "
                f"model: point {variable} at the {'BF16' if variable == 'MODEL_DIR' else 'FP8'} checkpoint of "
                f"MODEL={model}, or train this checkpoint with a {kind} profile: "
                f"{', '.join(fits) or 'none is shipped'}"]
    if allow_mismatch:
        return []
    return [f"{line} (set ALLOW_MODEL_SHAPE_MISMATCH=1 if MODEL_ARGS_FILE is deliberately different)"
            for line in report.mismatches]
