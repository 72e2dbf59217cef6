"""Qwen3-30B-A3B slime recipe: data preparation, math reward, eval config and Megatron model args."""
