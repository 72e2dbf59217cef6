"""The length-decay LR factor on verl's workers, for both of verl 0.9.1's schedulers (VERL.md section 3).

verl steps its scheduler once per ``update_actor``, after the last mini-batch (``workers/engine_workers.py:308,
373-376``), and each mini-batch's optimizer step reads the param groups' ``lr``. So the factor ``s`` of a step is
applied to the groups just before that step's mini-batches, computed from the scheduler's own state, which is never
changed (a checkpoint of the optimizer and scheduler resumes exactly as without the factor):

- FSDP (``torch.optim.lr_scheduler.LambdaLR``, verl's constant / cosine with warmup): ``lr_i = base_lrs[i] *
  lr_lambdas[i](last_epoch) * s``; the scheduler's next ``step()`` writes the unscaled value back, and the next
  update scales it again.
- Megatron (megatron-core's ``OptimizerParamScheduler``): the slime hook's rule
  (:func:`~mismatch_ctrl.lr_schedule.scale_scheduled_groups`), ``max_lr = sched.max_lr * s`` and ``min_lr =
  sched.min_lr * s`` in every group (``get_lr(group)`` reads these keys first) and ``lr = sched.get_lr(group)``; the
  scheduler's own ``max_lr`` / ``min_lr`` stay. Groups with their own schedule (``default_config`` false) are
  refused. The scaled group keys stay until the next update, so verl's logged ``actor/lr`` (the first group's
  ``lr`` after the scheduler's step) shows the factor here, unlike under FSDP.

Both are idempotent (a retried update applies the same values) and right after a resume.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import ConfigError, InputError
from ..formatting import brief
from ..lr_schedule import scale_scheduled_groups


def _scale(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise InputError(f"lr scale: expected a finite number > 0 (the length-decay factor the trainer sends), got "
                         f"{brief(value)}")
    return float(value)


def apply_lr_scale(optimizer: Any, scheduler: Any, scale: float) -> None:
    """Set every param group's LR to the scheduler's value at its current step times ``scale``."""
    scale = _scale(scale)
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, (list, tuple)):
        raise ConfigError(f"lr_decay: the optimizer ({type(optimizer).__name__}) has no param_groups to scale")
    if hasattr(scheduler, "lr_lambdas") and hasattr(scheduler, "base_lrs"):
        if len(scheduler.lr_lambdas) != len(groups):
            raise ConfigError(f"lr_decay: the LambdaLR has {len(scheduler.lr_lambdas)} lambdas for {len(groups)} "
                              "param groups (a group was added after the scheduler was built)")
        for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas):
            group["lr"] = base * factor(scheduler.last_epoch) * scale
    elif callable(getattr(scheduler, "get_lr", None)) and hasattr(scheduler, "max_lr"):
        scale_scheduled_groups(groups, scheduler, scheduler.max_lr, scheduler.min_lr, scale, "optim.lr / min_lr")
    else:
        raise ConfigError(f"lr_decay: the LR scheduler ({type(scheduler).__name__}) is neither a LambdaLR (verl's FSDP "
                          "engine) nor megatron-core's OptimizerParamScheduler (verl's Megatron engine); the factor "
                          "cannot be applied to it")
