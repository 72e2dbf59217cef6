#!/usr/bin/env bash
# Qwen3-30B-A3B with FP16 precision alignment (Qi et al. 2025, arXiv 2510.26788): Megatron --fp16 with dynamic loss
# scaling, and SGLang in float16 on the BF16 checkpoint (slime passes dtype=float16 with --fp16); plain GRPO, no FP8
# checkpoint. Same data, evaluation, layout and metrics as qwen3_30b_grpo.sh (FP8 rollouts, BF16 training): one
# variable changed, TRAIN_PRECISION.
# Settings are environment variables (see --help); METHOD, MODEL and the others in the environment override these.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main --default METHOD=grpo --default MODEL=qwen3_30b_a3b --default TRAIN_PRECISION=fp16 -- "$@"
