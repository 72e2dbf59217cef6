"""Configuration: shipped YAMLs, architecture defaults (ALGORITHMS.md section 2 table), aliases and error messages."""

import json
import re
from pathlib import Path

import pytest
import yaml

from mismatch_ctrl.config import build_config, load_config, read_yaml, resolve_architecture
from mismatch_ctrl.correction import CorrectionSpec
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.presets import PRESETS

CONFIGS = Path(__file__).resolve().parents[2] / "mismatch_ctrl" / "configs"
YAMLS = sorted(CONFIGS.rglob("*.yaml"))
# ALGORITHMS.md section 2: lambda_0, eta, eps, lambda_max.
ARCH_TABLE = {"dense": (0.1, 1.0, 0.0037, 1.0), "moe": (0.05, 1.0, 0.005, 1.0)}


def dc_values(config):
    d = config.dcgrpo
    return d.lambda_0, d.eta, d.eps, d.lambda_max


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "method.yaml"
    path.write_text(text)
    return path


def test_shipped_configs_exist():
    names = {p.relative_to(CONFIGS).as_posix() for p in YAMLS}
    assert {"arch/dense.yaml", "arch/moe.yaml", "methods/grpo.yaml", "methods/dcgrpo.yaml"} <= names


@pytest.mark.parametrize("path", YAMLS, ids=lambda p: p.relative_to(CONFIGS).as_posix())
@pytest.mark.parametrize("num_experts, arch", [(128, "moe"), (0, "dense")])
def test_every_shipped_yaml_loads(path, num_experts, arch):
    config = load_config(path, num_experts=num_experts)
    expected_arch = path.stem if path.parent.name == "arch" else arch
    assert config.architecture == expected_arch
    assert dc_values(config) == ARCH_TABLE[expected_arch]
    if path.parent.name == "methods":
        assert config.name == path.stem
    json.dumps(config.as_dict())


@pytest.mark.parametrize("arch", sorted(ARCH_TABLE))
def test_arch_files_equal_the_table(arch):
    section = yaml.safe_load((CONFIGS / "arch" / f"{arch}.yaml").read_text())["mismatch_ctrl"]
    d = section["dcgrpo"]
    assert (d["lambda_0"], d["eta"], d["eps"], d["lambda_max"]) == ARCH_TABLE[arch]


def test_method_values_override_arch_defaults():
    config = build_config({"dcgrpo": {"enabled": True, "eps": 0.02}}, architecture="moe")
    assert dc_values(config) == (0.05, 1.0, 0.02, 1.0)


def test_float_written_without_dot_is_accepted(tmp_path):
    path = write(tmp_path, "mismatch_ctrl:\n  architecture: dense\n  dcgrpo:\n    enabled: true\n    eps: 1e-4\n"
                           "  correction:\n    preset: geo_mis\n    veto: 1e-5\n")
    config = load_config(path)
    assert config.dcgrpo.eps == 1e-4 and config.correction.veto == 1e-5


def test_the_papers_dcgrpo_is_spelled_in_plain_yaml(tmp_path):
    path = write(tmp_path, "mismatch_ctrl:\n  architecture: moe\n  dcgrpo:\n    enabled: true\n    eps_guard: off\n"
                           "    drift_guard: off\n    penalty_cap: none\n    zero_advantage: penalise\n")
    d = load_config(path).dcgrpo
    assert (d.eps_guard, d.drift_guard, d.penalty_cap, d.cap, d.zero_advantage) == ("off", "off", "none", None,
                                                                                     "penalise")
    assert build_config({"dcgrpo": {"penalty_cap": 2}}, architecture="moe").dcgrpo.cap == 2.0


def test_eps_auto():
    assert build_config({"dcgrpo": {"enabled": True, "eps": "auto"}}, architecture="moe").dcgrpo.eps == "auto"


@pytest.mark.parametrize("section, key, fix", [
    ({"dcgrpo": {"lamda_0": 0.1}}, "mismatch_ctrl.dcgrpo.lamda_0", "did you mean 'lambda_0'"),
    ({"dcgpro": {}}, "mismatch_ctrl.dcgpro", "did you mean 'dcgrpo'"),
    ({"correction": {"is_hihg": 3}}, "mismatch_ctrl.correction.is_hihg", "did you mean 'is_high'"),
    ({"lr_decay": {"surge": {"ratoi": 2}}}, "mismatch_ctrl.lr_decay.surge.ratoi", "did you mean 'ratio'"),
    ({"dcgrpo": {"eps": 0}}, "mismatch_ctrl.dcgrpo.eps", "must be > 0 and < 1.0 (or 'auto')"),
    ({"dcgrpo": {"eps": -0.01}}, "mismatch_ctrl.dcgrpo.eps", "must be > 0"),
    ({"dcgrpo": {"eps": 5.0}}, "mismatch_ctrl.dcgrpo.eps", "keeps lambda at 0 and DC-GRPO off"),
    ({"dcgrpo": {"lambda_0": 0.0, "lambda_max": 0.0}}, "mismatch_ctrl.dcgrpo.lambda_max", "must be > 0"),
    ({"correction": {"preset": "geo_mis", "rs_low": None, "rs_high": -1.0}}, "mismatch_ctrl.correction.rs_high",
     "must be > 0 or null"),
    ({"correction": {"preset": "geo_mis", "rs_low": -0.5}}, "mismatch_ctrl.correction.rs_low", "not its log"),
    ({"dcgrpo": {"lambda_0": 0.5, "lambda_max": 0.2}}, "mismatch_ctrl.dcgrpo.lambda_max", "must be >= lambda_0"),
    ({"correction": {"preset": "tokn_tis"}}, "mismatch_ctrl.correction.preset", "choose one of"),
    ({"dcgrpo": {"enabled": "yes"}}, "mismatch_ctrl.dcgrpo.enabled", "expected true/false"),
    ({"dcgrpo": {"calibration_rollouts": 2.5}}, "mismatch_ctrl.dcgrpo.calibration_rollouts", "expected an integer"),
    ({"dcgrpo": {"eta": "fast"}}, "mismatch_ctrl.dcgrpo.eta", "expected a number"),
    ({"lr_decay": {"period": "sometimes"}}, "mismatch_ctrl.lr_decay.period", "expected an integer or one of 'auto'"),
    ({"dcgrpo": {"penalty_form": "quadratic"}}, "mismatch_ctrl.dcgrpo.penalty_form", "one of 'lagrangian'"),
    ({"dcgrpo": {"eta": float("nan")}}, "mismatch_ctrl.dcgrpo.eta", "finite number"),
    ({"dcgrpo": {"eps": float("nan")}}, "mismatch_ctrl.dcgrpo.eps", "must be a finite number"),
    ({"dcgrpo": {"lambda_max": float("inf")}}, "mismatch_ctrl.dcgrpo.lambda_max", "must be a finite number"),
    ({"dcgrpo": "on"}, "mismatch_ctrl.dcgrpo", "expected a mapping"),
    ({"acrl": {"enabled": True}, "correction": {"preset": "token_tis"}}, "mismatch_ctrl.acrl.enabled",
     "drop the IS stage"),
    ({"correction": {"rs_level": "geometric"}}, "mismatch_ctrl.correction.rs_level", "set rs_low and/or rs_high"),
    ({"correction": {"mis_level": "token", "is_level": "token"}}, "mismatch_ctrl.correction.mis_level",
     "duplicates is_level"),
    ({"state": {"keep_last": 0}}, "mismatch_ctrl.state.keep_last", "must be >= 1"),
    ({"dcgrpo": {"drift_guard": "on"}}, "mismatch_ctrl.dcgrpo.drift_guard", "one of 'persistent', 'saturated'"),
    ({"dcgrpo": {"drift_window": 1}}, "mismatch_ctrl.dcgrpo.drift_window", "must be >= 2"),
    ({"dcgrpo": {"penalty_cap": 0}}, "mismatch_ctrl.dcgrpo.penalty_cap", "'none' for no cap"),
    ({"dcgrpo": {"penalty_cap": "off"}}, "mismatch_ctrl.dcgrpo.penalty_cap", "expected a number or one of 'none'"),
    ({"dcgrpo": {"zero_advantage": "ignore"}}, "mismatch_ctrl.dcgrpo.zero_advantage", "'penalise', 'skip'"),
])
def test_errors_name_the_key_and_the_fix(section, key, fix):
    with pytest.raises(ConfigError) as err:
        build_config({"architecture": "dense", **section})
    assert key in str(err.value) and fix in str(err.value)


def test_unresolvable_architecture_with_dcgrpo_enabled():
    with pytest.raises(ConfigError, match=r"mismatch_ctrl.architecture: DC-GRPO needs lambda_0, eta, eps, lambda_max.*"
                                          r"set architecture: dense or moe"):
        build_config({"dcgrpo": {"enabled": True}})
    # Without DC-GRPO the architecture may stay unresolved.
    assert build_config({"correction": {"preset": "token_tis"}}).architecture is None


def test_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "mismatch_ctrl: [unclosed\n"))
    with pytest.raises(ConfigError, match="no top-level 'mismatch_ctrl:' key"):
        load_config(write(tmp_path, "dcgrpo:\n  enabled: true\n"))


@pytest.mark.parametrize("value, read", [("1:30", "90"), ("1:30.5", "90.5")])
def test_a_base_60_number_is_refused_not_read_as_seconds(tmp_path, value, read):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, f"mismatch_ctrl:\n  dcgrpo:\n    drift_window: {value}\n"))
    message = str(err.value)
    assert f"{value} is a base-60 number in YAML 1.1 (read as {read})" in message and "drift_window" in message


def test_a_float_that_underflows_to_zero_is_refused_naming_its_line(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, "mismatch_ctrl:\n  dcgrpo:\n    eps: 1.0e-400\n"))
    assert "1.0e-400 is below the smallest float and would read as 0.0" in str(err.value) and "line 3" in \
        str(err.value)
    assert read_yaml(write(tmp_path, "a: 0.0e+5\nb: 0.000\nc: 1.0e-300\n")) == {"a": 0.0, "b": 0.0, "c": 1e-300}


def test_an_integer_beyond_pythons_digit_limit_names_its_line_and_key(tmp_path):
    text = "mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n    lambda_max: " + "9" * 5000 + "\n"
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, text))
    message = str(err.value)
    assert "an integer of 5000 characters" in message and "line 4" in message and "lambda_max" in message
    assert load_config(write(tmp_path, text.replace("9" * 5000, "9" * 30)), num_experts=128).dcgrpo.lambda_max == 1e30


def test_slime_mis_yaml_keys_are_aliases():
    section = {"mis_level": "sequence", "mis_mode": "clip", "mis_lower_bound": 0.5, "mis_upper_bound": 2.0,
               "mis_veto_threshold": "1.0e-4"}
    config = build_config({"correction": section})
    assert config.correction == CorrectionSpec(is_level="sequence", is_mode="clip", is_low=0.5, is_high=2.0,
                                               veto=1e-4)


def test_verl_rollout_correction_keys_are_translated():
    """verl 0.9.1's vocabulary (mismatch_ctrl.verl_vocabulary): a "lo_hi" IS threshold is a mask band, a k1 band
    bounds -log rho (so verl's [lo, hi] is our ratio band [1/hi, 1/lo]), seq_mean_k3 is rs_k3_max."""
    section = {"rollout_is": "token", "rollout_is_threshold": "0.5_3.0", "rollout_is_batch_normalize": True,
               "rollout_rs": "seq_mean_k1,seq_mean_k3", "rollout_rs_threshold": "0.998_1.002,0.02"}
    config = build_config({"correction": section})
    assert config.correction == CorrectionSpec(is_level="token", is_mode="mask", is_low=0.5, is_high=3.0,
                                               batch_normalize=True, rs_level="geometric", rs_low=1 / 1.002,
                                               rs_high=1 / 0.998, rs_k3_max=0.02)
    assert build_config({"correction": {"rollout_is": "sequence", "rollout_is_threshold": 2.0}}).correction == \
        CorrectionSpec(is_level="sequence", is_high=2.0)


@pytest.mark.parametrize("section, message", [
    ({"rollout_rs": "geometric", "rollout_rs_threshold": 1.001}, "'geometric' has no mismatch_ctrl equivalent"),
    ({"rollout_rs_threshold_lower": 0.999}, "verl removed this key in 0.7.1"),
    ({"rollout_token_veto_threshold": 1e-4}, "verl 0.9.1 has no veto"),
    ({"rollout_rs": "seq_max_k3", "rollout_rs_threshold": 0.1}, "'seq_max_k3' has no mismatch_ctrl equivalent"),
    ({"rollout_rs": "token_k1"}, "rollout_rs_threshold: required"),
    ({"rollout_is": "token", "is_level": "token"}, "correction.is_level: given with verl's keys"),
    ({"rollout_is": "geometric"}, "expected token, sequence or null"),
    ({"rollout_is": "token", "rollout_is_threshold": "0_2"}, "expected a number > 0"),
])
def test_verl_keys_that_mean_nothing_here_are_refused(section, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        build_config({"correction": section})


@pytest.mark.parametrize("alias, canonical", [("icepop", "token_mis"), ("geo_rs", "geo_mis"),
                                              ("decoupled_token_is", "token_tis"), ("decoupled_seq_is", "seq_tis"),
                                              ("decoupled_geo_rs", "geo_mis"), ("disabled", "none")])
def test_preset_aliases(alias, canonical):
    config = build_config({"correction": {"preset": alias}})
    assert config.correction_preset == canonical and config.correction == PRESETS[canonical]


def test_preset_fields_can_be_overridden():
    config = build_config({"correction": {"preset": "token_tis", "is_high": 5.0}})
    assert config.correction == CorrectionSpec(is_level="token", is_mode="truncate", is_high=5.0)


@pytest.mark.parametrize("key", ["num_experts", "num_local_experts", "n_routed_experts"])
@pytest.mark.parametrize("as_directory", [True, False])
def test_architecture_from_hugging_face_config(tmp_path, key, as_directory):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x", key: 128}))
    target = tmp_path if as_directory else tmp_path / "config.json"
    assert resolve_architecture(hf_config=target) == "moe"
    config = build_config({"dcgrpo": {"enabled": True}}, hf_config=target)
    assert config.architecture == "moe" and dc_values(config) == ARCH_TABLE["moe"]


def test_dense_hugging_face_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3", "hidden_size": 4096}))
    assert resolve_architecture(hf_config=tmp_path) == "dense"
    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 0}))
    assert resolve_architecture(hf_config=tmp_path) == "dense"


def test_unreadable_hugging_face_config(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the Hugging Face config"):
        resolve_architecture(hf_config=tmp_path / "nowhere")


def test_architecture_precedence():
    # The YAML's own architecture wins over what the caller resolves.
    assert build_config({"architecture": "dense"}, num_experts=128).architecture == "dense"
    assert build_config({"architecture": "auto"}, num_experts=128).architecture == "moe"
    assert build_config({}, architecture="dense", num_experts=128).architecture == "dense"
    with pytest.raises(ConfigError, match="architecture: expected one of 'dense', 'moe'"):
        build_config({}, architecture="hybrid")
