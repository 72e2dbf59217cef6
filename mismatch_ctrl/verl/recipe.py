"""The verl recipe for the DC-GRPO paper's two settings (paper 001, section 5: DAPO-Math-17k, 64 prompts per step,
PPO mini-batch 16, responses up to 8192 tokens at temperature 1.0, no KL loss; Qwen3-8B on FSDP2, Qwen3-30B-A3B on
Megatron with TP2, EP8 and rollout TP4), as verl 0.9.1 Hydra overrides. No verl import: ``--help`` and the command
need none; :mod:`mismatch_ctrl.verl.launch` composes them with verl's config.

Settings are environment variables, as for the slime launchers (``launch/README.md``); every value goes into one
override, so ``-- key=value`` after the launcher's options replaces any of them (Hydra: the last one wins).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping

from .checks import CONFIG_KEY, TRAINER_MODE

EVAL_SETS = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")


CONFIG_NAME = "ppo_trainer"
"""verl's config for both backends: the Megatron one is ``model_engine=megatron`` (0.9.1's ``ppo_megatron_trainer.yaml``
is that, kept only for backward compatibility: its first line says so)."""


@dataclass(frozen=True)
class VerlRecipe:
    """One model's launcher: the defaults of its settings and its backend's overrides."""

    hf_name: str
    defaults: Mapping[str, str]
    backend: Callable[[Mapping[str, str]], list[str]]


def _fsdp(v: Mapping[str, str]) -> list[str]:
    return ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.ref.strategy=fsdp2",
            f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={v['MAX_TOKENS_PER_GPU']}",
            "actor_rollout_ref.model.use_remove_padding=true",
            "actor_rollout_ref.model.enable_gradient_checkpointing=true"]


def _megatron(v: Mapping[str, str]) -> list[str]:
    mc = "actor_rollout_ref.actor.megatron"
    out = ["model_engine=megatron", f"{mc}.tensor_model_parallel_size={v['TP']}",
           f"{mc}.expert_model_parallel_size={v['EP']}", f"{mc}.expert_tensor_parallel_size={v['ETP']}",
           f"{mc}.pipeline_model_parallel_size={v['PP']}", f"{mc}.sequence_parallel={str(int(v['TP']) > 1).lower()}",
           f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={v['MAX_TOKENS_PER_GPU']}"]
    if v["ROUTING_REPLAY"] == "1":
        out.append(f"{mc}.router_replay.mode=R3")
    return out


RECIPES: dict[str, VerlRecipe] = {
    "qwen3_8b": VerlRecipe("Qwen3-8B", {"ROLLOUT_TP": "2", "MAX_TOKENS_PER_GPU": "16384"}, _fsdp),
    "qwen3_30b_a3b": VerlRecipe("Qwen3-30B-A3B",
                                {"ROLLOUT_TP": "4", "TP": "2", "EP": "8", "ETP": "1", "PP": "1", "ROUTING_REPLAY": "0",
                                 "MAX_TOKENS_PER_GPU": "20480"}, _megatron),
}

COMMON: dict[str, tuple[str, str]] = {
    "METHOD": ("dcgrpo", "method; selects configs/methods/<METHOD>.yaml (+mismatch_ctrl.config)"),
    "REPO_ROOT": ("", "this repository (the same path on every node)"),
    "MODEL_DIR": ("/root/{hf_name}", "BF16 Hugging Face checkpoint (actor_rollout_ref.model.path); its config.json "
                                     "gives the architecture defaults"),
    "DATA_DIR": ("/root/data", "recipe data; --prepare writes DATA_DIR/verl/*.parquet"),
    "SAVE_DIR": ("/root/runs/verl_{model}_{METHOD}", "checkpoints (trainer.default_local_dir); verl resumes from "
                                                     "its latest global_step_N"),
    "NUM_NODES": ("1", "trainer.nnodes"),
    "GPUS_PER_NODE": ("8", "trainer.n_gpus_per_node"),
    "TOTAL_STEPS": ("500", "trainer.total_training_steps"),
    "TRAIN_BATCH_SIZE": ("64", "prompts per step (data.train_batch_size) [paper]"),
    "MINI_BATCH_SIZE": ("16", "prompts per PPO mini-batch (actor.ppo_mini_batch_size) [paper]"),
    "N_SAMPLES_PER_PROMPT": ("8", "responses per prompt (rollout.n)"),
    "MAX_PROMPT_LEN": ("2048", "data.max_prompt_length"),
    "MAX_RESPONSE_LEN": ("8192", "data.max_response_length [paper]"),
    "LR": ("1e-6", "actor.optim.lr"),
    "ROLLOUT_QUANTIZATION": ("fp8", "vLLM rollout quantization (rollout.quantization): fp8 or null for BF16"),
    "SAVE_FREQ": ("20", "trainer.save_freq (steps)"),
    "TEST_FREQ": ("50", "trainer.test_freq (steps)"),
    "WANDB_PROJECT": ("", "wandb project (trainer.logger gains wandb)"),
}
"""Settings of every verl launcher: (default, what it sets). ``{hf_name}``, ``{model}``, ``{METHOD}`` are filled."""
RECIPE_HELP = {"ROLLOUT_TP": "vLLM tensor parallel per engine (rollout.tensor_model_parallel_size)",
               "TP": "Megatron tensor parallel (+ sequence parallel when > 1)", "EP": "Megatron expert parallel",
               "ETP": "Megatron expert tensor parallel (megatron-core defaults it to TP: TP2 x EP8 then needs 16 GPUs)",
               "PP": "Megatron pipeline parallel", "ROUTING_REPLAY": "1: Megatron router replay R3 (MoE)",
               "MAX_TOKENS_PER_GPU": "actor.ppo_max_token_len_per_gpu (dynamic batch size)"}
INTEGERS = ("NUM_NODES", "GPUS_PER_NODE", "TOTAL_STEPS", "TRAIN_BATCH_SIZE", "MINI_BATCH_SIZE", "N_SAMPLES_PER_PROMPT",
            "MAX_PROMPT_LEN", "MAX_RESPONSE_LEN", "SAVE_FREQ", "TEST_FREQ", "ROLLOUT_TP", "TP", "EP", "ETP", "PP",
            "MAX_TOKENS_PER_GPU")


def settings(model: str, environ: Mapping[str, str], repo_root: str) -> dict[str, str]:
    """Every setting of ``model``'s launcher: the environment's value, else the default; integers checked."""
    recipe = RECIPES[model]
    values: dict[str, str] = {}
    for name, (default, _) in {**COMMON, **{k: (v, "") for k, v in recipe.defaults.items()}}.items():
        values[name] = environ.get(name, default)
    values["REPO_ROOT"] = values["REPO_ROOT"] or repo_root
    for name, value in values.items():
        values[name] = value.format(hf_name=recipe.hf_name, model=model, METHOD=values["METHOD"])
    for name in INTEGERS:
        if name in values and not re.fullmatch(r"[1-9][0-9]*", values[name]):
            raise ValueError(f"{name}={values[name]!r}: expected an integer >= 1")
    if not re.fullmatch(r"[A-Za-z0-9_]+", values["METHOD"]):
        raise ValueError(f"METHOD={values['METHOD']!r}: expected the name of a file in configs/methods/")
    return values


def overrides(model: str, v: Mapping[str, str]) -> list[str]:
    """verl's Hydra overrides of the recipe with settings ``v``."""
    data = f"{v['DATA_DIR']}/verl"
    val_files = ",".join(f"'{data}/{name}.parquet'" for name in EVAL_SETS)
    loggers = "['console','wandb']" if v["WANDB_PROJECT"] else "['console']"
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
        f"+{CONFIG_KEY}={v['REPO_ROOT']}/configs/methods/{v['METHOD']}.yaml",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        "algorithm.rollout_correction.bypass_mode=false",
        f"data.train_files={data}/dapo-math-17k.parquet", f"data.val_files=[{val_files}]",
        f"data.train_batch_size={v['TRAIN_BATCH_SIZE']}", f"data.max_prompt_length={v['MAX_PROMPT_LEN']}",
        f"data.max_response_length={v['MAX_RESPONSE_LEN']}",
        f"actor_rollout_ref.model.path={v['MODEL_DIR']}",
        f"{actor}.optim.lr={v['LR']}", f"{actor}.ppo_mini_batch_size={v['MINI_BATCH_SIZE']}",
        f"{actor}.use_kl_loss=false", f"{actor}.clip_ratio_low=0.2", f"{actor}.clip_ratio_high=0.28",
        f"{actor}.use_dynamic_bsz=true",
        *RECIPES[model].backend(v),
        f"{rollout}.name=vllm", f"{rollout}.n={v['N_SAMPLES_PER_PROMPT']}", f"{rollout}.temperature=1.0",
        f"{rollout}.tensor_model_parallel_size={v['ROLLOUT_TP']}", f"{rollout}.calculate_log_probs=true",
        f"{rollout}.quantization={v['ROLLOUT_QUANTIZATION'] or 'null'}",
        f"reward.custom_reward_function.path={v['REPO_ROOT']}/recipes/qwen3_30b_a3b/verl_reward.py",
        f"trainer.nnodes={v['NUM_NODES']}", f"trainer.n_gpus_per_node={v['GPUS_PER_NODE']}",
        f"trainer.total_training_steps={v['TOTAL_STEPS']}", f"trainer.save_freq={v['SAVE_FREQ']}",
        f"trainer.test_freq={v['TEST_FREQ']}", f"trainer.default_local_dir={v['SAVE_DIR']}",
        f"trainer.logger={loggers}", f"trainer.project_name={v['WANDB_PROJECT'] or 'mismatch_ctrl'}",
        f"trainer.experiment_name=verl_{model}_{v['METHOD']}",
    ]


def usage(launcher: str, model: str) -> str:
    recipe = RECIPES[model]
    lines = [f"usage: {launcher} [--help] [--prepare] [--dry-run] [-- HYDRA_OVERRIDE ...]", "",
             f"{recipe.hf_name} with mismatch_ctrl on verl 0.9.1 (its {CONFIG_NAME} config; docs/verl.md).",
             "  --prepare   the recipe's data (DAPO-Math-17k, six benchmarks) as verl parquet in DATA_DIR/verl",
             "  --dry-run   compose verl's config from the installed wheel with every override (an override verl's",
             "              schema does not know is refused), apply the adapter's and verl's checks, print the command",
             "  (none)      the same checks, then run the command", "",
             "Settings (environment variables):"]
    helps = {**{k: h for k, (_, h) in COMMON.items()}, **RECIPE_HELP}
    for name, (default, _) in {**COMMON, **{k: (v, "") for k, v in recipe.defaults.items()}}.items():
        shown = default.format(hf_name=recipe.hf_name, model=model, METHOD="<METHOD>") or "(repository root)"
        lines.append(f"  {name:<22} {helps.get(name, '')} [{shown}]")
    return "\n".join(lines)
