"""Issue 23 items 6-8: settings that would leave a controller or a guard inert are refused or warned about by one
rule in every place that reads them (check-config, the hook's init); state files with values outside their range
are refused naming the field; the TIS hook refuses a non-floating ``pg_loss`` and names tensors on other devices."""

from __future__ import annotations

import json
import logging

import pytest
import torch
import yaml
from slime_data import FULL, PREFIX, make_args, make_batch, method, rollout_data

from mismatch_ctrl.config import build_config, inert_settings
from mismatch_ctrl.controllers import ControllerSet
from mismatch_ctrl.dcgrpo import LagrangeController
from mismatch_ctrl.errors import ConfigError, InputError, StateError
from mismatch_ctrl.hostguard import HostGuard
from mismatch_ctrl.slime import hooks

MOE = {"architecture": "moe"}


def config(**sections):
    return build_config({**MOE, **sections})


@pytest.mark.parametrize("factor", [1.0, 0.5, 0.0, -2.0])
def test_an_eps_auto_factor_at_or_below_the_floor_is_refused(factor):
    with pytest.raises(ConfigError, match=r"dcgrpo.eps_auto_factor: must be > 1, got .*infeasible"):
        config(dcgrpo={"enabled": True, "eps_auto_factor": factor})


def test_a_factor_far_above_the_floor_is_warned_about_without_a_run_length():
    errors, warnings = inert_settings(config(dcgrpo={"enabled": True, "eps_auto_factor": 50.0}))
    assert not errors and len(warnings) == 1 and "eps_auto_factor = 50" in warnings[0]
    assert inert_settings(config(dcgrpo={"enabled": True, "eps_auto_factor": 1.1})) == ([], [])


@pytest.mark.parametrize("sections, rollouts, kind, text", [
    ({"dcgrpo": {"enabled": True, "eps": "auto", "calibration_rollouts": 20}}, 20, "error", "calibrate for the whole"),
    ({"acrl": {"enabled": True, "calibration_rollouts": 8}}, 8, "error", "never move its band"),
    ({"dcgrpo": {"enabled": True, "floor_rollouts": 12}}, 12, "warning", "never measure the floor"),
    ({"dcgrpo": {"enabled": True, "drift_window": 12}}, 12, "warning", "never complete a streak"),
    ({"dcgrpo": {"enabled": True, "eps": "auto", "calibration_rollouts": 10, "drift_window": 10}}, 20, "warning",
     "eps: auto calibrates for 10"),
    ({"lr_decay": {"enabled": True, "period": 50}}, 50, "warning", "never halves"),
])
def test_settings_inert_over_the_run_are_named(sections, rollouts, kind, text):
    errors, warnings = inert_settings(config(**sections), rollouts)
    found = errors if kind == "error" else warnings
    assert len(found) == 1 and text in found[0] and (not warnings if kind == "error" else not errors)
    assert inert_settings(config(**sections), rollouts * 10) == ([], [])  # a longer run leaves nothing inert


def test_the_hook_init_refuses_and_warns_by_the_same_rule(caplog):
    args = make_args(method("acrl", acrl={"calibration_rollouts": 8}), num_rollout=8)
    with pytest.raises(ConfigError, match="never move its band"):
        hooks.on_megatron_init(args)
    args = make_args(method("dcgrpo", dcgrpo={"drift_window": 30}), num_rollout=25)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.on_megatron_init(args)
    assert "never complete a streak" in caplog.text


@pytest.mark.parametrize("changes, needle", [
    ({"eps": 0.0}, r"dcgrpo\.eps: 0 is below the run's eps 0.005"), ({"eps": -1.0}, r"dcgrpo\.eps: must be >= 0"),
    ({"eps_setting": 3.0}, r"dcgrpo\.eps_setting: must be < 1"), ({"floor": -0.01}, r"dcgrpo\.floor: must be >= 0"),
    ({"observed": [0.01, -1.0]}, r"dcgrpo\.observed: .*must be >= 0"), ({"streak": [-0.5]}, r"dcgrpo\.streak: .*"
                                                                                           "must be >= 0"),
    # C_bar above exp(20), which no signal gives: 1.1 x such a floor could overflow to inf
    ({"observed": [1e308] * 3, "floor": 1e308, "rollouts": 3}, r"dcgrpo\.observed: .*must be <= exp\(20\)"),
    ({"observed": [0.01] * 3, "floor": 0.02, "rollouts": 3}, r"dcgrpo\.floor: 0.02 is not the median 0.01"),
])
def test_a_restored_dcgrpo_state_out_of_range_is_refused_naming_the_field(changes, needle):
    settings = config(dcgrpo={"enabled": True, "eps": 0.005}).dcgrpo
    state = LagrangeController(settings).state_dict()
    state.update(changes)
    with pytest.raises(StateError, match=needle):
        LagrangeController(settings).load_state_dict(state)


def test_the_whole_state_refuses_an_edited_eps_and_changes_nothing():
    controllers = ControllerSet(config(dcgrpo={"enabled": True, "eps": 0.005}))
    state = controllers.state_dict()
    state["dcgrpo"]["eps"] = -5.0
    before = controllers.state_dict()
    with pytest.raises(StateError, match=r"state_0000003.json: state.dcgrpo.eps: must be >= 0"):
        controllers.load_state_dict(state, "state_0000003.json: state")
    assert controllers.state_dict() == before


def test_a_run_whose_eps_calibrated_past_any_budget_resumes_from_its_own_state(caplog):
    """A broken engine (mean |log ratio| 0.95) calibrates eps to 1.045 >= 1: the run warns and goes on, and the state
    it writes resumes (with the warning again), not refused as out of range."""
    settings = config(dcgrpo={"enabled": True, "eps": "auto", "signal": "log_diff", "calibration_rollouts": 3}).dcgrpo
    ran = LagrangeController(settings)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        for _ in range(4):
            ran.update(0.95)
        assert ran.eps == pytest.approx(1.045) and "is no budget" in caplog.text
        caplog.clear()
        restored = LagrangeController(settings)
        restored.load_state_dict(json.loads(json.dumps(ran.state_dict())))
    assert restored.state_dict() == ran.state_dict() and "set by the saved run" in caplog.text


def tis_kwargs(**changes):
    d = rollout_data(make_batch(3), FULL)
    kwargs = {"pg_loss": torch.zeros(sum(d["response_lengths"])), "train_log_probs": d["log_probs"],
              "rollout_log_probs": d["rollout_log_probs"], "loss_masks": d["loss_masks"],
              "total_lengths": d["total_lengths"], "response_lengths": d["response_lengths"]}
    return {**kwargs, **changes}


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
def test_a_non_floating_pg_loss_is_refused_not_truncated(dtype):
    kwargs = tis_kwargs()
    kwargs["pg_loss"] = kwargs["pg_loss"].to(dtype)
    with pytest.raises(InputError, match=f"pg_loss must hold slime's floating-point per-token loss, got dtype {dtype}"):
        hooks.rollout_correction(make_args(method("token_tis")), **kwargs)


@pytest.mark.parametrize("name", ["grpo", "token_tis", "seq_mis"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_metrics_of_a_half_precision_pg_loss_stay_finite(name, dtype):
    """The TIS hook's metrics come in pg_loss's dtype, except float16: a log-ratio at its clamp (20) gives weights and
    k3 of exp(20) = 4.9e8, beyond float16's 65504, which read as inf in train/mismatch_ctrl/*."""
    kwargs = tis_kwargs()
    kwargs["rollout_log_probs"] = [t - 30.0 for t in kwargs["rollout_log_probs"]]
    kwargs["pg_loss"] = torch.ones(kwargs["pg_loss"].numel(), dtype=dtype)
    out, _, metrics = hooks.rollout_correction(make_args(method(name)), **kwargs)
    assert out.dtype == dtype and bool(torch.isfinite(out).all())
    for key, value in metrics.items():
        assert value.dtype == (torch.float32 if dtype == torch.float16 else dtype), key
        assert bool(torch.isfinite(value).all()), key


def test_tensors_on_other_devices_are_named():
    meta = tis_kwargs(pg_loss=torch.zeros(sum(tis_kwargs()["response_lengths"]), device="meta"))
    with pytest.raises(InputError, match="pg_loss is on meta but train_log_probs of sample 0 is on cpu"):
        hooks.rollout_correction(make_args(method("token_tis")), **meta)
    kwargs = tis_kwargs()
    kwargs["rollout_log_probs"] = [kwargs["rollout_log_probs"][0].to("meta"), *kwargs["rollout_log_probs"][1:]]
    with pytest.raises(InputError, match="sample 0: rollout_log_probs is on meta but train_log_probs of sample 0 is "
                                         "on cpu"):
        hooks.rollout_correction(make_args(method("token_tis")), **kwargs)


def test_check_config_refuses_and_warns_by_the_same_rule_as_the_hook(capsys):
    from mismatch_ctrl import cli

    assert cli.main(["check-config", "configs/methods/acrl.yaml", "--num-rollout", "5"]) == 2
    assert "never move its band" in capsys.readouterr().err
    assert cli.main(["check-config", "configs/methods/dcgrpo.yaml", "--num-rollout", "8", "--arch", "moe"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning:") == 1 and "drift_window = 10 but --num-rollout is 8" in err
    assert cli.main(["check-config", "configs/methods/dcgrpo.yaml", "--num-rollout", "500", "--arch", "moe"]) == 0
    assert capsys.readouterr().err == ""


def test_a_deeply_nested_hf_config_is_named_not_a_traceback(tmp_path, capsys):
    from mismatch_ctrl import cli

    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    assert cli.main(["check-config", "configs/methods/dcgrpo.yaml", "--hf-config", str(path)]) == 2
    assert f"{path} is nested too deeply to be a model's config.json" in capsys.readouterr().err


# --- a hostile round on items 6-8 -------------------------------------------------------------------------------------

FIXED = {"enabled": True, "penalty_form": "fixed", "drift_guard": "off"}


@pytest.mark.parametrize("sections, rollouts, text", [
    ({"dcgrpo": {**FIXED, "eps": "auto", "calibration_rollouts": 20}}, 20, "calibrate for the whole run"),
    ({"dcgrpo": {**FIXED, "lambda_0": 0.0}}, None, "lambda_0 = 0 with penalty_form: fixed"),
    ({"acrl": {"enabled": True, "c_min": 1.0, "c_0": 1.0, "c_max": 1.0}}, None, "ACRL would never move it"),
])
def test_a_controller_that_could_never_act_is_refused_in_every_place(sections, rollouts, text, tmp_path, capsys):
    from mismatch_ctrl import cli

    errors, _ = inert_settings(config(**sections), rollouts)
    assert len(errors) == 1 and text in errors[0]
    path = tmp_path / "method.yaml"
    path.write_text(yaml.safe_dump({"mismatch_ctrl": {"name": "t", **MOE, **sections}}))
    run_length = ["--num-rollout", str(rollouts)] if rollouts else []
    assert cli.main(["check-config", str(path), *run_length]) == 2
    assert text in capsys.readouterr().err
    with pytest.raises(ConfigError, match=text):
        hooks.on_megatron_init(make_args({"name": "t", **MOE, **sections}, num_rollout=rollouts or 100))


@pytest.mark.parametrize("sections, rollouts, text", [
    ({"dcgrpo": {**FIXED, "drift_guard": "persistent"}}, None, "there is no dual update, so the drift guard never"),
    ({"lr_decay": {"enabled": True, "period": "auto"}}, 31, "the detector needs 32 rollouts"),
    ({"lr_decay": {"enabled": True, "period": "auto", "surge": {"warmup": 200}}}, 150, "the detector needs 203"),
])
def test_a_guard_or_schedule_that_could_never_act_is_warned_about(sections, rollouts, text, caplog):
    errors, warnings = inert_settings(config(**sections), rollouts)
    assert not errors and len(warnings) == 1 and text in warnings[0]
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        hooks.on_megatron_init(make_args({"name": "t", **MOE, **sections}, num_rollout=rollouts or 100))
    assert text in caplog.text


def test_the_surge_detector_is_not_warned_about_when_it_can_trigger():
    assert inert_settings(config(lr_decay={"enabled": True, "period": "auto"}), 32) == ([], [])


def test_an_eps_auto_factor_nothing_uses_is_not_warned_about():
    """Only eps: auto, the floor guard's clamp and the drift guard multiply a floor by eps_auto_factor."""
    unused = {"enabled": True, "eps": 0.01, "eps_guard": "off", "drift_guard": "off", "eps_auto_factor": 50.0}
    assert inert_settings(config(dcgrpo=unused)) == ([], [])
    assert inert_settings(config(dcgrpo={**FIXED, "eps_auto_factor": 50.0})) == ([], [])


def test_a_min_scale_of_one_that_would_never_decay_the_lr_is_refused():
    with pytest.raises(ConfigError, match=r"lr_decay.min_scale: must be in \(0, 1\), got 1.0: .*inert"):
        config(lr_decay={"enabled": True, "period": 10, "min_scale": 1})


def saved_run(tmp_path):
    """Three DC-GRPO rollouts saved as slime would run them, rollout 2 marked as Megatron's checkpoint."""
    args = make_args(method("dcgrpo"), save=str(tmp_path), save_interval=3)
    for r in range(3):
        hooks.advantages(args, rollout_data(make_batch(100 + r), FULL))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("2")
    return tmp_path / "mismatch_ctrl"


def resume(tmp_path):
    args = make_args(method("dcgrpo"), load=str(tmp_path), save=str(tmp_path))
    hooks.on_megatron_init(args)
    return args


def edited(state, path, value):
    *keys, last = path
    for key in keys:
        state = state[key]
    state[last] = value


INCONSISTENT_STATES = [
    (("dcgrpo", "rollouts"), 0, r"dcgrpo\.rollouts: 0 rollouts updated the controller but 3 C_bar were observed"),
    (("dcgrpo", "eps"), 1e-9, r"dcgrpo\.eps: 1e-09 is below the run's eps 0.005"),
    (("dcgrpo", "lifts"), 10 ** 30, r"dcgrpo\.lifts: must be an integer >= 0 \(and below 2\*\*53\)"),
    (("surge", "start"), 2 ** 60, r"surge\.start: must be an integer >= 0 \(and below 2\*\*53\)"),
    (("surge", "baseline"), -100.0, r"surge\.baseline: must be >= 0"),
    (("surge", "streak"), 100, r"surge\.streak: 100 rising rollouts in a history of 3"),
    (("surge", "onset"), 1, r"surge\.onset: onset 1 and trigger None do not lie in order"),
    (("last_rollout",), 99, r"last_rollout: 99, but the surge detector's history .* ends at rollout 2"),
]


@pytest.mark.parametrize("path, value, message", INCONSISTENT_STATES)
def test_a_restored_state_out_of_range_or_inconsistent_is_refused_naming_the_field(path, value, message, tmp_path):
    state_file = saved_run(tmp_path) / "state_0000002.json"
    document = json.loads(state_file.read_text())
    edited(document["state"], path, value)
    state_file.write_text(json.dumps(document))
    with pytest.raises(StateError, match=message):
        resume(tmp_path)


@pytest.mark.parametrize("path, value, message", INCONSISTENT_STATES)
def test_a_refused_state_leaves_the_live_controllers_as_they_were(path, value, message):
    controllers = ControllerSet(config(dcgrpo={"enabled": True, "eps": 0.005}))
    for r in range(3):
        controllers.dcgrpo.update(0.004 + 0.001 * r)
        controllers.surge.update(r, 100.0)
        controllers.last_rollout = r
    state, before = controllers.state_dict(), json.dumps(controllers.state_dict())
    edited(state, path, value)
    with pytest.raises(StateError, match=message):
        controllers.load_state_dict(state)
    assert json.dumps(controllers.state_dict()) == before


def test_a_surge_trigger_beyond_the_history_is_refused():
    from mismatch_ctrl.lr_schedule import SurgeDetector, SurgeSettings

    detector = SurgeDetector(SurgeSettings())
    for r in range(3):
        detector.update(r, 100.0)
    state = {**detector.state_dict(), "onset": 1, "triggered_at": 40, "baseline": 100.0}
    with pytest.raises(StateError, match=r"surge\.onset: onset 1 and trigger 40 do not lie in order within the history "
                                         r"of rollouts 0 to 2"):
        detector.load_state_dict(state)


def test_a_state_file_copied_from_another_rollout_is_refused(tmp_path):
    directory = saved_run(tmp_path)
    document = json.loads((directory / "state_0000001.json").read_text())
    document["rollout_id"] = 2
    (directory / "state_0000002.json").write_text(json.dumps(document))
    with pytest.raises(StateError, match=r"state_0000002.json: state.last_rollout: 1, but the file is the state after "
                                         "rollout 2"):
        resume(tmp_path)


def test_a_state_file_with_a_key_given_twice_is_refused(tmp_path):
    state_file = saved_run(tmp_path) / "state_0000002.json"
    text = state_file.read_text()
    state_file.write_text(text.replace('"lam":', '"lam": 0.9, "lam":', 1))
    with pytest.raises(StateError, match=r"unreadable mismatch_ctrl state \(duplicate key 'lam': the file was edited"):
        resume(tmp_path)


def test_a_streak_longer_than_the_window_is_cut_with_a_warning_naming_it(caplog):
    settings = config(dcgrpo={"enabled": True, "eps": 0.005}).dcgrpo
    state = {**LagrangeController(settings).state_dict(), "streak": [0.01] * 25}
    controller = LagrangeController(settings)
    with caplog.at_level(logging.WARNING, logger="mismatch_ctrl"):
        controller.load_state_dict(state)
    assert controller.streak == [0.01] * 9
    assert "dcgrpo.streak: 25 rollouts saved, more than drift_window - 1 = 9 of the configuration: kept the newest 9" \
        in caplog.text


@pytest.mark.parametrize("hook", ["advantages", "rollout_correction"])
def test_complex_loss_masks_are_refused_naming_them(hook):
    d = rollout_data(make_batch(3), FULL)
    d["loss_masks"] = [m.to(torch.complex64) for m in d["loss_masks"]]
    with pytest.raises(InputError, match="loss_masks must hold 0/1 values .*got dtype torch.complex64"):
        if hook == "advantages":
            hooks.advantages(make_args(method("grpo")), d)
        else:
            hooks.rollout_correction(make_args(method("token_tis")), **tis_kwargs(loss_masks=d["loss_masks"]))


def test_rollout_data_on_two_devices_is_named_not_a_torch_error():
    d = rollout_data(make_batch(3), FULL)
    d["kl"] = [t.to("meta") for t in d["kl"]]
    with pytest.raises(InputError, match=r"rollout_data kl\[0\] is on meta but loss_masks\[0\] is on cpu"):
        hooks.advantages(make_args(method("grpo")), d)


@pytest.mark.parametrize("rewards", [torch.ones(16, dtype=torch.complex64), torch.ones(16, dtype=torch.bool),
                                     [torch.tensor(1 + 1j)] * 16])
def test_rewards_that_are_no_real_numbers_are_refused(rewards):
    d = rollout_data(make_batch(3), FULL)
    with pytest.raises(InputError, match=r"rewards(\[0\])? must hold real numbers, got a tensor of dtype"):
        hooks.advantages(make_args(method("grpo")), {**d, "rewards": rewards})


@pytest.mark.parametrize("name", ["grpo", "token_tis", "dcgrpo"])
def test_an_empty_batch_stays_on_the_device_of_the_hooks(name):
    args = make_args(method(name))
    empty = {"rewards": [], "response_lengths": [], "total_lengths": [], "loss_masks": [], "log_probs": [],
             "rollout_log_probs": [], "kl": []}
    loss = torch.zeros(0, requires_grad=True)  # made outside the guard: a device tensor
    with HostGuard() as advantage_guard:
        hooks.advantages(args, empty)
    with HostGuard() as tis_guard:
        pg_loss, masks, metrics = hooks.rollout_correction(args, pg_loss=loss, train_log_probs=[],
                                                           rollout_log_probs=[], loss_masks=[], total_lengths=[],
                                                           response_lengths=[])
    assert empty["advantages"] == [] and pg_loss.shape == (0,) and masks == []
    assert all(v.shape == (0,) for v in metrics.values())
    assert advantage_guard.syncs <= 2 and tis_guard.syncs <= 1


@pytest.mark.parametrize("name", ["grpo", "token_tis"])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_a_nonfinite_pg_loss_at_an_untrained_token_does_not_reach_slimes_loss(name, value):
    """slime sums pg_loss x mask: NaN x 0 is NaN, so the hook zeroes it at untrained tokens (every method alike),
    reading whether to in its one host synchronisation."""
    kwargs = tis_kwargs()
    untrained = int((torch.cat(kwargs["loss_masks"]) == 0).nonzero()[0])
    pg_loss = torch.randn(kwargs["pg_loss"].numel())
    pg_loss[untrained] = value
    pg_loss.requires_grad_()
    with HostGuard() as guard:
        out, _, metrics = hooks.rollout_correction(make_args(method(name)), **{**kwargs, "pg_loss": pg_loss})
    assert guard.syncs == 1 and bool(torch.isfinite(out).all()) and out[untrained] == 0
    out.sum().backward()
    assert bool(torch.isfinite(pg_loss.grad).all())
    assert float(metrics[PREFIX + "nonfinite_pg_loss_fraction"].sum()) == 0


def test_an_acrl_reference_no_discrepancy_can_exceed_is_refused_in_config_and_state():
    """D of log-ratios clamped to +-20 never exceeds 20: a band_high x reference at or above it never shrinks the
    band; a saved reference, D or history beyond the histogram's range is corrupt."""
    errors, _ = inert_settings(config(acrl={"enabled": True, "reference": 15.0}))
    assert len(errors) == 1 and "band_high x reference = 22.5 and ACRL could only widen its band" in errors[0]
    assert inert_settings(config(acrl={"enabled": True, "reference": 0.01})) == ([], [])
    controllers = ControllerSet(config(acrl={"enabled": True}))
    for key, value in (("reference", 1e300), ("last", 500.0), ("observed", [0.01, 1e6])):
        state = controllers.state_dict()
        state["acrl"][key] = value
        with pytest.raises(StateError, match=rf"acrl\.{key}: .*must be <= 100 \(D is a median per-sequence mean"):
            controllers.load_state_dict(state)
