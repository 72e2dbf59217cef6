"""``--custom-megatron-before-train-step-hook-path mismatch_ctrl.slime.hooks.before_train_step`` (SLIME.md sec. 4).

slime calls it on every rank (all pipeline stages) before each optimizer step. To make an LR multiplier stick with
Megatron's ``OptimizerParamScheduler``, every param group gets ``max_lr = args.lr * f`` and ``min_lr = args.min_lr * f``
(the scheduler reads these per-group keys first) and then ``lr = scheduler.get_lr(group)``; the scheduler's own
``max_lr`` is never touched, so checkpoints resume cleanly. Values come from ``args``, never from the groups (a resumed
optimizer restores the groups' previous values), so the hook is idempotent and right after a resume.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

from ..errors import ConfigError, InputError
from ..formatting import brief
from ..lr_schedule import scale_scheduled_groups
from ._groups import broadcast_from_last_stage, topology
from .runtime import ADVANTAGE_HOOK, get_runtime


def before_train_step(args: Any, rollout_id: int, step_id: int, model: Any, optimizer: Any,
                      opt_param_scheduler: Any) -> None:
    """Apply the length-decay LR multiplier of ``rollout_id`` to every param group (no-op without lr_decay)."""
    runtime = get_runtime(args)
    lr = runtime.controllers.lr
    if lr is None:
        return
    if not hasattr(optimizer, "param_groups"):
        raise ConfigError(f"before_train_step: the optimizer ({type(optimizer).__name__}) has no param_groups to "
                          "scale; slime passes Megatron's optimizer here (call the hook as slime's train loop does: "
                          "args, rollout_id, step_id, model, optimizer, opt_param_scheduler)")
    groups = optimizer.param_groups
    if not isinstance(groups, (list, tuple)) or not all(isinstance(group, Mapping) for group in groups):
        raise ConfigError(f"before_train_step: the optimizer's param_groups must be dicts of settings, got "
                          f"{brief(groups)}")
    if isinstance(rollout_id, bool) or not isinstance(rollout_id, numbers.Integral):
        raise InputError(f"before_train_step: rollout_id must be an integer (slime's rollout index), got "
                         f"{brief(rollout_id)} ({type(rollout_id).__name__})")
    if runtime.lr_applied is None or runtime.lr_applied[0] != rollout_id:
        seen = runtime.controllers.last_rollout
        if topology().is_last_stage and seen != rollout_id:
            raise ConfigError(
                f"before_train_step for rollout {rollout_id}, but the advantage hook last observed rollout {seen}: "
                f"lr_decay needs --custom-advantage-function-path {ADVANTAGE_HOOK} (it measures response lengths)")
        runtime.lr_applied = (rollout_id, broadcast_from_last_stage(runtime.controllers.lr_scale(rollout_id)))
    scale = runtime.lr_applied[1]
    if not callable(getattr(opt_param_scheduler, "get_lr", None)):
        raise ConfigError(f"before_train_step: opt_param_scheduler ({type(opt_param_scheduler).__name__}) has no "
                          "get_lr(group); slime passes Megatron's OptimizerParamScheduler, which sets each group's lr "
                          "from the max_lr / min_lr this hook scales")
    scale_scheduled_groups(optimizer.param_groups, opt_param_scheduler, args.lr, getattr(args, "min_lr", 0.0) or 0.0,
                           scale, "--lr / --min-lr")
