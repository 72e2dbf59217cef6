"""The flags after ``--`` as slime's own parsers read them (``mismatch_ctrl.launch.flags``), run as the preflight
runs it: a python with the job's PYTHONPATH, here over stand-ins of slime's three parsing functions
(``slime_parsers``)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launch_harness import Sandbox, needs_the_recipe_imports
from slime_parsers import write_parsers

from mismatch_ctrl.launch import flags, preflight
from mismatch_ctrl.launch.preflight import flag_problems, user_flags

ROOT = Path(__file__).resolve().parents[2]
BASE = ["--micro-batch-size", "1", "--hf-checkpoint", "/ckpt", "--rollout-max-response-len", "8192"]


@pytest.fixture(scope="module")
def checkouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("checkouts")
    write_parsers(root / "slime", root / "Megatron-LM")
    return root


def check(root: Path | None, extra: list[str]) -> list[dict]:
    """The module's findings for the user's ``extra`` after the launcher's arguments, with ``root``'s checkouts on
    the PYTHONPATH (none: slime is not importable)."""
    path = [str(root / "Megatron-LM"), str(root / "slime")] if root else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*path, str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "mismatch_ctrl.launch.flags", json.dumps(user_flags(extra)),
                           *BASE, *extra], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return [json.loads(line.removeprefix("flag-check: ")) for line in done.stdout.splitlines()]


def unknown(flag: str, *closest: str) -> dict:
    """An ``unknown`` finding, its suggestions cut to the closest (:func:`closest_only`)."""
    return {"kind": "unknown", "flag": flag, "like": list(closest)}


def closest_only(found: list[dict]) -> list[dict]:
    return [{**item, "like": item["like"][:1]} if "like" in item else item for item in found]


def abbreviation(flag: str, *full: str) -> dict:
    return {"kind": "abbreviation", "flag": flag, "full": list(full)}


@pytest.mark.parametrize("extra, found", [
    (["--sglang-context-length", "16384", "--debug-rollout-only", "--rollout-num-gpus-per-engine=4"], []),
    (["--rollout-max-respone-len", "4096"],  # Megatron's parser drops it
     [unknown("--rollout-max-respone-len", "--rollout-max-response-len")]),
    (["--rollout-max-respone-len=4096"], [unknown("--rollout-max-respone-len", "--rollout-max-response-len")]),
    (["--sglang-context-len", "16384"], [abbreviation("--sglang-context-len", "--sglang-context-length")]),
    (["--sglang-context-len=16384"], [abbreviation("--sglang-context-len", "--sglang-context-length")]),
    (["--rollout-num-gpus-per", "4"],  # the SGLang helper's parser completes it; Megatron's ignores it
     [abbreviation("--rollout-num-gpus-per", "--rollout-num-gpus-per-engine")]),
    (["--rollout-max-response", "4096"],  # no abbreviations in Megatron's parser
     [unknown("--rollout-max-response", "--rollout-max-response-len")]),
    (["--debug-rollout"], [unknown("--debug-rollout", "--debug-rollout-only")]),  # nor in the pre-parser
    (["--zzz-unrelated"], [unknown("--zzz-unrelated")]),
    (["--rollout-num-gpus", "8"], []),  # a flag of slime's, though the SGLang helper also reads it as a prefix
    (["--sglang-json-model-override-args", "--x y"], []),  # a value, not a flag
    (["--debug-train-only", "--sglang-m", "0.5"], []),  # slime does not parse SGLang's flags in this mode
])
def test_each_flag_is_read_as_slimes_parsers_read_it(checkouts, extra, found):
    assert closest_only(check(checkouts, extra)) == found


@pytest.mark.parametrize("extra, message", [
    (["--sglang-m", "0.5"], "ambiguous option: --sglang-m could match --sglang-mem-fraction-static, "
                            "--sglang-max-running-requests"),
    (["--sglang-context-length", "16k"], "argument --sglang-context-length: invalid int value: '16k'"),
    (["--sglang-pp-size", "0"], "sglang_parse_args fails: ZeroDivisionError: integer division or modulo by zero"),
    (["--help"], "--help (or -h) makes slime print its help and exit without training"),
])
def test_arguments_slime_rejects_are_refused_with_its_message(checkouts, extra, message):
    assert check(checkouts, extra) == [{"kind": "refused", "message": message}]


def test_without_slime_it_says_it_could_not_check():
    (found,) = check(None, ["--sglang-context-len", "16384"])
    assert found["kind"] == "cannot check" and found["error"].startswith("ModuleNotFoundError")
    assert "slime" in found["error"]


def test_the_parsers_and_the_command_line_are_restored_after_a_refusal(checkouts, monkeypatch):
    for name in [name for name in sys.modules if name.split(".")[0] in ("slime", "megatron")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(checkouts / "slime"))
    monkeypatch.syspath_prepend(str(checkouts / "Megatron-LM"))
    parse_known_args, argv = argparse.ArgumentParser.parse_known_args, list(sys.argv)
    with pytest.raises(flags.Refused, match="ambiguous option"):
        flags.parsed([*BASE, "--sglang-m", "0.5"])
    assert argparse.ArgumentParser.parse_known_args is parse_known_args and sys.argv == argv
    runs, with_sglang = flags.parsed(BASE)
    assert with_sglang and len(runs) == 4  # the pre-parser, the SGLang helper and parser, Megatron's
    for name in [name for name in sys.modules if name.split(".")[0] in ("slime", "megatron")]:
        del sys.modules[name]  # the stand-ins are not the installed megatron-core


def test_user_flags_are_the_words_that_name_a_flag():
    assert user_flags(["--a", "1", "--b=2", "-c", "--", "x", "--a", "--x y", "--j={\"k\": 1}"]) == [
        "--a", "--b", "--a", "--j"]


def test_without_flags_after_dashes_nothing_is_started(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("no check should start"))
    assert flag_problems({}, ["7", "-x"], ["--seed", "7"]) == ([], [])


@pytest.mark.parametrize("stdout, returncode, warning", [
    ("", 1, "PYTHON=py failed: Traceback"),
    ("flag-check: not json\n", 0, "PYTHON=py failed: flag-check: not json"),
])
def test_a_check_that_fails_itself_is_a_warning(monkeypatch, stdout, returncode, warning):
    done = subprocess.CompletedProcess([], returncode, stdout=stdout, stderr="Traceback (most recent call last)")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: done)
    monkeypatch.setattr(preflight, "job_env", lambda s: {})
    errors, warnings = flag_problems({"PYTHON": "py", "SLIME_DIR": "/slime"}, ["--seed", "7"], ["--seed", "7"])
    assert errors == [] and len(warnings) == 1 and warning in warnings[0]


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
    (["--rollout-max-respone-len", "4096"], "Megatron or SGLang (did you mean --rollout-max-response-len?): slime "
                                            "parses train.py's arguments with ignore_unknown_args"),
    (["--sglang-context-len", "16384"], "--sglang-context-len after -- is an abbreviation that a parser of slime's "
                                        "completes to --sglang-context-length: write the flag in full"),
    (["--sglang-m", "0.5"], "rejects train.py's arguments (the launcher's and yours), as it would when the job "
                            "starts: ambiguous option: --sglang-m could match"),
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
    assert "warning: the flags after -- were not checked against the parsers of slime at SLIME_DIR=" in result.stderr
    assert "ModuleNotFoundError" in result.stderr


def test_a_word_a_parser_took_as_a_value_is_not_a_finding():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--sglang-json-model-override-args")
    _, left = parser.parse_known_args(["--sglang-json-model-override-args", "--x y", "--typo"])
    assert flags.findings(["--x y", "--typo"], [(parser, left)]) == [{"kind": "unknown", "flag": "--typo", "like": []}]
