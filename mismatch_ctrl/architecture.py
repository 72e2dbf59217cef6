"""Is the model dense or a mixture of experts: the one rule the config loader and the launcher share.

Torch-free (json and the standard library only), so ``python -m mismatch_ctrl.launch --dry-run`` works on a laptop
with a plain ``python3`` + PyYAML. The rule: MoE iff the expert count is > 0, where the count is Megatron's
``--num-experts`` or the first integer among :data:`EXPERT_COUNT_KEYS` in a Hugging Face ``config.json``.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any, Literal, Mapping

from . import regular_files
from .errors import ConfigError
from .formatting import brief, clip

Architecture = Literal["dense", "moe"]
ARCHITECTURES: tuple[str, ...] = ("dense", "moe")
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
"""``config.json`` keys that give the number of routed experts (Qwen3-MoE, Mixtral, DeepSeek, others)."""
MAX_HF_CONFIG_BYTES = 16 << 20
"""A model's ``config.json`` is a few KB (a vision model's, tens); a larger file is not one."""


def read_hf_config(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """``(file, contents)`` of a Hugging Face ``config.json`` given as the file or its model directory.

    Raises :class:`ConfigError` naming the file when it cannot be read (no regular file, larger than
    :data:`MAX_HF_CONFIG_BYTES`, not UTF-8: ``regular_files``), is not JSON or is not a JSON object.
    """
    path = Path(path)
    path = path / "config.json" if path.is_dir() and path.suffix != ".json" else path  # a directory named *.json
    try:                                                                                # is refused by name below
        data = regular_files.read_json(path, MAX_HF_CONFIG_BYTES)
    except RecursionError:
        raise ConfigError(f"the Hugging Face config {path} is nested too deeply to be a model's config.json; give the "
                          "model directory (slime's --hf-checkpoint) or its config.json") from None
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the Hugging Face config {path} ({clip(reason, 200)}); give the model "
                          "directory (slime's --hf-checkpoint) or its config.json, or set mismatch_ctrl.architecture"
                          ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"the Hugging Face config {path} is a JSON {type(data).__name__}, not an object of "
                          f"settings; point at the model's config.json")
    return path, data


def expert_count(hf_config: Mapping[str, Any]) -> int:
    """Routed experts of a parsed ``config.json``: the first of :data:`EXPERT_COUNT_KEYS` that is set (not null), at
    the top level or else in ``text_config`` (multimodal MoE models: Qwen3-VL-MoE, Llama 4); 0 if none is.
    :class:`ConfigError` if that value is not an integer >= 0."""
    for section, prefix in ((hf_config, ""), (hf_config.get("text_config"), "text_config.")):
        if not isinstance(section, Mapping):
            continue
        for key in EXPERT_COUNT_KEYS:
            value = section.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"config.json {prefix}{key}: expected the number of experts (an integer >= 0), got "
                                  f"{brief(value)}; fix the file or set mismatch_ctrl.architecture")
            return value
    return 0


def architecture_of(num_experts: int) -> Architecture:
    """``moe`` when ``num_experts > 0``, else ``dense``."""
    return "moe" if int(num_experts) > 0 else "dense"


def resolve_architecture(*, architecture: str | None = None, num_experts: int | None = None,
                         hf_config: str | Path | None = None) -> Architecture | None:
    """``dense`` / ``moe`` from an explicit name, an expert count (> 0 is MoE) or a Hugging Face ``config.json``
    (file or model directory), in that order of precedence; ``None`` when none is given."""
    if architecture is not None:
        if architecture not in ARCHITECTURES:
            raise ConfigError(f"architecture: expected one of {', '.join(map(repr, ARCHITECTURES))}, "
                              f"got {architecture!r}")
        return architecture  # type: ignore[return-value]
    if num_experts is not None:
        if isinstance(num_experts, bool) or not isinstance(num_experts, numbers.Integral) or num_experts < 0:
            raise ConfigError(f"--num-experts: expected the number of experts (an integer >= 0; slime's args), got "
                              f"{brief(num_experts)}; or set mismatch_ctrl.architecture")
        return architecture_of(num_experts)
    if hf_config is not None:
        return architecture_of(expert_count(read_hf_config(hf_config)[1]))
    return None
