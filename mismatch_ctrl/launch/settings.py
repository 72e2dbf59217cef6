"""The launchers' settings: environment variables with defaults (an unset or empty variable takes the default).

Defaults may depend on earlier settings and on the model profile (``MODEL_DIR=/root/<hf name>``); the launcher
script supplies ``METHOD``, ``MODEL`` and ``TRAIN_PRECISION`` defaults, the bash wrapper ``REPO_ROOT`` and ``PYTHON``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable, Mapping

from ..errors import ConfigError
from .profiles import PROFILES, ModelProfile

TRAIN_SET_FILE = "dapo-math-17k.jsonl"
DATA_MODULE = "recipes.qwen3_30b_a3b.data"
PRECISIONS = ("bf16", "fp8", "fp16")
RUN_NAME_SUFFIX = {"bf16": "", "fp8": "_fp8train", "fp16": "_fp16"}

Default = Callable[[Mapping[str, str], ModelProfile], str]


@dataclass(frozen=True)
class Setting:
    name: str
    default: Default
    doc: str


def _fixed(value: object) -> Default:
    return lambda values, profile: str(value)


def _given(name: str) -> Default:
    """A default the launcher script or the bash wrapper supplies (``--default NAME=VALUE``)."""
    return lambda values, profile: values.get(f"default:{name}", "")


def _run_name(v: Mapping[str, str], p: ModelProfile) -> str:
    return f"{v['MODEL']}_{v['METHOD']}" + RUN_NAME_SUFFIX.get(v["TRAIN_PRECISION"], "")


S = Setting
SECTIONS: tuple[tuple[str, tuple[Setting, ...]], ...] = (
    ("Method and model", (
        S("METHOD", _given("METHOD"), "method; selects configs/methods/<METHOD>.yaml"),
        S("MODEL", _given("MODEL"), "model profile: " + ", ".join(
            f"{name} ({profile.kind})" for name, profile in PROFILES.items()) + "; sets the layout defaults"),
        S("TRAIN_PRECISION", _given("TRAIN_PRECISION"), "bf16 (Megatron BF16), fp8 (Transformer Engine FP8 "
          "training, blockwise e4m3: slime's precision-alignment recipe; both with FP8 rollouts on FP8_HF_DIR) or "
          "fp16 (FP16 precision alignment, Qi et al. 2025: Megatron --fp16 with dynamic loss scaling, and slime "
          "starts SGLang with dtype float16 on the BF16 checkpoint MODEL_DIR; no FP8 checkpoint)"),
        S("RUN_NAME", _run_name, "names SAVE_DIR and the wandb group; every launcher has its own"),
        S("REPO_ROOT", _given("REPO_ROOT"), "this repository; the same path must exist on every node (job PYTHONPATH)"),
        S("METHOD_CONFIG", lambda v, p: f"{v['REPO_ROOT']}/configs/methods/{v['METHOD']}.yaml",
          "method YAML for --custom-config-path"),
        S("MODEL_ARGS_FILE", lambda v, p: f"{v['REPO_ROOT']}/recipes/{v['MODEL']}/model.sh",
          "bash file defining the Megatron MODEL_ARGS array"),
        S("EVAL_PROTOCOL", _fixed("light"), "light: the six benchmarks at the training response length with few "
          "samples (recipes/qwen3_30b_a3b/eval_light.yaml, every 50 rollouts, ~9% of the run's tokens); full: the "
          "paper-style protocol (eval.yaml: up to 32k tokens, 4-32 samples, every 20 rollouts, ~79%)"),
        S("EVAL_CONFIG", lambda v, p: f"{v['REPO_ROOT']}/recipes/qwen3_30b_a3b/"
          f"{'eval.yaml' if v['EVAL_PROTOCOL'] == 'full' else 'eval_light.yaml'}",
          "slime --eval-config file (default from EVAL_PROTOCOL)"),
        S("ALLOW_MODEL_SHAPE_MISMATCH", _fixed(0), "1: accept an FP8_HF_DIR config.json whose numbers differ from "
          "MODEL_ARGS_FILE (layers, hidden size, heads, experts, ...); a checkpoint of the other kind (dense / MoE) is "
          "refused regardless"),
    )),
    ("Paths on the cluster", (
        S("SLIME_DIR", _fixed("/root/slime"), "slime checkout (train.py, tools/)"),
        S("MEGATRON_DIR", _fixed("/root/Megatron-LM"), "Megatron-LM checkout (goes first on the job PYTHONPATH)"),
        S("MODEL_DIR", lambda v, p: f"/root/{p.hf_name}", "BF16 Hugging Face checkpoint; input of --prepare; with "
          "TRAIN_PRECISION=fp16 SGLang serves it, in float16 (--hf-checkpoint)"),
        S("FP8_HF_DIR", lambda v, p: f"/root/{p.hf_name}-FP8",
          "FP8 block-128 Hugging Face checkpoint for SGLang (--hf-checkpoint; not used with TRAIN_PRECISION=fp16); "
          "its config.json drives the layout checks"),
        S("TORCH_DIST_DIR", lambda v, p: f"/root/{p.hf_name}_torch_dist",
          "BF16 Megatron torch_dist checkpoint (--ref-load)"),
        S("SAVE_DIR", lambda v, p: f"/root/runs/{v['RUN_NAME']}",
          "run checkpoints (--save); a shared file system for several nodes"),
        S("LOAD_DIR", lambda v, p: v["SAVE_DIR"],
          "resume from here if it holds a checkpoint, else start from TORCH_DIST_DIR (--load)"),
        S("DATA_DIR", _fixed("/root/data"),
          f"recipe data: {TRAIN_SET_FILE} and eval/*.jsonl; exported to the job for EVAL_CONFIG"),
        S("PROMPT_DATA", lambda v, p: f"{v['DATA_DIR']}/{TRAIN_SET_FILE}", "training prompts (--prompt-data)"),
    )),
    ("Cluster", (
        S("NUM_NODES", _fixed(1), "nodes (--actor-num-nodes)"),
        S("GPUS_PER_NODE", _fixed(8), "GPUs per node (--actor-num-gpus-per-node, --num-gpus-per-node)"),
        S("RAY_ADDRESS", _fixed("http://127.0.0.1:8265"), "Ray dashboard address for ray job submit"),
        S("PYTHON", _given("PYTHON"), "python for check-config, preflight imports and --prepare"),
        S("NCCL_NVLS_ENABLE", _fixed("auto"), "0, 1, or auto (1 when nvidia-smi topo -m shows NVLink)"),
        S("PASS_ENV", _fixed(""), "names of extra variables copied into the job env, e.g. 'WANDB_API_KEY "
          "RECIPE_RM_WORKERS' (values appear in the printed command)"),
    )),
    ("Parallel layout and memory", (
        S("TP", lambda v, p: str(p.tp), "tensor parallel (--tensor-model-parallel-size; --sequence-parallel when > 1)"),
        S("PP", _fixed(1), "pipeline parallel (--pipeline-model-parallel-size)"),
        S("CP", _fixed(1), "context parallel (--context-parallel-size)"),
        S("EP", lambda v, p: str(p.ep), "expert parallel (--expert-model-parallel-size); 1 for dense models"),
        S("ETP", _fixed(1), "expert tensor parallel (--expert-tensor-parallel-size)"),
        S("ROLLOUT_GPUS_PER_ENGINE", lambda v, p: str(p.rollout_gpus_per_engine),
          "GPUs per SGLang engine (--rollout-num-gpus-per-engine): the engine's tensor parallel size"),
        S("ROLLOUT_EP", lambda v, p: str(p.rollout_ep),
          "SGLang expert parallel per engine (--sglang-ep-size); MoE only. FP8 block-128 experts need "
          "moe_intermediate_size / (ROLLOUT_GPUS_PER_ENGINE / ROLLOUT_EP) to be a multiple of 128"),
        S("OPTIMIZER_CPU_OFFLOAD", lambda v, p: str(int(p.optimizer_cpu_offload)),
          "1: Adam on CPU (--optimizer-cpu-offload --overlap-cpu-optimizer-d2h-h2d --use-precision-aware-optimizer)"),
        S("MAX_TOKENS_PER_GPU", lambda v, p: str(p.max_tokens_per_gpu), "--max-tokens-per-gpu (dynamic batch size)"),
        S("SGLANG_MEM_FRACTION", _fixed(0.7), "--sglang-mem-fraction-static"),
        S("GPU_MEMORY_GB", _fixed(80), "memory of one GPU in GB (H100: 80); the memory estimate warns above it"),
    )),
    ("Training", (
        S("NUM_ROLLOUT", _fixed(500), "rollouts to train (--num-rollout); keep it fixed across resumes"),
        S("ROLLOUT_BATCH_SIZE", _fixed(64), "prompts per rollout (--rollout-batch-size)"),
        S("N_SAMPLES_PER_PROMPT", _fixed(8), "responses per prompt (--n-samples-per-prompt)"),
        S("GLOBAL_BATCH_SIZE", _fixed(128),
          "samples per optimizer step (--global-batch-size); keep it fixed across resumes"),
        S("MAX_RESPONSE_LEN", _fixed(8192), "--rollout-max-response-len"),
        S("ROLLOUT_TEMPERATURE", _fixed(1), "--rollout-temperature"),
        S("LR", _fixed("1e-6"), "--lr (constant schedule; the method's hooks may scale it)"),
        S("EPS_CLIP", _fixed(0.2), "--eps-clip"),
        S("EPS_CLIP_HIGH", _fixed(0.28), "--eps-clip-high"),
        S("SAVE_INTERVAL", _fixed(20), "--save-interval (rollouts)"),
        S("EVAL_INTERVAL", lambda v, p: "20" if v["EVAL_PROTOCOL"] == "full" else "50",
          "--eval-interval (rollouts; default from EVAL_PROTOCOL); 0 turns evaluation off"),
        S("SKIP_EVAL_BEFORE_TRAIN", _fixed(0), "1: --skip-eval-before-train"),
        S("ROUTING_REPLAY", _fixed(0), "1: --use-rollout-routing-replay (R3, MoE only). It removes the routing part "
          "of the train/rollout mismatch, so calibrate eps with and without it"),
    )),
    ("Logging (off unless set)", (
        S("WANDB_PROJECT", _fixed(""), "wandb project: --use-wandb --wandb-project (key: WANDB_API_KEY in the Ray "
          "nodes' env, or PASS_ENV)"),
        S("WANDB_GROUP", lambda v, p: v["RUN_NAME"], "--wandb-group"),
        S("WANDB_TEAM", _fixed(""), "--wandb-team"),
        S("TENSORBOARD_DIR", _fixed(""), "TensorBoard log dir: --use-tensorboard, TENSORBOARD_DIR in the job env"),
    )),
    ("Preparation (--prepare)", (
        S("DATA_ARGS", _fixed(""),
          f"extra arguments of python -m {DATA_MODULE}, e.g. '--source aime24=/mnt/aime24.parquet'"),
        S("FP8_CONVERT_WORKERS", _fixed(4), "--max-workers of tools/convert_hf_to_fp8.py"),
    )),
)

POSITIVE_INTEGERS = ("NUM_NODES", "GPUS_PER_NODE", "TP", "PP", "CP", "EP", "ETP", "ROLLOUT_GPUS_PER_ENGINE",
                     "ROLLOUT_EP", "NUM_ROLLOUT", "ROLLOUT_BATCH_SIZE", "N_SAMPLES_PER_PROMPT", "GLOBAL_BATCH_SIZE",
                     "MAX_RESPONSE_LEN", "MAX_TOKENS_PER_GPU", "SAVE_INTERVAL", "FP8_CONVERT_WORKERS")
FLAGS = ("OPTIMIZER_CPU_OFFLOAD", "SKIP_EVAL_BEFORE_TRAIN", "ROUTING_REPLAY", "ALLOW_MODEL_SHAPE_MISMATCH")
POSITIVE_NUMBERS = {"LR": "1e-6", "ROLLOUT_TEMPERATURE": "1.0", "EPS_CLIP": "0.2", "EPS_CLIP_HIGH": "0.28"}
"""Settings that must be finite numbers > 0, with an example each."""
SANE_RANGES = {
    "LR": (0.0, 1e-3, "Adam's learning rate: RL fine-tuning of an LLM uses ~1e-6; a rate above 1e-3 wrecks the "
                      "pretrained weights within a few steps"),
    "ROLLOUT_TEMPERATURE": (0.1, 2.0, "the sampling temperature: below 0.1 every sample of a prompt is the same and "
                                      "GRPO's advantages vanish (slime also divides the training logits by it); above "
                                      "2 the samples are noise"),
    "EPS_CLIP": (0.0, 0.99, "slime clips the ratio from below at 1 - EPS_CLIP, which must stay above 0"),
    "EPS_CLIP_HIGH": (0.0, 1.0, "slime clips the ratio from above at 1 + EPS_CLIP_HIGH; DAPO's clip-higher uses "
                                "0.28"),
}
"""(lowest, highest, why) of the numbers a run can take: values no run should get are refused before any command."""
MOST_GPUS = 65536
"""More GPUs than a cluster gives one job: the bound of every count of GPUs or of their parallel groups."""
UPPER_BOUNDS = {
    "NUM_NODES": (MOST_GPUS // 8, "more nodes than a cluster gives one job"),
    "GPUS_PER_NODE": (16, "a node holds at most 16 GPUs (an H100 HGX node: 8)"),
    **{name: (MOST_GPUS, "more GPUs than a cluster gives one job") for name in
       ("TP", "PP", "CP", "EP", "ETP", "ROLLOUT_GPUS_PER_ENGINE", "ROLLOUT_EP")},
    "N_SAMPLES_PER_PROMPT": (1024, "samples of one prompt, each a request SGLang generates; RL recipes use 4 to 64"),
    "ROLLOUT_BATCH_SIZE": (65536, "prompts of one rollout, all held by slime's rollout manager at once"),
    "GLOBAL_BATCH_SIZE": (65536, "at most the samples of one rollout (ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT)"),
    "NUM_ROLLOUT": (10**6, "a rollout takes minutes on a cluster: a million of them is years"),
    "MAX_RESPONSE_LEN": (1 << 20, "no rollout engine's context holds a million tokens"),
    "MAX_TOKENS_PER_GPU": (1 << 20, "a micro-batch of a million tokens does not fit one GPU beside the model"),
    "SAVE_INTERVAL": (10**6, "at most NUM_ROLLOUT's bound"),
    "EVAL_INTERVAL": (10**6, "at most NUM_ROLLOUT's bound"),
    "FP8_CONVERT_WORKERS": (256, "processes of the FP8 conversion on one node"),
}
"""(highest, why) of the counts a cluster can hold; checked on the text before it is read as a number."""
PATH_SETTINGS = ("REPO_ROOT", "METHOD_CONFIG", "MODEL_ARGS_FILE", "EVAL_CONFIG", "SLIME_DIR", "MEGATRON_DIR",
                 "MODEL_DIR", "FP8_HF_DIR", "TORCH_DIST_DIR", "SAVE_DIR", "LOAD_DIR", "DATA_DIR", "PROMPT_DATA",
                 "TENSORBOARD_DIR")
"""Settings that are paths: Ray runs the job's processes in other working directories, so a relative path given
here is made absolute against the launcher's (:attr:`Settings.made_absolute`)."""
MOST_GPU_MEMORY_GB = 1024
"""More memory than one GPU has (an H200: 141 GB; a B200: 192 GB): a larger GPU_MEMORY_GB is a value in MB, and would
keep every memory warning quiet."""
_POSITIVE = re.compile(r"[1-9][0-9]*")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class Settings:
    """Every setting's value and default (both strings), the model profile, and typed reads."""

    def __init__(self, environ: Mapping[str, str], given: Mapping[str, str]):
        """``given``: the launcher's defaults (``METHOD``, ``MODEL``, ``TRAIN_PRECISION``, ``REPO_ROOT``,
        ``PYTHON``). Raises :class:`ConfigError` for an unknown ``MODEL`` (no profile, no defaults)."""
        self.environ = environ
        context: dict[str, str] = {f"default:{name}": value for name, value in given.items()}
        context.setdefault("default:TRAIN_PRECISION", "bf16")
        self.values: dict[str, str] = {}
        self.defaults: dict[str, str] = {}
        self.profile: ModelProfile | None = None
        self.made_absolute: dict[str, str] = {}
        """The relative paths given (setting -> the value as given), now absolute against the working directory."""
        for _, settings in SECTIONS:
            for setting in settings:
                default = setting.default({**context, **self.values}, self.profile)  # type: ignore[arg-type]
                self.defaults[setting.name] = default
                self.values[setting.name] = environ.get(setting.name) or default
                value = self.values[setting.name]
                if setting.name in PATH_SETTINGS and value and not value.startswith(("/", "~")):
                    self.made_absolute[setting.name] = value
                    self.values[setting.name] = os.path.join(os.getcwd(), value)
                if setting.name == "METHOD" and not self.values["METHOD"]:
                    raise ConfigError("METHOD is not set: give a method (configs/methods/<METHOD>.yaml)")
                if setting.name == "MODEL":
                    self.profile = PROFILES.get(self.values["MODEL"])
                    if self.profile is None:
                        raise ConfigError(f"MODEL={self.values['MODEL']} is unknown; known models: " + ", ".join(
                            f"{name} ({profile.kind})" for name, profile in PROFILES.items()))

    def __getitem__(self, name: str) -> str:
        return self.values[name]

    @property
    def rollout_checkpoint(self) -> str:
        """The setting naming the checkpoint SGLang serves (``--hf-checkpoint``): ``MODEL_DIR`` (the BF16 model,
        cast to float16) with ``TRAIN_PRECISION=fp16``, else ``FP8_HF_DIR``."""
        return "MODEL_DIR" if self.values["TRAIN_PRECISION"] == "fp16" else "FP8_HF_DIR"

    def int(self, name: str) -> int:
        return int(self.values[name])

    def flag(self, name: str) -> bool:
        return self.values[name] == "1"

    def is_positive_integer(self, name: str) -> bool:
        """Whether ``name`` holds a positive integer (:meth:`problems` names it otherwise)."""
        return bool(_POSITIVE.fullmatch(self[name]))

    @property
    def pass_env(self) -> list[str]:
        return self.values["PASS_ENV"].split()

    def problems(self) -> list[str]:
        """A line per value of the wrong form (integers and their bounds, 0/1 flags, choices, PASS_ENV names, a path
        starting with ``~``)."""
        out = [f"{name}={self[name]} must be a positive integer" for name in POSITIVE_INTEGERS
               if not self.is_positive_integer(name)]
        if not re.fullmatch(r"0|[1-9][0-9]*", self["EVAL_INTERVAL"]):  # the form of the other integers
            out.append(f"EVAL_INTERVAL={self['EVAL_INTERVAL']} must be 0 (off) or a positive integer")
        for name, (highest, why) in UPPER_BOUNDS.items():
            text = self[name]
            if text.isdigit() and (len(text) > len(str(highest)) or int(text) > highest):
                out.append(f"{name}={text[:24]}{'...' if len(text) > 24 else ''} is above {highest}: {why}")
        out += [f"{name}={self[name]} starts with '~', which nothing expands here (a quoted value keeps it): write "
                "the path in full ($HOME/... in place of ~/...)" for name in PATH_SETTINGS
                if self[name].startswith("~")]
        out += [f"{name}={self[name]} must be 0 or 1" for name in FLAGS if self[name] not in ("0", "1")]
        if self["NCCL_NVLS_ENABLE"] not in ("0", "1", "auto"):
            out.append(f"NCCL_NVLS_ENABLE={self['NCCL_NVLS_ENABLE']} must be 0, 1 or auto")
        if self["EVAL_PROTOCOL"] not in ("light", "full"):
            out.append(f"EVAL_PROTOCOL={self['EVAL_PROTOCOL']} must be light or full")
        if self["TRAIN_PRECISION"] not in PRECISIONS:
            out.append(f"TRAIN_PRECISION={self['TRAIN_PRECISION']} must be one of {', '.join(PRECISIONS)}")
        for name, example in POSITIVE_NUMBERS.items():
            value, (low, high, why) = _number(self[name]), SANE_RANGES[name]
            if not 0 < value < float("inf"):
                out.append(f"{name}={self[name]} must be a finite number > 0, e.g. {name}={example}")
            elif not low <= value <= high:
                out.append(f"{name}={self[name]} is outside [{low:g}, {high:g}]: {why} (default {self.defaults[name]})")
        for name, low, high in (("SGLANG_MEM_FRACTION", 0.0, 1.0), ("GPU_MEMORY_GB", 0.0, MOST_GPU_MEMORY_GB)):
            if not low < _number(self[name]) < high:
                out.append(f"{name}={self[name]} must be a number in ({low:g}, {high:g})" + (
                    f": the memory of one GPU in GB (H100: 80, H200: 141; {high:g} is more than any GPU has: a value "
                    "in MB?)" if name == "GPU_MEMORY_GB" else ""))
        run_name = self["RUN_NAME"]
        if run_name in (".", "..") or "/" in run_name or not run_name.isprintable():
            out.append(f"RUN_NAME={run_name!r} must be a plain name (no '/', no control characters, not . or ..): it "
                       "names the run's folder under /root/runs (the default SAVE_DIR) and its wandb group")
        for name in self.pass_env:
            if not _NAME.fullmatch(name):
                out.append(f"PASS_ENV holds '{name}', which is not a variable name")
            elif name not in self.environ:
                out.append(f"PASS_ENV names {name}, which is not set in this environment")
        return out


def _number(text: str) -> float:
    """``text`` as a float; NaN when it is not a number (NaN fails every range check)."""
    try:
        return float(text)
    except ValueError:
        return float("nan")


def setting_of_flag(flag: str) -> list[str]:
    """The settings whose documentation names ``flag`` (e.g. ``--lr`` -> LR), as ``--help`` lists them."""
    pattern = re.compile(re.escape(flag) + r"(?![\w-])")
    return [setting.name for _, section in SECTIONS for setting in section if pattern.search(setting.doc)]


def usage(launcher: str, settings: Settings) -> str:
    """The ``--help`` text: modes, exit codes, every setting with its default and, if overridden, its value."""
    method, model = settings.defaults["METHOD"], settings.defaults["MODEL"]
    precision = settings.defaults["TRAIN_PRECISION"].upper()
    lines = [
        f"usage: {launcher} [--dry-run] [--prepare] [--help] [-- EXTRA_TRAIN_ARGS...]",
        "",
        f"Train {model} with method {method} on slime: SGLang rollouts on the "
        f"{'BF16 checkpoint in float16' if precision == 'FP16' else 'FP8 checkpoint'}, Megatron {precision}",
        "training, colocated on the same GPUs, submitted with ray job submit. Arguments after -- are appended to "
        "train.py's;",
        "before submitting, slime's own parsers must read each of their flags as written (full names).",
        "",
        "modes:",
        "  (none)      check the configuration and the cluster (GPUs, Ray, imports, checkpoints, data), then submit "
        "the job",
        "  --dry-run   check the configuration and the layout, estimate memory, warn about missing cluster paths,",
        "              print the ray job submit command; exit 0 if the layout is valid, else 2",
        "  --prepare   write the data, convert MODEL_DIR to TORCH_DIST_DIR (torch_dist) and to FP8_HF_DIR (FP8 block "
        "128)",
        "              where a complete output (marker .mismatch_ctrl_complete) is missing; with --dry-run, print the "
        "steps",
        "",
        "exit codes: 0 success, 1 preflight/preparation failure, 2 bad configuration or usage",
        "",
        "environment variables (NAME=default; an empty value means the default; [now: ...] shows an override):",
    ]
    for title, section in SECTIONS:
        lines += ["", f"  {title}"]
        for setting in section:
            lines += [f"    {setting.name}={settings.defaults[setting.name]}", f"        {setting.doc}"]
            if settings[setting.name] != settings.defaults[setting.name]:
                lines.append(f"        [now: {settings[setting.name]}]")
    return "\n".join(lines) + "\n"
