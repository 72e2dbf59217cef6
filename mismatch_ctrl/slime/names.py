"""The names slime and Megatron see: the hooks' dotted paths (what the launcher passes to slime's flags) and
Megatron's checkpoint tracker file. Standard library only, so the launcher imports them without torch."""

from __future__ import annotations

from pathlib import Path

HOOKS = "mismatch_ctrl.slime.hooks"
ADVANTAGE_HOOK = f"{HOOKS}.advantages"
TIS_HOOK = f"{HOOKS}.rollout_correction"
LR_HOOK = f"{HOOKS}.before_train_step"
INIT_HOOK = f"{HOOKS}.on_megatron_init"
HOOK_FLAGS = {
    "--custom-advantage-function-path": ADVANTAGE_HOOK,
    "--custom-tis-function-path": TIS_HOOK,
    "--custom-megatron-before-train-step-hook-path": LR_HOOK,
    "--custom-megatron-init-path": INIT_HOOK,
}
"""slime's flag for each hook (SLIME.md sections 1-4)."""
TRACKER = "latest_checkpointed_iteration.txt"
"""Megatron's tracker file: a directory holding it is a Megatron checkpoint."""


def is_megatron_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds Megatron's tracker file."""
    return Path(directory, TRACKER).is_file()
