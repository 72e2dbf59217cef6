"""``python -m mismatch_ctrl.verl.launch --launcher NAME --model MODEL -- [--help|--prepare|--dry-run] [-- OVERRIDES]``:
the core of ``launch/verl_*.sh`` (via ``launch/lib.sh``'s ``verl_launcher_main``).

``--dry-run`` composes the full configuration with verl's own Hydra config from the installed wheel (the same
``config_name`` ``verl.trainer.main_ppo`` loads; an override verl's schema lacks is refused by Hydra), then applies
the adapter's checks (:mod:`mismatch_ctrl.verl.checks`: bypass mode, rollout log-probs, the estimator, the correction
keys), verl's own ``validate_config`` (``trainer/main_ppo.py``) and the layout rules verl and Megatron enforce at
start-up, and prints the exact command. Without it the same checks run, then the command. Exit codes: 0 success, 1 a
failed preparation, 2 a refused configuration or usage.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, Sequence

from ..errors import ConfigError
from .recipe import CONFIG_NAME, RECIPES, overrides, settings, usage

REPO_ROOT = str(Path(__file__).resolve().parents[2])


def compose(config_name: str, words: Sequence[str]) -> Any:
    """verl's ``config_name`` composed with ``words``; :class:`ConfigError` with Hydra's reason for a refused one."""
    import verl
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            return hydra_compose(config_name, overrides=list(words))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"verl {verl.__version__}'s config ({config_name}) refuses the overrides: "
                          f"{' '.join(str(exc).split())}") from None


def layout_problems(cfg: Any) -> list[str]:
    """Start-up rules of a layout, read in verl 0.9.1: the rollout engines tile the GPUs (``workers/
    engine_workers.py:636-639`` asserts ``world_size % (rollout TP x DP x PP) == 0``); Megatron's model-parallel
    group tiles them (``TP x PP x CP`` divides the world, and so does expert TP x EP x PP, megatron-core 0.16
    ``parallel_state.py:788-794``; expert TP defaults to TP); a PPO
    mini-batch divides the step's prompts (``validate_config``'s ``train_batch_size % ppo_mini_batch_size``)."""
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    rollout = cfg.actor_rollout_ref.rollout
    engine = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    out = []
    if world % engine:
        out.append(f"actor_rollout_ref.rollout: an engine of {engine} GPUs (tensor x data x pipeline parallel) does "
                   f"not tile the {world} GPUs (trainer.nnodes x trainer.n_gpus_per_node); verl asserts it at start")
    actor = cfg.actor_rollout_ref.actor
    if actor.strategy == "megatron":
        mc = actor.megatron
        model = mc.tensor_model_parallel_size * mc.pipeline_model_parallel_size * mc.context_parallel_size
        if world % model:
            out.append(f"actor.megatron: TP x PP x CP = {model} does not divide the {world} GPUs")
        etp = mc.expert_tensor_parallel_size or mc.tensor_model_parallel_size
        experts = etp * mc.expert_model_parallel_size * mc.pipeline_model_parallel_size
        if world % experts:
            out.append(f"actor.megatron: expert TP x EP x PP = {experts} does not divide the {world} GPUs "
                       "(megatron-core parallel_state.py:788-794 raises)")
    if cfg.data.train_batch_size % actor.ppo_mini_batch_size:
        out.append(f"data.train_batch_size={cfg.data.train_batch_size} is not a multiple of "
                   f"actor.ppo_mini_batch_size={actor.ppo_mini_batch_size}")
    return out


def check(cfg: Any) -> None:
    """The adapter's checks, then the layout rules, then verl's own ``validate_config`` on ``cfg``."""
    from .runtime import read_config
    read_config(cfg)
    problems = layout_problems(cfg)
    if problems:
        raise ConfigError("; ".join(problems))
    from verl.trainer.main_ppo import validate_config
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    try:
        with contextlib.redirect_stdout(sys.stderr):  # its report; stdout carries only the command
            validate_config(config=cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
    except (AssertionError, ValueError) as exc:
        raise ConfigError(f"verl's validate_config refuses the configuration: {exc}") from None


def command(words: Sequence[str]) -> list[str]:
    return ["python3", "-m", "verl.trainer.main_ppo", "--config-name", CONFIG_NAME, *words]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--launcher", required=True)
    parser.add_argument("--model", required=True, choices=sorted(RECIPES))
    parser.add_argument("user", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    user = args.user[1:] if args.user[:1] == ["--"] else args.user
    options, extra = (user[:user.index("--")], user[user.index("--") + 1:]) if "--" in user else (user, [])
    name = args.launcher
    unknown = [o for o in options if o not in ("--help", "-h", "--prepare", "--dry-run")]
    if unknown:
        print(f"{name}: unknown option {unknown[0]} (Hydra overrides go after --)\n{usage(name, args.model)}",
              file=sys.stderr)
        return 2
    if "--help" in options or "-h" in options:
        print(usage(name, args.model))
        return 0
    try:
        values = settings(args.model, os.environ, REPO_ROOT)
    except ValueError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    if "--prepare" in options:
        steps = [[sys.executable, "-m", "recipes.qwen3_30b_a3b.data", "--out", values["DATA_DIR"]],
                 [sys.executable, "-m", "recipes.qwen3_30b_a3b.verl_data", "--data-dir", values["DATA_DIR"]]]
        for step in steps:
            print(shlex.join(step), flush=True)
            if subprocess.run(step, cwd=values["REPO_ROOT"]).returncode:
                print(f"{name}: preparation failed at: {shlex.join(step)}", file=sys.stderr)
                return 1
        return 0
    words = [*overrides(args.model, values), *extra]
    try:
        check(compose(CONFIG_NAME, words))
    except ConfigError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return 2
    cmd = command(words)
    if "--dry-run" in options:
        print(" \\\n  ".join(shlex.quote(w) for w in cmd))
        return 0
    os.chdir(values["REPO_ROOT"])
    os.execvp(cmd[0], cmd)


if __name__ == "__main__":
    raise SystemExit(main())
