"""The lab through the verl adapter matches the lab through the slime hooks run for run (same seed, same policy,
same engine) for the methods whose computation the adapters own: GRPO, and DC-GRPO with length decay (T_d = 1, so the
factor halves every rollout). The strongest check that the two adapters share one core: every logged number of
every rollout agrees to float tolerance. (A correction preset: ``test_verl_lab_correction_on_cpu.py``.)"""

from __future__ import annotations

import json
import math

import pytest
import torch

from mismatch_ctrl.lab.model.policy import PolicyConfig, TinyPolicy
from mismatch_ctrl.lab.model.tasks import make_task
from mismatch_ctrl.lab.training import trainer as slime_lab
from mismatch_ctrl.lab.training import verl_trainer
from mismatch_ctrl.lab.training.methods import RunSpec, method_section
from mismatch_ctrl.lab.training.settings import LabSettings
from mismatch_ctrl.lab.training.trainer import Trainer
from mismatch_ctrl.lab.training.verl_trainer import VerlTrainer

SETTINGS = dict(steps=4, prompts_per_step=4, samples_per_prompt=4, eval_every=2, eval_prompts=16, policy="dense",
                seed=260)
FAST_DECAY = {"lr_decay": {"enabled": True, "period": 1}}


def policy_state():
    policy = TinyPolicy(PolicyConfig.for_task(make_task("add"), d_model=32, n_layers=1, n_heads=2, d_ff=64), seed=1)
    return {"policy_config": policy.config.to_dict(), "state_dict": policy.state_dict()}


def records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("method, quant", [("grpo", "e4m3"), ("dcgrpo_length_decay", "e5m2")])
def test_lab_through_verl_matches_the_slime_run(tmp_path, monkeypatch, method, quant):
    if method == "dcgrpo_length_decay":  # a factor within 4 rollouts: T_d = 1
        section = {**method_section(method), **FAST_DECAY}
        for module in (slime_lab, verl_trainer):
            monkeypatch.setattr(module, "method_section", lambda name, section=section: section)
    state = policy_state()
    runs = {}
    for name, cls in (("slime", Trainer), ("verl", VerlTrainer)):
        torch.manual_seed(0)
        cls(RunSpec.parse(method, quant), LabSettings(**SETTINGS), state, tmp_path / name).run()
        runs[name] = records(tmp_path / name / "metrics.jsonl")
    assert len(runs["slime"]) == len(runs["verl"]) == SETTINGS["steps"]
    compared = 0
    for slime, verl in zip(runs["slime"], runs["verl"]):
        for key in sorted(set(slime) & set(verl) - {"seconds"}):
            if isinstance(slime[key], float) and math.isnan(slime[key]):
                assert math.isnan(verl[key]), key
            else:
                assert verl[key] == pytest.approx(slime[key], rel=1e-5, abs=1e-7), (slime["step"], key)
            compared += 1
        assert not {k for k in verl if k not in slime}  # verl logs nothing the slime run does not
    assert compared > 60
    if method == "dcgrpo_length_decay":
        assert len({r["lambda"] for r in runs["verl"]}) > 1  # the multiplier moved
        assert [r["lr_scale"] for r in runs["verl"]] == [1.0, 0.5, 0.25, 0.125]
        assert runs["verl"][-1]["train/lr"] == pytest.approx(1e-3 * 0.125)  # LabSettings.lr

