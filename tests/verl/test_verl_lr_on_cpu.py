"""Length-triggered LR decay on verl's workers: the factor applied to every param group before each update, under
the schedulers verl 0.9.1 builds (its FSDP cosine/constant LambdaLR, megatron-core's OptimizerParamScheduler from
verl's Megatron config), never changing the scheduler's state, across a checkpoint round trip; the worker class
the trainer swaps in pops the factor verl delivers from ``extra_info``."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
from tensordict import TensorDict
from verl.trainer.ppo.utils import Role
from verl.utils import tensordict_utils as tu
from verl.utils.megatron.optimizer import get_megatron_optimizer_param_scheduler
from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup
from verl.workers import engine_workers

from mismatch_ctrl.errors import ConfigError, InputError
from mismatch_ctrl.verl import workers
from mismatch_ctrl.verl.lr import apply_lr_scale
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl.trainer import MismatchCtrlTrainer
from verl_harness import compose_verl, dense_model, trainer_of, verl_config

SCALES = [1.0, 1.0, 0.5, 0.5, 0.25, 0.25, 0.25, 0.1]


def optimizer():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    return torch.optim.AdamW([{"params": model[0].parameters()}, {"params": model[1].parameters(), "lr": 3e-3}],
                             lr=1e-3)


def fsdp(opt, kind):
    return get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=8, min_lr_ratio=0.1) \
        if kind == "cosine" else get_constant_schedule_with_warmup(opt, num_warmup_steps=2)


@functools.lru_cache(maxsize=None)
def megatron_optim():
    optim = "actor_rollout_ref.actor.optim"
    config = compose_verl("model_engine=megatron", f"{optim}.lr=1e-3", f"{optim}.min_lr=1e-4",
                          f"{optim}.lr_warmup_steps=2", f"{optim}.lr_decay_style=cosine",
                          f"{optim}.total_training_steps=8")
    return config.actor_rollout_ref.actor.optim


def megatron(opt):
    return get_megatron_optimizer_param_scheduler(opt, megatron_optim())


def verl_update(opt, sched, scale, kind):
    """One verl update: the factor, the mini-batches' optimizer steps (lrs recorded), then verl's scheduler step."""
    apply_lr_scale(opt, sched, scale)
    used = [g["lr"] for g in opt.param_groups]
    opt.step()
    sched.step(1) if kind == "megatron" else sched.step()
    return used


def build(kind):
    opt = optimizer()
    return opt, megatron(opt) if kind == "megatron" else fsdp(opt, kind)


def state(sched):
    return {k: v for k, v in sched.state_dict().items() if k != "lr_lambdas"}


@pytest.mark.parametrize("kind", ["cosine", "constant", "megatron"])
def test_factor_scales_the_schedule_and_never_its_state(kind):
    opt, sched = build(kind)
    plain_opt, plain = build(kind)
    for scale in SCALES:
        expected = [g["lr"] for g in plain_opt.param_groups]
        used = verl_update(opt, sched, scale, kind)
        assert used == pytest.approx([lr * scale for lr in expected], rel=1e-12)
        verl_update(plain_opt, plain, 1.0, kind)
        assert state(sched) == state(plain)  # the scheduler never sees the factor


@pytest.mark.parametrize("kind", ["cosine", "megatron"])
def test_checkpoint_round_trip_resumes_the_same_lrs(kind):
    opt, sched = build(kind)
    lrs = [verl_update(opt, sched, s, kind) for s in SCALES[:4]]
    saved = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    lrs += [verl_update(opt, sched, s, kind) for s in SCALES[4:]]
    opt2, sched2 = build(kind)
    opt2.load_state_dict(saved[0])
    sched2.load_state_dict(saved[1])
    resumed = [verl_update(opt2, sched2, s, kind) for s in SCALES[4:]]
    assert sum(resumed, []) == pytest.approx(sum(lrs[4:], []), rel=1e-12)


def test_bad_factor_and_unknown_scheduler_are_refused():
    opt, sched = build("cosine")
    with pytest.raises(InputError, match="expected a finite number > 0"):
        apply_lr_scale(opt, sched, float("nan"))
    with pytest.raises(ConfigError, match="neither a LambdaLR"):
        apply_lr_scale(opt, object(), 0.5)
    opt.param_groups[1]["default_config"] = False
    with pytest.raises(ConfigError, match="own LR schedule"):
        apply_lr_scale(opt, megatron(opt), 0.5)


class Engine:
    def __init__(self, kind):
        self.optimizer, self.lr_scheduler = build(kind)


def test_worker_pops_the_factor_and_scales_before_verls_mini_batches(monkeypatch):
    seen = {}

    def verl_train_mini_batch(self, data):
        seen["lrs"] = [g["lr"] for g in self.engine.optimizer.param_groups]
        seen["keys"] = list(data.keys())
        return "verl's output"

    monkeypatch.setattr(engine_workers.TrainingWorker, "train_mini_batch", verl_train_mini_batch)
    worker = workers.TrainingWorker.__new__(workers.TrainingWorker)
    worker.engine = Engine("cosine")
    base = [g["lr"] for g in worker.engine.optimizer.param_groups]
    data = TensorDict({"x": torch.zeros(2, 1)}, batch_size=2)
    tu.assign_non_tensor(data, **{workers.LR_SCALE_KEY: 0.5})
    assert worker.train_mini_batch(data) == "verl's output"
    assert seen["lrs"] == pytest.approx([lr * 0.5 for lr in base]) and workers.LR_SCALE_KEY not in seen["keys"]
    with pytest.raises(InputError, match="trainer_mode=mismatch_ctrl"):
        worker.train_mini_batch(TensorDict({"x": torch.zeros(2, 1)}, batch_size=2))
    assert workers.ActorRolloutRefWorker.actor_worker_cls is workers.TrainingWorker


class ActorGroup:
    def __init__(self):
        self.batches = []

    def update_actor(self, batch):
        self.batches.append(copy.deepcopy(batch.extra_info))
        return {"metrics": {"mfu": 0.5, "lr": 1e-6}}


def test_trainer_sends_the_factor_and_swaps_the_actor_worker(tmp_path):
    config = verl_config("actor_rollout_ref.actor.ppo_mini_batch_size=2", method="dcgrpo_length_decay",
                         model=dense_model(tmp_path))
    trainer = trainer_of(MismatchCtrlTrainer, config)
    trainer.mismatch_ctrl = VerlRuntime(read_config(config))
    trainer.actor_rollout_wg = ActorGroup()
    from transfer_queue import KVBatchMeta
    trainer._update_actor(KVBatchMeta(partition_id="train", keys=["a_0_0"], tags=[{}]), {})
    assert trainer.actor_rollout_wg.batches[0][workers.LR_SCALE_KEY] == 1.0
    trainer._init_resource_pool_mgr()
    actor = trainer.role_worker_mapping[Role.ActorRollout]
    assert actor.__ray_metadata__.modified_class.__mro__[1] is workers.ActorRolloutRefWorker
