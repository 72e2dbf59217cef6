"""The lab through verl with a correction verl computes natively: training runs with our correction (the slime hook),
and each rollout reports how far verl 0.9.1's own correction lies from ours. The reported numbers are recomputed here
from the rollout's dump (slime's ``--dump-details`` format, written by the lab's trainer): our weights by a per-token
loop over the preset's formula, verl's by its ``compute_rollout_correction_and_rejection_mask`` called directly. A
planted discrepancy (another threshold on verl's side) is reported, not hidden; a preset verl cannot express is
refused by name."""

from __future__ import annotations

import math

import pytest
import torch
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask

from mismatch_ctrl.lab.sweeps.verl_compare import differences
from mismatch_ctrl.lab.training import methods, verl_correction
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.training.settings import LabSettings
from mismatch_ctrl.lab.training.verl_trainer import VerlTrainer
from mismatch_ctrl.verl_vocabulary import PRESET_KEYS
from test_verl_lab_on_cpu import policy_state, records

NARROW = (0.99, 1.01)
"""An IcePop band the tiny policy's mismatch leaves (its ratios lie within about [0.98, 1.025]; [0.5, 2] holds them
all)."""
SETTINGS = dict(steps=3, prompts_per_step=4, samples_per_prompt=4, eval_every=3, eval_prompts=16, policy="dense",
                seed=261, dump_details=True)
GAP = ("weight_abs_max", "weight_rel_max", "keep_differs", "kept_by_verl_only", "tokens")


def our_correction(old, rollout, band):
    """Ours, token by token: ``rho = exp(clamp(old - rollout, -20, 20))``; token TIS (``band`` None) keeps every token
    at weight ``min(rho, 2)``, IcePop keeps ``lo <= rho <= hi`` at weight ``rho`` and drops the rest (weight 0)."""
    keep, weights = [], []
    for lp, rlp in zip(old.tolist(), rollout.tolist()):
        rho = math.exp(min(max(lp - rlp, -20.0), 20.0))
        kept = band is None or band[0] <= rho <= band[1]
        keep.append(kept)
        weights.append((min(rho, 2.0) if band is None else rho) if kept else 0.0)
    return torch.tensor(keep), torch.tensor(weights, dtype=torch.float64)


def expected_gap(dump, band, keys):
    """The gap metrics of one rollout, from its dump: verl's function called directly with ``keys`` on the padded
    batch, against :func:`our_correction`."""
    samples = dump["samples"]
    old = torch.nn.utils.rnn.pad_sequence([s["log_probs"] for s in samples], batch_first=True)
    rollout = torch.nn.utils.rnn.pad_sequence([s["rollout_log_probs"] for s in samples], batch_first=True)
    mask = torch.nn.utils.rnn.pad_sequence([s["loss_masks"].long() for s in samples], batch_first=True)
    weights, verl_mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=old, rollout_log_prob=rollout, response_mask=mask, **keys)
    abs_max = rel_max = 0.0
    differs = verl_only = tokens = 0
    for i, s in enumerate(samples):
        n = s["response_lengths"]
        ours_keep, ours_w = our_correction(s["log_probs"], s["rollout_log_probs"], band)
        for t in range(n):
            verl_keep = bool(verl_mask[i, t])
            verl_w = float(weights.batch["rollout_is_weights"][i, t])
            tokens += 1
            differs += verl_keep != bool(ours_keep[t])
            verl_only += verl_keep and not ours_keep[t]
            if verl_keep and ours_keep[t]:
                diff = abs(verl_w - float(ours_w[t]))
                abs_max = max(abs_max, diff)
                rel_max = max(rel_max, diff / max(abs(verl_w), float(ours_w[t])) if diff else 0.0)
    return dict(zip(GAP, (abs_max, rel_max, differs, verl_only, tokens))), metrics


def run_verl(tmp_path, method, quant="e5m2"):
    torch.manual_seed(0)
    out = tmp_path / "verl"
    VerlTrainer(RunSpec.parse(method, quant), LabSettings(**SETTINGS), policy_state(), out).run()
    return out, records(out / "metrics.jsonl")


def check_reported(out, rows, band, keys):
    for row in rows:
        expected, verl_metrics = expected_gap(torch.load(out / "dump" / "train_data" / f"{row['step']}.pt"), band,
                                              keys)
        for name, value in expected.items():
            assert row[f"correction_gap/{name}"] == pytest.approx(value, rel=1e-5, abs=2e-7), (row["step"], name)
        for name, value in verl_metrics.items():  # verl's own metrics, as its call gives them
            assert row[name] == pytest.approx(float(value), rel=1e-6, abs=1e-9, nan_ok=True), (row["step"], name)
        assert row["correction/is_weight_mean"] > 0  # ours beside verl's
    return [dict((name, row[f"correction_gap/{name}"]) for name in GAP) for row in rows]


def test_the_gap_to_verls_token_tis_is_reported_per_rollout(tmp_path):
    out, rows = run_verl(tmp_path, "token_tis")
    gaps = check_reported(out, rows, None, PRESET_KEYS["token_tis"])
    assert all(g["weight_abs_max"] < 1e-6 and g["keep_differs"] == 0 and g["tokens"] > 0 for g in gaps)


def test_icepops_out_of_band_tokens_are_reported(tmp_path, monkeypatch):
    """The same band on both sides (verl's keys by the adapter's rule): equal weights, and the tokens verl keeps in
    response_mask at weight 0 where ours drops them are counted."""
    monkeypatch.setitem(methods.VARIANTS, "icepop_narrow", ("icepop", {"correction": dict(zip(("is_low", "is_high"),
                                                                                               NARROW))}))
    out, rows = run_verl(tmp_path, "icepop_narrow")
    gaps = check_reported(out, rows, NARROW, {**PRESET_KEYS["token_mis"], "rollout_is_threshold": "0.99_1.01"})
    assert all(g["weight_abs_max"] < 1e-6 for g in gaps)
    assert all(g["keep_differs"] == g["kept_by_verl_only"] > 0 for g in gaps)


@pytest.mark.parametrize("method", ["seq_mis", "geo_mis"])
def test_a_preset_verl_cannot_express_is_refused_by_name(tmp_path, method):
    with pytest.raises(ValueError, match=f"'{method}'.*no verl 0.9.1 equivalent.*nearest"):
        VerlTrainer(RunSpec.parse(method, "e4m3"), LabSettings(**SETTINGS), policy_state(), tmp_path)


def test_a_planted_discrepancy_is_reported_and_training_stays_ours(tmp_path, capsys, monkeypatch):
    """``verl_compare`` with verl's threshold planted at 1.005 against our 2.0: tokens with 1.005 < rho weigh
    differently, the gap says by how much (recomputed here), the summary prints it and does not fail on it; and every
    number both runs log agrees (exit 0): the verl run trained with our correction as the slime run did."""
    from mismatch_ctrl.lab.sweeps import verl_compare

    planted = {**PRESET_KEYS["token_tis"], "rollout_is_threshold": 1.005}
    monkeypatch.setattr(verl_correction, "correction_keys", lambda config: planted)
    monkeypatch.setattr(verl_compare, "warmup_policy", lambda preset: type("W", (), {"policy": _policy()})())
    monkeypatch.setattr(verl_compare, "LabSettings", lambda **kw: LabSettings(**{**SETTINGS, **kw}))
    code = verl_compare.main(["--method", "token_tis", "--quant", "e5m2", "--steps", str(SETTINGS["steps"]),
                              "--seed", str(SETTINGS["seed"]), "--out", str(tmp_path)])
    text = capsys.readouterr().out
    assert code == 0 and "the adapters agree" in text, text
    slime, rows = records(tmp_path / "slime" / "metrics.jsonl"), records(tmp_path / "verl" / "metrics.jsonl")
    assert "train/mismatch_ctrl/is_weight_mean" in slime[0]  # our correction's metrics, from the slime hook
    # the verl run logs all the slime run logs but the slime hook's guard of slime's rewards (verl computes its own)
    assert all(set(a) - set(b) == {"nonfinite_reward_fraction"} for a, b in zip(slime, rows))
    assert len(differences(slime, rows)) > 50
    gaps = check_reported(tmp_path / "verl", rows, None, planted)
    worst = max(g["weight_abs_max"] for g in gaps)
    assert worst > 0.005 and all(g["keep_differs"] == 0 for g in gaps)
    assert "correction token_tis: verl 0.9.1's own against ours" in text and f"at most {worst:.3g}" in text


def _policy():
    from mismatch_ctrl.lab.model.policy import PolicyConfig, TinyPolicy

    state = policy_state()
    policy = TinyPolicy(PolicyConfig(**state["policy_config"]))
    policy.load_state_dict(state["state_dict"])
    return policy

