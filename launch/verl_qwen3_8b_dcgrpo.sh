#!/usr/bin/env bash
# dense Qwen3-8B with DC-GRPO on verl 0.9.1: FSDP2 training, vLLM FP8 rollouts (TP2), the paper's batch (64 prompts,
# PPO mini-batch 16) and lengths (8192), dense defaults from the model's config.json. Settings: --help; docs/verl.md.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
verl_launcher_main qwen3_8b -- "$@"
