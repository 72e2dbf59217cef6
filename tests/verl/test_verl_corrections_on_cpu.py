"""The mapping table against verl 0.9.1's own correction: for every preset verl expresses, verl's
``compute_rollout_correction_and_rejection_mask`` with the table's keys gives our weights and masks; the presets it
cannot express run from our core on verl's driver (through verl's real ``_compute_advantage``), checked against a
per-sequence loop."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from mismatch_ctrl.batch import TokenBatch
from mismatch_ctrl.correction import apply_correction
from mismatch_ctrl.presets import PRESETS
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl.trainer import MismatchCtrlTrainer
from mismatch_ctrl.verl_vocabulary import PRESET_KEYS
from verl_harness import FakeTransferQueue, load_step, make_step, trainer_of, verl_config

NATIVE = [p for p, keys in PRESET_KEYS.items() if keys is not None]


def padded_batch(seed, rows=24, width=40, noise=0.6):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None, :] < lengths[:, None]) & (torch.rand(rows, width, generator=gen) > 0.05)
    old = -torch.rand(rows, width, generator=gen) * 2.0
    rollout = (old + noise * torch.randn(rows, width, generator=gen)).clamp(max=0.0)
    rollout[rows // 2] = old[rows // 2] + 1e-5  # a sequence where the engines (almost) agree
    return old, rollout, mask.long(), lengths


@pytest.mark.parametrize("preset", NATIVE)
@pytest.mark.parametrize("seed", [70, 71])
def test_verls_native_correction_equals_ours(preset, seed):
    old, rollout, mask, lengths = padded_batch(seed)
    keys = PRESET_KEYS[preset]
    weights, verl_mask, _ = compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, **keys)
    ours = apply_correction(PRESETS[preset], TokenBatch.from_padded(old, rollout, mask, lengths))
    keep = torch.arange(old.shape[1])[None, :] < lengths[:, None]
    verl_w = torch.ones_like(old) if weights is None else weights.batch["rollout_is_weights"]
    verl_final = (verl_w * verl_mask)[keep]
    torch.testing.assert_close(verl_final, ours.weights.to(verl_final.dtype), rtol=1e-5, atol=1e-6)
    if keys["rollout_is"] is not None and "_" in str(keys["rollout_is_threshold"]):
        # IcePop in verl zeroes the weight but keeps the token in response_mask (the loss's token count); ours
        # drops it from the mask: same weights, another denominator under token-mean aggregation.
        dropped = (verl_mask[keep] != 0) & (ours.mask == 0)
        assert dropped.any() and torch.equal(verl_final[dropped], torch.zeros(int(dropped.sum())))
        assert torch.equal(ours.mask.bool() | dropped, verl_mask[keep].bool())
    else:
        assert torch.equal(verl_mask[keep].to(ours.mask.dtype), ours.mask)
    if preset == "k3_rs":
        assert 0 < int((verl_mask.sum(1) == 0).sum()) < old.shape[0]  # the band rejected some, not all


def reference_geo(step, spec):
    """Geo-RS with veto (+ token TIS), one sequence at a time: rho = exp(l), l = old - rollout clamped to +-20."""
    out = []
    for m, lp, rlp in zip(step.mask, step.old, step.rollout):
        l_tok = (lp.double() - rlp.double()).clamp(-20, 20)
        trained = m.bool()
        n = int(trained.sum())
        geo = math.exp(float(l_tok[trained].sum()) / max(n, 1))
        vetoed = bool((l_tok[trained].exp() < spec.veto).any())
        rejected = n > 0 and (not spec.rs_low <= geo <= spec.rs_high or vetoed)
        keep = trained & (not rejected)
        weight = l_tok.exp().clamp(max=spec.is_high) if spec.is_level == "token" else torch.ones_like(l_tok)
        out.append((keep.long(), weight * keep))
    return out


@pytest.mark.parametrize("preset", ["geo_mis", "geo_rs_token_tis"])
def test_presets_verl_cannot_express_run_from_the_core_on_the_driver(tmp_path, monkeypatch, preset):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"mismatch_ctrl": {"name": preset, "architecture": "dense",
                                                      "correction": {"preset": preset}}}))
    config = verl_config(method=path)
    trainer = trainer_of(MismatchCtrlTrainer, config)
    trainer.mismatch_ctrl = VerlRuntime(read_config(config))
    queue = FakeTransferQueue()
    queue.install(monkeypatch)
    step = make_step(73, noise=0.002)
    load_step(queue, step)
    metrics = {}
    trainer._compute_advantage(step.meta(), metrics)
    expected = reference_geo(step, PRESETS[preset])
    rejected = 0
    for key, (keep, weight) in zip(step.keys, expected):
        row = queue.rows[key]
        assert torch.equal(row["response_mask"], keep)
        rejected += int(keep.sum() == 0)
        if preset == "geo_rs_token_tis":
            torch.testing.assert_close(row["rollout_is_weights"].double(), weight, rtol=1e-5, atol=1e-7)
        else:
            assert "rollout_is_weights" not in row
        assert not row["advantages"][keep == 0].any()
    assert 0 < rejected < len(step.keys)
    assert metrics["mismatch_ctrl/correction/rejected_seq_fraction"] == pytest.approx(
        sum(int(k.sum() == 0) and int(m.sum() > 0) for (k, _), m in zip(expected, step.mask)) / len(step.keys))
