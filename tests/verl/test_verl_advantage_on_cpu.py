"""DC-GRPO through verl 0.9.1's real trainer code: ``PPOTrainer._compute_advantage`` (verl's rollout correction and
GRPO) runs unchanged inside the adapter's override, with only TransferQueue's get/put stubbed, and the advantages it
writes back are checked against a per-sequence loop written here from the paper's formulas."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import yaml
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.padding_utils import construct_minimal_padding_template
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from mismatch_ctrl.errors import InputError
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl.trainer import MismatchCtrlTrainer
from verl_harness import FakeTransferQueue, load_step, make_step, trainer_of, verl_config

PAPER = {"name": "dcgrpo_plain", "architecture": "dense",
         "dcgrpo": {"enabled": True, "lambda_0": 0.05, "eta": 2.0, "eps": 0.02, "lambda_max": 1.0,
                    "penalty_cap": "none", "zero_advantage": "penalise", "drift_guard": "off", "eps_guard": "off"}}


def write_method(tmp_path, section):
    path = tmp_path / f"{section['name']}.yaml"
    path.write_text(yaml.safe_dump({"mismatch_ctrl": section}))
    return path


def adapter(config):
    trainer = trainer_of(MismatchCtrlTrainer, config)
    trainer.mismatch_ctrl = VerlRuntime(read_config(config))
    return trainer


def reference_grpo(step):
    """GRPO per prompt group: (r - mean) / (std + 1e-6), unbiased std; a single sample keeps r."""
    out = []
    for i, u in enumerate(step.uid):
        group = [step.rewards[j] for j in range(len(step.uid)) if step.uid[j] == u]
        if len(group) == 1:
            out.append(step.rewards[i])
            continue
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
        out.append((step.rewards[i] - mean) / (std + 1e-6))
    return out


def reference_step(step, lam, settings):
    """Shaped advantages and the next lambda, one sequence at a time."""
    adv, c_seq, shaped = reference_grpo(step), [], []
    for i in range(len(step.keys)):
        m = step.mask[i].double()
        c = (step.old[i].double().exp() - step.rollout[i].double().exp()).abs() * m
        c_seq.append(float(c.sum() / max(float(m.sum()), 1.0)))
        shaped.append((adv[i] - lam * c) * m)
    c_bar = sum(c_seq) / len(c_seq)
    lam_next = min(max(lam + settings["eta"] * (c_bar - settings["eps"]), 0.0), settings["lambda_max"])
    return shaped, c_bar, lam_next


def test_advantages_and_lambda_through_verls_compute_advantage(tmp_path, monkeypatch):
    config = verl_config(method=write_method(tmp_path, PAPER))
    trainer = adapter(config)
    lam = PAPER["dcgrpo"]["lambda_0"]
    lambdas = []
    for seed in range(4):
        queue = FakeTransferQueue()
        queue.install(monkeypatch)
        step = make_step(70 + seed)
        load_step(queue, step)
        trainer.global_steps = seed + 1
        metrics = {}
        trainer._compute_advantage(step.meta(), metrics)
        shaped, c_bar, lam_next = reference_step(step, lam, PAPER["dcgrpo"])
        for i, key in enumerate(step.keys):
            torch.testing.assert_close(queue.rows[key]["advantages"].double(), shaped[i], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(queue.rows[key]["returns"], queue.rows[key]["advantages"])
        assert metrics["mismatch_ctrl/lambda"] == pytest.approx(lam)
        assert metrics["mismatch_ctrl/discrepancy"] == pytest.approx(c_bar, rel=1e-5)
        assert metrics["mismatch_ctrl/lambda_next"] == pytest.approx(lam_next, rel=1e-5)
        assert any(k.startswith("rollout_corr/") for k in metrics)  # verl's correction metrics ran (metrics only)
        lambdas.append(lam_next)
        lam = lam_next
    assert len(set(lambdas)) == len(lambdas)  # lambda moved every step


def test_verls_rollout_corr_metrics_and_grpo_unchanged_without_dcgrpo(tmp_path, monkeypatch):
    """The adapter leaves verl's own results alone: ``rollout_corr/*`` metrics equal those of verl's own trainer on
    the same batch, and with DC-GRPO off (length decay only) the advantages are verl's GRPO."""
    step = make_step(81)
    runs = {}
    for name, cls, method in (("verl", PPOTrainerSync, None), ("adapter", MismatchCtrlTrainer, "length_decay")):
        overrides = ("algorithm.rollout_correction.rollout_is=token", "algorithm.adv_estimator=grpo")
        trainer = trainer_of(cls, verl_config(*overrides)) if method is None else adapter(verl_config(
            *overrides, method=write_method(tmp_path, {"name": method, "architecture": "dense",
                                                       "lr_decay": {"enabled": True, "period": 5}})))
        queue = FakeTransferQueue()
        queue.install(monkeypatch)
        load_step(queue, step)
        metrics = {}
        trainer._compute_advantage(step.meta(), metrics)
        runs[name] = (metrics, copy.deepcopy(queue.rows))
    verl_metrics, adapter_metrics = runs["verl"][0], runs["adapter"][0]
    corr = {k: v for k, v in verl_metrics.items() if k.startswith("rollout_corr/")}
    assert corr and corr == {k: v for k, v in adapter_metrics.items() if k.startswith("rollout_corr/")}
    assert "mismatch_ctrl/lr_scale" in adapter_metrics and "mismatch_ctrl/lambda" not in adapter_metrics
    for key in step.keys:
        for field in ("advantages", "returns", "response_mask", "rollout_is_weights"):
            torch.testing.assert_close(runs["adapter"][1][key][field], runs["verl"][1][key][field])
    reference = reference_grpo(step)
    for i, key in enumerate(step.keys):
        expected = reference[i] * step.mask[i].float()
        torch.testing.assert_close(runs["verl"][1][key]["advantages"], expected, atol=1e-5, rtol=1e-5)


def test_mismatched_lengths_name_the_field(tmp_path, monkeypatch):
    config = verl_config(method=write_method(tmp_path, PAPER))
    trainer = adapter(config)
    queue = FakeTransferQueue()
    queue.install(monkeypatch)
    step = make_step(90)
    load_step(queue, step)
    key = step.keys[0]
    queue.rows[key]["rollout_log_probs"] = torch.cat([queue.rows[key]["rollout_log_probs"], torch.zeros(2)])
    with pytest.raises(InputError, match="response 0: rollout_log_probs has .* tokens but response_mask has"):
        trainer._compute_advantage(step.meta(), {})


def test_verls_padding_responses_are_no_samples(tmp_path, monkeypatch):
    """verl pads a batch its data-parallel and mini-batch sizes do not divide with synthetic one-token responses
    (verl's own template, tagged ``is_padding``; ``_balance_batch``): the controllers' step over the padded batch is
    the step over its samples (``C_bar``, lambda, mean length, every metric), the samples' advantages are the same,
    and the padding keeps verl's zero advantage."""
    config = verl_config(method=write_method(tmp_path, PAPER))
    step = make_step(95)
    runs = []
    for pads in (0, 3):
        queue = FakeTransferQueue()
        queue.install(monkeypatch)
        load_step(queue, step)
        meta = step.meta()
        template, tag = construct_minimal_padding_template(queue.rows[step.keys[0]], {}, eos_token_id=2)
        keys = [f"pad_{i}_0" for i in range(pads)]
        for key in keys:  # the worker's recompute scores the padding's one token too
            queue.rows[key] = {"response_mask": template["response_mask"], "rm_scores": template["rm_scores"],
                               "rollout_log_probs": template["rollout_log_probs"], "uid": torch.tensor(-1),
                               "old_log_probs": torch.tensor([-0.7])}
        assert tag["is_padding"] and not template["response_mask"].any()
        meta = KVBatchMeta(partition_id="train", keys=meta.keys + keys, tags=meta.tags + [tag] * pads)
        metrics = {}
        adapter(config)._compute_advantage(meta, metrics)
        runs.append(({k: v for k, v in metrics.items() if k.startswith("mismatch_ctrl/")}, queue.rows))
    (plain, plain_rows), (padded, padded_rows) = runs
    assert padded == plain and plain["mismatch_ctrl/discrepancy"] > 0
    for key in step.keys:
        torch.testing.assert_close(padded_rows[key]["advantages"], plain_rows[key]["advantages"], rtol=0, atol=0)
    assert all(not padded_rows[f"pad_{i}_0"]["advantages"].any() for i in range(3))
