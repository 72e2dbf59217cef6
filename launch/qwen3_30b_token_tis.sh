#!/usr/bin/env bash
# Qwen3-30B-A3B with token-level truncated importance sampling (baseline).
# Settings are environment variables (see --help); METHOD, MODEL and the others in the environment override these.
set -euo pipefail
# shellcheck source=launch/lib.sh
source "$(dirname -- "${BASH_SOURCE[0]}")/lib.sh"
launcher_main --default METHOD=token_tis --default MODEL=qwen3_30b_a3b -- "$@"
