# shellcheck shell=bash
# Shared library of the launchers in this directory. It owns the settings (environment variables with defaults),
# the configuration checks, the cluster preflight, the checkpoint/data preparation and the
# `ray job submit ... -- python3 <slime>/train.py ...` command.
#
# A launcher sets DEFAULT_METHOD and DEFAULT_MODEL, sources this file and calls `launcher_main "$@"`.
# Flags are spelled as in slime 624b824a and Megatron-LM 1dcf0daf, the docker image's versions (the list checked against
# their parsers is KNOWN_TRAIN_FLAGS in tests/launch/launch_harness.py).
# Exit codes: 0 success, 1 preflight or preparation failure (cluster, paths, conversion), 2 bad configuration or usage.

set -euo pipefail

COMPLETE_MARKER=.mismatch_ctrl_complete
LIB_REPO_ROOT=$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd)
LAUNCHER=$0

HOOK_ADVANTAGES=mismatch_ctrl.slime.hooks.advantages
HOOK_ROLLOUT_CORRECTION=mismatch_ctrl.slime.hooks.rollout_correction
HOOK_BEFORE_TRAIN_STEP=mismatch_ctrl.slime.hooks.before_train_step
HOOK_MEGATRON_INIT=mismatch_ctrl.slime.hooks.on_megatron_init
REWARD_FUNCTION=recipes.qwen3_30b_a3b.reward.rm
DATA_MODULE=recipes.qwen3_30b_a3b.data
TRAIN_SET_FILE=dapo-math-17k.jsonl
EVAL_SET_NAMES=(aime24 aime25 amc23 math500 minerva olympiadbench)

note() { printf '%s: %s\n' "$LAUNCHER" "$*" >&2; }

die() {
  local code=$1
  shift
  printf '%s: error: %s\n' "$LAUNCHER" "$*" >&2
  exit "$code"
}

# report_list LABEL ITEM...: print one "LABEL: item" line per item on stderr.
report_list() {
  local label=$1 item
  shift
  for item in "$@"; do printf '%s: %s: %s\n' "$LAUNCHER" "$label" "$item" >&2; done
}

# ---------------------------------------------------------------------------------------------------------------
# Settings: every one is an environment variable; an empty or unset variable takes the default.

SETTING_NAMES=()
SETTING_DEFAULTS=()
SETTING_DOCS=()

# setting NAME DEFAULT DOC
setting() {
  SETTING_NAMES+=("$1")
  SETTING_DEFAULTS+=("$2")
  SETTING_DOCS+=("$3")
  [[ -n "${!1:-}" ]] || printf -v "$1" '%s' "$2"
}

# section TITLE: a heading in --help.
section() {
  SETTING_NAMES+=("")
  SETTING_DEFAULTS+=("")
  SETTING_DOCS+=("$1")
}

# model_profile: per-model defaults (Hugging Face name, parallel layout, memory) for MODEL.
model_profile() {
  case "$MODEL" in
    qwen3_30b_a3b)
      PROFILE_HF_NAME=Qwen3-30B-A3B PROFILE_TP=2 PROFILE_EP=8 PROFILE_ROLLOUT_GPUS=4
      PROFILE_CPU_OFFLOAD=1 PROFILE_MAX_TOKENS=20480
      ;;
    qwen3_8b)
      PROFILE_HF_NAME=Qwen3-8B PROFILE_TP=2 PROFILE_EP=1 PROFILE_ROLLOUT_GPUS=2
      PROFILE_CPU_OFFLOAD=0 PROFILE_MAX_TOKENS=16384
      ;;
    *) die 2 "MODEL=$MODEL is unknown; known models: qwen3_30b_a3b (MoE), qwen3_8b (dense)" ;;
  esac
}

declare_settings() {
  local python_default=python3
  [[ -x "$LIB_REPO_ROOT/.venv/bin/python" ]] && python_default=$LIB_REPO_ROOT/.venv/bin/python

  section "Method and model"
  setting METHOD "$DEFAULT_METHOD" "method; selects configs/methods/<METHOD>.yaml"
  setting MODEL "$DEFAULT_MODEL" "model profile: qwen3_30b_a3b (MoE) or qwen3_8b (dense); sets the layout defaults"
  model_profile
  setting REPO_ROOT "$LIB_REPO_ROOT" "this repository; the same path must exist on every node (job PYTHONPATH)"
  setting METHOD_CONFIG "$REPO_ROOT/configs/methods/$METHOD.yaml" "method YAML for --custom-config-path"
  setting MODEL_ARGS_FILE "$REPO_ROOT/recipes/$MODEL/model.sh" "bash file defining the Megatron MODEL_ARGS array"
  setting EVAL_CONFIG "$REPO_ROOT/recipes/qwen3_30b_a3b/eval.yaml" "slime --eval-config file"

  section "Paths on the cluster"
  setting SLIME_DIR /root/slime "slime checkout (train.py, tools/)"
  setting MEGATRON_DIR /root/Megatron-LM "Megatron-LM checkout (goes first on the job PYTHONPATH)"
  setting MODEL_DIR "/root/$PROFILE_HF_NAME" "BF16 Hugging Face checkpoint; input of --prepare"
  setting FP8_HF_DIR "/root/$PROFILE_HF_NAME-FP8" "FP8 block-128 Hugging Face checkpoint for SGLang (--hf-checkpoint)"
  setting TORCH_DIST_DIR "/root/${PROFILE_HF_NAME}_torch_dist" "BF16 Megatron torch_dist checkpoint (--ref-load)"
  setting SAVE_DIR "/root/runs/${MODEL}_${METHOD}" "run checkpoints (--save); a shared file system for several nodes"
  setting LOAD_DIR "$SAVE_DIR" "resume from here if it holds a checkpoint, else start from TORCH_DIST_DIR (--load)"
  setting DATA_DIR /root/data "recipe data: $TRAIN_SET_FILE and eval/*.jsonl; exported to the job for EVAL_CONFIG"
  setting PROMPT_DATA "$DATA_DIR/$TRAIN_SET_FILE" "training prompts (--prompt-data)"

  section "Cluster"
  setting NUM_NODES 1 "nodes (--actor-num-nodes)"
  setting GPUS_PER_NODE 8 "GPUs per node (--actor-num-gpus-per-node, --num-gpus-per-node)"
  setting RAY_ADDRESS http://127.0.0.1:8265 "Ray dashboard address for ray job submit"
  setting PYTHON "$python_default" "python for check-config, preflight imports and --prepare"
  setting NCCL_NVLS_ENABLE auto "0, 1, or auto (1 when nvidia-smi topo -m shows NVLink)"
  setting PASS_ENV "" "names of extra variables copied into the job env, e.g. 'WANDB_API_KEY RECIPE_RM_WORKERS' \
(values appear in the printed command)"

  section "Parallel layout and memory"
  setting TP "$PROFILE_TP" "tensor parallel (--tensor-model-parallel-size; --sequence-parallel when > 1)"
  setting PP 1 "pipeline parallel (--pipeline-model-parallel-size)"
  setting CP 1 "context parallel (--context-parallel-size)"
  setting EP "$PROFILE_EP" "expert parallel (--expert-model-parallel-size); 1 for dense models"
  setting ETP 1 "expert tensor parallel (--expert-tensor-parallel-size)"
  setting ROLLOUT_GPUS_PER_ENGINE "$PROFILE_ROLLOUT_GPUS" "GPUs per SGLang engine (--rollout-num-gpus-per-engine)"
  setting OPTIMIZER_CPU_OFFLOAD "$PROFILE_CPU_OFFLOAD" "1: Adam on CPU (--optimizer-cpu-offload \
--overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)"
  setting MAX_TOKENS_PER_GPU "$PROFILE_MAX_TOKENS" "--max-tokens-per-gpu (dynamic batch size)"
  setting SGLANG_MEM_FRACTION 0.7 "--sglang-mem-fraction-static"

  section "Training"
  setting NUM_ROLLOUT 500 "rollouts to train (--num-rollout); keep it fixed across resumes"
  setting ROLLOUT_BATCH_SIZE 64 "prompts per rollout (--rollout-batch-size)"
  setting N_SAMPLES_PER_PROMPT 8 "responses per prompt (--n-samples-per-prompt)"
  setting GLOBAL_BATCH_SIZE 128 "samples per optimizer step (--global-batch-size); keep it fixed across resumes"
  setting MAX_RESPONSE_LEN 8192 "--rollout-max-response-len"
  setting ROLLOUT_TEMPERATURE 1 "--rollout-temperature"
  setting LR 1e-6 "--lr (constant schedule; the method's hooks may scale it)"
  setting EPS_CLIP 0.2 "--eps-clip"
  setting EPS_CLIP_HIGH 0.28 "--eps-clip-high"
  setting SAVE_INTERVAL 20 "--save-interval (rollouts)"
  setting EVAL_INTERVAL 20 "--eval-interval (rollouts); 0 turns evaluation off"
  setting SKIP_EVAL_BEFORE_TRAIN 0 "1: --skip-eval-before-train"
  setting ROUTING_REPLAY 0 "1: --use-rollout-routing-replay (R3, MoE only). It removes the routing part of the \
train/rollout mismatch, so calibrate eps with and without it"

  section "Logging (off unless set)"
  setting WANDB_PROJECT "" "wandb project: --use-wandb --wandb-project (key: WANDB_API_KEY in the Ray nodes' env, or PASS_ENV)"
  setting WANDB_GROUP "${MODEL}_${METHOD}" "--wandb-group"
  setting WANDB_TEAM "" "--wandb-team"
  setting TENSORBOARD_DIR "" "TensorBoard log dir: --use-tensorboard, TENSORBOARD_DIR in the job env"

  section "Preparation (--prepare)"
  setting DATA_ARGS "" "extra arguments of python -m $DATA_MODULE, e.g. '--source aime24=/mnt/aime24.parquet'"
  setting FP8_CONVERT_WORKERS 4 "--max-workers of tools/convert_hf_to_fp8.py"
}

usage() {
  local i name current
  cat <<EOF
usage: $LAUNCHER [--dry-run] [--prepare] [--help] [-- EXTRA_TRAIN_ARGS...]

Train $DEFAULT_MODEL with method $DEFAULT_METHOD on slime: SGLang rollouts on the FP8 checkpoint, Megatron BF16
training, colocated on the same GPUs, submitted with ray job submit. Arguments after -- are appended to train.py's.

modes:
  (none)      check the configuration and the cluster (GPUs, Ray, imports, checkpoints, data), then submit the job
  --dry-run   check the configuration, warn about missing cluster paths, print the ray job submit command; exit 0
  --prepare   write the data, convert MODEL_DIR to TORCH_DIST_DIR (torch_dist) and to FP8_HF_DIR (FP8 block 128)
              where a complete output (marker $COMPLETE_MARKER) is missing; with --dry-run, print the steps

exit codes: 0 success, 1 preflight/preparation failure, 2 bad configuration or usage

environment variables (NAME=default; an empty value means the default; [now: ...] shows an override):
EOF
  for i in "${!SETTING_NAMES[@]}"; do
    name=${SETTING_NAMES[i]}
    if [[ -z "$name" ]]; then
      printf '\n  %s\n' "${SETTING_DOCS[i]}"
      continue
    fi
    printf '    %s=%s\n        %s\n' "$name" "${SETTING_DEFAULTS[i]}" "${SETTING_DOCS[i]}"
    current=${!name}
    [[ "$current" == "${SETTING_DEFAULTS[i]}" ]] || printf '        [now: %s]\n' "$current"
  done
}

parse_cli() {
  MODE_DRY_RUN=0
  MODE_PREPARE=0
  MODE_HELP=0
  EXTRA_TRAIN_ARGS=()
  while (($#)); do
    case "$1" in
      --dry-run) MODE_DRY_RUN=1 ;;
      --prepare) MODE_PREPARE=1 ;;
      -h | --help) MODE_HELP=1 ;;
      --)
        shift
        EXTRA_TRAIN_ARGS=("$@")
        break
        ;;
      *) die 2 "unknown option '$1' (see --help; arguments for train.py go after --)" ;;
    esac
    shift
  done
}

# ---------------------------------------------------------------------------------------------------------------
# Model arguments

# model_arg FLAG DEFAULT: the value after FLAG in MODEL_ARGS, else DEFAULT.
model_arg() {
  local i
  for ((i = 0; i < ${#MODEL_ARGS[@]}; i++)); do
    if [[ "${MODEL_ARGS[i]}" == "$1" ]]; then
      printf '%s' "${MODEL_ARGS[i + 1]:-}"
      return 0
    fi
  done
  printf '%s' "$2"
}

load_model_args() {
  [[ -f "$MODEL_ARGS_FILE" ]] || die 2 "MODEL_ARGS_FILE=$MODEL_ARGS_FILE does not exist (expected recipes/<model>/model.sh)"
  MODEL_ARGS=()
  # shellcheck source=/dev/null
  source "$MODEL_ARGS_FILE"
  ((${#MODEL_ARGS[@]})) || die 2 "MODEL_ARGS_FILE=$MODEL_ARGS_FILE does not define a MODEL_ARGS array"
  NUM_EXPERTS=$(model_arg --num-experts 0)
  NUM_LAYERS=$(model_arg --num-layers 0)
  NUM_HEADS=$(model_arg --num-attention-heads 0)
  NUM_QUERY_GROUPS=$(model_arg --num-query-groups "$NUM_HEADS")
}

# ---------------------------------------------------------------------------------------------------------------
# Configuration checks (no cluster needed): values, layout arithmetic, the method YAML.

CONFIG_ERRORS=()

config_error() { CONFIG_ERRORS+=("$*"); }

is_positive_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }

# require_divides A A_TEXT B B_TEXT: config error unless A divides B.
require_divides() {
  (($3 % $1 == 0)) || config_error "$2 = $1 must divide $4 = $3"
}

check_values() {
  local name ok=0
  for name in NUM_NODES GPUS_PER_NODE TP PP CP EP ETP ROLLOUT_GPUS_PER_ENGINE NUM_ROLLOUT ROLLOUT_BATCH_SIZE \
    N_SAMPLES_PER_PROMPT GLOBAL_BATCH_SIZE MAX_RESPONSE_LEN MAX_TOKENS_PER_GPU SAVE_INTERVAL FP8_CONVERT_WORKERS; do
    is_positive_int "${!name}" || { config_error "$name=${!name} must be a positive integer"; ok=1; }
  done
  [[ "$EVAL_INTERVAL" =~ ^[0-9]+$ ]] || { config_error "EVAL_INTERVAL=$EVAL_INTERVAL must be 0 (off) or a positive integer"; ok=1; }
  for name in OPTIMIZER_CPU_OFFLOAD SKIP_EVAL_BEFORE_TRAIN ROUTING_REPLAY; do
    [[ "${!name}" == 0 || "${!name}" == 1 ]] || { config_error "$name=${!name} must be 0 or 1"; ok=1; }
  done
  [[ "$NCCL_NVLS_ENABLE" =~ ^(0|1|auto)$ ]] || config_error "NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE must be 0, 1 or auto"
  read -r -a PASS_ENV_NAMES <<<"$PASS_ENV"
  for name in "${PASS_ENV_NAMES[@]}"; do
    if [[ ! "$name" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
      config_error "PASS_ENV holds '$name', which is not a variable name"
    elif [[ -z "${!name+set}" ]]; then
      config_error "PASS_ENV names $name, which is not set in this environment"
    fi
  done
  for name in NUM_EXPERTS NUM_LAYERS NUM_HEADS NUM_QUERY_GROUPS; do
    [[ "${!name}" =~ ^[0-9]+$ ]] || { config_error "MODEL_ARGS_FILE gives a non-integer $name=${!name}"; ok=1; }
  done
  return "$ok"
}

check_layout() {
  local gpus=$((NUM_NODES * GPUS_PER_NODE)) gpus_text="NUM_NODES x GPUS_PER_NODE = $NUM_NODES x $GPUS_PER_NODE"
  local samples=$((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT))
  require_divides $((TP * PP * CP)) "TP x PP x CP = $TP x $PP x $CP" "$gpus" "the GPUs ($gpus_text)"
  if ((gpus % (TP * PP * CP) == 0)); then
    # Megatron's micro-batch calculator (initialized by slime) asserts this, with micro batch size 1.
    require_divides $((gpus / (TP * PP * CP))) "the data-parallel size (GPUs / (TP x PP x CP))" \
      "$GLOBAL_BATCH_SIZE" "GLOBAL_BATCH_SIZE"
  fi
  if ((NUM_EXPERTS > 0)); then
    require_divides $((EP * ETP * PP)) "EP x ETP x PP = $EP x $ETP x $PP" "$gpus" "the GPUs ($gpus_text)"
    require_divides "$EP" "EP" "$NUM_EXPERTS" "the experts of MODEL=$MODEL"
  else
    ((EP == 1 && ETP == 1)) || config_error "MODEL=$MODEL is dense (no --num-experts): EP and ETP must be 1 (got EP=$EP ETP=$ETP)"
    ((ROUTING_REPLAY == 0)) || config_error "ROUTING_REPLAY=1 needs a MoE model; MODEL=$MODEL is dense"
  fi
  ((NUM_HEADS == 0)) || require_divides "$TP" "TP" "$NUM_HEADS" "the attention heads of MODEL=$MODEL"
  ((NUM_QUERY_GROUPS == 0)) || require_divides "$TP" "TP" "$NUM_QUERY_GROUPS" "the query groups of MODEL=$MODEL"
  ((NUM_LAYERS == 0)) || require_divides "$PP" "PP" "$NUM_LAYERS" "the layers of MODEL=$MODEL"
  require_divides "$ROLLOUT_GPUS_PER_ENGINE" "ROLLOUT_GPUS_PER_ENGINE" "$gpus" "the GPUs ($gpus_text)"
  if ((ROLLOUT_GPUS_PER_ENGINE <= GPUS_PER_NODE)); then
    require_divides "$ROLLOUT_GPUS_PER_ENGINE" "ROLLOUT_GPUS_PER_ENGINE" "$GPUS_PER_NODE" "GPUS_PER_NODE (engines must not straddle nodes)"
  else
    require_divides "$GPUS_PER_NODE" "GPUS_PER_NODE" "$ROLLOUT_GPUS_PER_ENGINE" "ROLLOUT_GPUS_PER_ENGINE (multi-node engines use whole nodes)"
  fi
  ((samples % GLOBAL_BATCH_SIZE == 0)) || config_error "ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT = \
$ROLLOUT_BATCH_SIZE x $N_SAMPLES_PER_PROMPT = $samples must be a multiple of GLOBAL_BATCH_SIZE = $GLOBAL_BATCH_SIZE \
(whole optimizer steps per rollout)"
}

# run_python ARG...: PYTHON with the repository (and slime, Megatron-LM) on PYTHONPATH.
run_python() {
  env PYTHONPATH="$MEGATRON_DIR:$SLIME_DIR:$REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" "$@"
}

available_methods() {
  local file names=()
  for file in "$REPO_ROOT"/configs/methods/*.yaml; do
    [[ -f "$file" ]] && names+=("$(basename -- "$file" .yaml)")
  done
  printf '%s' "${names[*]}"
}

check_method_config() {
  local output
  if [[ ! -f "$METHOD_CONFIG" ]]; then
    config_error "METHOD_CONFIG=$METHOD_CONFIG does not exist (METHOD=$METHOD; methods in configs/methods: $(available_methods))"
    return 0
  fi
  if output=$(run_python -m mismatch_ctrl check-config "$METHOD_CONFIG" --num-experts "$NUM_EXPERTS" 2>&1); then
    METHOD_CONFIG_SUMMARY=$output
  else
    config_error "METHOD_CONFIG=$METHOD_CONFIG is invalid: $output"
  fi
}

validate_config() {
  if ! command -v "$PYTHON" >/dev/null 2>&1; then
    die 2 "PYTHON=$PYTHON is not an executable; set PYTHON to a python with this package installed"
  fi
  if check_values; then
    check_layout
    if ((EVAL_INTERVAL > 0)) && [[ ! -f "$EVAL_CONFIG" ]]; then
      config_error "EVAL_CONFIG=$EVAL_CONFIG does not exist (or set EVAL_INTERVAL=0 to train without evaluation)"
    fi
  fi
  check_method_config
  if ((${#CONFIG_ERRORS[@]})); then
    report_list "configuration error" "${CONFIG_ERRORS[@]}"
    exit 2
  fi
}

# ---------------------------------------------------------------------------------------------------------------
# Cluster paths: warnings in --dry-run, errors before a launch.

PATH_PROBLEMS=()

# hf_config_problems DIR KIND(fp8|bf16) VARNAME: problems of DIR/config.json for MODEL, one per line.
hf_config_problems() {
  run_python -c '
import json, os, sys
path, kind, var, layers, experts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
config_path = os.path.join(path, "config.json")
try:
    with open(config_path) as f:
        config = json.load(f)
except OSError:
    sys.exit(f"{var}: {config_path} does not exist")
except ValueError as exc:
    sys.exit(f"{var}: {config_path} is not valid JSON ({exc})")
quant = config.get("quantization_config")
if kind == "fp8":
    if not isinstance(quant, dict):
        print(f"{var}: {config_path} has no quantization_config; SGLang needs an FP8 checkpoint with "
              "quant_method fp8 and weight_block_size [128, 128] (run --prepare, or use the Qwen/*-FP8 release)")
    else:
        method, block = quant.get("quant_method"), quant.get("weight_block_size")
        if method != "fp8" or list(block or []) != [128, 128]:
            print(f"{var}: {config_path} quantization_config has quant_method {method!r} and weight_block_size "
                  f"{block!r}; expected fp8 and [128, 128] (block e4m3, which slime re-quantizes to at every sync)")
elif quant is not None:
    print(f"{var}: {config_path} has a quantization_config; it must be the BF16 model")
found_layers, found_experts = config.get("num_hidden_layers"), config.get("num_experts") or 0
if found_layers != layers:
    print(f"{var}: {config_path} has num_hidden_layers {found_layers}, MODEL_ARGS_FILE says {layers}")
if found_experts != experts:
    print(f"{var}: {config_path} has num_experts {found_experts}, MODEL_ARGS_FILE says {experts}")
' "$1" "$2" "$3" "$NUM_LAYERS" "$NUM_EXPERTS" 2>&1
}

# eval_data_files: the dataset paths of EVAL_CONFIG, resolving ${oc.env:NAME,default} as slime's OmegaConf does.
eval_data_files() {
  run_python -c '
import os, re, sys
import yaml
with open(sys.argv[1]) as f:
    config = yaml.safe_load(f) or {}
environment = dict(os.environ, DATA_DIR=sys.argv[2])
interpolation = re.compile(r"\$\{oc\.env:([A-Za-z_][A-Za-z0-9_]*)(?:,([^}]*))?\}")
for dataset in config.get("eval", config).get("datasets") or []:
    print(interpolation.sub(lambda m: environment.get(m.group(1), m.group(2) or ""), str(dataset["path"])))
' "$EVAL_CONFIG" "$DATA_DIR"
}

add_problem_lines() {
  local line
  while IFS= read -r line; do
    [[ -z "$line" ]] || PATH_PROBLEMS+=("$line")
  done <<<"$1"
}

collect_path_problems() {
  local file files missing=()
  [[ -f "$SLIME_DIR/train.py" ]] || PATH_PROBLEMS+=("SLIME_DIR=$SLIME_DIR has no train.py; set SLIME_DIR to the slime checkout (/root/slime in the slimerl/slime image)")
  [[ -d "$MEGATRON_DIR/megatron" ]] || PATH_PROBLEMS+=("MEGATRON_DIR=$MEGATRON_DIR has no megatron/ package; set MEGATRON_DIR to the Megatron-LM checkout (/root/Megatron-LM in the image)")
  if [[ -d "$FP8_HF_DIR" ]]; then
    add_problem_lines "$(hf_config_problems "$FP8_HF_DIR" fp8 FP8_HF_DIR)"
  else
    PATH_PROBLEMS+=("FP8_HF_DIR=$FP8_HF_DIR does not exist; run '$LAUNCHER --prepare' (converts MODEL_DIR) or download the Qwen/$PROFILE_HF_NAME-FP8 release there")
  fi
  [[ -f "$TORCH_DIST_DIR/latest_checkpointed_iteration.txt" ]] || PATH_PROBLEMS+=("TORCH_DIST_DIR=$TORCH_DIST_DIR is not a Megatron checkpoint (no latest_checkpointed_iteration.txt); run '$LAUNCHER --prepare'")
  [[ -f "$PROMPT_DATA" ]] || PATH_PROBLEMS+=("PROMPT_DATA=$PROMPT_DATA does not exist; run '$LAUNCHER --prepare' (writes DATA_DIR)")
  if ((EVAL_INTERVAL > 0)); then
    if files=$(eval_data_files 2>&1); then
      while IFS= read -r file; do
        [[ -z "$file" || -f "$file" ]] || missing+=("$file")
      done <<<"$files"
      ((${#missing[@]} == 0)) || PATH_PROBLEMS+=("eval sets of EVAL_CONFIG (with DATA_DIR=$DATA_DIR) do not exist: ${missing[*]}; run '$LAUNCHER --prepare' or set EVAL_INTERVAL=0")
    else
      PATH_PROBLEMS+=("EVAL_CONFIG=$EVAL_CONFIG could not be read: $files")
    fi
  fi
}

# ---------------------------------------------------------------------------------------------------------------
# Cluster preflight (before a launch or a conversion).

CLUSTER_PROBLEMS=()

check_local_gpus() {
  local count
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    CLUSTER_PROBLEMS+=("nvidia-smi not found: run on a GPU node, inside the container started with --gpus all")
    return 0
  fi
  if ! count=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>&1 | grep -c '^[[:space:]]*[0-9]'); then
    count=0
  fi
  ((count >= GPUS_PER_NODE)) || CLUSTER_PROBLEMS+=("this node has $count GPUs (nvidia-smi) but GPUS_PER_NODE=$GPUS_PER_NODE; use a node with $GPUS_PER_NODE GPUs or set GPUS_PER_NODE (and a layout that fits)")
}

check_ray() {
  local status total needed=$((NUM_NODES * GPUS_PER_NODE))
  if ! command -v ray >/dev/null 2>&1; then
    CLUSTER_PROBLEMS+=("ray not found on PATH: run inside the slimerl/slime image (docker/README.md)")
    return 0
  fi
  if ! timeout 60 ray job list --address "$RAY_ADDRESS" >/dev/null 2>&1; then
    CLUSTER_PROBLEMS+=("Ray is not reachable at RAY_ADDRESS=$RAY_ADDRESS; start it on the head node with 'ray start --head --num-gpus $GPUS_PER_NODE --dashboard-host=0.0.0.0 --dashboard-port=8265' (other nodes: 'ray start --address=<head-ip>:6379 --num-gpus $GPUS_PER_NODE') or set RAY_ADDRESS")
    return 0
  fi
  status=$(env -u RAY_ADDRESS timeout 60 ray status 2>/dev/null) || true
  total=$(grep -oE '[0-9.]+/[0-9.]+ GPU' <<<"$status" | head -n 1 | sed -E 's#.*/([0-9]+).*#\1#') || true
  if [[ -z "$total" ]]; then
    note "warning: could not read the cluster's GPU count from 'ray status'; Ray will wait if fewer than $needed GPUs join"
  elif ((total < needed)); then
    CLUSTER_PROBLEMS+=("the Ray cluster has $total GPUs but the layout needs NUM_NODES x GPUS_PER_NODE = $needed; start Ray on every node with --num-gpus $GPUS_PER_NODE or lower NUM_NODES")
  fi
}

# check_imports TARGET...: each TARGET is a module or module:attribute importable by PYTHON. What the imports print
# is dropped; only the lines marked "import-check:" are reported.
check_imports() {
  local output line failed=0
  output=$(run_python -c '
import contextlib, importlib, io, sys
for target in sys.argv[1:]:
    module, _, attribute = target.partition(":")
    name = target.replace(":", ".")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            loaded = importlib.import_module(module)
        if attribute:
            getattr(loaded, attribute)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0]
        print(f"import-check: cannot import {name}: {message}", flush=True)
' "$@" 2>&1) || failed=1
  while IFS= read -r line; do
    [[ "$line" != import-check:* ]] || { CLUSTER_PROBLEMS+=("${line#import-check: }"); failed=2; }
  done <<<"$output"
  case "$failed" in
    0) return 0 ;;
    1) CLUSTER_PROBLEMS+=("PYTHON=$PYTHON failed while checking imports: $(tail -n 3 <<<"$output")") ;;
    2) CLUSTER_PROBLEMS+=("imports use PYTHONPATH=$MEGATRON_DIR:$SLIME_DIR:$REPO_ROOT: slime and megatron come with the slimerl/slime image (SLIME_DIR, MEGATRON_DIR); mismatch_ctrl and recipes need REPO_ROOT and pip install -e '.[recipe]' (docker/Dockerfile)") ;;
  esac
}

# preflight_launch: the quick checks (GPUs, Ray); then, when they and the path checks passed, the imports (slow on
# the image: megatron.training loads torch and Transformer Engine).
preflight_launch() {
  check_local_gpus
  check_ray
  if ((${#PATH_PROBLEMS[@]} + ${#CLUSTER_PROBLEMS[@]})); then
    note "import checks (slime, megatron, hooks, reward) run once the problems below are fixed"
    return 0
  fi
  check_imports slime megatron.training \
    "${HOOK_ADVANTAGES%.*}:${HOOK_ADVANTAGES##*.}" \
    "${HOOK_ROLLOUT_CORRECTION%.*}:${HOOK_ROLLOUT_CORRECTION##*.}" \
    "${HOOK_BEFORE_TRAIN_STEP%.*}:${HOOK_BEFORE_TRAIN_STEP##*.}" \
    "${HOOK_MEGATRON_INIT%.*}:${HOOK_MEGATRON_INIT##*.}" \
    "${REWARD_FUNCTION%.*}:${REWARD_FUNCTION##*.}"
}

# ---------------------------------------------------------------------------------------------------------------
# The command

# shell_quote WORD: WORD as a shell word (single-quoted unless it only has safe characters).
shell_quote() {
  if [[ "$1" =~ ^[A-Za-z0-9_./:=,+@-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# print_command WORD...: a copy-pasteable command; a long one gets a new line (with a backslash) before every --option.
print_command() {
  local word first=1 long=0
  (($# <= 6)) || long=1
  for word in "$@"; do
    if ((first)); then
      first=0
    elif ((long)) && [[ "$word" == --* ]]; then
      printf ' \\\n  '
    else
      printf ' '
    fi
    shell_quote "$word"
  done
  printf '\n'
}

nvls_enable() {
  local links
  if [[ "$NCCL_NVLS_ENABLE" != auto ]]; then
    printf '%s' "$NCCL_NVLS_ENABLE"
    return 0
  fi
  links=0
  if command -v nvidia-smi >/dev/null 2>&1; then
    links=$({ nvidia-smi topo -m 2>/dev/null || true; } | grep -cE 'NV[0-9]+') || true
  fi
  if ((links > 0)); then printf 1; else printf 0; fi
}

# runtime_env_json: the Ray runtime env; PYTHONPATH puts Megatron-LM, slime and this repository in every actor.
runtime_env_json() {
  local name pairs=(
    PYTHONPATH "$MEGATRON_DIR:$SLIME_DIR:$REPO_ROOT"
    CUDA_DEVICE_MAX_CONNECTIONS 1
    NCCL_NVLS_ENABLE "$(nvls_enable)"
    PYTHONUNBUFFERED 1
    DATA_DIR "$DATA_DIR"
  )
  [[ -z "$TENSORBOARD_DIR" ]] || pairs+=(TENSORBOARD_DIR "$TENSORBOARD_DIR")
  for name in "${PASS_ENV_NAMES[@]}"; do pairs+=("$name" "${!name}"); done
  "$PYTHON" -c '
import json, sys
values = iter(sys.argv[1:])
print(json.dumps({"env_vars": dict(zip(values, values))}, separators=(",", ":")))
' "${pairs[@]}"
}

build_train_args() {
  local bs cuda_graph_bs=(1 2 4 8)
  for ((bs = 16; bs <= 256; bs += 8)); do cuda_graph_bs+=("$bs"); done
  TRAIN_ARGS=(
    --actor-num-nodes "$NUM_NODES" --actor-num-gpus-per-node "$GPUS_PER_NODE" --num-gpus-per-node "$GPUS_PER_NODE"
    --colocate
    "${MODEL_ARGS[@]}"
    --hf-checkpoint "$FP8_HF_DIR" --ref-load "$TORCH_DIST_DIR" --load "$LOAD_DIR" --save "$SAVE_DIR"
    --save-interval "$SAVE_INTERVAL"
    --prompt-data "$PROMPT_DATA" --input-key prompt --label-key label --apply-chat-template --rollout-shuffle
    --custom-rm-path "$REWARD_FUNCTION"
    --num-rollout "$NUM_ROLLOUT" --rollout-batch-size "$ROLLOUT_BATCH_SIZE" --n-samples-per-prompt "$N_SAMPLES_PER_PROMPT"
    --rollout-max-response-len "$MAX_RESPONSE_LEN" --rollout-temperature "$ROLLOUT_TEMPERATURE"
    --global-batch-size "$GLOBAL_BATCH_SIZE" --balance-data
  )
  if ((EVAL_INTERVAL > 0)); then
    TRAIN_ARGS+=(--eval-config "$EVAL_CONFIG" --eval-interval "$EVAL_INTERVAL")
    ((SKIP_EVAL_BEFORE_TRAIN == 0)) || TRAIN_ARGS+=(--skip-eval-before-train)
  fi
  TRAIN_ARGS+=(--tensor-model-parallel-size "$TP")
  ((TP == 1)) || TRAIN_ARGS+=(--sequence-parallel)
  TRAIN_ARGS+=(--pipeline-model-parallel-size "$PP" --context-parallel-size "$CP")
  ((NUM_EXPERTS == 0)) || TRAIN_ARGS+=(--expert-model-parallel-size "$EP" --expert-tensor-parallel-size "$ETP")
  TRAIN_ARGS+=(
    --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
    --use-dynamic-batch-size --max-tokens-per-gpu "$MAX_TOKENS_PER_GPU"
    --advantage-estimator grpo --eps-clip "$EPS_CLIP" --eps-clip-high "$EPS_CLIP_HIGH"
    --custom-advantage-function-path "$HOOK_ADVANTAGES"
    --custom-tis-function-path "$HOOK_ROLLOUT_CORRECTION"
    --custom-megatron-before-train-step-hook-path "$HOOK_BEFORE_TRAIN_STEP"
    --custom-megatron-init-path "$HOOK_MEGATRON_INIT"
    --custom-config-path "$METHOD_CONFIG"
    --get-mismatch-metrics
  )
  ((ROUTING_REPLAY == 0)) || TRAIN_ARGS+=(--use-rollout-routing-replay)
  TRAIN_ARGS+=(
    --optimizer adam --lr "$LR" --lr-decay-style constant --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.98
  )
  ((OPTIMIZER_CPU_OFFLOAD == 0)) ||
    TRAIN_ARGS+=(--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)
  TRAIN_ARGS+=(
    --rollout-num-gpus-per-engine "$ROLLOUT_GPUS_PER_ENGINE" --sglang-mem-fraction-static "$SGLANG_MEM_FRACTION"
    --sglang-cuda-graph-bs "${cuda_graph_bs[@]}"
    --attention-dropout 0.0 --hidden-dropout 0.0 --accumulate-allreduce-grads-in-fp32 --attention-softmax-in-fp32
    --attention-backend flash
  )
  if [[ -n "$WANDB_PROJECT" ]]; then
    TRAIN_ARGS+=(--use-wandb --wandb-project "$WANDB_PROJECT" --wandb-group "$WANDB_GROUP")
    [[ -z "$WANDB_TEAM" ]] || TRAIN_ARGS+=(--wandb-team "$WANDB_TEAM")
  fi
  [[ -z "$TENSORBOARD_DIR" ]] || TRAIN_ARGS+=(--use-tensorboard)
  TRAIN_ARGS+=("${EXTRA_TRAIN_ARGS[@]}")
}

build_submit_command() {
  local env_json
  env_json=$(runtime_env_json) || die 2 "PYTHON=$PYTHON could not build the runtime-env JSON"
  build_train_args
  SUBMIT_COMMAND=(
    ray job submit --address "$RAY_ADDRESS" --runtime-env-json "$env_json"
    -- python3 "$SLIME_DIR/train.py" "${TRAIN_ARGS[@]}"
  )
}

print_summary() {
  local gpus=$((NUM_NODES * GPUS_PER_NODE)) kind="dense" replay=off
  ((NUM_EXPERTS == 0)) || kind="MoE, $NUM_EXPERTS experts, EP$EP x ETP$ETP"
  ((ROUTING_REPLAY == 0)) || replay=on
  note "method $METHOD: ${METHOD_CONFIG_SUMMARY:-$METHOD_CONFIG}"
  note "model $MODEL ($kind): rollouts on $FP8_HF_DIR (FP8), training from $TORCH_DIST_DIR (BF16)"
  note "layout: $NUM_NODES node(s) x $GPUS_PER_NODE GPUs, colocated; trainer TP$TP x PP$PP x CP$CP -> DP$((gpus / (TP * PP * CP))); $((gpus / ROLLOUT_GPUS_PER_ENGINE)) SGLang engines x $ROLLOUT_GPUS_PER_ENGINE GPUs"
  note "batch: $ROLLOUT_BATCH_SIZE prompts x $N_SAMPLES_PER_PROMPT samples per rollout = $((ROLLOUT_BATCH_SIZE * N_SAMPLES_PER_PROMPT / GLOBAL_BATCH_SIZE)) optimizer steps of $GLOBAL_BATCH_SIZE; $NUM_ROLLOUT rollouts; routing replay $replay"
  if [[ -f "$LOAD_DIR/latest_checkpointed_iteration.txt" ]]; then
    note "resume: LOAD_DIR=$LOAD_DIR holds iteration $(<"$LOAD_DIR/latest_checkpointed_iteration.txt")"
  else
    note "fresh start: LOAD_DIR=$LOAD_DIR holds no checkpoint, slime loads TORCH_DIST_DIR"
  fi
}

# ---------------------------------------------------------------------------------------------------------------
# --prepare: data, BF16 HF -> torch_dist, BF16 HF -> FP8 (block 128). Conversions write DIR.partial, mark it complete
# and rename it to DIR, so DIR without the marker was not written here and is never deleted.

PREPARE_PROBLEMS=()

# show_and_run WORD...: print the command; run it unless this is a dry run.
show_and_run() {
  print_command "$@"
  ((MODE_DRY_RUN)) || "$@"
}

# conversion_state DIR: complete | missing | foreign
conversion_state() {
  if [[ -f "$1/$COMPLETE_MARKER" ]]; then
    printf complete
  elif [[ -e "$1" ]]; then
    printf foreign
  else
    printf missing
  fi
}

data_files() {
  local name
  printf '%s\n' "$DATA_DIR/$TRAIN_SET_FILE"
  for name in "${EVAL_SET_NAMES[@]}"; do printf '%s\n' "$DATA_DIR/eval/$name.jsonl"; done
}

plan_prepare() {
  local file var dir
  DATA_MISSING=()
  while IFS= read -r file; do [[ -f "$file" ]] || DATA_MISSING+=("$file"); done < <(data_files)
  TORCH_DIST_STATE=$(conversion_state "$TORCH_DIST_DIR")
  FP8_STATE=$(conversion_state "$FP8_HF_DIR")
  for var in TORCH_DIST_DIR FP8_HF_DIR; do
    dir=${!var}
    [[ "$(conversion_state "$dir")" != foreign ]] ||
      PREPARE_PROBLEMS+=("$var=$dir exists without $COMPLETE_MARKER, so --prepare did not write it and leaves it alone: if it is a finished checkpoint run 'touch $dir/$COMPLETE_MARKER', otherwise remove it")
  done
  if [[ "$TORCH_DIST_STATE" == missing || "$FP8_STATE" == missing ]]; then
    if [[ -d "$MODEL_DIR" ]]; then
      while IFS= read -r file; do
        [[ -z "$file" ]] || PREPARE_PROBLEMS+=("$file")
      done <<<"$(hf_config_problems "$MODEL_DIR" bf16 MODEL_DIR)"
    else
      PREPARE_PROBLEMS+=("MODEL_DIR=$MODEL_DIR does not exist; download the BF16 model there (e.g. huggingface-cli download Qwen/$PROFILE_HF_NAME --local-dir $MODEL_DIR)")
    fi
  fi
  if [[ "$TORCH_DIST_STATE" == missing ]]; then
    [[ -f "$SLIME_DIR/tools/convert_hf_to_torch_dist.py" ]] || PREPARE_PROBLEMS+=("SLIME_DIR=$SLIME_DIR has no tools/convert_hf_to_torch_dist.py")
    command -v torchrun >/dev/null 2>&1 || ((MODE_DRY_RUN)) || PREPARE_PROBLEMS+=("torchrun not found on PATH (it comes with torch in the slimerl/slime image)")
  fi
  if [[ "$FP8_STATE" == missing ]]; then
    [[ -f "$SLIME_DIR/tools/convert_hf_to_fp8.py" ]] || PREPARE_PROBLEMS+=("SLIME_DIR=$SLIME_DIR has no tools/convert_hf_to_fp8.py")
  fi
}

# convert NAME DIR VERIFY COMMAND...: run COMMAND (which writes DIR.partial), VERIFY DIR.partial, mark and rename it.
convert() {
  local name=$1 dir=$2 verify=$3 partial="$2.partial" problems
  shift 3
  if [[ -e "$partial" ]]; then
    note "[$name] removing $partial, left by an interrupted run"
    show_and_run rm -rf -- "$partial"
  fi
  show_and_run "$@" || die 1 "[$name] conversion failed; $partial is incomplete and will be redone by the next --prepare"
  if ((MODE_DRY_RUN == 0)); then
    problems=$("$verify" "$partial") || true
    [[ -z "$problems" ]] || die 1 "[$name] conversion finished but its output is not usable: $problems (left in $partial)"
  fi
  show_and_run touch "$partial/$COMPLETE_MARKER"
  show_and_run mv -- "$partial" "$dir"
}

verify_torch_dist() {
  [[ -f "$1/latest_checkpointed_iteration.txt" ]] || printf '%s has no latest_checkpointed_iteration.txt' "$1"
}

verify_fp8() { hf_config_problems "$1" fp8 FP8_HF_DIR; }

run_prepare() {
  local data_args=() pythonpath="$MEGATRON_DIR:$SLIME_DIR:$REPO_ROOT"
  read -r -a data_args <<<"$DATA_ARGS"
  plan_prepare
  if ((MODE_DRY_RUN == 0)) && [[ "$TORCH_DIST_STATE" == missing || "$FP8_STATE" == missing ]]; then
    check_local_gpus
    check_imports slime megatron.training
    PREPARE_PROBLEMS+=("${CLUSTER_PROBLEMS[@]}")
  fi
  if ((${#PREPARE_PROBLEMS[@]})); then
    if ((MODE_DRY_RUN)); then
      report_list warning "${PREPARE_PROBLEMS[@]}"
    else
      report_list error "${PREPARE_PROBLEMS[@]}"
      die 1 "nothing was prepared; fix the errors above and re-run --prepare"
    fi
  fi

  if ((${#DATA_MISSING[@]})); then
    printf '# [data] %d of %d files missing in DATA_DIR=%s: write them\n' "${#DATA_MISSING[@]}" $((1 + ${#EVAL_SET_NAMES[@]})) "$DATA_DIR"
    show_and_run env PYTHONPATH="$REPO_ROOT" "$PYTHON" -m "$DATA_MODULE" --out "$DATA_DIR" "${data_args[@]}" ||
      die 1 "[data] python -m $DATA_MODULE failed (it needs the Hugging Face hub, or DATA_ARGS='--source NAME=PATH ...')"
  else
    printf '# [data] skip: DATA_DIR=%s has every file\n' "$DATA_DIR"
  fi

  if [[ "$TORCH_DIST_STATE" == missing ]]; then
    printf '# [torch_dist] convert MODEL_DIR=%s to TORCH_DIST_DIR=%s\n' "$MODEL_DIR" "$TORCH_DIST_DIR"
    convert torch_dist "$TORCH_DIST_DIR" verify_torch_dist \
      env PYTHONPATH="$pythonpath" torchrun --nproc-per-node "$GPUS_PER_NODE" \
      "$SLIME_DIR/tools/convert_hf_to_torch_dist.py" "${MODEL_ARGS[@]}" \
      --hf-checkpoint "$MODEL_DIR" --save "$TORCH_DIST_DIR.partial"
  else
    printf '# [torch_dist] skip: TORCH_DIST_DIR=%s is %s\n' "$TORCH_DIST_DIR" "$TORCH_DIST_STATE"
  fi

  if [[ "$FP8_STATE" == missing ]]; then
    printf '# [fp8] convert MODEL_DIR=%s to FP8_HF_DIR=%s (block 128x128 e4m3)\n' "$MODEL_DIR" "$FP8_HF_DIR"
    convert fp8 "$FP8_HF_DIR" verify_fp8 \
      env PYTHONPATH="$pythonpath" "$PYTHON" "$SLIME_DIR/tools/convert_hf_to_fp8.py" \
      --model-dir "$MODEL_DIR" --save-dir "$FP8_HF_DIR.partial" --strategy block --block-size 128 128 \
      --max-workers "$FP8_CONVERT_WORKERS"
  else
    printf '# [fp8] skip: FP8_HF_DIR=%s is %s\n' "$FP8_HF_DIR" "$FP8_STATE"
  fi
}

# ---------------------------------------------------------------------------------------------------------------

launcher_main() {
  parse_cli "$@"
  declare_settings
  if ((MODE_HELP)); then
    usage
    exit 0
  fi
  load_model_args
  validate_config
  if ((MODE_PREPARE)); then
    run_prepare
    exit 0
  fi
  build_submit_command
  collect_path_problems
  print_summary
  if ((MODE_DRY_RUN)); then
    ((${#PATH_PROBLEMS[@]} == 0)) || report_list "warning (an error at launch)" "${PATH_PROBLEMS[@]}"
    print_command "${SUBMIT_COMMAND[@]}"
    exit 0
  fi
  preflight_launch
  if ((${#PATH_PROBLEMS[@]} + ${#CLUSTER_PROBLEMS[@]})); then
    report_list error "${PATH_PROBLEMS[@]}" "${CLUSTER_PROBLEMS[@]}"
    die 1 "preflight failed; nothing was submitted"
  fi
  mkdir -p -- "$SAVE_DIR"
  note "submitting:"
  print_command "${SUBMIT_COMMAND[@]}" >&2
  exec "${SUBMIT_COMMAND[@]}"
}
