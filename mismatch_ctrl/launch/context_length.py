"""Whether the response lengths a run asks for fit the rollout engine's context length, checked before any GPU.

SGLang 0.5.15.post1 (the image's) refuses a request whose prompt plus ``max_new_tokens`` exceeds its context length
(``python/sglang/srt/managers/tokenizer_manager.py:973-995``, ``_validate_one_request``: "Requested token count
exceeds the model's maximum context length"; with ``--allow-auto-truncate`` it cuts ``max_new_tokens`` instead), and
a prompt alone that reaches it (:957-971). slime sends every rollout request with ``max_new_tokens =
--rollout-max-response-len`` (``slime/rollout/sglang_rollout.py:99``, 624b824a) and every evaluation request with the
dataset's ``max_response_len`` (:547). A refused request fails the rollout, after the cluster has loaded the model.

The context length is SGLang's ``--context-length`` (``--sglang-context-length`` through slime) when given, else the
one SGLang derives from the checkpoint's ``config.json`` (``python/sglang/srt/utils/hf_transformers/common.py:371-397``,
``get_context_length``): the first of ``max_sequence_length``, ``seq_length``, ``max_seq_len``, ``model_max_length``,
``max_position_embeddings``, times ``rope_scaling.factor`` unless ``rope_scaling`` holds
``original_max_position_embeddings`` or is ``llama3``'s; 2048 without any. Qwen3-30B-A3B and Qwen3-8B: 40960. A
``--context-length`` above the derived one is refused at start-up unless ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN``
is set (``python/sglang/srt/configs/model_config.py:675-704``).

A length that leaves no room for a prompt is an error; one that leaves less than :data:`PROMPT_ROOM` tokens a warning
with slime's fix, ``--rollout-max-prompt-len``, which drops prompts of more tokens when the data is loaded
(``slime/rollout/data_source.py:75``, ``slime/utils/data.py:87-137``).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
"""The ``config.json`` keys SGLang reads the context length from, in its order of preference."""
DEFAULT_CONTEXT_LENGTH = 2048
"""SGLang's context length for a ``config.json`` without any of :data:`CONTEXT_LENGTH_KEYS`."""
PROMPT_ROOM = 2048
"""Fewer tokens than this left for the prompt gets a warning: a math prompt in a chat template can take ~1k."""
OVERRIDE_FLAG = "--sglang-context-length"


def sglang_context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang derives from a parsed ``config.json`` (the rule in the module docstring)."""
    factor = 1.0
    rope = config.get("rope_scaling")
    if isinstance(rope, Mapping) and "original_max_position_embeddings" not in rope and \
            rope.get("rope_type") != "llama3":
        factor = float(rope.get("factor", 1.0))
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return int(float(value) * factor)
    return DEFAULT_CONTEXT_LENGTH


def context_override(extra: Sequence[str]) -> int | None:
    """The value of ``--sglang-context-length`` among the arguments after ``--`` (the last, as argparse keeps)."""
    found = None
    for i, word in enumerate(extra):
        if word == OVERRIDE_FLAG and i + 1 < len(extra):
            found = extra[i + 1]
        elif word.startswith(OVERRIDE_FLAG + "="):
            found = word.split("=", 1)[1]
    return int(found) if found is not None and found.isdigit() else None


def response_length_problems(lengths: Mapping[str, int], context: int, source: str) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the response lengths a run requests (``lengths``: where each is set -> tokens) in an
    engine of ``context`` tokens; ``source`` says where the context length comes from. A prompt of at most
    ``context - length`` tokens is served."""
    errors, warnings = [], []
    for where, length in lengths.items():
        room = context - length
        if room <= 0:
            errors.append(f"{where} = {length} is not below the rollout engine's context length {context} ({source}): "
                          "SGLang refuses every request whose prompt + max_new_tokens exceeds it, so no prompt fits; "
                          f"lower it to at most {context - PROMPT_ROOM}, or serve a longer context "
                          f"({OVERRIDE_FLAG} N after --, where the model supports N)")
        elif room < PROMPT_ROOM:
            warnings.append(f"{where} = {length} leaves {room} tokens of the engine's context length {context} "
                            f"({source}) for the prompt: SGLang refuses a longer prompt and the rollout fails; drop "
                            f"such prompts with --rollout-max-prompt-len {room} after --, or lower {where}")
    return errors, warnings


def override_problems(override: int, derived: int, source: str) -> list[str]:
    """A warning when ``--sglang-context-length`` exceeds what SGLang derives from the checkpoint."""
    if override <= derived:
        return []
    return [f"{OVERRIDE_FLAG} {override} is above the context length {derived} of the model ({source}): SGLang "
            "refuses it at start-up unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 reaches the engines (set it and "
            "name it in PASS_ENV), and serves it only where the model's positions reach that far"]
