"""Response lengths against the rollout engine's context length: SGLang refuses a request whose prompt plus
``max_new_tokens`` reaches it (``mismatch_ctrl/launch/context_length.py``), so the launcher refuses lengths that leave
no room for a prompt and warns where little is left."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from launch_harness import HF_CONFIGS, REPO, Sandbox
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.launch.preflight import eval_sets, job_data_files
from mismatch_ctrl.launch.settings import Settings
from mismatch_ctrl.launch.context_length import (PROMPT_ROOM, RequestedLength, context_override,
                                                 response_length_problems, sglang_context_length)

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


@pytest.mark.parametrize("config, key", [
    ({"max_position_embeddings": float("inf")}, "max_position_embeddings"),
    ({"max_position_embeddings": -5}, "max_position_embeddings"),
    ({"max_position_embeddings": 10 ** 400}, "max_position_embeddings"),
    ({"max_position_embeddings": "40960"}, "max_position_embeddings"),
    ({"max_position_embeddings": 32768, "rope_scaling": {"rope_type": "yarn", "factor": None}}, "rope_scaling.factor"),
])
def test_a_context_length_sglang_could_not_derive_is_named(config, key) -> None:
    with pytest.raises(ConfigError, match=f"config.json has {key} = "):
        sglang_context_length(config)


def test_transformers_reads_rope_scaling_type_as_rope_type() -> None:
    assert sglang_context_length({"max_position_embeddings": 131072,
                                  "rope_scaling": {"type": "llama3", "factor": 8.0}}) == 131072


@pytest.mark.parametrize("extra, expected", [
    ([], None), (["--sglang-context-length", "65536"], 65536), (["--sglang-context-length=8192"], 8192),
    (["--sglang-context-length", "1024", "--foo", "--sglang-context-length", "2048"], 2048),
    (["--sglang-context-length"], None), (["--sglang-context-length", "128k"], 128000),
    (["--sglang-context-length", "128Ki"], 131072), (["--sglang-context-length", "25.6k"], 25600),
    (["--sglang-context-length", "65_536"], 65536),
])
def test_the_context_length_given_after_the_double_dash_is_read_as_sglang_reads_it(extra, expected) -> None:
    assert context_override(extra) == expected


@pytest.mark.parametrize("value", ["abc", "1.5Ki", "\u00b2", "0", "12kb"])
def test_a_context_length_sglang_cannot_read_is_named(value) -> None:
    with pytest.raises(ValueError, match="--sglang-context-length after --"):
        context_override(["--sglang-context-length", value])


def asked(where: str, length: int) -> RequestedLength:
    return RequestedLength(where, length, "rollout", "--rollout-max-prompt-len")


def test_no_room_is_an_error_little_room_a_warning_with_slimes_fix() -> None:
    context = 3 * PROMPT_ROOM
    lengths = [asked("A", context), asked("B", context - 1), asked("C", context - PROMPT_ROOM + 1),
               asked("D", context - PROMPT_ROOM), asked("E", context + 1)]
    errors, warnings = response_length_problems(lengths, context, "here")
    assert [line.split(" = ")[0] for line in errors] == ["A", "E"]  # SGLang serves prompt + max_new_tokens <= context
    assert [line.split(" = ")[0] for line in warnings] == ["B", "C"]
    assert "--rollout-max-prompt-len 1 " in warnings[0] and f"--rollout-max-prompt-len {PROMPT_ROOM - 1} " in \
        warnings[1] and "(here)" in warnings[1] and "the rollout fails" in warnings[1]
    assert response_length_problems([asked("A", 8192)], QWEN3_CONTEXT, "here") == ([], [])


def test_the_fix_applied_silences_the_warning_and_auto_truncate_turns_the_error_into_one() -> None:
    context = 3 * PROMPT_ROOM
    lengths = [asked("B", context - 100), asked("A", context)]
    assert response_length_problems(lengths[:1], context, "here", ["--rollout-max-prompt-len", "100"]) == ([], [])
    assert len(response_length_problems(lengths[:1], context, "here", ["--rollout-max-prompt-len", "101"])[1]) == 1
    assert len(response_length_problems(lengths[:1], context, "here", ["--eval-max-prompt-len", "100"])[1]) == 1
    errors, warnings = response_length_problems(lengths, context, "here", ["--sglang-allow-auto-truncate"])
    assert errors == [] and len(warnings) == 1 and "A = " in warnings[0] and "responses stop short" in warnings[0]


@pytest.mark.parametrize("context", [1024, 2048])
def test_the_advice_for_a_small_context_is_never_a_negative_length(context) -> None:
    (error,), _ = response_length_problems([asked("A", context)], context, "here")
    assert f"lower it below {context}, or serve" in error and "at most" not in error


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
    longer = sandbox.run(LAUNCHER, "--dry-run", "--", "--sglang-context-length", "128Ki",
                         env={**cluster, "MAX_RESPONSE_LEN": "65536"})
    assert longer.returncode == 2
    refused = lines(longer, "configuration error")
    assert len(refused) == 1 and f"--sglang-context-length 131072 is above the context length {QWEN3_CONTEXT}" in \
        refused[0] and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in refused[0]
    allowed = sandbox.run(LAUNCHER, "--dry-run", "--", "--sglang-context-length", "128Ki",
                          env={**cluster, "MAX_RESPONSE_LEN": "65536", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
                               "PASS_ENV": "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"})
    assert allowed.returncode == 0 and "context length" not in allowed.stderr, allowed.stderr
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


GIVEN = {"METHOD": "dcgrpo", "MODEL": "qwen3_30b_a3b", "REPO_ROOT": str(REPO), "PYTHON": "python3"}


@pytest.mark.parametrize("text", [
    "eval:\n  defaults:\n    max_response_len: 4096\n  datasets:\n"
    "    - name: aime24\n      path: ${oc.env:DATA_DIR}/aime24.jsonl\n"
    "      max_response_len: 30000\n"
    "    - name: math500\n      path: /m/math500.jsonl\n",
    # no eval: key (slime reads the root), datasets keyed by name
    "defaults:\n  max_response_len: 4096\ndatasets:\n"
    "  aime24:\n    path: ${oc.env:DATA_DIR, /data}/aime24.jsonl\n    max_response_len: 30000\n"
    "  math500:\n    path: /m/math500.jsonl\n",
])
def test_eval_sets_are_read_as_slime_reads_them(tmp_path, text) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text(text)
    s = Settings({"EVAL_CONFIG": str(config), "DATA_DIR": "/data", "MAX_RESPONSE_LEN": "8192"}, GIVEN)
    sets = eval_sets(s)
    assert [(e.name, e.path, e.max_response_len, e.max_response_len_from) for e in sets] == [
        ("aime24", "/data/aime24.jsonl", 30000, "EVAL_CONFIG"), ("math500", "/m/math500.jsonl", 4096, "EVAL_CONFIG")]
    assert job_data_files(s)[1:] == ["/data/aime24.jsonl", "/m/math500.jsonl"]


def test_an_eval_set_without_a_length_takes_slimes_flags(tmp_path) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - name: a\n      path: /a.jsonl\n")
    s = Settings({"EVAL_CONFIG": str(config), "MAX_RESPONSE_LEN": "8192"}, GIVEN)
    assert [(e.max_response_len, e.max_response_len_from) for e in eval_sets(s)] == [(8192, "MAX_RESPONSE_LEN")]
    assert [(e.max_response_len, e.max_response_len_from) for e in eval_sets(s, ["--eval-max-response-len", "39000"])] \
        == [(39000, "--eval-max-response-len")]


def test_eval_sets_of_one_length_are_named_together(sandbox: Sandbox, tmp_path: Path) -> None:
    cluster = sandbox.make_cluster()
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n" + "".join(
        f"    - name: {name}\n      path: ${{oc.env:DATA_DIR}}/eval/{name}.jsonl\n" for name in ("aime24", "math500")))
    result = sandbox.run(LAUNCHER, "--dry-run", "--", "--eval-max-response-len", "40000",
                         env={**cluster, "EVAL_CONFIG": str(config)})
    assert result.returncode == 0, result.stderr
    warned = [line for line in lines(result, "warning") if "context length" in line]
    assert len(warned) == 1 and "--eval-max-response-len (eval sets aime24, math500) = 40000 leaves 960 tokens" in \
        warned[0] and "the evaluation fails" in warned[0] and "--eval-max-prompt-len 960 after --" in warned[0]
    bad = sandbox.run(LAUNCHER, "--dry-run", "--", "--eval-max-response-len", "lots", env=cluster)
    assert bad.returncode == 2 and "--eval-max-response-len 'lots' after -- is not an integer" in bad.stderr


@pytest.mark.parametrize("text, fragment", [
    ("eval:\n  datasets:\n    - name: a\n      path: /a\n      max_response_len: ${oc.env:LEN,30000}\n",
     "dataset a: max_response_len is '${oc.env:LEN,30000}', not a positive integer (slime passes it on unconverted"),
    ("eval:\n  defaults:\n    max_response_len: null\n  datasets:\n    - name: a\n      path: /a\n",
     "dataset a: max_response_len is None"),
    ("eval:\n  datasets:\n    - name: a\n      path: /a\n      n_samples_per_eval_prompt: '4'\n",
     "dataset a: n_samples_per_eval_prompt is '4'"),
    ("eval:\n  datasets: []\n", "defines no datasets: slime refuses to start"),
    ("eval:\n  datasets:\n    - path: /a\n", "a dataset entry has no name"),
    ("eval: null\n", "its eval: is None, not a mapping"),
    ("eval:\n  datasets: 3\n", "datasets a list of mappings"),
])
def test_an_eval_config_slime_would_fail_on_is_named(tmp_path, text, fragment) -> None:
    """slime hands the numbers to SGLang unconverted (a string from ${oc.env} fails at the first evaluation) and
    refuses a config without datasets or with unnamed ones."""
    config = tmp_path / "eval.yaml"
    config.write_text(text)
    with pytest.raises(ValueError, match=re.escape(fragment)):
        eval_sets(Settings({"EVAL_CONFIG": str(config)}, GIVEN))


def test_eval_samples_follow_the_flag_after_the_double_dash(tmp_path) -> None:
    config = tmp_path / "eval.yaml"
    config.write_text("eval:\n  datasets:\n    - name: a\n      path: /a\n    - name: b\n      path: /b\n"
                      "      n_samples_per_eval_prompt: 2\n")
    s = Settings({"EVAL_CONFIG": str(config)}, GIVEN)
    assert [e.samples for e in eval_sets(s)] == [1, 2]
    assert [e.samples for e in eval_sets(s, ["--n-samples-per-eval-prompt", "16"])] == [16, 2]
