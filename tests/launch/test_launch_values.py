"""Values no run should get are refused before a command is printed, and a path holding ``$`` reaches train.py as it
is through ``ray job submit`` (issue 23, item 9)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from launch_harness import HF_CONFIGS, REPO, Result, Sandbox, split_submit

LAUNCHER = "qwen3_30b_dcgrpo.sh"


@pytest.mark.parametrize("name, value, why", [
    ("LR", "1e6", "wrecks the pretrained weights"), ("LR", "0.01", "outside [0, 0.001]"),
    ("ROLLOUT_TEMPERATURE", "1000", "above 2 the samples are noise"),
    ("ROLLOUT_TEMPERATURE", "0.001", "below 0.1 every sample of a prompt is the same"),
    ("EPS_CLIP", "2", "1 - EPS_CLIP, which must stay above 0"), ("EPS_CLIP", "1", "outside [0, 0.99]"),
    ("EPS_CLIP_HIGH", "5", "outside [0, 1]"),
])
def test_a_value_no_run_should_get_is_refused_before_any_command(sandbox: Sandbox, name, value, why) -> None:
    result = sandbox.run(LAUNCHER, "--dry-run", env={name: value})
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert f"configuration error: {name}={value} is outside [" in result.stderr and why in result.stderr


@pytest.mark.parametrize("name, value", [("LR", "1e-3"), ("LR", "1e-7"), ("ROLLOUT_TEMPERATURE", "2"),
                                         ("ROLLOUT_TEMPERATURE", "0.1"), ("EPS_CLIP", "0.5"), ("EPS_CLIP_HIGH", "1")])
def test_the_edges_of_the_sane_ranges_are_accepted(sandbox: Sandbox, name, value) -> None:
    result = sandbox.run(LAUNCHER, "--dry-run", env={name: value})
    assert result.returncode == 0, result.stderr
    command = result.command()
    assert command[command.index("--" + name.lower().replace("_", "-")) + 1] == value


def _host_ram(stderr: str) -> str:
    return re.search(r"host RAM per node ~([0-9.]+) GB", stderr).group(1)


@pytest.mark.parametrize("change, moe_layers", [({"mlp_only_layers": list(range(48))}, 0),
                                                ({"decoder_sparse_step": 2}, 24),
                                                ({"mlp_only_layers": [0, 1, 2]}, 45)])
def test_a_config_whose_moe_layers_disagree_with_the_recipe_is_refused(sandbox: Sandbox, change, moe_layers) -> None:
    cluster = sandbox.make_cluster()
    reference = sandbox.run(LAUNCHER, "--dry-run", env=cluster)
    assert reference.returncode == 0, reference.stderr
    config = {**HF_CONFIGS["qwen3_30b_a3b"], **change,
              "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
    (sandbox.cluster / "Qwen3-30B-A3B-FP8" / "config.json").write_text(json.dumps(config))
    result = sandbox.run(LAUNCHER, "--dry-run", env=cluster)
    assert result.returncode == 2 and result.stdout == ""
    assert f"has {moe_layers} MoE layers of 48 (mlp_only_layers, decoder_sparse_step), MODEL_ARGS_FILE says 48 " \
           "(--moe-layer-freq [1]*48)" in result.stderr
    allowed = sandbox.run(LAUNCHER, "--dry-run", env={**cluster, "ALLOW_MODEL_SHAPE_MISMATCH": "1"})
    assert allowed.returncode == 0, allowed.stderr
    assert _host_ram(allowed.stderr) == _host_ram(reference.stderr)  # the trained model is the recipe's


def _job_argv(result: Result, joiner) -> list[str]:
    """What train.py receives on the cluster: the printed command's entrypoint joined as ``ray job submit`` joins it,
    run by /bin/sh as Ray's job supervisor runs it (python3 replaced by a function printing its arguments)."""
    _, args = split_submit(result.command())
    words = result.command()[result.command().index("--") + 1:]
    script = "python3() { for a; do printf '%s\\0' \"$a\"; done; }; " + joiner(words)
    done = subprocess.run(["sh", "-c", script], capture_output=True, env={"HOME": "/home/x", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert len(args) > 10
    return done.stdout.decode().split("\0")[:-1]


@pytest.mark.parametrize("version, joiner", [("2.60.0", shlex.join), ("2.56.0", shlex.join),
                                             ("2.55.1", subprocess.list2cmdline), ("2.9.3", subprocess.list2cmdline)])
def test_a_path_with_a_dollar_reaches_train_py_as_it_is(sandbox: Sandbox, version, joiner) -> None:
    cluster = sandbox.make_cluster()
    sandbox.add_ray(version=version)
    odd = {"TORCH_DIST_DIR": str(sandbox.cluster / "torch$HOME'dist"), "SAVE_DIR": str(sandbox.cluster / "run$1"),
           "FP8_HF_DIR": str(sandbox.cluster / "fp8 with spaces")}
    result = sandbox.run(LAUNCHER, "--dry-run", env={**cluster, **odd})
    assert result.returncode == 0, result.stderr
    received = _job_argv(result, joiner)
    for flag, name in (("--ref-load", "TORCH_DIST_DIR"), ("--save", "SAVE_DIR"), ("--hf-checkpoint", "FP8_HF_DIR")):
        assert received[received.index(flag) + 1] == odd[name]
    assert received[received.index("--moe-layer-freq") + 1] == "[1]*48"


def test_an_older_ray_that_cannot_pass_a_path_is_refused_naming_it(sandbox: Sandbox) -> None:
    sandbox.add_ray(version="2.55.1")
    path = "/root/ckpt $HOME"
    result = sandbox.run(LAUNCHER, "--dry-run", env={"TORCH_DIST_DIR": path})
    assert result.returncode == 2 and result.stdout == ""
    assert f"configuration error: {path!r} (from TORCH_DIST_DIR) cannot reach train.py unchanged: Ray 2.55" in \
        result.stderr and "Ray >= 2.56" in result.stderr
    sandbox.add_ray(version="2.60.0")
    assert sandbox.run(LAUNCHER, "--dry-run", env={"TORCH_DIST_DIR": path}).returncode == 0


@pytest.mark.parametrize("name, value", [("DATA_DIR", "/data/$USER"), ("REPO_ROOT", "{root}/w${{HOME}}"),
                                         ("SLIME_DIR", "/root/slime$x"), ("TENSORBOARD_DIR", "/tb/$RUN"),
                                         ("MEGATRON_DIR", "/root/Mega:tron"), ("REPO_ROOT", "{root}/a:b")])
def test_a_job_environment_value_ray_would_change_is_refused(sandbox: Sandbox, name, value) -> None:
    value = value.format(root=sandbox.root)
    if name == "REPO_ROOT":
        Path(value).symlink_to(REPO)  # this repository under an odd name
    result = sandbox.run(LAUNCHER, "--dry-run", env={name: value})
    assert result.returncode == 2 and result.stdout == ""
    assert f"configuration error: {name}={value} holds " in result.stderr


def test_a_passed_variable_with_a_dollar_is_refused_and_one_without_is_kept(sandbox: Sandbox) -> None:
    result = sandbox.run(LAUNCHER, "--dry-run", env={"PASS_ENV": "SECRET", "SECRET": "abc$DEF"})
    assert result.returncode == 2 and "SECRET=abc$DEF holds $DEF" in result.stderr
    assert "or leave the variable out of PASS_ENV" in result.stderr
    ok = sandbox.run(LAUNCHER, "--dry-run", env={"PASS_ENV": "SECRET", "SECRET": "abc$"})
    assert ok.returncode == 0, ok.stderr  # a lone $ is left alone by Ray


def test_a_dry_run_without_ray_warns_that_the_quoting_depends_on_the_ray_version(sandbox: Sandbox) -> None:
    result = sandbox.run(LAUNCHER, "--dry-run", env={"TORCH_DIST_DIR": "/root/a$b"})
    assert result.returncode == 0
    assert "warning: cannot ask ray its version (no ray on PATH, or `ray --version` does not say it): the command " \
           "assumes Ray >= 2.56, which passes '/root/a$b' (from TORCH_DIST_DIR) to train.py unchanged" in result.stderr
    plain = sandbox.run(LAUNCHER, "--dry-run")
    assert "cannot ask ray its version" not in plain.stderr
    sandbox.add_ray(version="unknown")  # a launch refuses what it cannot quote for sure
    launch = sandbox.run(LAUNCHER, env={"TORCH_DIST_DIR": "/root/a$b"})
    assert launch.returncode == 2 and "configuration error: cannot ask ray its version" in launch.stderr


def test_a_config_json_nested_too_deeply_is_named_not_a_traceback(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster()
    (sandbox.cluster / "Qwen3-30B-A3B-FP8" / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    result = sandbox.run(LAUNCHER, "--dry-run", env=cluster)
    assert result.returncode == 0 and "Traceback" not in result.stderr
    assert "config.json is nested too deeply to be a model's config.json" in result.stderr
