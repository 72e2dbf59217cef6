"""The launchers' bad input (issue 37, items 2, 5, 9 and 10): files that are no regular file, one sample per prompt,
values slime's parser would read as options, counts no cluster holds, relative paths, the `.partial` of --prepare, a
tracker file longer than Megatron's, and a dry run that touches no GPU tool. Every launch runs the real launcher
(``launch/*.sh`` in the sandbox of ``tests/launch/launch_harness.py``) with a deadline."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from launch_harness import Result, Sandbox, split_submit
from no_hang import make_fifo

LAUNCHER = "qwen3_30b_dcgrpo.sh"


@pytest.fixture
def sandbox(tmp_path: Path) -> Sandbox:
    return Sandbox(tmp_path)


def errors(result: Result) -> list[str]:
    return [line.split("configuration error: ", 1)[1] for line in result.stderr.splitlines()
            if "configuration error: " in line]


def refused(result: Result, needle: str) -> None:
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert any(needle in line for line in errors(result)), result.stderr


def train_words(result: Result) -> list[str]:
    return split_submit(result.command())[1]


def value_of(words: list[str], flag: str) -> str:
    return words[len(words) - 1 - words[::-1].index(flag) + 1]


# Item 5: one sample per prompt.
@pytest.mark.parametrize("launcher", ["qwen3_30b_dcgrpo.sh", "qwen3_30b_grpo.sh", "qwen3_30b_geo_mis.sh",
                                      "qwen3_30b_token_tis.sh", "qwen3_30b_length_decay.sh", "qwen3_8b_dcgrpo.sh"])
def test_one_sample_per_prompt_is_refused_for_a_group_normalised_estimator(sandbox, launcher):
    result = sandbox.run(launcher, "--dry-run", env={"N_SAMPLES_PER_PROMPT": "1", "GLOBAL_BATCH_SIZE": "64"})
    refused(result, "N_SAMPLES_PER_PROMPT=1 with --advantage-estimator grpo: slime subtracts each prompt's mean "
                    "reward over its samples")
    assert "every advantage is 0" in result.stderr and "use 2 or more samples per prompt" in result.stderr


@pytest.mark.parametrize("flag", ["--disable-rewards-normalization", "--custom-reward-post-process-path=my.post"])
def test_one_sample_per_prompt_is_kept_when_the_normalisation_is_off(sandbox, flag):
    result = sandbox.run(LAUNCHER, "--dry-run", "--", flag, env={"N_SAMPLES_PER_PROMPT": "1",
                                                                 "GLOBAL_BATCH_SIZE": "64"})
    assert result.returncode == 0 and "N_SAMPLES_PER_PROMPT=1" not in result.stderr, result.stderr
    assert value_of(train_words(result), "--n-samples-per-prompt") == "1"


def test_two_samples_per_prompt_are_enough(sandbox):
    result = sandbox.run(LAUNCHER, "--dry-run", env={"N_SAMPLES_PER_PROMPT": "2", "GLOBAL_BATCH_SIZE": "128"})
    assert result.returncode == 0, result.stderr


# Item 5: values slime's parser would read as options.
@pytest.mark.parametrize("name, value, flag", [
    ("WANDB_PROJECT", "--foo", "--wandb-project"), ("WANDB_PROJECT", "-x", "--wandb-project"),
    ("WANDB_TEAM", "--team", "--wandb-team"), ("WANDB_GROUP", "-g", "--wandb-group"),
    ("RAY_ADDRESS", "--bad", "--address"),
])
def test_a_value_that_starts_with_a_dash_is_refused_naming_the_flag(sandbox, name, value, flag):
    env = {"WANDB_PROJECT": "mc", name: value}
    result = sandbox.run(LAUNCHER, "--dry-run", env=env)
    refused(result, f"{name}={value} starts with '-': the parser of {flag} would read it as an option")


def test_a_run_name_that_starts_with_a_dash_is_refused_through_the_wandb_group(sandbox):
    result = sandbox.run(LAUNCHER, "--dry-run", env={"WANDB_PROJECT": "mc", "RUN_NAME": "-r"})
    refused(result, "WANDB_GROUP=-r starts with '-'")


@pytest.mark.parametrize("name, flag", [("SAVE_DIR", "--save"), ("LOAD_DIR", "--load"),
                                        ("FP8_HF_DIR", "--hf-checkpoint"), ("TORCH_DIST_DIR", "--ref-load")])
def test_a_path_that_starts_with_a_dash_reaches_slime_as_an_absolute_path(sandbox, name, flag):
    result = sandbox.run(LAUNCHER, "--dry-run", env={name: "-x"})
    assert result.returncode == 0, result.stderr
    assert value_of(train_words(result), flag) == f"{sandbox.root}/-x"
    assert f"warning: {name}=-x is a relative path: Ray runs the job in other working directories, so it is used as " \
           f"{sandbox.root}/-x" in result.stderr


# Item 5: relative paths are made absolute (the launcher runs in sandbox.root).
def test_relative_paths_are_made_absolute_with_a_warning(sandbox):
    cluster = sandbox.make_cluster()
    relative = {name: os.path.relpath(cluster[name], sandbox.root) for name in ("DATA_DIR", "FP8_HF_DIR")}
    env = {**cluster, **relative, "SAVE_DIR": "runs/mine", "TENSORBOARD_DIR": "tb"}
    result = sandbox.run(LAUNCHER, "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    words = train_words(result)
    assert value_of(words, "--save") == value_of(words, "--load") == f"{sandbox.root}/runs/mine"
    assert value_of(words, "--prompt-data") == f"{cluster['DATA_DIR']}/dapo-math-17k.jsonl"
    assert value_of(words, "--hf-checkpoint") == cluster["FP8_HF_DIR"]
    env_vars = json.loads(value_of(split_submit(result.command())[0], "--runtime-env-json"))["env_vars"]
    assert env_vars["DATA_DIR"] == cluster["DATA_DIR"] and env_vars["TENSORBOARD_DIR"] == f"{sandbox.root}/tb"
    for name in ("SAVE_DIR", "DATA_DIR", "FP8_HF_DIR", "TENSORBOARD_DIR"):
        assert f"warning: {name}=" in result.stderr and "is a relative path" in result.stderr, name
    assert "warning: LOAD_DIR" not in result.stderr  # its default follows SAVE_DIR, already absolute


def test_absolute_paths_give_no_warning_and_the_command_is_unchanged(sandbox):
    result = sandbox.run(LAUNCHER, "--dry-run", env=sandbox.make_cluster())
    assert result.returncode == 0 and "relative path" not in result.stderr, result.stderr


@pytest.mark.parametrize("name", ["SAVE_DIR", "DATA_DIR", "EVAL_CONFIG"])
def test_a_path_starting_with_a_tilde_is_refused(sandbox, name):
    refused(sandbox.run(LAUNCHER, "--dry-run", env={name: "~/runs"}),
            f"{name}=~/runs starts with '~', which nothing expands here")


# Item 5: counts bounded by what a cluster holds (checked on the text: a 5000-digit number is no traceback).
@pytest.mark.parametrize("name, value, needle", [
    ("ROLLOUT_BATCH_SIZE", "1000000000", "ROLLOUT_BATCH_SIZE=1000000000 is above 65536"),
    ("N_SAMPLES_PER_PROMPT", "100000", "N_SAMPLES_PER_PROMPT=100000 is above 1024"),
    ("GLOBAL_BATCH_SIZE", "10" * 30, "GLOBAL_BATCH_SIZE=101010101010101010101010... is above 65536"),
    ("NUM_NODES", "100000", "NUM_NODES=100000 is above 8192"),
    ("GPUS_PER_NODE", "64", "GPUS_PER_NODE=64 is above 16"),
    ("NUM_ROLLOUT", "9" * 5000, "NUM_ROLLOUT=999999999999999999999999... is above 1000000"),
    ("TP", "9" * 5000, "TP=999999999999999999999999... is above 65536"),
    ("MAX_TOKENS_PER_GPU", "2000000", "is above 1048576"),
    ("MAX_RESPONSE_LEN", "9" * 5000, "is above 1048576"),
    ("EVAL_INTERVAL", "9" * 5000, "EVAL_INTERVAL=999999999999999999999999... is above 1000000"),
    ("SAVE_INTERVAL", "10000000", "SAVE_INTERVAL=10000000 is above 1000000"),
    ("FP8_CONVERT_WORKERS", "100000", "FP8_CONVERT_WORKERS=100000 is above 256"),
])
def test_counts_no_cluster_holds_are_refused_before_any_command(sandbox, name, value, needle):
    refused(sandbox.run(LAUNCHER, "--dry-run", env={name: value}), needle)


def test_samples_per_rollout_are_bounded(sandbox):
    result = sandbox.run(LAUNCHER, "--dry-run", env={"ROLLOUT_BATCH_SIZE": "16384", "N_SAMPLES_PER_PROMPT": "8",
                                                     "GLOBAL_BATCH_SIZE": "128"})
    refused(result, "ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT = 16384 x 8 = 131072 samples per rollout, above 65536")
    edge = sandbox.run(LAUNCHER, "--dry-run", env={"ROLLOUT_BATCH_SIZE": "8192", "N_SAMPLES_PER_PROMPT": "8",
                                                   "GLOBAL_BATCH_SIZE": "128"})
    assert "samples per rollout, above" not in edge.stderr, edge.stderr


# Items 2 and 9: files that are no regular file, named at once (a FIFO is never opened).
def _fifo_in_place(path: Path) -> Path:
    if path.exists():
        path.unlink()
    return make_fifo(path)


def test_a_fifo_as_the_checkpoints_config_json_is_named_in_a_dry_run(sandbox):
    cluster = sandbox.make_cluster()
    _fifo_in_place(Path(cluster["FP8_HF_DIR"]) / "config.json")
    result = sandbox.run(LAUNCHER, "--dry-run", env=cluster)
    assert "config.json (a FIFO (named pipe), not a regular file)" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_dev_zero_as_the_checkpoints_config_json_is_named_not_read(sandbox):
    cluster = sandbox.make_cluster()
    config = Path(cluster["FP8_HF_DIR"]) / "config.json"
    config.unlink()
    config.symlink_to("/dev/zero")
    result = sandbox.run(LAUNCHER, "--dry-run", env=cluster)
    assert "config.json (a character device, not a regular file)" in result.stderr, result.stderr


@pytest.mark.parametrize("make, what", [(make_fifo, "a FIFO (named pipe)"), (Path.mkdir, "a directory"),
                                        (lambda p: p.symlink_to("/dev/zero"), "a character device")])
def test_an_eval_config_that_is_no_regular_file_is_named_for_what_it_is(sandbox, make, what):
    path = sandbox.root / "eval.yaml"
    make(path)
    result = sandbox.run(LAUNCHER, "--dry-run", env={**sandbox.make_cluster(), "EVAL_CONFIG": str(path)})
    refused(result, f"EVAL_CONFIG={path} is {what}, not a regular file: give slime's eval config YAML")
    assert "does not exist" not in result.stderr


def test_a_missing_eval_config_is_still_named_as_missing(sandbox):
    result = sandbox.run(LAUNCHER, "--dry-run", env={"EVAL_CONFIG": str(sandbox.root / "nope.yaml")})
    refused(result, f"EVAL_CONFIG={sandbox.root / 'nope.yaml'} does not exist (or set EVAL_INTERVAL=0")


@pytest.mark.parametrize("name", ["METHOD_CONFIG", "MODEL_ARGS_FILE"])
def test_a_fifo_as_a_method_or_model_file_is_named(sandbox, name):
    fifo = make_fifo(sandbox.root / "file")
    result = sandbox.run(LAUNCHER, "--dry-run", env={name: str(fifo)})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{name}={fifo} is a FIFO (named pipe), not a regular file" in result.stderr


def _resume_from(sandbox: Sandbox, tracker: Path) -> Result:
    cluster = sandbox.make_cluster()
    save = Path(cluster["SAVE_DIR"])
    save.mkdir(parents=True, exist_ok=True)
    tracker.rename(save / "latest_checkpointed_iteration.txt") if tracker.exists() or tracker.is_symlink() else None
    return sandbox.run(LAUNCHER, "--dry-run", env=cluster)


@pytest.mark.parametrize("content, needle", [
    (b"1" * 65, "longer than Megatron's tracker (the iteration number or 'release', at most 64 bytes)"),
    (b"20\n" + b" " * 10_000, "longer than Megatron's tracker"),
    (b"x" * (1 << 20), "longer than Megatron's tracker"),
])
def test_a_tracker_file_longer_than_megatrons_is_named_as_such(sandbox, content, needle):
    tracker = sandbox.root / "tracker"
    tracker.write_bytes(content)
    result = _resume_from(sandbox, tracker)
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_a_tracker_of_megatrons_length_still_resumes(sandbox):
    tracker = sandbox.root / "tracker"
    tracker.write_bytes(b"40\n")
    result = _resume_from(sandbox, tracker)
    assert result.returncode == 0 and "holds iteration 40" in result.stderr, result.stderr


@pytest.mark.parametrize("make, what", [(make_fifo, "a FIFO (named pipe)"), (Path.mkdir, "a directory"),
                                        (lambda p: p.symlink_to(p.parent / "gone"), "a broken link")])
def test_a_tracker_that_is_no_regular_file_is_named_for_what_it_is(sandbox, make, what):
    tracker = sandbox.root / "tracker"
    make(tracker)
    result = _resume_from(sandbox, tracker)
    assert f"latest_checkpointed_iteration.txt: not a regular file ({what})" in result.stderr, result.stderr


# Item 9: a stale DIR.partial of --prepare that no interrupted conversion leaves.
@pytest.mark.parametrize("kind", ["file", "link to a directory", "broken link", "fifo"])
def test_a_partial_that_is_no_folder_is_named_and_left_alone(sandbox, kind):
    cluster = sandbox.make_cluster(prepared=False)
    partial = Path(f"{cluster['FP8_HF_DIR']}.partial")
    target = sandbox.root / "kept"
    if kind == "file":
        partial.write_text("mine")
    elif kind == "fifo":
        make_fifo(partial)
    else:
        if kind == "link to a directory":
            target.mkdir()
            (target / "precious").write_text("x")
        partial.symlink_to(target)
    result = sandbox.run(LAUNCHER, "--prepare", "--dry-run", env=cluster)
    assert "Traceback" not in result.stderr, result.stderr
    if kind.endswith("link") or kind.startswith("link"):
        assert f"FP8_HF_DIR: {partial} is a symbolic link (to {target}), not the folder an interrupted --prepare " \
               f"leaves" in result.stderr and f"rm {partial}; its target stays" in result.stderr, result.stderr
    else:
        what = "a file" if kind == "file" else "a FIFO (named pipe)"
        assert f"FP8_HF_DIR: {partial} is {what}, not the folder an interrupted --prepare leaves" in result.stderr
    assert "left by an interrupted run" not in result.stderr
    assert partial.is_symlink() or partial.exists()
    if kind == "link to a directory":
        assert (target / "precious").read_text() == "x"


def test_a_partial_folder_is_still_redone(sandbox):
    cluster = sandbox.make_cluster(prepared=False)
    Path(f"{cluster['FP8_HF_DIR']}.partial").mkdir()
    result = sandbox.run(LAUNCHER, "--prepare", "--dry-run", env=cluster)
    assert "left by an interrupted run" in result.stderr and "not the folder" not in result.stderr, result.stderr


# Item 10: a dry run touches no GPU tool.
def _logging_nvidia_smi(sandbox: Sandbox) -> Path:
    log = sandbox.logs / "nvidia-smi.calls"
    tool = sandbox.bin / "nvidia-smi"
    tool.write_text(f"#!/bin/bash\necho \"$*\" >> {log}\necho 'GPU0 X NV18'\n")
    tool.chmod(0o755)
    return log


def test_a_dry_run_runs_no_nvidia_smi_and_says_auto_is_decided_at_launch(sandbox):
    log = _logging_nvidia_smi(sandbox)
    result = sandbox.run(LAUNCHER, "--dry-run", env=sandbox.make_cluster())
    assert result.returncode == 0, result.stderr
    assert not log.exists(), log.read_text()
    env_vars = json.loads(value_of(split_submit(result.command())[0], "--runtime-env-json"))["env_vars"]
    assert env_vars["NCCL_NVLS_ENABLE"] == "auto"
    assert "NCCL_NVLS_ENABLE=auto is decided when the job is submitted" in result.stderr
    pinned = sandbox.run(LAUNCHER, "--dry-run", env={**sandbox.make_cluster(), "NCCL_NVLS_ENABLE": "1"})
    env_vars = json.loads(value_of(split_submit(pinned.command())[0], "--runtime-env-json"))["env_vars"]
    assert env_vars["NCCL_NVLS_ENABLE"] == "1" and "decided when the job is submitted" not in pinned.stderr
    assert not log.exists()


@pytest.mark.parametrize("topology, expected", [("GPU0 X NV18", "1"), ("GPU0 X SYS", "0")])
def test_a_launch_still_decides_auto_from_nvidia_smi(tmp_path, monkeypatch, topology, expected):
    from mismatch_ctrl.launch.command import nvls_enable
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/bash\necho '{topology}'\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert nvls_enable("auto") == expected and nvls_enable("0") == "0"
