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

A length that leaves no room for a prompt is an error (a warning with ``--sglang-allow-auto-truncate``, where SGLang
shortens the responses instead); one that leaves less than :data:`PROMPT_ROOM` tokens a warning with slime's fix,
unless it is given: ``--rollout-max-prompt-len`` (``--eval-max-prompt-len`` for evaluation), which drops prompts of
more tokens when the data is loaded (``slime/rollout/data_source.py:75``, ``slime/utils/data.py:87-137``,
``slime/rollout/sglang_rollout.py:532``). ``--context-length`` is read as SGLang reads it (``human_readable_int``:
``131072``, ``128k``, ``128Ki``; ``python/sglang/srt/utils/common.py:2816-2851``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Mapping, Sequence

from ..errors import ConfigError
from ..formatting import brief

CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")
"""The ``config.json`` keys SGLang reads the context length from, in its order of preference."""
DEFAULT_CONTEXT_LENGTH = 2048
"""SGLang's context length for a ``config.json`` without any of :data:`CONTEXT_LENGTH_KEYS`."""
PROMPT_ROOM = 2048
"""Fewer tokens than this left for the prompt gets a warning: a math prompt in a chat template can take ~1k."""
OVERRIDE_FLAG = "--sglang-context-length"
AUTO_TRUNCATE_FLAG = "--sglang-allow-auto-truncate"
LONGER_CONTEXT_ENV = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
_TRUE = ("true", "1", "yes", "y")
"""What SGLang's ``EnvBool`` reads as true (``python/sglang/srt/environ.py:114-121``)."""


@dataclass(frozen=True)
class RequestedLength:
    """A response length slime asks SGLang for: ``where`` it is set, the requests it is for (``rollout`` or
    ``evaluation``) and slime's flag that drops longer prompts for them."""

    where: str
    length: int
    requests: str
    prompt_flag: str


def flag_text(extra: Sequence[str], flag: str) -> str | None:
    """The word after ``flag`` (or in ``flag=...``) among train.py's extra arguments, the last as argparse keeps;
    None when absent."""
    found = None
    for i, word in enumerate(extra):
        if word == flag and i + 1 < len(extra):
            found = extra[i + 1]
        elif word.startswith(flag + "="):
            found = word.split("=", 1)[1]
    return found


def flag_value_in(extra: Sequence[str], flag: str) -> int | None:
    """The integer given with ``flag`` among train.py's extra arguments (:func:`flag_text`); None when absent;
    :class:`ValueError` when it is not an integer."""
    found = flag_text(extra, flag)
    if found is None:
        return None
    if not (found.isascii() and found.isdigit()):
        raise ValueError(f"{flag} {found!r} after -- is not an integer")
    return int(found)


def _positive(key: str, value: Any) -> float:
    """``value`` as a finite positive float; :class:`ConfigError` naming ``key`` otherwise."""
    try:
        number = float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an integer beyond any float
        number = math.inf
    if not (math.isfinite(number) and number > 0):
        raise ConfigError(f"config.json has {key} = {brief(value)}; expected a positive number (SGLang derives its "
                          "context length from it)")
    return number


def sglang_context_length(config: Mapping[str, Any]) -> int:
    """The context length SGLang derives from a parsed ``config.json`` (the rule in the module docstring; transformers
    reads a ``rope_scaling.type`` as its ``rope_type``); :class:`ConfigError` naming a key SGLang could not use."""
    factor = 1.0
    rope = config.get("rope_scaling")
    if isinstance(rope, Mapping) and rope and "original_max_position_embeddings" not in rope and \
            rope.get("rope_type", rope.get("type")) != "llama3":
        factor = _positive("rope_scaling.factor", rope.get("factor", 1))
    for key in CONTEXT_LENGTH_KEYS:
        value = config.get(key)
        if value is not None:
            return int(_positive(f"{key} x rope_scaling.factor", _positive(key, value) * factor))
    return DEFAULT_CONTEXT_LENGTH


def human_readable_int(text: str) -> int:
    """An integer as SGLang's ``human_readable_int`` reads it: plain (``65_536`` too), SI (``128k``, ``25.6k``) or IEC
    (``128Ki``); :class:`ValueError` otherwise."""
    text = text.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text, flags=re.ASCII)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise ValueError(f"{text!r}: decimals are not allowed with IEC suffixes")
            return int(number) * 2 ** (10 * ("KMGT".index(suffix[0]) + 1))
        return int(Decimal(number) * 10 ** (3 * ("kMGT".index(suffix) + 1)))
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not an integer SGLang reads (plain, or with k, M, Ki, Mi, ...)") from None


def context_override(extra: Sequence[str]) -> int | None:
    """The value of ``--sglang-context-length`` among the arguments after ``--`` (the last, as argparse keeps); None
    when absent; :class:`ValueError` naming the flag when SGLang could not read it."""
    found = flag_text(extra, OVERRIDE_FLAG)
    if found is None:
        return None
    try:
        value = human_readable_int(found)
    except (ValueError, InvalidOperation) as exc:
        raise ValueError(f"{OVERRIDE_FLAG} after --: {exc}") from None
    if value < 1:
        raise ValueError(f"{OVERRIDE_FLAG} after --: {found!r} is not a positive length")
    return value


def response_length_problems(lengths: Sequence[RequestedLength], context: int, source: str,
                             extra: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(errors, warnings) for the response lengths a run requests in an engine of ``context`` tokens; ``source`` says
    where the context length comes from; ``extra``: train.py's arguments after ``--``. A prompt of at most
    ``context - length`` tokens is served."""
    errors, warnings = [], []
    truncate = AUTO_TRUNCATE_FLAG in extra
    for asked in lengths:
        room = context - asked.length
        if room <= 0:
            what = (f"{asked.where} = {asked.length} is not below the rollout engine's context length {context} "
                    f"({source})")
            if truncate:
                warnings.append(f"{what}: with {AUTO_TRUNCATE_FLAG} SGLang shortens every {asked.requests} request's "
                                "max_new_tokens to fit, so the responses stop short of it")
                continue
            lower = f"below {context}" + (f", at most {context - PROMPT_ROOM} to leave room for prompts"
                                          if context > PROMPT_ROOM else "")
            errors.append(f"{what}: SGLang refuses every request whose prompt + max_new_tokens exceeds it, so no "
                          f"prompt fits; lower it {lower}, or serve a longer context ({OVERRIDE_FLAG} N after --, "
                          "where the model supports N)")
        elif room < PROMPT_ROOM and not truncate:
            limit = flag_value_in(extra, asked.prompt_flag)
            if limit is not None and limit <= room:
                continue
            warnings.append(f"{asked.where} = {asked.length} leaves {room} tokens of the engine's context length "
                            f"{context} ({source}) for the prompt: SGLang refuses a longer prompt and the "
                            f"{asked.requests} fails; drop such prompts with {asked.prompt_flag} {room} after --, or "
                            f"lower {asked.where.split(' (')[0]}")
    return errors, warnings


def override_problems(override: int, derived: int, source: str, pass_env: Sequence[str],
                      environ: Mapping[str, str]) -> list[str]:
    """An error when ``--sglang-context-length`` exceeds what SGLang derives from the checkpoint and the engines will
    not have ``SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN`` set true (SGLang refuses to start then)."""
    if override <= derived or (LONGER_CONTEXT_ENV in pass_env and environ.get(LONGER_CONTEXT_ENV, "").lower() in _TRUE):
        return []
    return [f"{OVERRIDE_FLAG} {override} is above the context length {derived} of the model ({source}): SGLang "
            f"refuses to start unless {LONGER_CONTEXT_ENV}=1 reaches the engines (set it and name it in PASS_ENV), "
            "and serves it only where the model's positions reach that far"]
