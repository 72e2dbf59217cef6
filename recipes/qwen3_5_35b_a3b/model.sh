# Megatron model arguments of Qwen3.5-35B-A3B (256 experts, top-8, one shared expert; 40 layers, every 4th full
# attention, the others Gated DeltaNet), as in slime's scripts/models/qwen3.5-35B-A3B.sh at 624b824a, except:
# --moe-layer-freq as the pattern [1]*40 (slime's script builds the same list in a loop: FIRST_K_DENSE_REPLACE=0),
# and without --use-gated-attention, which neither Megatron-LM 1dcf0daf nor slime defines (slime's parsers would
# drop it without a word); the gate is --attention-output-gate (TransformerConfig.attention_output_gate).
# The layers come from slime's spec slime_plugins.models.qwen3_5 (SLIME_DIR is on the job's PYTHONPATH).
# Usage: source recipes/qwen3_5_35b_a3b/model.sh; ... "${MODEL_ARGS[@]}"
MODEL_ARGS=(
   --spec slime_plugins.models.qwen3_5 get_qwen3_5_spec

   --disable-bias-linear
   --qk-layernorm
   --group-query-attention
   --num-attention-heads 16
   --num-query-groups 2
   --kv-channels 256
   --num-layers 40
   --hidden-size 2048
   --ffn-hidden-size 512

   --normalization RMSNorm
   --apply-layernorm-1p
   --position-embedding-type rope
   --norm-epsilon 1e-6
   --rotary-percent 0.25
   --swiglu
   --untie-embeddings-and-output-weights
   --vocab-size 248320
   --rotary-base 10000000

   --moe-ffn-hidden-size 512
   --moe-shared-expert-intermediate-size 512
   --moe-router-score-function softmax
   --moe-token-dispatcher-type alltoall
   --moe-router-topk 8
   --moe-layer-freq "[1]*40"
   --num-experts 256
   --moe-grouped-gemm
   --moe-token-drop-policy probs
   --moe-router-dtype fp32
   --moe-permute-fusion
   --moe-aux-loss-coeff 0

   --attention-output-gate
   --moe-shared-expert-gate
)
