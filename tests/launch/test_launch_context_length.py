"""Response lengths against the rollout engine's context length: SGLang refuses a request whose prompt plus
``max_new_tokens`` reaches it (``mismatch_ctrl/launch/context_length.py``), so the launcher refuses lengths that leave
no room for a prompt and warns where little is left."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch_harness import HF_CONFIGS, Sandbox
from mismatch_ctrl.launch.context_length import (PROMPT_ROOM, context_override, response_length_problems,
                                                 sglang_context_length)

LAUNCHER = "qwen3_30b_dcgrpo.sh"
QWEN3_CONTEXT = 40960


@pytest.mark.parametrize("config, expected", [
    (HF_CONFIGS["qwen3_30b_a3b"], QWEN3_CONTEXT),
    (HF_CONFIGS["qwen3_8b"], QWEN3_CONTEXT),
    ({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, 131072),
    ({"max_position_embeddings": 32768, "rope_scaling": {"type": "linear", "factor": 2}}, 65536),
    ({"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, 131072),
    ({"max_position_embeddings": 131072,
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
    ({"seq_length": 8192, "max_position_embeddings": 32768}, 8192),  # SGLang's order of keys
    ({"max_sequence_length": 4096, "model_max_length": 16384}, 4096),
    ({"model_max_length": 16384, "max_position_embeddings": 32768}, 16384),
    ({"hidden_size": 8}, 2048),
])
def test_the_context_length_is_sglangs(config, expected) -> None:
    assert sglang_context_length(config) == expected


@pytest.mark.parametrize("extra, expected", [
    ([], None), (["--sglang-context-length", "65536"], 65536), (["--sglang-context-length=8192"], 8192),
    (["--sglang-context-length", "1024", "--foo", "--sglang-context-length", "2048"], 2048),
    (["--sglang-context-length"], None), (["--sglang-context-length", "abc"], None),
])
def test_the_context_length_given_after_the_double_dash(extra, expected) -> None:
    assert context_override(extra) == expected


def test_no_room_is_an_error_little_room_a_warning_with_slimes_fix() -> None:
    context = 3 * PROMPT_ROOM
    lengths = {"A": context, "B": context - 1, "C": context - PROMPT_ROOM + 1, "D": context - PROMPT_ROOM,
               "E": context + 1}
    errors, warnings = response_length_problems(lengths, context, "here")
    assert [line.split(" = ")[0] for line in errors] == ["A", "E"]  # SGLang serves prompt + max_new_tokens <= context
    assert [line.split(" = ")[0] for line in warnings] == ["B", "C"]
    assert "--rollout-max-prompt-len 1 " in warnings[0] and f"--rollout-max-prompt-len {PROMPT_ROOM - 1} " in \
        warnings[1] and "(here)" in warnings[1]
    errors, warnings = response_length_problems({"A": 8192}, QWEN3_CONTEXT, "here")
    assert errors == warnings == []


def lines(result, kind: str) -> list[str]:
    return [line for line in result.stderr.splitlines() if kind in line]


def test_a_response_length_the_engine_cannot_serve_is_refused_before_any_command(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster()
    result = sandbox.run(LAUNCHER, "--dry-run", env={**cluster, "MAX_RESPONSE_LEN": str(QWEN3_CONTEXT)})
    assert result.returncode == 2 and result.stdout == "", result.stderr
    errors = lines(result, "configuration error")
    assert len(errors) == 1 and f"MAX_RESPONSE_LEN = {QWEN3_CONTEXT} is not below the rollout engine's context " \
                                f"length {QWEN3_CONTEXT} (FP8_HF_DIR={cluster['FP8_HF_DIR']}/config.json)" in errors[0]
    assert f"at most {QWEN3_CONTEXT - PROMPT_ROOM}" in errors[0]


def test_little_room_for_the_prompt_warns_and_a_longer_served_context_passes(sandbox: Sandbox) -> None:
    cluster = sandbox.make_cluster()
    near = QWEN3_CONTEXT - 1000
    result = sandbox.run(LAUNCHER, "--dry-run", env={**cluster, "MAX_RESPONSE_LEN": str(near)})
    assert result.returncode == 0, result.stderr
    warned = [line for line in lines(result, "warning") if "MAX_RESPONSE_LEN" in line]
    assert len(warned) == 1 and "leaves 1000 tokens" in warned[0] and "--rollout-max-prompt-len 1000 " in warned[0]
    longer = sandbox.run(LAUNCHER, "--dry-run", "--", "--sglang-context-length", "131072",
                         env={**cluster, "MAX_RESPONSE_LEN": "65536"})
    assert longer.returncode == 0, longer.stderr
    warned = [line for line in lines(longer, "warning") if "context length" in line]
    assert len(warned) == 1 and f"--sglang-context-length 131072 is above the context length {QWEN3_CONTEXT}" in \
        warned[0] and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in warned[0]
    shorter = sandbox.run(LAUNCHER, "--dry-run", "--", "--sglang-context-length", "16384",
                          env={**cluster, "MAX_RESPONSE_LEN": "16384"})
    assert shorter.returncode == 2 and "MAX_RESPONSE_LEN = 16384 is not below the rollout engine's context length " \
        "16384 (--sglang-context-length after --)" in shorter.stderr, shorter.stderr


def test_before_the_checkpoint_exists_the_profiles_context_length_is_used(sandbox: Sandbox, tmp_path: Path) -> None:
    result = sandbox.run(LAUNCHER, "--dry-run", env={"FP8_HF_DIR": str(tmp_path / "none"),
                                                     "MAX_RESPONSE_LEN": "50000"})
    assert result.returncode == 2
    assert any(f"context length {QWEN3_CONTEXT} (recorded in profile qwen3_30b_a3b" in line
               for line in lines(result, "configuration error")), result.stderr


def test_an_eval_set_whose_response_length_the_engine_cannot_serve_is_named(sandbox: Sandbox, tmp_path: Path) -> None:
    cluster = sandbox.make_cluster()
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  defaults:\n    max_response_len: 8192\n  datasets:\n"
                      "    - name: aime24\n      path: ${oc.env:DATA_DIR}/eval/aime24.jsonl\n"
                      "      max_response_len: 40960\n"
                      "    - name: math500\n      path: ${oc.env:DATA_DIR}/eval/math500.jsonl\n")
    result = sandbox.run(LAUNCHER, "--dry-run", env={**cluster, "EVAL_CONFIG": str(config)})
    assert result.returncode == 2, result.stderr
    errors = lines(result, "configuration error")
    assert len(errors) == 1 and "max_response_len of eval set aime24 (EVAL_CONFIG) = 40960" in errors[0]


def test_an_eval_length_that_is_not_an_integer_is_named_not_a_traceback(sandbox: Sandbox, tmp_path: Path) -> None:
    cluster = sandbox.make_cluster()
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - name: aime24\n      path: /x/aime24.jsonl\n"
                      "      max_response_len: lots\n")
    result = sandbox.run(LAUNCHER, "--dry-run", env={**cluster, "EVAL_CONFIG": str(config)})
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert any("EVAL_CONFIG" in line and "dataset aime24: max_response_len is 'lots', not a positive integer" in line
               for line in lines(result, "warning")), result.stderr
    launched = sandbox.run(LAUNCHER, env={**cluster, "EVAL_CONFIG": str(config)})
    assert launched.returncode == 1 and "dataset aime24: max_response_len is 'lots'" in launched.stderr
    assert not sandbox.calls("ray") or all("submit" not in call for call in sandbox.calls("ray"))
