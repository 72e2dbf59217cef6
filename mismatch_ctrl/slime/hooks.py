"""The hook functions users put on slime's command line (stable dotted paths):

=====================================================  =========================================================
slime flag                                             value
=====================================================  =========================================================
``--custom-advantage-function-path``                   ``mismatch_ctrl.slime.hooks.advantages``
``--custom-tis-function-path``                         ``mismatch_ctrl.slime.hooks.rollout_correction``
``--custom-megatron-before-train-step-hook-path``      ``mismatch_ctrl.slime.hooks.before_train_step``
``--custom-megatron-init-path``                        ``mismatch_ctrl.slime.hooks.on_megatron_init``
``--custom-config-path``                               a YAML with a ``mismatch_ctrl:`` key (``configs/methods/``)
=====================================================  =========================================================

plus ``--get-mismatch-metrics`` (forces the training engine's log-prob recompute and runs the TIS hook).
"""

from .advantage import advantages
from .init_hook import on_megatron_init
from .lr_hook import before_train_step
from .tis import rollout_correction

__all__ = ["advantages", "rollout_correction", "before_train_step", "on_megatron_init"]
