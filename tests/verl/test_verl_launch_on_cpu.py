"""The verl launchers' ``--dry-run`` against verl 0.9.1's own Hydra config from the installed wheel: the full
configuration composes and passes the adapter's checks and verl's ``validate_config``; an unknown override, bypass
mode and rollout log-probs off are refused before anything runs, naming the fix."""

from __future__ import annotations

import json
import shlex

import pytest

from mismatch_ctrl.verl.launch import main

LAUNCHERS = {"qwen3_8b": 0, "qwen3_30b_a3b": 128}


@pytest.fixture
def model_dir(tmp_path):
    def make(experts):
        path = tmp_path / f"model{experts}"
        path.mkdir(exist_ok=True)
        (path / "config.json").write_text(json.dumps({"model_type": "qwen3_moe" if experts else "qwen3",
                                                      "num_experts": experts}))
        return path
    return make


def dry_run(monkeypatch, capsys, model, model_path, *extra, **env):
    monkeypatch.setenv("MODEL_DIR", str(model_path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    tail = ["--", *extra] if extra else []
    code = main(["--launcher", f"verl_{model}", "--model", model, "--", "--dry-run", *tail])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("model", sorted(LAUNCHERS))
def test_dry_run_composes_with_verls_config_and_prints_the_command(monkeypatch, capsys, model_dir, model):
    experts = LAUNCHERS[model]
    code, out, err = dry_run(monkeypatch, capsys, model, model_dir(experts), ROUTING_REPLAY="1")
    assert code == 0, err
    words = shlex.split(out.replace("\\\n", " "))
    assert words[:5] == ["python3", "-m", "verl.trainer.main_ppo", "--config-name", "ppo_trainer"]
    assert "trainer.v1.trainer_mode=mismatch_ctrl" in words and "actor_rollout_ref.rollout.quantization=fp8" in words
    assert ("model_engine=megatron" in words) == bool(experts)
    if experts:
        assert "actor_rollout_ref.actor.megatron.expert_model_parallel_size=8" in words
        assert "actor_rollout_ref.actor.megatron.router_replay.mode=R3" in words


@pytest.mark.parametrize("extra, message", [
    (("actor_rollout_ref.actor.optim.lrr=1e-6",), "refuses the overrides"),
    (("algorithm.rollout_correction.bypass_mode=true",), "set algorithm.rollout_correction.bypass_mode=false"),
    (("actor_rollout_ref.rollout.calculate_log_probs=false",), "calculate_log_probs=true"),
    (("trainer.n_gpus_per_node=5",), "does not tile the 5 GPUs"),
])
def test_dry_run_refuses_before_submission(monkeypatch, capsys, model_dir, extra, message):
    code, out, err = dry_run(monkeypatch, capsys, "qwen3_8b", model_dir(0), *extra)
    assert code == 2 and message in err and out == ""


def test_megatrons_expert_layout_rule(monkeypatch, capsys, model_dir):
    code, _, err = dry_run(monkeypatch, capsys, "qwen3_30b_a3b", model_dir(128), ETP="2")
    assert code == 2 and "expert TP x EP x PP = 16 does not divide the 8 GPUs" in err


def test_a_bad_setting_and_an_unknown_option_are_usage_errors(monkeypatch, capsys, model_dir):
    code, _, err = dry_run(monkeypatch, capsys, "qwen3_30b_a3b", model_dir(128), TP="two")
    assert code == 2 and "TP='two': expected an integer >= 1" in err
    assert main(["--launcher", "x", "--model", "qwen3_8b", "--", "--dryrun"]) == 2
    assert "unknown option --dryrun" in capsys.readouterr().err
