"""``--custom-megatron-init-path mismatch_ctrl.slime.hooks.on_megatron_init`` (SLIME.md sections 4-5).

slime calls it once per train rank at the end of Megatron's initialisation (process groups exist; the model and the
checkpoint are not loaded yet). It validates the configuration against slime's flags, failing fast with a message
naming the key or flag, and restores the controllers when a checkpoint is being resumed.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from .runtime import get_runtime

log = logging.getLogger("mismatch_ctrl")


def on_megatron_init(args: Any) -> None:
    """Validate the ``mismatch_ctrl`` config and restore controller state (a no-op if already done)."""
    runtime = get_runtime(args)
    log.info("mismatch_ctrl config: %s", json.dumps(runtime.config.as_dict(), sort_keys=True))
