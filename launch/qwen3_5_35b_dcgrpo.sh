#!/usr/bin/env bash
# Qwen3.5-35B-A3B (MoE, 256 experts + a shared one, hybrid attention) with DC-GRPO: the third model profile.
# Settings are environment variables (see --help); METHOD, MODEL and the others in the environment override these.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main --default METHOD=dcgrpo --default MODEL=qwen3_5_35b_a3b -- "$@"
