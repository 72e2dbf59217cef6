"""``--dry-run`` checks the flags after ``--`` as a launch does: with slime's parsers where they import (here the
stand-ins of ``slime_parsers``), else says so and applies argparse's abbreviation rule to the flags the launcher
knows (``mismatch_ctrl.launch.known_flags``)."""

from __future__ import annotations

import argparse
import contextlib
import io
from pathlib import Path

import pytest

from launch_harness import Sandbox
from slime_parsers import write_parsers

from mismatch_ctrl.launch import context_length, main, precision, values
from mismatch_ctrl.launch.known_flags import KNOWN_FLAGS, PASSED_FLAGS, READ_FLAGS, offline_findings

NOT_CHECKED = "the flags after -- were not checked against the parsers of slime at SLIME_DIR="


def dry_run(sandbox: Sandbox, *extra: str, env: dict[str, str] | None = None):
    return sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run", "--", *extra, env=env)


@pytest.mark.parametrize("extra, full", [
    (["--sglang-context-len", "4096"], "--sglang-context-length"),  # the case: SGLang's parser completes it
    (["--sglang-context-len=4096"], "--sglang-context-length"),
    (["--rollout-max-response", "4096"], "--rollout-max-response-len"),  # Megatron's parser would drop it
    (["--eps-clip-hi", "0.3"], "--eps-clip-high"),
])
def test_without_slime_an_abbreviation_is_refused_with_its_full_name(sandbox, extra, full):
    result = dry_run(sandbox, *extra)
    assert result.returncode == 2, result.stderr
    flag = extra[0].partition("=")[0]
    assert f"configuration error: {flag} after -- is not a full flag name: it begins {full}" in result.stderr
    assert NOT_CHECKED in result.stderr and "ModuleNotFoundError" in result.stderr
    assert "argparse's abbreviation rule" in result.stderr and result.stdout == ""


def test_without_slime_full_and_unknown_flags_pass_with_what_was_not_checked_said(sandbox):
    result = dry_run(sandbox, "--sglang-context-length", "40960", "--use-kl-loss", "--rollout-max-respone-len", "9",
                     "--rollout-num-gpus", "8")  # a real flag of slime's that begins a known one
    assert result.returncode == 0, result.stderr
    assert NOT_CHECKED in result.stderr
    assert "--rollout-max-respone-len after -- is not a flag the launcher knows: did you mean " \
           "--rollout-max-response-len?" in result.stderr
    assert "not judged without slime's parsers (not among the flags the launcher knows): --use-kl-loss" in \
           result.stderr
    assert "--rollout-num-gpus after" not in result.stderr
    assert "--sglang-context-length 40960" in result.stdout.replace("\\\n", " ")


def test_without_flags_after_dashes_nothing_is_said(sandbox):
    result = sandbox.run("qwen3_30b_dcgrpo.sh", "--dry-run")
    assert result.returncode == 0 and "flags after --" not in result.stderr


def stand_in_cluster(sandbox: Sandbox) -> dict[str, str]:
    env = sandbox.make_cluster()
    write_parsers(Path(env["SLIME_DIR"]), Path(env["MEGATRON_DIR"]))
    return env


@pytest.mark.parametrize("extra, error", [
    (["--sglang-context-len", "16384"], "--sglang-context-len after -- is an abbreviation that a parser of slime's "
                                        "completes to --sglang-context-length"),
    (["--rollout-max-respone-len", "4096"], "--rollout-max-respone-len after -- is not a flag of slime at SLIME_DIR="),
    (["--sglang-m", "0.5"], "as it would when the job starts: ambiguous option: --sglang-m could match"),
    (["--use-kl-loss"], "--use-kl-loss after -- is not a flag of slime"),  # the stand-ins lack it: their verdict rules
])
def test_where_slimes_parsers_import_the_dry_run_uses_their_verdict(sandbox, extra, error):
    result = dry_run(sandbox, *extra, env=stand_in_cluster(sandbox))
    assert result.returncode == 2 and "configuration error: " in result.stderr and error in result.stderr, \
        result.stderr
    assert NOT_CHECKED not in result.stderr and "argparse's abbreviation rule" not in result.stderr


def test_where_slimes_parsers_import_a_flag_they_read_as_written_passes(sandbox):
    result = dry_run(sandbox, "--sglang-context-length", "40960", env=stand_in_cluster(sandbox))
    assert result.returncode == 0, result.stderr
    assert "flags after --" not in result.stderr


def test_the_offline_rule_is_argparses_completion_on_the_known_flags():
    """Against argparse itself: a parser with every known flag and allow_abbrev=True completes a proper prefix to the
    one known flag it begins, and reports the ambiguity when it begins several; offline_findings names the same."""
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    for flag in KNOWN_FLAGS:
        parser.add_argument(flag, dest=flag, nargs="?")
    prefixes = {flag[:cut] for flag in KNOWN_FLAGS for cut in range(4, len(flag))} - KNOWN_FLAGS
    assert len(prefixes) > 1000
    for prefix in sorted(prefixes):
        (finding,) = offline_findings([prefix])
        assert finding["kind"] == "abbreviation" and finding["flag"] == prefix
        errors = io.StringIO()
        with contextlib.redirect_stderr(errors), contextlib.suppress(SystemExit):
            parsed, _ = parser.parse_known_args([prefix, "1"])
            (taken,) = [flag for flag, value in vars(parsed).items() if value is not None]
            assert finding["full"] == [taken]
            continue
        assert "ambiguous option" in errors.getvalue() and len(finding["full"]) > 1
        assert all(flag in errors.getvalue() for flag in finding["full"])


def test_known_flags_are_not_judged_and_others_get_the_closest_known_spelling():
    assert offline_findings(sorted(KNOWN_FLAGS)) == []
    assert offline_findings(["--zzz", "--n-samples-per-promt", "--zzz"]) == [
        {"kind": "not known", "flag": "--zzz", "like": []},
        {"kind": "not known", "flag": "--n-samples-per-promt", "like": ["--n-samples-per-prompt"]}]


def test_every_flag_the_checks_read_after_dashes_is_known():
    read = {context_length.OVERRIDE_FLAG, context_length.AUTO_TRUNCATE_FLAG, *main.INTEGER_FLAGS,
            *precision.DYNAMIC_SCALING_FLAGS, *precision.LOW_PRECISION_TRAINING_FLAGS, *values.NORMALISATION_OFF}
    assert read <= READ_FLAGS | PASSED_FLAGS
