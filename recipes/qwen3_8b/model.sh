# Megatron model arguments of the dense Qwen3-8B, as in slime's scripts/models/qwen3-8B.sh at 624b824a, except
# --position-embedding-type rope for its deprecated spelling --use-rotary-position-embeddings (Megatron 1dcf0daf
# training/arguments.py:1675; the same setting, as the 30B args already spell it).
# Usage: source recipes/qwen3_8b/model.sh; ... "${MODEL_ARGS[@]}"
MODEL_ARGS=(
   --swiglu
   --num-layers 36
   --hidden-size 4096
   --ffn-hidden-size 12288
   --num-attention-heads 32
   --group-query-attention
   --num-query-groups 8
   --position-embedding-type rope
   --disable-bias-linear
   --normalization RMSNorm
   --norm-epsilon 1e-6
   --rotary-base 1000000
   --vocab-size 151936
   --kv-channels 128
   --qk-layernorm
   --untie-embeddings-and-output-weights
)
