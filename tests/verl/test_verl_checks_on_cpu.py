"""Refusals on verl's real composed config, each naming the override that fixes it; the overrides a refusal prints
compose with verl's schema and are then accepted."""

from __future__ import annotations

import shlex

import pytest
import yaml
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.verl.checks import check_version, overrides
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl.trainer import MismatchCtrlTrainer
from mismatch_ctrl.verl_vocabulary import PRESET_KEYS
from verl_harness import dense_model, verl_config


def method(tmp_path, **section):
    path = tmp_path / "method.yaml"
    path.write_text(yaml.safe_dump({"mismatch_ctrl": {"name": "m", "architecture": "dense", **section}}))
    return path


DCGRPO = {"dcgrpo": {"enabled": True}}


@pytest.mark.parametrize("override, fix", [
    ("algorithm.rollout_correction.bypass_mode=true", "set algorithm.rollout_correction.bypass_mode=false"),
    ("actor_rollout_ref.rollout.calculate_log_probs=false", "set actor_rollout_ref.rollout.calculate_log_probs=true"),
    ("algorithm.adv_estimator=gae", "set algorithm.adv_estimator=grpo"),
    ("algorithm.adv_estimator=reinforce_plus_plus", "set algorithm.adv_estimator=grpo"),
    ("trainer.use_v1=false", "set trainer.use_v1=true"),
    ("+trainer.v1.sync.parameter_sync_step=2", "stale batches are not handled"),
    ("trainer.v1.trainer_mode=separate_async", "staleness is not handled.*set trainer.v1.trainer_mode=mismatch_ctrl"),
])
def test_settings_under_which_dcgrpo_would_not_run_are_refused(tmp_path, override, fix):
    config = verl_config(override, method=method(tmp_path, **DCGRPO))
    with pytest.raises(ConfigError, match=fix):
        read_config(config)


def test_acrl_and_a_missing_yaml_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="ACRL band is not available on verl"):
        read_config(verl_config(method=method(tmp_path, acrl={"enabled": True})))
    with pytest.raises(ConfigError, match=r"add \+mismatch_ctrl.config=configs/methods/dcgrpo.yaml"):
        read_config(verl_config("algorithm.adv_estimator=grpo"))


def test_architecture_comes_from_the_models_config_json(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"mismatch_ctrl": {"name": "m", **DCGRPO}}))
    assert read_config(verl_config(method=path, model=dense_model(tmp_path))).architecture == "dense"
    with pytest.raises(ConfigError, match="is no local model directory.*set mismatch_ctrl.architecture: dense or moe"):
        read_config(verl_config(method=path))  # verl's default model path is a hub id


@pytest.mark.parametrize("preset", [p for p, keys in PRESET_KEYS.items() if keys is not None and p != "none"])
def test_a_native_preset_needs_verls_keys_and_the_printed_overrides_compose(tmp_path, preset):
    path = method(tmp_path, correction={"preset": preset})
    with pytest.raises(ConfigError, match="is computed by verl itself") as refusal:
        read_config(verl_config(method=path))
    fix = overrides(PRESET_KEYS[preset])
    assert fix in str(refusal.value)
    config = read_config(verl_config(*shlex.split(fix), method=path))  # verl's schema composes them; accepted
    assert VerlRuntime(config).core_correction is None


@pytest.mark.parametrize("preset", [p for p, keys in PRESET_KEYS.items() if keys is None])
def test_a_preset_verl_cannot_express_runs_from_the_core_with_verls_own_off(tmp_path, preset):
    path = method(tmp_path, correction={"preset": preset})
    assert VerlRuntime(read_config(verl_config(method=path))).core_correction is not None
    with pytest.raises(ConfigError, match="rollout_is=null algorithm.rollout_correction.rollout_rs=null"):
        read_config(verl_config("algorithm.rollout_correction.rollout_is=token", method=path))


def test_another_verl_version_is_a_warning_naming_both():
    assert check_version("0.9.1") is None
    assert "verl 0.10.0 is installed; the verl adapter was read from and tested against verl 0.9.1" in \
        check_version("0.10.0")


def test_verls_own_constructor_runs_the_checks_and_keeps_sync_mode(tmp_path):
    config = verl_config(method=method(tmp_path, **DCGRPO))
    trainer = MismatchCtrlTrainer(config)
    assert trainer.trainer_mode == "sync" and config.trainer.v1.trainer_mode == "sync"
    # verl's __init__ took its "sync" branches: the synchronous replay buffer, one advantage step per training step
    assert type(trainer.replay_buffer) is ReplayBuffer and trainer.parameter_sync_step == 1
    assert trainer.mismatch_ctrl.config.dcgrpo.enabled
    with pytest.raises(ConfigError, match="bypass_mode=false"):
        MismatchCtrlTrainer(verl_config("algorithm.rollout_correction.bypass_mode=true",
                                        method=method(tmp_path, **DCGRPO)))
