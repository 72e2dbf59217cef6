#!/usr/bin/env bash
# dense Qwen3-8B with DC-GRPO (dense defaults from configs/arch/dense.yaml): TP2, 2-GPU rollout engines.
# Settings are environment variables (see --help); METHOD, MODEL and the others in the environment override these.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main --default METHOD=dcgrpo --default MODEL=qwen3_8b -- "$@"
