"""The verl 0.9.1 trainer that runs mismatch_ctrl: verl's synchronous v1 trainer with four methods extended.

Selected by ``trainer.v1.trainer_mode=mismatch_ctrl`` (registered by :mod:`mismatch_ctrl.verl.plugin`); it then sets
``trainer_mode`` back to ``sync``, so every branch of verl's base class on the literal ``"sync"``
(``trainer/ppo/v1/trainer_base.py:153,731,902,1004,1499``) runs as in verl's own default trainer. All on the driver:

- ``_compute_advantage`` (``:1743-1802``): reads ``response_mask``, ``old_log_probs`` and ``rollout_log_probs``
  before verl's correction changes the mask, lets verl run its rollout correction and GRPO unchanged, then hands
  the whole batch to :meth:`~mismatch_ctrl.verl.runtime.VerlRuntime.step` (DC-GRPO, dual update, surge detector,
  LR factor; a correction verl cannot express; the synthetic padding responses verl's ``_balance_batch`` adds,
  tagged ``is_padding``, are no samples there) and writes back what it changed. Metrics go to verl's logger as
  ``mismatch_ctrl/<name>`` beside verl's ``rollout_corr/*``.
- ``_update_actor`` (``:1827-1866``): sends the LR factor of the step to the workers in ``extra_info``
  (:mod:`mismatch_ctrl.verl.workers` applies it) when length decay is on.
- ``_save_checkpoint`` / ``_load_checkpoint`` (``:948-1029``, ``:850-908``): the controller state goes into
  ``global_step_N/mismatch_ctrl/`` before verl writes its tracker file, and is restored when verl resumes from
  ``global_step_N``.
- ``_init_resource_pool_mgr`` (``:788-848``): with length decay, the actor worker class is
  :class:`~mismatch_ctrl.verl.workers.ActorRolloutRefWorker`.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
import torch
import transfer_queue as tq
from omegaconf import open_dict
from tensordict import TensorDict
from verl.trainer.ppo.utils import Role
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from ..errors import InputError
from .checks import TRAINER_MODE
from .runtime import VerlRuntime, read_config
from .workers import LR_SCALE_KEY, ActorRolloutRefWorker

log = logging.getLogger("mismatch_ctrl")

INPUTS = ["response_mask", "old_log_probs", "rollout_log_probs"]
ACTOR_ROLES = (Role.Actor, Role.ActorRollout, Role.ActorRolloutRef)


def _nested(flat: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """A flat ``[T]`` tensor as verl's jagged per-response tensor (the layout ``response_to_nested`` writes)."""
    return torch.nested.as_nested_tensor(list(torch.split(flat, sizes)), layout=torch.jagged)


@register_trainer(TRAINER_MODE)
class MismatchCtrlTrainer(PPOTrainerSync):
    """verl's ``PPOTrainerSync`` with mismatch_ctrl's controllers on the driver (module docstring)."""

    def __init__(self, config: Any) -> None:
        self.mismatch_ctrl = VerlRuntime(read_config(config))
        with open_dict(config):
            config.trainer.v1.trainer_mode = "sync"
        super().__init__(config)

    def _init_resource_pool_mgr(self) -> None:
        super()._init_resource_pool_mgr()
        if self.mismatch_ctrl.lr_decay:
            for role in ACTOR_ROLES:
                if role in self.role_worker_mapping:
                    self.role_worker_mapping[role] = ray.remote(ActorRolloutRefWorker)

    def _compute_advantage(self, batch: Any, metrics: dict) -> Any:
        inputs = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=INPUTS)
        check_inputs(inputs)
        samples = [not tag.get("is_padding", False) for tag in batch.tags]
        batch = super()._compute_advantage(batch, metrics)
        verl_out = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id,
                                   select_fields=["advantages", "response_mask"])
        mask = inputs["response_mask"]
        sizes = mask.offsets().diff().tolist()
        out = self.mismatch_ctrl.step(
            self.global_steps, sizes, inputs["old_log_probs"].values(), inputs["rollout_log_probs"].values(),
            mask.values(), verl_out["advantages"].values(), verl_out["response_mask"].values(),
            max_response_length=self.config.data.get("max_response_length"), samples=samples)
        metrics.update(out.metrics)
        fields = {}
        if out.advantages is not None:
            fields["advantages"] = fields["returns"] = _nested(out.advantages, sizes)
        if out.response_mask is not None:
            fields["response_mask"] = _nested(out.response_mask, sizes)
        if out.is_weights is not None:
            fields["rollout_is_weights"] = _nested(out.is_weights, sizes)
        if fields:
            batch = tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id,
                                    fields=TensorDict(fields, batch_size=len(sizes)))
        return batch

    def _update_actor(self, batch: Any, metrics: dict) -> Any:
        if self.mismatch_ctrl.lr_decay:
            batch.extra_info[LR_SCALE_KEY] = self.mismatch_ctrl.lr_scale(self.global_steps)
        return super()._update_actor(batch, metrics)

    def _save_checkpoint(self) -> None:
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        self.mismatch_ctrl.save(folder, self.global_steps)
        super()._save_checkpoint()

    def _load_checkpoint(self) -> None:
        super()._load_checkpoint()
        if self.global_steps > 0:
            self.mismatch_ctrl.resume(resumed_folder(self.config), self.global_steps)


def check_inputs(inputs: Any) -> None:
    """Both engines' log-probs are in the batch and score each response's tokens exactly (one value per token of
    ``response_mask``): :class:`InputError` naming the field and the first response that differs."""
    for field in INPUTS[1:]:
        if field not in inputs.keys():
            raise InputError(f"verl's batch has no {field!r} at the advantage step: "
                             + ("set actor_rollout_ref.rollout.calculate_log_probs=true" if field == "rollout_log_probs"
                                else "the trainer's recompute (_compute_old_log_prob) did not run"))
    lengths = inputs["response_mask"].offsets().diff()
    for field in INPUTS[1:]:
        other = inputs[field].offsets().diff()
        if not torch.equal(other, lengths):
            row = int((other != lengths).nonzero()[0])
            raise InputError(f"response {row}: {field} has {int(other[row])} tokens but response_mask has "
                             f"{int(lengths[row])}; the trainer and the rollout engine must score exactly the "
                             "response tokens")


def resumed_folder(config: Any) -> str:
    """The ``global_step_N`` folder verl's ``_load_checkpoint`` resumed from, found by verl's own rule
    (``trainer_base.py:850-876``: ``resume_mode`` auto reads the tracker file in ``default_local_dir``,
    ``resume_path`` takes ``resume_from_path``)."""
    trainer = config.trainer
    if trainer.resume_mode == "resume_path":
        folder = trainer.resume_from_path
    else:
        folder = find_latest_ckpt_path(os.path.join(os.getcwd(), trainer.default_local_dir)
                                       if not os.path.isabs(trainer.default_local_dir) else trainer.default_local_dir)
    return folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder)
