"""The names slime and Megatron see: the hooks' dotted paths (what the launcher passes to slime's flags) and
Megatron's checkpoint tracker file, with its reader. No torch, so the launcher imports them without it."""

from __future__ import annotations

from pathlib import Path

from .. import regular_files
from ..errors import StateError
from ..formatting import brief

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
MAX_TRACKER_BYTES = 64
"""Megatron writes the iteration (or ``release``) and nothing else: a few bytes. A longer file is not its tracker."""


def is_megatron_checkpoint(directory: str | Path) -> bool:
    """Whether ``directory`` holds Megatron's tracker file."""
    return Path(directory, TRACKER).is_file()


def tracker_in(load: str | Path) -> Path | None:
    """``{load}/latest_checkpointed_iteration.txt`` when there is one (None: nothing to resume);
    :class:`StateError` when it is there but no regular file."""
    tracker = Path(load) / TRACKER
    if not (tracker.exists() or tracker.is_symlink()):
        return None
    what = regular_files.what_is(tracker)
    if what is not None:
        raise StateError(f"{tracker}: not a regular file ({what}), so which checkpoint is resumed is unknown; "
                         "Megatron cannot read it either: fix it or point --load at a complete checkpoint")
    return tracker


def read_tracker(path: Path) -> int | None:
    """The iteration in Megatron's ``latest_checkpointed_iteration.txt`` (None for ``release``); Megatron's own
    reader accepts an integer or ``release`` and exits on anything else, so :class:`StateError` names the file here,
    before the controllers silently start afresh."""
    try:
        text = regular_files.read_bytes(path, MAX_TRACKER_BYTES).decode("utf-8", errors="replace").strip()
    except regular_files.TooLarge:
        raise StateError(f"{path}: longer than Megatron's tracker (the iteration number or 'release', at most "
                         f"{MAX_TRACKER_BYTES} bytes), so not the file Megatron writes: restore it from the checkpoint "
                         "(it holds the number of the iter_NNNNNNN folder to resume) or point --load at a complete "
                         "checkpoint") from None
    except OSError as exc:
        raise StateError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if text == "release":
        return None
    if not text.isascii() or not text.isdigit():
        raise StateError(f"{path}: holds {brief(text, 40)}, not a checkpoint iteration (an integer >= 0, or "
                         "'release'); Megatron cannot resume from it either: fix the file or point --load at a "
                         "complete checkpoint")
    return int(text)
