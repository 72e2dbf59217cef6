# shellcheck shell=bash
# Shared by the launchers in this directory: finds a python and hands over to the launcher core,
# `python -m mismatch_ctrl.launch` (mismatch_ctrl/launch/: settings, layout checks, memory estimate, command,
# preflight, --prepare). A launcher sources this file and calls
#   launcher_main --default METHOD=<method> --default MODEL=<model> [--default TRAIN_PRECISION=fp8] -- "$@"
# Every setting is an environment variable (see --help). Exit codes: 0 success, 1 preflight or preparation failure,
# 2 bad configuration or usage.

set -euo pipefail

LIB_REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)

launcher_main() {
  local python_default=python3 python
  [[ -x "$LIB_REPO_ROOT/.venv/bin/python" ]] && python_default=$LIB_REPO_ROOT/.venv/bin/python
  python=${PYTHON:-$python_default}
  if ! command -v "$python" >/dev/null 2>&1; then
    printf '%s: error: PYTHON=%s is not an executable; set PYTHON to a python with PyYAML (and, for check-config, this package'"'"'s dependencies)\n' "$0" "$python" >&2
    exit 2
  fi
  PYTHONPATH="$LIB_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m mismatch_ctrl.launch --launcher "$0" \
    --default "REPO_ROOT=$LIB_REPO_ROOT" --default "PYTHON=$python_default" "$@"
}

# The verl launchers (launch/verl_*.sh): `python -m mismatch_ctrl.verl.launch` with a python that has verl 0.9.1 (the
# VERL_PYTHON setting; default .venv-verl's when `make verl-venv` made it, else python3, as in verl's own image):
#   verl_launcher_main <model> -- "$@"
verl_launcher_main() {
  local model=$1 python
  shift
  [[ ${1:-} == -- ]] && shift
  python=python3
  [[ -x "$LIB_REPO_ROOT/.venv-verl/bin/python" ]] && python=$LIB_REPO_ROOT/.venv-verl/bin/python
  python=${VERL_PYTHON:-$python}
  if ! command -v "$python" >/dev/null 2>&1; then
    printf '%s: error: VERL_PYTHON=%s is not an executable; set it to a python with verl==0.9.1\n' "$0" "$python" >&2
    exit 2
  fi
  PYTHONPATH="$LIB_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$python" -m mismatch_ctrl.verl.launch \
    --launcher "$0" --model "$model" -- "$@"
}
