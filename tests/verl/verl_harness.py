"""What the verl tests share: verl 0.9.1's own Hydra config composed from the installed wheel, an in-memory stand-in
for TransferQueue's two calls the driver makes (the remote data transport: the only thing stubbed), verl-shaped step
data, and trainer objects built as verl's own CPU tests build them (``__new__`` plus the attributes a method reads;
verl ``tests/trainer/ppo/v1/test_trainer_base_on_cpu.py``).

verl keeps a step's data in TransferQueue per response key ``{uid}_{session}_{index}`` as jagged tensors (one row per
response: ``response_mask``, ``old_log_probs``, ``rollout_log_probs``, ``rm_scores`` with the reward on the last token;
``uid`` one number per row), which is what :class:`FakeTransferQueue` stores.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transfer_queue as tq
from omegaconf import open_dict
from transfer_queue import KVBatchMeta

from mismatch_ctrl.verl.launch import compose
from mismatch_ctrl.verl.recipe import CONFIG_NAME
from mismatch_ctrl.verl.transport import LocalTransferQueue

REPO = Path(__file__).resolve().parents[2]
METHODS = REPO / "configs" / "methods"
GROUP = 4


def verl_config(*overrides: str, method: str | Path | None = None, model: Path | None = None) -> Any:
    """verl's ``ppo_trainer`` config from the wheel with Hydra ``overrides`` (verl's schema refuses unknown keys);
    ``method`` adds what docs/verl.md tells a user to add: ``+mismatch_ctrl.config=<method>``, the adapter's trainer
    and GRPO (verl's default estimator is GAE). Composed once per set of overrides (Hydra takes seconds); the method
    and model paths are then set on a copy, as ``+mismatch_ctrl.config`` and ``actor_rollout_ref.model.path`` would
    (:func:`compose_verl` composes them for real)."""
    extra = ("trainer.v1.trainer_mode=mismatch_ctrl", "algorithm.adv_estimator=grpo") if method is not None else ()
    config = copy.deepcopy(_composed((*extra, *overrides)))
    with open_dict(config):
        if method is not None:
            config.mismatch_ctrl = {"config": str(method if isinstance(method, Path) else METHODS / f"{method}.yaml")}
        if model is not None:
            config.actor_rollout_ref.model.path = str(model)
    return config


@functools.lru_cache(maxsize=None)
def _composed(overrides: tuple[str, ...]) -> Any:
    return compose_verl(*overrides)


def compose_verl(*overrides: str) -> Any:
    """verl's ``ppo_trainer`` config (``model_engine=megatron`` among the overrides for the Megatron backend) composed
    by Hydra from the wheel's config directory, as ``main_ppo`` and the launchers' dry run do."""
    return compose(CONFIG_NAME, overrides)


def dense_model(tmp_path: Path) -> Path:
    """A model directory whose ``config.json`` says dense (no experts): the architecture verl's model path names."""
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text('{"model_type": "qwen3", "num_hidden_layers": 2}')
    return model


class FakeTransferQueue(LocalTransferQueue):
    """The package's in-process TransferQueue, installed for one test by pytest's ``monkeypatch``."""

    def install(self, monkeypatch: Any) -> None:
        monkeypatch.setattr(tq, "kv_batch_get", self.kv_batch_get)
        monkeypatch.setattr(tq, "kv_batch_put", self.kv_batch_put)


@dataclass
class Step:
    """One step's responses (full length, in key order) and the batch metadata verl's trainer passes around."""

    keys: list[str]
    uid: list[int]
    rewards: list[float]
    mask: list[torch.Tensor]
    old: list[torch.Tensor]
    rollout: list[torch.Tensor]

    def meta(self) -> KVBatchMeta:
        return KVBatchMeta(partition_id="train", keys=list(self.keys), tags=[{} for _ in self.keys])


def make_step(seed: int, groups: int = 4, noise: float = 0.3, max_length: int = 40) -> Step:
    """Random responses of ``groups`` prompts x ``GROUP`` samples: lengths 1..max_length, a few untrained tokens,
    rollout log-probs near the trainer's (FP8-like noise), rewards 0/1 (a group may be all equal)."""
    gen = torch.Generator().manual_seed(seed)
    keys, uid, rewards, mask, old, rollout = [], [], [], [], [], []
    for g in range(groups):
        for s in range(GROUP):
            n = int(torch.randint(1, max_length + 1, (1,), generator=gen))
            m = (torch.rand(n, generator=gen) > 0.1).long()
            m[0] = 1 if torch.rand(1, generator=gen) > 0.05 else m[0]
            lp = -torch.rand(n, generator=gen) * 3.0
            rlp = (lp + noise * torch.randn(n, generator=gen)).clamp(max=0.0)
            keys.append(f"p{g}_s{s}_0")
            uid.append(g)
            rewards.append(float(torch.rand(1, generator=gen) > (0.5 if g % 3 else 2.0)))
            mask.append(m)
            old.append(lp)
            rollout.append(rlp)
    return Step(keys, uid, rewards, mask, old, rollout)


def load_step(queue: FakeTransferQueue, step: Step) -> None:
    """Put a step's data where verl's trainer expects it after ``_compute_old_log_prob``."""
    for i, key in enumerate(step.keys):
        scores = torch.zeros(step.mask[i].numel())
        scores[-1] = step.rewards[i]
        queue.rows[key] = {"uid": torch.tensor(step.uid[i]), "response_mask": step.mask[i],
                           "old_log_probs": step.old[i], "rollout_log_probs": step.rollout[i], "rm_scores": scores}


def trainer_of(cls: type, config: Any) -> Any:
    """A trainer object with ``config`` as verl's CPU tests build one: no workers, no Ray."""
    trainer = cls.__new__(cls)
    trainer.config = config
    trainer.global_steps = 1
    return trainer
