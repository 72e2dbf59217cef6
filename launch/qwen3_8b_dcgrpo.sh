#!/usr/bin/env bash
# dense Qwen3-8B with DC-GRPO (dense defaults from configs/arch/dense.yaml): TP2, 2-GPU rollout engines.
# Settings are environment variables (see --help); METHOD and MODEL in the environment override the defaults below.
set -euo pipefail
DEFAULT_METHOD=dcgrpo
DEFAULT_MODEL=qwen3_8b
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main "$@"
