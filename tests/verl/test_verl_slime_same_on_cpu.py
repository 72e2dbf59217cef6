"""One core, two adapters: on the same batches the verl adapter (through verl's real ``_compute_advantage``) and the
slime advantage hook give the same shaped advantages and the same lambda trajectory, with the per-architecture
defaults of the same model ``config.json`` (read by slime from ``--hf-checkpoint``, by verl from
``actor_rollout_ref.model.path``)."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest
import torch
import yaml

from mismatch_ctrl.slime.hooks import advantages as slime_advantages
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl.trainer import MismatchCtrlTrainer
from test_verl_advantage_on_cpu import reference_grpo
from verl_harness import METHODS, FakeTransferQueue, load_step, make_step, trainer_of, verl_config

PROMPT = 7
STEPS = 6


def slime_args(section, model):
    """The ``args`` slime hands its hooks (the flags the adapter reads; no --save: nothing persisted)."""
    return Namespace(mismatch_ctrl=section, num_experts=None, hf_checkpoint=str(model), save=None, load=None,
                     finetune=False, start_rollout_id=None, lr=1e-6, min_lr=0.0, advantage_estimator="grpo",
                     custom_advantage_function_path="mismatch_ctrl.slime.hooks.advantages",
                     custom_tis_function_path=None, custom_megatron_before_train_step_hook_path=(
                         "mismatch_ctrl.slime.hooks.before_train_step"), get_mismatch_metrics=True,
                     rollout_max_response_len=40, save_interval=None, num_rollout=100)


def slime_rollout(step):
    return {"rewards": reference_grpo(step), "response_lengths": [m.numel() for m in step.mask],
            "total_lengths": [m.numel() + PROMPT for m in step.mask], "loss_masks": [m.int() for m in step.mask],
            "log_probs": [t.clone() for t in step.old], "rollout_log_probs": [t.clone() for t in step.rollout],
            "kl": [torch.zeros_like(t) for t in step.old]}


@pytest.mark.parametrize("method, experts, extra", [
    ("dcgrpo", 0, {}),
    ("dcgrpo", 128, {"dcgrpo": {"eps": "auto", "calibration_rollouts": 2, "penalty_form": "hinge"}}),
    ("dcgrpo_length_decay", 0, {"lr_decay": {"period": 3}}),
])
def test_slime_and_verl_adapters_agree(tmp_path, monkeypatch, method, experts, extra):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "qwen3", "num_experts": experts}))
    section = yaml.safe_load((METHODS / f"{method}.yaml").read_text())["mismatch_ctrl"]
    for key, value in extra.items():
        section[key] = {**section.get(key, {}), **value}
    path = tmp_path / "method.yaml"
    path.write_text(yaml.safe_dump({"mismatch_ctrl": section}))
    trainer = trainer_of(MismatchCtrlTrainer, verl_config("data.max_response_length=40", method=path, model=model))
    trainer.mismatch_ctrl = VerlRuntime(read_config(trainer.config))
    args = slime_args(section, model)
    assert trainer.mismatch_ctrl.config.architecture == ("moe" if experts else "dense")
    lambdas = {"slime": [], "verl": []}
    for k in range(STEPS):
        step = make_step(100 + k, noise=0.05 * (k + 1))
        rollout_data = slime_rollout(step)
        slime_advantages(args, rollout_data)
        queue = FakeTransferQueue()
        queue.install(monkeypatch)
        load_step(queue, step)
        trainer.global_steps = k + 1
        metrics = {}
        trainer._compute_advantage(step.meta(), metrics)
        for i, key in enumerate(step.keys):
            trained = step.mask[i].bool()
            verl_adv = queue.rows[key]["advantages"]
            torch.testing.assert_close(verl_adv[trained], rollout_data["advantages"][i][trained].float(),
                                       atol=2e-6, rtol=1e-5)
            assert not verl_adv[~trained].any()
        for name in ("lambda", "lambda_next", "discrepancy", "lr_scale", "penalty_abs_mean", "eps"):
            slime_value = rollout_data.get(f"mismatch_ctrl/{name}", [None])[0]
            verl_value = metrics.get(f"mismatch_ctrl/{name}")
            assert (slime_value is None) == (verl_value is None), name
            if slime_value is not None:
                assert verl_value == pytest.approx(slime_value, rel=1e-6, abs=1e-9), name
        lambdas["slime"].append(rollout_data["mismatch_ctrl/lambda_next"][0])
        lambdas["verl"].append(metrics["mismatch_ctrl/lambda_next"])
    assert lambdas["verl"] == pytest.approx(lambdas["slime"], rel=1e-6)
    assert len(set(lambdas["verl"])) > 1
