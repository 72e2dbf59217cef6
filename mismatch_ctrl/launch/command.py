"""The ``ray job submit ... -- python3 <slime>/train.py ...`` command.

Flags are spelled as slime 624b824a, Megatron-LM 1dcf0daf and SGLang 0.5.15.post1 define them (the list checked
against their parsers is :data:`.known_flags.PASSED_FLAGS`). SGLang server arguments pass
through slime as ``--sglang-<flag>`` (``slime/backends/sglang_utils/arguments.py::add_sglang_arguments``); the
spellings used here are the primary, non-deprecated ones of SGLang 0.5.15.post1
(``python/sglang/srt/server_args.py``): ``--sglang-ep-size`` (field ``ep_size``; ``--expert-parallel-size`` and
``--ep`` are aliases) and ``--sglang-cuda-graph-bs-decode`` (``--cuda-graph-bs`` is a deprecated alias there and an
ambiguous prefix once it is removed).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from typing import Sequence

from ..slime.names import HOOK_FLAGS
from .model_shape import MegatronModel
from .quoting import for_ray
from .settings import Settings

REWARD_FUNCTION = "recipes.qwen3_30b_a3b.reward.rm"
CUDA_GRAPH_BATCH_SIZES = (1, 2, 4, 8, *range(16, 257, 8))
# slime's scripts/low_precision/run-qwen3-30b-a3b-fp8.sh: FP8 training with Transformer Engine, blockwise e4m3.
FP8_TRAINING_ARGS = ("--transformer-impl", "transformer_engine", "--fp8-format", "e4m3", "--fp8-recipe", "blockwise")
# FP16 precision alignment: Megatron's --fp16 (megatron/core/model_parallel_config.py:109, a flag through
# ArgumentGroupFactory(TransformerConfig), megatron/training/arguments.py:1644) with its dynamic loss scaler (defaults
# arguments.py:2213-2224); slime then sets bf16 = not fp16 (slime/backends/megatron_utils/arguments.py:157) and starts
# SGLang with dtype float16 (slime/backends/sglang_utils/sglang_engine.py:571-572).
PRECISION_TRAINING_ARGS = {"bf16": (), "fp8": FP8_TRAINING_ARGS, "fp16": ("--fp16",)}


def job_pythonpath(s: Settings) -> str:
    """Megatron-LM, slime and this repository: every Ray actor imports the hooks and the recipe from there."""
    return f"{s['MEGATRON_DIR']}:{s['SLIME_DIR']}:{s['REPO_ROOT']}"


def job_env(s: Settings) -> dict[str, str]:
    """This process's environment with the job's PYTHONPATH first: how a check imports what the job will import."""
    inherited = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": job_pythonpath(s) + (f":{inherited}" if inherited else "")}


def nvls_enable(setting: str) -> str:
    """``NCCL_NVLS_ENABLE``: the setting, or for ``auto`` 1 when ``nvidia-smi topo -m`` shows NVLink (``NV<n>``)."""
    if setting != "auto":
        return setting
    if shutil.which("nvidia-smi") is None:
        return "0"
    try:
        topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "0"
    return "1" if re.search(r"NV[0-9]+", topology) else "0"


def runtime_env(s: Settings, nvls: str) -> str:
    """The Ray runtime-env JSON of the job."""
    env = {"PYTHONPATH": job_pythonpath(s), "CUDA_DEVICE_MAX_CONNECTIONS": "1", "NCCL_NVLS_ENABLE": nvls,
           "PYTHONUNBUFFERED": "1", "DATA_DIR": s["DATA_DIR"]}
    if s["TENSORBOARD_DIR"]:
        env["TENSORBOARD_DIR"] = s["TENSORBOARD_DIR"]
    if s["TRAIN_PRECISION"] == "fp8":
        env["NVTE_FP8_BLOCK_SCALING_FP32_SCALES"] = "1"  # fp32 block scales, as slime's FP8 training script sets
    for name in s.pass_env:
        env[name] = s.environ[name]
    return json.dumps({"env_vars": env}, separators=(",", ":"))


def train_args(s: Settings, model: MegatronModel, extra: Sequence[str]) -> list[str]:
    """``train.py``'s arguments; ``extra`` (the user's, after ``--``) come last so that they win."""
    nodes, gpus = s["NUM_NODES"], s["GPUS_PER_NODE"]
    moe = model.is_moe
    args = [
        "--actor-num-nodes", nodes, "--actor-num-gpus-per-node", gpus, "--num-gpus-per-node", gpus, "--colocate",
        *model.args,
        "--hf-checkpoint", s[s.rollout_checkpoint], "--ref-load", s["TORCH_DIST_DIR"], "--load", s["LOAD_DIR"],
        "--save", s["SAVE_DIR"], "--save-interval", s["SAVE_INTERVAL"],
        "--prompt-data", s["PROMPT_DATA"], "--input-key", "prompt", "--label-key", "label", "--apply-chat-template",
        "--rollout-shuffle", "--custom-rm-path", REWARD_FUNCTION,
        "--num-rollout", s["NUM_ROLLOUT"], "--rollout-batch-size", s["ROLLOUT_BATCH_SIZE"],
        "--n-samples-per-prompt", s["N_SAMPLES_PER_PROMPT"], "--rollout-max-response-len", s["MAX_RESPONSE_LEN"],
        "--rollout-temperature", s["ROLLOUT_TEMPERATURE"], "--global-batch-size", s["GLOBAL_BATCH_SIZE"],
        "--balance-data",
    ]
    if s.int("EVAL_INTERVAL") > 0:
        args += ["--eval-config", s["EVAL_CONFIG"], "--eval-interval", s["EVAL_INTERVAL"]]
        if s.flag("SKIP_EVAL_BEFORE_TRAIN"):
            args.append("--skip-eval-before-train")
    args += ["--tensor-model-parallel-size", s["TP"]]
    if s.int("TP") > 1:
        args.append("--sequence-parallel")  # Megatron's MoE layer raises in training for TP > 1 without it
    args += ["--pipeline-model-parallel-size", s["PP"], "--context-parallel-size", s["CP"]]
    if moe:
        args += ["--expert-model-parallel-size", s["EP"], "--expert-tensor-parallel-size", s["ETP"]]
    args += PRECISION_TRAINING_ARGS.get(s["TRAIN_PRECISION"], ())
    args += [
        "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
        "--use-dynamic-batch-size", "--max-tokens-per-gpu", s["MAX_TOKENS_PER_GPU"],
        "--advantage-estimator", "grpo", "--eps-clip", s["EPS_CLIP"], "--eps-clip-high", s["EPS_CLIP_HIGH"],
    ]
    for flag, path in HOOK_FLAGS.items():
        args += [flag, path]
    args += ["--custom-config-path", s["METHOD_CONFIG"], "--get-mismatch-metrics"]
    if s.flag("ROUTING_REPLAY"):
        args.append("--use-rollout-routing-replay")
    args += ["--optimizer", "adam", "--lr", s["LR"], "--lr-decay-style", "constant", "--weight-decay", "0.1",
             "--adam-beta1", "0.9", "--adam-beta2", "0.98"]
    if s.flag("OPTIMIZER_CPU_OFFLOAD"):
        args += ["--optimizer-cpu-offload", "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer"]
    args += ["--rollout-num-gpus-per-engine", s["ROLLOUT_GPUS_PER_ENGINE"]]
    if moe:
        args += ["--sglang-ep-size", s["ROLLOUT_EP"]]
    args += ["--sglang-mem-fraction-static", s["SGLANG_MEM_FRACTION"],
             "--sglang-cuda-graph-bs-decode", *map(str, CUDA_GRAPH_BATCH_SIZES),
             "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",
             "--attention-softmax-in-fp32", "--attention-backend", "flash"]
    if s["WANDB_PROJECT"]:
        args += ["--use-wandb", "--wandb-project", s["WANDB_PROJECT"], "--wandb-group", s["WANDB_GROUP"]]
        if s["WANDB_TEAM"]:
            args += ["--wandb-team", s["WANDB_TEAM"]]
    if s["TENSORBOARD_DIR"]:
        args.append("--use-tensorboard")
    return args + list(extra)


def entrypoint(s: Settings, model: MegatronModel, extra: Sequence[str]) -> list[str]:
    """The job's command: ``python3 <SLIME_DIR>/train.py`` and its arguments, as train.py must receive them."""
    return ["python3", f"{s['SLIME_DIR']}/train.py", *train_args(s, model, extra)]


def submit_command(s: Settings, model: MegatronModel, extra: Sequence[str], nvls: str,
                   ray: tuple[int, int] | None = None) -> list[str]:
    """``ray job submit`` with the entrypoint quoted for the ``ray`` of version ``ray`` (``quoting.for_ray``)."""
    return ["ray", "job", "submit", "--address", s["RAY_ADDRESS"], "--runtime-env-json", runtime_env(s, nvls),
            "--", *for_ray(entrypoint(s, model, extra), ray)]


def format_command(words: Sequence[str]) -> str:
    """A copy-pasteable command; a long one gets a backslash-newline before every ``--option``."""
    long = len(words) > 6
    out = []
    for i, word in enumerate(words):
        if i:
            out.append(" \\\n  " if long and word.startswith("--") else " ")
        out.append(shlex.quote(word))
    return "".join(out)
