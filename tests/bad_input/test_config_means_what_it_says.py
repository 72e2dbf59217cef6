"""A method YAML means what it says, in every place that reads it (check-config, which the launchers' ``--dry-run``
runs, and slime's ``on_megatron_init``): duplicate keys refused in block and flow style, mismatch_ctrl's own blocks
written beside ``mismatch_ctrl:`` refused, every number bounded by what the hooks' float32 arithmetic carries, and
settings that leave a controller inert at any discrepancy refused or warned about."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import torch
from slime_data import make_args, method

from mismatch_ctrl.config import SECTIONS, build_config, inert_settings, load_config
from mismatch_ctrl.correction import CorrectionSpec
from mismatch_ctrl.dcgrpo import PENALTY_MAX
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.signals import SIGNALS
from mismatch_ctrl.slime import hooks

FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def check_config(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mismatch_ctrl", "check-config", str(path), *extra],
                          capture_output=True, text=True, timeout=120)


def write(tmp_path: Path, text: str, name: str = "method.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- duplicate keys ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, key", [
    ("mismatch_ctrl:\n  name: x\n  correction: {preset: token_tis, preset: none}\n", "preset"),
    ("mismatch_ctrl: {name: x, dcgrpo: {enabled: true, eps: 0.01, eps: 0.5}}\n", "eps"),
    ("mismatch_ctrl:\n  name: x\n  dcgrpo:\n    eps: 0.01\n    enabled: true\n    eps: 0.5\n", "eps"),
    ("mismatch_ctrl: {name: x, name: y}\n", "name"),
    ("mismatch_ctrl:\n  name: x\n  dcgrpo: {enabled: true}\n  dcgrpo: {enabled: false}\n", "dcgrpo"),
])
def test_a_duplicate_key_is_refused_in_block_and_flow_style(tmp_path, text, key):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError, match=f"duplicate key '{key}'"):
        load_config(path, architecture="moe")
    done = check_config(path, "--arch", "moe")
    assert done.returncode == 2 and f"duplicate key '{key}'" in done.stderr


def test_a_merge_key_may_still_be_overridden(tmp_path):
    path = write(tmp_path, "base: &b {eps: 0.01, enabled: true}\nmismatch_ctrl:\n  name: x\n"
                           "  dcgrpo: {<<: *b, eps: 0.02}\n")
    assert load_config(path, architecture="moe").dcgrpo.eps == 0.02


# --- blocks beside mismatch_ctrl: ------------------------------------------------------------------------------------

MISPLACED = [
    ("mismatch_ctrl: {name: dcgrpo}\ndcgrpo: {enabled: true}\n", "dcgrpo"),
    ("mismatch_ctrl:\n  name: x\ncorrection:\n  preset: geo_mis\n", "correction"),
    ("mismatch_ctrl: {name: x}\nlr_decay: {enabled: true}\nacrl: {enabled: false}\n", "lr_decay, acrl"),
    ("mismatch_ctrl: {name: x}\ntorch_compile: true\n", "torch_compile"),
    ("mismatch_ctrl: {name: x}\nstate: {keep_last: 2}\n", "state"),
]


@pytest.mark.parametrize("text, keys", MISPLACED)
def test_a_block_beside_mismatch_ctrl_is_refused_by_check_config(tmp_path, text, keys):
    done = check_config(write(tmp_path, text), "--arch", "moe")
    assert done.returncode == 2, done.stdout
    assert f"{keys}: mismatch_ctrl's own" in done.stderr and "indent" in done.stderr and "under 'mismatch_ctrl:'" \
        in done.stderr


def test_other_top_level_keys_are_slimes_business(tmp_path):
    """slime's own keys (its mis.yaml's) beside ours stay allowed: only mismatch_ctrl's own keys are refused."""
    path = write(tmp_path, "mismatch_ctrl: {name: x}\nuse_tis: true\ntis_mode: truncate\n")
    assert load_config(path, architecture="moe").name == "x"


def slime_args(tmp_path: Path, text: str, *, file: bool = True):
    """``args`` as slime builds them from ``--custom-config-path``: every top-level key of the YAML set on args."""
    import yaml

    path = write(tmp_path, text)
    document = yaml.safe_load(text)  # slime's own read: the last of duplicate keys wins
    args = make_args(document["mismatch_ctrl"], custom_config_path=str(path if file else tmp_path / "elsewhere.yaml"))
    for key, value in document.items():
        if key != "mismatch_ctrl":
            setattr(args, key, value)
    return args


@pytest.mark.parametrize("text, keys", MISPLACED)
def test_on_megatron_init_refuses_what_check_config_refuses(tmp_path, text, keys):
    with pytest.raises(ConfigError, match=f"{keys}: mismatch_ctrl's own"):
        hooks.on_megatron_init(slime_args(tmp_path, text))


def test_on_megatron_init_refuses_duplicates_slime_resolved_silently(tmp_path):
    args = slime_args(tmp_path, "mismatch_ctrl:\n  name: x\n  correction: {preset: token_tis, preset: none}\n")
    assert args.mismatch_ctrl["correction"] == {"preset": "none"}  # what slime's yaml.safe_load made of it
    with pytest.raises(ConfigError, match="duplicate key 'preset'"):
        hooks.on_megatron_init(args)


def test_a_merged_block_is_refused_where_the_file_is_not_on_this_machine(tmp_path, caplog):
    args = slime_args(tmp_path, "mismatch_ctrl: {name: dcgrpo}\ndcgrpo: {enabled: true}\n", file=False)
    with pytest.raises(ConfigError, match="dcgrpo: mismatch_ctrl's own key"):
        hooks.on_megatron_init(args)
    assert "not found on this machine" in caplog.text


def test_a_valid_file_passes_on_megatron_init(tmp_path):
    args = slime_args(tmp_path, (Path(__file__).parents[2] / "configs" / "methods" / "dcgrpo.yaml").read_text())
    hooks.on_megatron_init(args)


# --- magnitudes ------------------------------------------------------------------------------------------------------

def float_fields(cls: type) -> list[str]:
    hints = typing.get_type_hints(cls)
    return [f.name for f in dataclasses.fields(cls) if float in (typing.get_args(hints[f.name]) or (hints[f.name],))]


FLOAT_SETTINGS = [(section, name) for section, cls in {**SECTIONS, "correction": CorrectionSpec}.items()
                  for name in float_fields(cls)]


def test_every_number_setting_is_found():
    assert ("dcgrpo", "eta") in FLOAT_SETTINGS and ("acrl", "c_max") in FLOAT_SETTINGS and \
        ("correction", "is_high") in FLOAT_SETTINGS and len(FLOAT_SETTINGS) >= 20


@pytest.mark.parametrize("section, name", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", [1.0e39, -1.0e39, "1e308"])
def test_a_number_beyond_float32_is_refused_at_config_time(section, name, value):
    with pytest.raises(ConfigError, match=rf"mismatch_ctrl\.{section}\.{name}: must be at most 3\.403e\+38"):
        build_config({section: {name: value}}, architecture="moe")


@pytest.mark.parametrize("overrides", [{"eta": 1e308, "lambda_max": 1e308},
                                       {"lambda_0": 1.0e39, "lambda_max": 1.0e39}])
def test_the_reported_overflows_are_refused_before_any_rollout(overrides):
    for base in ("dcgrpo", "dcgrpo_paper"):
        with pytest.raises(ConfigError, match="must be at most"):
            build_config(method(base, dcgrpo=overrides), architecture="moe")


@pytest.mark.parametrize("signal", SIGNALS)
def test_lambda_max_is_bounded_by_the_signals_largest_penalty(signal):
    from mismatch_ctrl.signals import SIGNAL_MAX

    largest = PENALTY_MAX / SIGNAL_MAX[signal]
    ok = build_config({"dcgrpo": {"enabled": True, "signal": signal, "lambda_max": largest * 0.999}},
                      architecture="moe")
    assert ok.dcgrpo.lambda_max < largest
    with pytest.raises(ConfigError, match=rf"dcgrpo\.lambda_max: must be at most .* with signal {signal}"):
        build_config({"dcgrpo": {"enabled": True, "signal": signal, "lambda_max": largest * 1.01}},
                     architecture="moe")


@pytest.mark.parametrize("signal", SIGNALS)
def test_the_largest_allowed_penalty_keeps_every_advantage_finite(signal):
    """At the bounds (lambda at the largest lambda_max, log-ratios at the clamp, rewards at the largest taken), every
    shaped advantage of the hook is finite in float32."""
    from mismatch_ctrl.signals import SIGNAL_MAX
    from mismatch_ctrl.slime.inputs import REWARD_MAX

    lam = PENALTY_MAX / SIGNAL_MAX[signal] * 0.999
    args = make_args(method("dcgrpo_paper", dcgrpo={"signal": signal, "lambda_0": lam, "lambda_max": lam,
                                                   "eps": 0.5}))
    n = 8
    rollout = [torch.full((5,), -30.0) for _ in range(n)]
    train = [torch.full((5,), 0.0) if i % 2 else torch.full((5,), -30.0 + 25.0) for i in range(n)]
    rewards = [REWARD_MAX if i % 2 else -REWARD_MAX for i in range(n)]
    data = {"rewards": rewards, "response_lengths": [5] * n, "total_lengths": [9] * n,
            "loss_masks": [torch.ones(5, dtype=torch.int32) for _ in range(n)], "log_probs": train,
            "rollout_log_probs": rollout, "kl": [torch.zeros(5) for _ in range(n)]}
    hooks.advantages(args, data)
    shaped = torch.cat(data["advantages"])
    assert shaped.dtype == torch.float32 and torch.isfinite(shaped).all()
    assert shaped.abs().max() > FLOAT32_MAX / 4  # the extremes were reached


# --- inert settings ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("section, error", [
    ({"dcgrpo": {"enabled": True, "eps": "auto", "eps_auto_factor": 1000.0}}, "dcgrpo.eps_auto_factor = 1000"),
    ({"dcgrpo": {"enabled": True, "eps_guard": "clamp", "drift_guard": "off", "eps_auto_factor": 5000.0}},
     "dcgrpo.eps_auto_factor = 5000"),
    ({"acrl": {"enabled": True, "c_min": 1e-9, "c_0": 1e-9, "c_max": 1e-8}}, "acrl.c_max = 1e-08"),
])
def test_a_controller_that_could_never_act_is_an_error(tmp_path, section, error):
    config = build_config(section, architecture="moe")
    errors, _ = inert_settings(config)
    assert any(error in e for e in errors), errors
    import yaml

    done = check_config(write(tmp_path, yaml.safe_dump({"mismatch_ctrl": {"name": "x", **section}})), "--arch", "moe")
    assert done.returncode == 2 and error in done.stderr
    args = make_args({"name": "x", **section})
    with pytest.raises(ConfigError, match=error.replace(".", r"\.").replace("-", r"\-")):
        hooks.on_megatron_init(args)


@pytest.mark.parametrize("section, warning", [
    ({"dcgrpo": {"enabled": True, "lambda_0": 0.0, "lambda_max": 1e-9}}, "dcgrpo.lambda_max = 1e-09"),
    ({"dcgrpo": {"enabled": True, "penalty_cap": 1e-9}}, "dcgrpo.penalty_cap = 1e-09"),
    ({"dcgrpo": {"enabled": True, "eps": "auto", "eps_auto_factor": 50.0}}, "dcgrpo.eps_auto_factor = 50"),
])
def test_a_controller_lost_to_rounding_is_a_warning(section, warning):
    errors, warnings = inert_settings(build_config(section, architecture="moe"))
    assert not errors and any(warning in w for w in warnings), warnings


def test_the_shipped_methods_are_neither_inert_nor_out_of_range():
    for path in sorted((Path(__file__).parents[2] / "configs" / "methods").glob("*.yaml")):
        for arch in ("dense", "moe"):
            errors, warnings = inert_settings(load_config(path, architecture=arch))
            assert not errors and not warnings, (path.name, errors, warnings)


def test_the_float32_bound_is_the_largest_float32():
    assert math.isclose(FLOAT32_MAX, 3.4028234663852886e38, rel_tol=0, abs_tol=0)
    build_config({"dcgrpo": {"eta": FLOAT32_MAX}}, architecture="moe")  # the bound itself is a float32
