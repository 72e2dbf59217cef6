#!/usr/bin/env bash
# MoE Qwen3-30B-A3B with DC-GRPO on verl 0.9.1: Megatron training (TP2 + sequence parallel, EP8), vLLM FP8 rollouts
# (TP4), router replay R3 with ROUTING_REPLAY=1, MoE defaults from the model's config.json. Settings: --help.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
verl_launcher_main qwen3_30b_a3b -- "$@"
