#!/usr/bin/env bash
# Qwen3-30B-A3B with GRPO and length-triggered LR decay (baseline).
# Settings are environment variables (see --help); METHOD and MODEL in the environment override the defaults below.
set -euo pipefail
DEFAULT_METHOD=length_decay
DEFAULT_MODEL=qwen3_30b_a3b
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main "$@"
