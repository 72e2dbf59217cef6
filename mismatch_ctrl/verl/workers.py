"""verl worker classes that apply the length-decay LR factor (VERL.md section 3; the rule is in
:mod:`mismatch_ctrl.verl.lr`).

The trainer puts the factor of the step into the batch's ``extra_info`` (``LR_SCALE_KEY``); verl delivers
``extra_info`` entries to the worker as non-tensor entries of the batch (``utils/transferqueue_utils.py:160-177``).
:class:`ActorRolloutRefWorker` is verl's hybrid worker whose inner training worker (``actor_worker_cls``,
``workers/engine_workers.py:459``) is :class:`TrainingWorker` below: before the step's mini-batches it pops the
factor and scales every param group of its engine's optimizer from the engine's scheduler. A batch without the
factor is an error: this worker runs only under the adapter's trainer, which always sends it.
"""

from __future__ import annotations

from typing import Any

from verl.utils import tensordict_utils as tu
from verl.workers import engine_workers

from ..errors import InputError
from .lr import apply_lr_scale

LR_SCALE_KEY = "mismatch_ctrl_lr_scale"


class TrainingWorker(engine_workers.TrainingWorker):
    """verl's training worker; ``train_mini_batch`` first applies the step's LR factor."""

    def train_mini_batch(self, data: Any) -> Any:
        scale = tu.pop(data, key=LR_SCALE_KEY, default=None)
        if scale is None:
            raise InputError(f"the batch has no {LR_SCALE_KEY}: mismatch_ctrl's LR-decay worker runs under the "
                             "adapter's trainer (trainer.v1.trainer_mode=mismatch_ctrl), which sends it")
        apply_lr_scale(self.engine.optimizer, self.engine.lr_scheduler, scale)
        return super().train_mini_batch(data)


class ActorRolloutRefWorker(engine_workers.ActorRolloutRefWorker):
    """verl's hybrid worker with :class:`TrainingWorker` as its actor."""

    actor_worker_cls = TrainingWorker
