#!/usr/bin/env bash
# Qwen3-30B-A3B with slime's precision-alignment recipe (scripts/low_precision/run-qwen3-30b-a3b-fp8.sh): FP8
# training (Transformer Engine, blockwise e4m3) + FP8 rollouts + token TIS (min(ratio, 2), slime's --use-tis), on the
# same data, evaluation, layout and metrics as the BF16-train/FP8-rollout runs: one variable changed.
# Settings are environment variables (see --help); METHOD, MODEL and the others in the environment override these.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main --default METHOD=token_tis --default MODEL=qwen3_30b_a3b --default TRAIN_PRECISION=fp8 -- "$@"
