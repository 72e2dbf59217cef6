"""Bad input and inconsistent slime flags give clear errors naming the field and the fix (single process, no
megatron), plus the context-parallel cases from the spawned worlds."""

from __future__ import annotations

import logging

import pytest
import torch
from slime_compare import WORLD_IDS
from slime_data import FULL, PREFIX, cp_positions, make_args, make_batch, method, rollout_data

from mismatch_ctrl.errors import ConfigError, InputError
from mismatch_ctrl.slime import hooks

BATCH = make_batch(7)
DCGRPO = method("dcgrpo")
GRPO = method("grpo")

ONE_STEP = {"rollout_batch_size": 32, "n_samples_per_prompt": 8, "global_batch_size": 256}
"""A rollout that is one optimizer step (slime can reuse the log-probs in the loss)."""


def data(**changes):
    out = rollout_data(BATCH, FULL)
    out.update(changes)
    return out


def tis_kwargs(batch=BATCH, **changes):
    d = rollout_data(batch, FULL)
    kwargs = {"pg_loss": torch.zeros(sum(batch.response_lengths)), "train_log_probs": d["log_probs"],
              "rollout_log_probs": d["rollout_log_probs"], "loss_masks": d["loss_masks"],
              "total_lengths": d["total_lengths"], "response_lengths": d["response_lengths"]}
    kwargs.update(changes)
    return kwargs


def test_missing_rollout_log_probs():
    d = data()
    del d["rollout_log_probs"]
    with pytest.raises(InputError, match="rollout_log_probs"):
        hooks.advantages(make_args(DCGRPO), d)


def test_missing_log_probs_with_dcgrpo_asks_for_get_mismatch_metrics():
    d = data()
    del d["log_probs"]
    with pytest.raises(InputError, match="--get-mismatch-metrics"):
        hooks.advantages(make_args(DCGRPO), d)


def test_missing_log_probs_with_grpo_skips_the_metrics_and_warns_once(caplog):
    """slime's single-step recipe recomputes no log-probs: GRPO still works (slime's own advantages), the mismatch
    metrics are skipped, and the warning comes once, not every rollout."""
    args = make_args(GRPO)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        for _ in range(3):
            d = data()
            del d["log_probs"]
            hooks.advantages(args, d)
    warnings = [r for r in caplog.records if "log_probs" in r.getMessage()]
    assert len(warnings) == 1 and "--get-mismatch-metrics" in warnings[0].getMessage()
    assert all(torch.equal(a, torch.ones_like(kl) * reward)
               for a, kl, reward in zip(d["advantages"], d["kl"], d["rewards"]))
    assert PREFIX + "prob_diff_mean" not in d and PREFIX + "mean_response_length" in d


@pytest.mark.parametrize("shared, tis_hook", [(False, True), (True, True), (True, False)])
def test_compact_rollouts_are_named_once(shared, tis_hook, caplog):
    """Samples sharing a rollout id (a multi-turn trajectory) change how slime averages the TIS hook's train/ metrics:
    said once per run where that hook runs; unique ids, slime's default, say nothing."""
    args = make_args(GRPO) if tis_hook else make_args(GRPO, custom_tis_function_path=None)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        for _ in range(3):
            d = data()
            if shared:
                d["rollout_ids"] = [i // 2 for i in range(len(d["rewards"]))]
            hooks.advantages(args, d)
    said = [r for r in caplog.records if "compact rollouts" in r.getMessage()]
    assert len(said) == (shared and tis_hook) and (not said or "per trajectory, not per sample" in said[0].getMessage())


def test_log_probs_length_mismatch_names_the_sample_and_both_lengths():
    d = data()
    k = 4
    n = BATCH.response_lengths[k]
    d["rollout_log_probs"][k] = d["rollout_log_probs"][k][:-1]
    with pytest.raises(InputError) as exc:
        hooks.advantages(make_args(DCGRPO), d)
    message = str(exc.value)
    assert f"sample {k}" in message and str(n - 1) in message and str(n) in message


def test_loss_mask_shorter_than_the_response():
    d = data()
    d["loss_masks"][2] = d["loss_masks"][2][1:]
    with pytest.raises(InputError, match=r"sample 2: loss_masks has \d+ tokens but response_lengths\[2\]"):
        hooks.advantages(make_args(DCGRPO), d)


def test_tis_pg_loss_length_mismatch():
    n = sum(BATCH.response_lengths)
    with pytest.raises(InputError, match=f"pg_loss has {n + 1} tokens.*{n}"):
        hooks.rollout_correction(make_args(method("token_tis")), **tis_kwargs(pg_loss=torch.zeros(n + 1)))


def test_tis_log_probs_length_mismatch():
    kwargs = tis_kwargs()
    kwargs["train_log_probs"] = list(kwargs["train_log_probs"])
    kwargs["train_log_probs"][0] = torch.zeros(BATCH.response_lengths[0] + 2)
    with pytest.raises(InputError, match="sample 0: log_probs"):
        hooks.rollout_correction(make_args(method("token_tis")), **kwargs)


@pytest.mark.parametrize("section, key", [
    ({"dcgrpo": {"enabled": True, "lamda_0": 0.1}}, "mismatch_ctrl.dcgrpo.lamda_0"),
    ({"name": "x", "dcgpro": {"enabled": True}}, "mismatch_ctrl.dcgpro"),
    ({"correction": {"preset": "token_tis", "is_hgh": 3.0}}, "mismatch_ctrl.correction.is_hgh"),
])
def test_unknown_config_keys_are_named(section, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        hooks.on_megatron_init(make_args(section))


def test_args_without_mismatch_ctrl():
    with pytest.raises(ConfigError, match="--custom-config-path"):
        hooks.on_megatron_init(make_args(None))


@pytest.mark.parametrize("section, flags, needle", [
    (method("geo_mis"), {"custom_tis_function_path": None}, "preset 'geo_mis' needs --custom-tis-function-path"),
    (method("acrl"), {"custom_tis_function_path": None}, "acrl needs --custom-tis-function-path"),
    (method("grpo", correction={"use_tis": True, "use_rs": False, "tis_level": "token", "tis_mode": "truncate",
                                "tis_upper_bound": 2.0}), {"custom_tis_function_path": None},
     "the correction section needs --custom-tis-function-path"),
    (method("token_tis"), {"get_mismatch_metrics": False}, "--get-mismatch-metrics"),
    (method("length_decay"), {"custom_megatron_before_train_step_hook_path": None},
     "--custom-megatron-before-train-step-hook-path"),
    (DCGRPO, {"custom_advantage_function_path": "slime.custom.advantages"}, "--custom-advantage-function-path"),
    (GRPO, {"advantage_estimator": "ppo"}, "--advantage-estimator ppo"),
    (method("length_decay"), {"decoupled_lr": 1.0e-5}, "decoupled"),
    (DCGRPO, {"get_mismatch_metrics": False, **ONE_STEP}, "global_batch_size = 32 x 8 // 256 = 1"),
    (DCGRPO, {"get_mismatch_metrics": False, **ONE_STEP, "global_batch_size": 200}, "32 x 8 // 200 = 1"),
    (method("acrl"), {"get_mismatch_metrics": False, "use_tis": True, **ONE_STEP}, "one optimizer step per rollout"),
    (DCGRPO, {"get_mismatch_metrics": False, "use_rollout_logprobs": True}, "--use-rollout-logprobs"),
])
def test_inconsistent_slime_flags_fail_at_init(section, flags, needle):
    with pytest.raises(ConfigError) as exc:
        hooks.on_megatron_init(make_args(section, **flags))
    assert needle in str(exc.value)


@pytest.mark.parametrize("flags", [
    {"global_batch_size": 64},  # four optimizer steps per rollout: slime recomputes the log-probs
    {"kl_coef": 0.01}, {"keep_old_actor": True}, {"advantage_estimator": "gspo"},
    {"use_routing_replay": True}, {"get_mismatch_metrics": True},
])
def test_dcgrpo_without_get_mismatch_metrics_runs_where_slime_recomputes_log_probs(flags, caplog):
    """slime 624b824 actor.py:461-475 recomputes the training log-probs unless the one-step loss can reuse them."""
    args = make_args(DCGRPO, **{"get_mismatch_metrics": False, **ONE_STEP, **flags})
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.on_megatron_init(args)
    assert not any("--get-mismatch-metrics" in r.getMessage() for r in caplog.records)


def test_use_tis_is_enough_to_run_the_correction_hook():
    hooks.on_megatron_init(make_args(method("token_tis"), get_mismatch_metrics=False, use_tis=True))


def test_nonfinite_error_policy_names_the_sample():
    batch = make_batch(11, nonfinite=True)
    bad = next(i for i, b in enumerate(batch.nonfinite) if b)
    with pytest.raises(InputError, match=f"sample {bad}: non-finite log-prob"):
        hooks.advantages(make_args(dict(DCGRPO, nonfinite="error")), rollout_data(batch, FULL))


def test_nonfinite_log_probs_keep_pg_loss_finite_single_process():
    """The guard on the CPU lab's path: the NaN/-inf tokens are counted, dropped from the returned masks and from
    pg_loss (even where pg_loss itself is NaN), and the gradient is finite."""
    batch = make_batch(11, nonfinite=True)
    d = rollout_data(batch, FULL)
    args = make_args(method("token_tis"))
    hooks.advantages(args, d)
    assert d[PREFIX + "nonfinite_tokens"][0] == sum(len(b) for b in batch.nonfinite) > 0
    pg = torch.ones(sum(batch.response_lengths))
    offsets = torch.tensor([0] + batch.response_lengths).cumsum(0).tolist()
    for i, bad in enumerate(batch.nonfinite):
        pg[[offsets[i] + p for p in bad]] = float("nan")
    pg.requires_grad_(True)
    out, masks, _ = hooks.rollout_correction(args, **tis_kwargs(batch, pg_loss=pg))
    out.sum().backward()
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(pg.grad).all())
    for i, bad in enumerate(batch.nonfinite):
        for p in bad:
            assert masks[i][p] == 0 and out[offsets[i] + p] == 0 and pg.grad[offsets[i] + p] == 0


def test_lr_hook_needs_the_advantage_hook_of_the_same_rollout():
    args = make_args(method("length_decay"))
    d = data()
    del d["log_probs"]
    hooks.advantages(args, d)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ConfigError, match="--custom-advantage-function-path"):
        hooks.before_train_step(args, 1, 0, [], optimizer, None)


@pytest.mark.parametrize("optimizer", [object(), None, torch.nn.Linear(1, 1)], ids=["object", "none", "module"])
def test_lr_hook_names_an_optimizer_without_param_groups(optimizer):
    args = make_args(method("length_decay"))
    hooks.advantages(args, data())
    with pytest.raises(ConfigError, match=r"before_train_step: the optimizer \(\w+\) has no param_groups to scale"):
        hooks.before_train_step(args, 0, 0, [], optimizer, None)


@pytest.mark.parametrize("world", [2, 4], ids=WORLD_IDS.get)
def test_full_length_tensors_under_context_parallelism(runs, world):
    """Full-length log-probs or pg_loss where slime passes CP-local ones: every CP rank raises InputError (before any
    collective, so nothing hangs) naming the sample, both lengths and the CP share."""
    from slime_scenarios import seed_of

    batch = make_batch(seed_of("bad_input_cp"))
    for rank in runs.world(world, "bad_input_cp"):
        view, result = rank["view"], rank["result"]
        local = [len(cp_positions(batch.total_lengths[g], batch.response_lengths[g], view.cp_rank, view.cp_size))
                 for g in result["samples"]]
        k = next(i for i, g in enumerate(result["samples"]) if local[i] != batch.response_lengths[g])
        full = batch.response_lengths[result["samples"][k]]
        message = result["advantages_error"]
        assert f"sample {k}: log_probs" in message and f"has {full} tokens" in message
        assert f"response has {local[k]}" in message and "context-parallel" in message
        assert f"{result['local_tokens']}" in result["tis_error"] and "pg_loss" in result["tis_error"]


YAML_SHAPES = {
    "empty section": "mismatch_ctrl:\n",
    "empty mapping": "mismatch_ctrl: {}\n",
    "lost indentation": "mismatch_ctrl:\nname: dcgrpo\ndcgrpo:\n  enabled: true\n",
    "a list": "mismatch_ctrl:\n  - name: grpo\n",
    "a string": "mismatch_ctrl: dcgrpo\n",
    "valid": "mismatch_ctrl:\n  name: grpo\n",
    "valid dcgrpo": "mismatch_ctrl:\n  name: dcgrpo\n  dcgrpo:\n    enabled: true\n",
    "unknown key": "mismatch_ctrl:\n  name: grpo\n  dcgrpoo: {}\n",
}


@pytest.mark.parametrize("shape", sorted(YAML_SHAPES))
def test_check_config_and_the_init_hook_refuse_the_same_yaml_shapes(tmp_path, shape, capsys):
    """slime merges every top-level key of --custom-config-path into args; whatever on_megatron_init refuses,
    check-config refuses first, and the other way round."""
    import yaml

    from mismatch_ctrl.cli import main

    path = tmp_path / "method.yaml"
    path.write_text(YAML_SHAPES[shape])
    checked = main(["check-config", str(path), "--num-experts", "128"])
    args = make_args(None, **yaml.safe_load(path.read_text()))
    try:
        hooks.on_megatron_init(args)
        refused = False
    except ConfigError:
        refused = True
    assert (checked == 2) == refused, capsys.readouterr().err
    assert refused == (not shape.startswith("valid"))


@pytest.mark.parametrize("key", ["log_probs", "rollout_log_probs"])
def test_integer_log_probs_are_refused_not_averaged(key):
    d = rollout_data(make_batch(3), FULL)
    d[key] = [t.round().long() for t in d[key]]
    with pytest.raises(InputError, match=f"{key if key != 'log_probs' else 'train_log_probs'} must hold floating-point "
                                         "log-probs, got dtype torch.int64"):
        hooks.advantages(make_args(method("dcgrpo")), d)


def test_a_nonfinite_pg_loss_is_counted_and_named_not_hidden(caplog):
    batch = make_batch(5)
    args = make_args(method("grpo"))
    offsets = torch.tensor([0] + batch.response_lengths).cumsum(0).tolist()
    sample = next(i for i, m in enumerate(batch.loss_masks) if int(m.sum()) >= 2)
    position = offsets[sample] + int(batch.loss_masks[sample].nonzero()[0, 0])
    pg = torch.ones(sum(batch.response_lengths))
    pg[position] = float("nan")
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        out, _, metrics = hooks.rollout_correction(args, **tis_kwargs(batch, pg_loss=pg))
    assert torch.isnan(out[position])  # slime's loss will be NaN: not hidden
    fraction = metrics[PREFIX + "nonfinite_pg_loss_fraction"]
    assert fraction[position] == 1 and float(fraction.sum()) == 1
    assert "pg_loss is NaN/inf at 1 trained token" in caplog.text and "slime's loss" in caplog.text
    _, _, clean = hooks.rollout_correction(args, **tis_kwargs(batch, pg_loss=torch.ones_like(pg)))
    assert float(clean[PREFIX + "nonfinite_pg_loss_fraction"].sum()) == 0
