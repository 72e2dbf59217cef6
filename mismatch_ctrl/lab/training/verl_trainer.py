"""A lab run through the verl adapter: the same policy, engine, rollouts and PPO loss as :class:`Trainer`, with the
advantage step and the LR factor taken through verl 0.9.1's own trainer code on verl's own batch structures.

Per rollout:

1. the rollout's responses go into an in-process TransferQueue (:class:`~mismatch_ctrl.verl.transport.
   LocalTransferQueue`: the only part of verl replaced) as verl holds them after its ``_compute_old_log_prob``: jagged
   ``response_mask``, ``old_log_probs``, ``rollout_log_probs``, ``rm_scores`` (the raw reward on the last token),
   ``uid`` (the prompt);
2. verl's ``PPOTrainer._compute_advantage``, extended by :class:`~mismatch_ctrl.verl.trainer.MismatchCtrlTrainer`:
   verl's rollout-correction metrics and GRPO (raw rewards in, group-normalised by verl), then the adapter's step;
3. verl's ``_update_actor`` sends the step's LR factor in ``extra_info`` to the actor worker group, which is this
   object (the Ray transport replaced): it applies the factor to a verl constant ``LambdaLR``
   (:func:`~mismatch_ctrl.verl.lr.apply_lr_scale`, as the adapter's worker does), runs the lab's optimizer steps and
   steps the scheduler once, after the last, as verl's worker does.

For the methods whose computation the adapter owns (GRPO, DC-GRPO, length decay) the run gives :class:`Trainer`'s
run through the slime hooks, run for run, with the same seed (``tests/verl/test_verl_lab_on_cpu.py``). A correction
preset verl computes natively trains with ours, through the slime hook as every lab run (the adapter gets the method
without it: on a cluster verl would apply its own); on each rollout's batch verl's own correction is computed beside
it, and how far verl's result lies from ours is logged (:mod:`.verl_correction`,
``tests/verl/test_verl_lab_correction_on_cpu.py``). A preset verl cannot express is refused by name.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import yaml
from torch import Tensor
from transfer_queue import KVBatchMeta
from verl.utils.torch_functional import get_constant_schedule_with_warmup

from ...verl.launch import compose
from ...verl.lr import apply_lr_scale
from ...verl.recipe import CONFIG_NAME
from ...verl.runtime import VerlRuntime, read_config
from ...verl.trainer import MismatchCtrlTrainer
from ...verl.transport import LocalTransferQueue
from ...verl.workers import LR_SCALE_KEY
from .methods import method_section
from .trainer import PREFIX, Trainer
from .verl_correction import correction_gap, native_correction


class PerUpdate:
    """The lab loop's per-optimizer-step scheduler call, a no-op: verl steps its scheduler once per update."""

    def step(self, increment: int) -> None:
        return None


class VerlTrainer(Trainer):
    """One lab run with the advantage step and the LR factor through verl's trainer (module docstring)."""

    def start_hooks(self) -> None:
        section = method_section(self.spec.method)
        try:
            self.correction = native_correction(section, self.policy.config.n_experts)
        except ValueError as exc:
            raise ValueError(f"method {self.spec.method!r}: {exc}") from None
        if self.correction is not None:  # ours trains (the slime hook); verl's is computed beside it (advantages)
            section = {key: value for key, value in section.items() if key != "correction"}
        folder = self.out_dir / "verl"
        folder.mkdir(parents=True, exist_ok=True)
        method = folder / "method.yaml"
        method.write_text(yaml.safe_dump({"mismatch_ctrl": section}))
        model = folder / "model"
        model.mkdir(exist_ok=True)
        (model / "config.json").write_text(json.dumps({"model_type": "lab", "num_experts":
                                                       self.policy.config.n_experts}))
        s = self.settings
        config = compose(CONFIG_NAME, [
            "trainer.v1.trainer_mode=mismatch_ctrl", f"+mismatch_ctrl.config={method}",
            "algorithm.adv_estimator=grpo", f"actor_rollout_ref.model.path={model}",
            f"data.max_response_length={self.max_new}", f"actor_rollout_ref.rollout.n={s.samples_per_prompt}",
            f"data.train_batch_size={s.prompts_per_step}", f"actor_rollout_ref.actor.ppo_mini_batch_size="
            f"{s.prompts_per_step // s.optimizer_steps}"])
        runtime = VerlRuntime(read_config(config))
        self.verl = MismatchCtrlTrainer.__new__(MismatchCtrlTrainer)
        self.verl.config, self.verl.mismatch_ctrl, self.verl.actor_rollout_wg = config, runtime, self
        self.queue = LocalTransferQueue()
        self.lambda_lr = get_constant_schedule_with_warmup(self.optimizer, num_warmup_steps=0)
        self.scheduler = PerUpdate()

    def _meta(self, n: int) -> KVBatchMeta:
        group = self.settings.samples_per_prompt
        return KVBatchMeta(partition_id="train", keys=[f"p{i // group}_s{i % group}_0" for i in range(n)],
                           tags=[{} for _ in range(n)])

    def advantages(self, step: int, data: dict[str, Any]) -> None:
        meta = self._meta(len(data["raw_reward"]))
        for i, key in enumerate(meta.keys):
            mask = data["loss_masks"][i]
            scores = mask.new_zeros(mask.numel(), dtype=data["log_probs"][i].dtype)
            scores[-1] = data["raw_reward"][i]
            self.queue.rows[key] = {"uid": mask.new_tensor(i // self.settings.samples_per_prompt),
                                    "response_mask": mask, "old_log_probs": data["log_probs"][i],
                                    "rollout_log_probs": data["rollout_log_probs"][i], "rm_scores": scores}
        self.verl.global_steps = step + 1
        metrics: dict[str, float] = {}
        with self.queue.installed():
            self.verl._compute_advantage(meta, metrics)
        data["advantages"] = [self.queue.rows[key]["advantages"] for key in meta.keys]
        data["returns"] = list(data["advantages"])
        if self.correction is not None:
            gap = correction_gap(*self.correction, data["response_lengths"], torch.cat(data["log_probs"]),
                                 torch.cat(data["rollout_log_probs"]), torch.cat(data["loss_masks"]),
                                 self.verl.mismatch_ctrl.config.nonfinite)
            metrics.update({PREFIX + name: value for name, value in gap.items()})
        data.update({name: [value] for name, value in metrics.items() if name.startswith(PREFIX)})

    def train_rollout(self, step: int, data: dict[str, Any], rollout: Any) -> dict[str, float]:
        self._update = (step, data, rollout)
        self.verl._update_actor(self._meta(len(data["rewards"])), {})
        return self._train_metrics

    def update_actor(self, batch: KVBatchMeta) -> dict[str, Any]:
        """verl's actor worker group (``actor_rollout_wg.update_actor``), in this process."""
        apply_lr_scale(self.optimizer, self.lambda_lr, batch.extra_info.get(LR_SCALE_KEY, 1.0))
        self._train_metrics = super().train_rollout(*self._update)
        self.lambda_lr.step()
        return {"metrics": {"mfu": 0.0, "lr": self.lambda_lr.get_last_lr()[0]}}

    def before_optimizer_step(self, step: int, opt_step: int) -> None:
        return None  # the factor is applied once per update, before its mini-batches (update_actor)

    def correct(self, **kwargs: Any) -> tuple[Tensor, list[Tensor], dict[str, Tensor]]:
        if self.correction is not None:
            return super().correct(**kwargs)  # ours, through the slime hook
        return kwargs["pg_loss"], kwargs["loss_masks"], {}  # no correction: verl's loss weighs nothing

