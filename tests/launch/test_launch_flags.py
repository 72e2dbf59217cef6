"""The flags after ``--`` as slime's own parsers read them (``mismatch_ctrl.launch.flags``), run as the preflight
runs it: a python with the job's PYTHONPATH, here over stand-ins of slime's three parsing functions
(``slime_parsers``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_harness import Sandbox, needs_the_recipe_imports
from slime_parsers import write_parsers

from mismatch_ctrl.launch.preflight import user_flags

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--micro-batch-size", "1", "--hf-checkpoint", "/ckpt", "--rollout-max-response-len", "8192"]


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkouts")
    write_parsers(root / "slime", root / "Megatron-LM")
    return root


def check(root: Path | None, extra: list[str]) -> list[str]:
    """The module's findings for the user's ``extra`` after the launcher's arguments, with ``root``'s checkouts on
    the PYTHONPATH (none: slime is not importable)."""
    path = [str(root / "Megatron-LM"), str(root / "slime")] if root else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "mismatch_ctrl.launch.flags", json.dumps(user_flags(extra)),
                           *BASE, *extra], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return [line.removeprefix("flag-check: ") for line in done.stdout.splitlines()]


@pytest.mark.parametrize("extra, found", [
    (["--sglang-context-length", "16384", "--debug-rollout-only", "--rollout-num-gpus-per-engine=4"], []),
    (["--rollout-max-respone-len", "4096"], ["unknown --rollout-max-respone-len"]),  # Megatron's parser drops it
    (["--rollout-max-respone-len=4096"], ["unknown --rollout-max-respone-len"]),
    (["--sglang-context-len", "16384"], ["abbreviation --sglang-context-len --sglang-context-length"]),
    (["--rollout-num-gpus-per", "4"],  # the SGLang helper's parser completes it; Megatron's ignores it
     ["abbreviation --rollout-num-gpus-per --rollout-num-gpus-per-engine"]),
    (["--rollout-max-response", "4096"], ["unknown --rollout-max-response"]),  # no abbreviations in Megatron's
    (["--debug-rollout"], ["unknown --debug-rollout"]),  # nor in the pre-parser
])
def test_each_flag_is_read_as_slimes_parsers_read_it(checkouts, extra, found):
    assert check(checkouts, extra) == found


@pytest.mark.parametrize("extra, message", [
    (["--sglang-m", "0.5"], "refused: ambiguous option: --sglang-m could match --sglang-mem-fraction-static, "
                            "--sglang-max-running-requests"),
    (["--sglang-context-length", "16k"], "refused: argument --sglang-context-length: invalid int value: '16k'"),
])
def test_arguments_a_parser_rejects_are_refused_with_its_message(checkouts, extra, message):
    assert check(checkouts, extra) == [message]


def test_without_slime_it_says_it_could_not_check():
    (line,) = check(None, ["--sglang-context-len", "16384"])
    assert line.startswith("cannot check: ModuleNotFoundError") and "slime" in line


def test_user_flags_are_the_words_that_name_a_flag():
    assert user_flags(["--a", "1", "--b=2", "-c", "--", "x", "--a"]) == ["--a", "--b", "--a"]


def ready_cluster(sandbox: Sandbox) -> dict[str, str]:
    """Everything in place, with the stand-ins of slime's parsers in the slime and Megatron-LM checkouts."""
    needs_the_recipe_imports()
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_ray(reachable=True, cluster_gpus=8)
    env = sandbox.make_cluster()
    write_parsers(Path(env["SLIME_DIR"]), Path(env["MEGATRON_DIR"]))
    return env


def submitted(sandbox: Sandbox) -> bool:
    return ["job", "submit"] in [call[:2] for call in sandbox.calls("ray")]


@pytest.mark.parametrize("extra, error", [
    (["--rollout-max-respone-len", "4096"], "--rollout-max-respone-len after -- is not a flag of slime, Megatron or "
                                            "SGLang: slime parses train.py's arguments with ignore_unknown_args"),
    (["--sglang-context-len", "16384"], "--sglang-context-len after -- is an abbreviation that slime's parsers read "
                                        "as --sglang-context-length: write the flag in full"),
    (["--sglang-m", "0.5"], "slime's parsers reject train.py's arguments, as they would when the job starts: "
                            "ambiguous option: --sglang-m could match"),
])
def test_a_launch_whose_flags_slime_would_misread_is_refused_before_submission(sandbox, extra, error):
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--", *extra, env=ready_cluster(sandbox))
    assert result.returncode == 1 and error in result.stderr, result.stderr
    assert "preflight failed; nothing was submitted" in result.stderr and not submitted(sandbox)


def test_flags_slime_reads_as_written_are_submitted(sandbox):
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--", "--sglang-context-length", "40960", env=ready_cluster(sandbox))
    assert result.returncode == 0 and submitted(sandbox), result.stderr
    assert "flags after --" not in result.stderr


def test_a_slime_whose_parsers_cannot_be_run_gets_a_warning_not_a_refusal(sandbox):
    needs_the_recipe_imports()
    sandbox.add_nvidia_smi(gpus=8)
    sandbox.add_ray(reachable=True, cluster_gpus=8)
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--", "--sglang-context-length", "40960", env=sandbox.make_cluster())
    assert result.returncode == 0 and submitted(sandbox), result.stderr
    assert "warning: the flags after -- were not checked against slime's parsers: ModuleNotFoundError" in result.stderr
