"""``python -m mismatch_ctrl.launch [--launcher NAME] [--default NAME=VALUE ...] -- [USER ARGUMENTS]``.

The bash launchers (``launch/*.sh`` via ``launch/lib.sh``) call this with their defaults; the user's arguments come
after ``--``: ``--dry-run``, ``--prepare``, ``--help`` and ``-- EXTRA_TRAIN_ARGS``. Exit codes: 0 success, 1
preflight or preparation failure, 2 bad configuration or usage. Messages go to stderr as ``LAUNCHER: ...``; the
command (and ``--prepare``'s steps) to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, Sequence

from ..errors import ConfigError, StateError
from ..formatting import clip
from ..slime.names import TRACKER
from .command import entrypoint, format_command, job_env, nvls_enable, submit_command, train_args
from .layout import Layout, engine_problems, trainer_problems
from .context_length import (OVERRIDE_FLAG, RequestedLength, context_override, flag_value_in, override_problems,
                             response_length_problems)
from .eval_cost import eval_cost
from .memory import estimate, rollout_cost_lines
from .model_shape import CheckpointReport, MegatronModel, ModelShape, inspect_checkpoint, read_model_args
from .precision import precision_problems
from .prepare import Preparation, PrepareFailed
from .profiles import checkpoint_kind_problems
from .quoting import entrypoint_problems, ray_version, runtime_env_problems, unknown_ray_problems
from .preflight import (EVAL_CONFIG_ERRORS, IMPORT_TARGETS, dry_run_flag_problems, eval_sets, file_problem,
                        flag_problems, host_memory_bytes, import_problems, local_gpu_problems, path_problems,
                        ray_problems, resume_point, user_flags)
from .settings import Settings, setting_of_flag, usage
from .values import absolute_path_notes, group_size_problems, option_like_problems, samples_problems

REPO_ROOT = str(Path(__file__).resolve().parents[2])
COMPUTE = {"bf16": "BF16", "fp8": "FP8 blockwise e4m3 (Transformer Engine)",
           "fp16": "FP16 (Megatron --fp16 with dynamic loss scaling)"}
"""The trainer's compute per TRAIN_PRECISION, as the summary names it."""
INTEGER_FLAGS = ("--eval-max-response-len", "--rollout-max-prompt-len", "--eval-max-prompt-len",
                "--n-samples-per-eval-prompt")
"""slime's integer flags after ``--`` that the launcher's checks read."""


class Stop(Exception):
    """End the launcher with ``code`` (the message, if any, was already reported)."""

    def __init__(self, code: int):
        super().__init__(code)
        self.code = code


@dataclass
class Report:
    """Messages on stderr, prefixed with the launcher's name."""

    launcher: str

    def note(self, message: str) -> None:
        print(f"{self.launcher}: {message}", file=sys.stderr, flush=True)

    def warn(self, message: str) -> None:
        self.note(f"warning: {message}")

    def lines(self, label: str, items: Sequence[str]) -> None:
        for item in items:
            self.note(f"{label}: {item}")

    def die(self, code: int, message: str) -> NoReturn:
        self.note(f"error: {message}")
        raise Stop(code)


@dataclass
class UserArgs:
    dry_run: bool = False
    prepare: bool = False
    help: bool = False
    extra: list[str] = field(default_factory=list)


def parse_user_args(argv: Sequence[str], report: Report) -> UserArgs:
    out = UserArgs()
    for i, word in enumerate(argv):
        if word == "--dry-run":
            out.dry_run = True
        elif word == "--prepare":
            out.prepare = True
        elif word in ("-h", "--help"):
            out.help = True
        elif word == "--":
            out.extra = list(argv[i + 1:])
            break
        else:
            report.die(2, f"unknown option '{word}' (see --help; arguments for train.py go after --)")
    return out


def _core_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mismatch_ctrl.launch",
        description="The core of the launch/*.sh launchers: check the settings (environment variables) and the "
                    "parallel layout against Megatron's and SGLang's rules, estimate memory, prepare data and "
                    "checkpoints, run the preflight and submit the slime job. Arguments after -- are the launcher "
                    "user's (--dry-run, --prepare, --help, -- EXTRA_TRAIN_ARGS).")
    parser.add_argument("--launcher", default="mismatch_ctrl.launch", help="name shown in messages and --help")
    parser.add_argument("--default", action="append", default=[], metavar="NAME=VALUE",
                        help="a launcher default: METHOD, MODEL, TRAIN_PRECISION, REPO_ROOT or PYTHON (repeatable)")
    return parser


def method_check(s: Settings, model: MegatronModel, dry_run: bool) -> tuple[str, list[str], list[str]]:
    """(summary, configuration errors, deferred problems) of ``PYTHON -m mismatch_ctrl check-config METHOD_CONFIG``
    for the model's architecture (Megatron ``--num-experts``) and the run's ``NUM_ROLLOUT`` (settings that would leave
    a controller inert are refused, as ``on_megatron_init`` would on the cluster; a ``NUM_ROLLOUT`` that is no
    positive integer is named by the settings' own check, and the method is checked without it). A PYTHON without
    torch cannot run the check: in ``--dry-run`` that is deferred to the launch (a warning), otherwise an error."""
    config = s["METHOD_CONFIG"]
    methods = " ".join(sorted(path.stem for path in Path(s["REPO_ROOT"], "configs", "methods").glob("*.yaml")))
    problem = file_problem("METHOD_CONFIG", config, f"a method YAML (methods in configs/methods: {methods})",
                           f"METHOD={s['METHOD']}; methods in configs/methods: {methods}")
    if problem is not None:
        return "", [problem], []
    environment = job_env(s)
    run_length = ["--num-rollout", s["NUM_ROLLOUT"]] if s.is_positive_integer("NUM_ROLLOUT") else []
    done = subprocess.run([s["PYTHON"], "-m", "mismatch_ctrl", "check-config", config, *run_length, "--num-experts",
                           str(model.num_experts)], capture_output=True, text=True, env=environment)
    output = (done.stdout + done.stderr).strip()
    if done.returncode == 0:
        return output, [], []
    if "No module named 'torch'" in output:
        message = f"METHOD_CONFIG={config} not validated: PYTHON={s['PYTHON']} has no torch (check-config needs it)"
        return "", ([] if dry_run else [message]), ([message] if dry_run else [])
    return "", [f"METHOD_CONFIG={config} is invalid: {clip(output, 2000)}"], []


def duplicate_flag_problems(s: Settings, model: MegatronModel, extra: Sequence[str]) -> list[str]:
    """Arguments after ``--`` that repeat a flag the launcher already passes to train.py: argparse would take the
    last silently (and for some flags append), so they are refused, naming the variable that sets the flag."""
    own = {word for word in train_args(s, model, []) if word.startswith("--")}
    out = []
    for flag in user_flags(extra):
        if flag in own:
            variables = setting_of_flag(flag)
            via = f"set {' or '.join(variables)} instead" if variables else "the launcher sets it (see --dry-run)"
            out.append(f"{flag} after -- duplicates a flag the launcher passes to train.py: {via}")
    return out


def served_checkpoint(s: Settings, model: MegatronModel) -> CheckpointReport:
    """The ``config.json`` of the checkpoint SGLang serves (``Settings.rollout_checkpoint``): the FP8 one, or with
    ``TRAIN_PRECISION=fp16`` the BF16 ``MODEL_DIR``."""
    variable = s.rollout_checkpoint
    return inspect_checkpoint(s[variable], "bf16" if variable == "MODEL_DIR" else "fp8", variable, model)


def engine_shape(s: Settings, served: CheckpointReport) -> tuple[ModelShape, str]:
    """The shape the engine rules check: the served checkpoint's when its config.json reads, else the profile's
    (without FP8 weight blocks when SGLang serves the BF16 checkpoint)."""
    variable = s.rollout_checkpoint
    if served.shape is not None:
        return served.shape, f"{variable}={s[variable]}/config.json"
    shape = s.profile.shape if variable == "FP8_HF_DIR" else dataclasses.replace(s.profile.shape,
                                                                                  weight_block_size=None)
    return shape, f"recorded in profile {s['MODEL']}; {variable}={s[variable]} has no readable config.json yet"


def response_lengths_check(s: Settings, shape: ModelShape, source: str, extra: Sequence[str]
                           ) -> tuple[list[str], list[str]]:
    """(errors, warnings): the training and evaluation response lengths against the rollout engine's context length
    (:mod:`.context_length`); eval sets of one length and origin are named together."""
    try:
        override = context_override(extra)
        for flag in INTEGER_FLAGS:
            flag_value_in(extra, flag)
    except ValueError as exc:
        return [str(exc)], []
    try:
        evaluation = eval_sets(s, extra)
    except EVAL_CONFIG_ERRORS:
        evaluation = []  # the path checks name an EVAL_CONFIG that cannot be read
    lengths = [RequestedLength("MAX_RESPONSE_LEN", s.int("MAX_RESPONSE_LEN"), "rollout", "--rollout-max-prompt-len")]
    groups: dict[tuple[int, str], list[str]] = {}
    for e in evaluation:
        groups.setdefault((e.max_response_len, e.max_response_len_from), []).append(e.name)
    for (length, origin), names in groups.items():
        sets = f"eval set{'s' if len(names) > 1 else ''} {', '.join(names)}"
        where = f"{origin} ({sets})" if origin != "EVAL_CONFIG" else f"max_response_len of {sets} (EVAL_CONFIG)"
        lengths.append(RequestedLength(where, length, "evaluation", "--eval-max-prompt-len"))
    if override is None:
        return response_length_problems(lengths, shape.context_length, source, extra)
    errors, warnings = response_length_problems(lengths, override, f"{OVERRIDE_FLAG} after --", extra)
    return errors + override_problems(override, shape.context_length, source, s.pass_env, s.environ), warnings


def trained_shape(shape: ModelShape, model: MegatronModel) -> ModelShape:
    """The engine's shape with the dense / MoE layer split Megatron builds from MODEL_ARGS_FILE (they differ only when
    ALLOW_MODEL_SHAPE_MISMATCH=1 accepted a config.json with other MoE layers): the training memory and host RAM
    follow the model that is trained."""
    if not (shape.is_moe and model.is_moe):
        return shape
    layers = model.num_layers or shape.num_hidden_layers
    return dataclasses.replace(shape, num_hidden_layers=layers, dense_layers=max(0, layers - model.moe_layers))


def summary(s: Settings, model: MegatronModel, layout: Layout, method_summary: str, report: Report) -> None:
    experts = model.num_experts
    kind = f"MoE, {experts} experts, EP{layout.ep} x ETP{layout.etp}" if model.is_moe else "dense"
    compute = COMPUTE.get(s["TRAIN_PRECISION"], "BF16")
    engines = f"TP{layout.rollout_gpus_per_engine}" + (
        f", EP{layout.rollout_ep}: moe_tp {layout.moe_tp}" if model.is_moe else "")
    steps = layout.rollout_batch_size * layout.n_samples_per_prompt // layout.global_batch_size
    report.note(f"method {s['METHOD']}: {method_summary or s['METHOD_CONFIG']}")
    served = "BF16 weights served in float16" if s.rollout_checkpoint == "MODEL_DIR" else "FP8"
    report.note(f"model {s['MODEL']} ({kind}): rollouts on {s[s.rollout_checkpoint]} ({served}), training from "
                f"{s['TORCH_DIST_DIR']} (BF16 weights, {compute} compute)")
    report.note(f"layout: {layout.num_nodes} node(s) x {layout.gpus_per_node} GPUs, colocated; trainer TP{layout.tp} "
                f"x PP{layout.pp} x CP{layout.cp} -> DP{layout.dp}; {layout.engines} SGLang engines x "
                f"{layout.rollout_gpus_per_engine} GPUs ({engines})")
    report.note(f"batch: {layout.rollout_batch_size} prompts x {layout.n_samples_per_prompt} samples per rollout = "
                f"{steps} optimizer steps of {layout.global_batch_size}; {s['NUM_ROLLOUT']} rollouts; routing replay "
                f"{'on' if layout.routing_replay else 'off'}")
    try:
        iteration = resume_point(s)
    except StateError:
        return  # named by the path checks
    if iteration is not None:
        report.note(f"resume: LOAD_DIR={s['LOAD_DIR']} holds iteration {iteration}")
    elif Path(s["LOAD_DIR"], TRACKER).is_file():
        report.note(f"LOAD_DIR={s['LOAD_DIR']} holds a release checkpoint: slime loads it, the controllers start "
                    "afresh")
    else:
        report.note(f"fresh start: LOAD_DIR={s['LOAD_DIR']} holds no checkpoint, slime loads TORCH_DIST_DIR")


def run(argv: Sequence[str], report: Report, given: dict[str, str]) -> int:
    user = parse_user_args(argv, report)
    try:
        s = Settings(os.environ, given)
    except ConfigError as exc:
        report.die(2, str(exc))
    if user.help:
        sys.stdout.write(usage(report.launcher, s))
        return 0
    try:
        model = read_model_args(s["MODEL_ARGS_FILE"])
    except ConfigError as exc:
        report.die(2, str(exc))

    errors = s.problems()
    if not errors:
        errors += samples_problems(s) + group_size_problems(s, train_args(s, model, user.extra)) + \
            option_like_problems(s, ["--address", s["RAY_ADDRESS"], *entrypoint(s, model, [])])
    settings_valid = not errors
    for line in absolute_path_notes(s):
        report.warn(line)
    served = served_checkpoint(s, model)
    if not errors:
        errors += checkpoint_kind_problems(served, s.rollout_checkpoint, model, s["MODEL"],
                                           s.flag("ALLOW_MODEL_SHAPE_MISMATCH"))
        errors += precision_problems(s, user.extra)
    shape, source = engine_shape(s, served)
    layout = None
    length_warnings: list[str] = []
    if not errors:
        layout = Layout.from_settings(s)
        errors += trainer_problems(layout, model) + engine_problems(layout, shape, source)
        eval_config = file_problem("EVAL_CONFIG", s["EVAL_CONFIG"], "slime's eval config YAML (e.g. recipes/"
                                   "qwen3_30b_a3b/eval_light.yaml), or set EVAL_INTERVAL=0 to train without "
                                   "evaluation", "or set EVAL_INTERVAL=0 to train without evaluation")
        if s.int("EVAL_INTERVAL") > 0 and eval_config is not None:
            errors.append(eval_config)
        else:
            length_errors, length_warnings = response_lengths_check(s, shape, source, user.extra)
            errors += length_errors
    method_summary, method_errors, deferred = method_check(s, model, user.dry_run)
    errors += method_errors + (duplicate_flag_problems(s, model, user.extra) if settings_valid else [])
    if user.dry_run and not user.prepare and settings_valid:  # a launch checks them after its import checks
        flag_errors, flag_warnings = dry_run_flag_problems(s, user.extra, train_args(s, model, user.extra))
        errors += flag_errors
        report.lines("warning", flag_warnings)
    ray = ray_version() if not errors and not user.prepare else None
    if not errors and not user.prepare:
        words = entrypoint(s, model, user.extra)
        errors += runtime_env_problems(s) + entrypoint_problems(s, words, ray)
        errors += unknown_ray_problems(s, words) if ray is None and not user.dry_run else []
    if errors:
        report.lines("configuration error", errors)
        return 2

    if user.prepare:
        preparation = Preparation(s, model, report.launcher, user.dry_run, report.note)
        problems = preparation.problems()
        if problems:
            if user.dry_run:
                report.lines("warning", problems)
            else:
                report.lines("error", problems)
                report.die(1, "nothing was prepared; fix the errors above and re-run --prepare")
        try:
            preparation.run()
        except PrepareFailed as exc:
            report.die(1, str(exc))
        return 0

    nvls = s["NCCL_NVLS_ENABLE"] if user.dry_run else nvls_enable(s["NCCL_NVLS_ENABLE"])  # no GPU tool in a dry run
    command = submit_command(s, model, user.extra, nvls, ray)
    paths = path_problems(s, report.launcher, served) + deferred
    summary(s, model, layout, method_summary, report)
    report.note(f"engine layout checked on the model shape {source}")
    terms = dict(max_tokens_per_gpu=s.int("MAX_TOKENS_PER_GPU"), cpu_offload=s.flag("OPTIMIZER_CPU_OFFLOAD"),
                 sglang_mem_fraction=float(s["SGLANG_MEM_FRACTION"]), gpu_memory_gb=float(s["GPU_MEMORY_GB"]),
                 fp8_training=s["TRAIN_PRECISION"] == "fp8", trained=trained_shape(shape, model))
    memory = estimate(shape, layout, **terms, rollout_precision="FP16" if s["TRAIN_PRECISION"] == "fp16" else "FP8")
    for line in memory.lines():
        report.note(line)
    if memory.rollout_precision != "FP8":
        for line in rollout_cost_lines(memory, estimate(shape, layout, **terms)):
            report.note(line)
    for line in memory.warnings() + length_warnings:
        report.warn(line)
    try:
        cost = eval_cost(s, user.extra)
    except EVAL_CONFIG_ERRORS:
        cost = None  # named by the path checks
    if cost is not None:
        for line in cost.lines(s["EVAL_PROTOCOL"]):
            report.note(line)
        for line in cost.warnings():
            report.warn(line)
    if user.dry_run:
        if nvls == "auto":
            report.note("NCCL_NVLS_ENABLE=auto is decided when the job is submitted (1 when `nvidia-smi topo -m` on "
                        "this node shows NVLink, else 0): a dry run runs no GPU tool, so the command shows auto; set "
                        "NCCL_NVLS_ENABLE=0 or 1 to fix it")
        report.lines("warning (an error at launch)", paths)
        if ray is None:
            report.lines("warning", unknown_ray_problems(s, entrypoint(s, model, user.extra)))
        print(format_command(command), flush=True)
        return 0

    cluster = local_gpu_problems(s) + ray_problems(s, report.warn)
    if paths or cluster:
        report.note("import checks (slime, megatron, hooks, reward) run once the problems below are fixed")
    else:
        cluster += import_problems(s, IMPORT_TARGETS)
        if not cluster:  # slime and Megatron import: their parsers read the flags after --
            flag_errors, flag_warnings = flag_problems(s, user.extra, train_args(s, model, user.extra))
            cluster += flag_errors
            report.lines("warning", flag_warnings)
    host = host_memory_bytes()
    if host is not None and memory.host_per_node > host:
        report.warn(f"the run needs ~{memory.host_per_node / 1e9:.0f} GB of host RAM per node (pinned weights and CPU "
                    f"Adam), this node has {host / 1e9:.0f} GB")
    if paths or cluster:
        report.lines("error", paths + cluster)
        report.die(1, "preflight failed; nothing was submitted")
    Path(s["SAVE_DIR"]).mkdir(parents=True, exist_ok=True)
    report.note("submitting:")
    print(format_command(command), file=sys.stderr, flush=True)
    sys.stdout.flush()
    os.execvp(command[0], command)
    return 0  # not reached


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)
    core = _core_parser().parse_args(argv[:split])
    given = {"TRAIN_PRECISION": "bf16", "REPO_ROOT": REPO_ROOT, "PYTHON": sys.executable}
    for item in core.default:
        name, sep, value = item.partition("=")
        if not sep:
            _core_parser().error(f"--default {item!r}: expected NAME=VALUE")
        given[name] = value
    report = Report(core.launcher)
    try:
        return run(argv[split + 1:], report, given)
    except Stop as stop:
        return stop.code
