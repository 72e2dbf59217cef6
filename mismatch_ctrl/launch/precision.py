"""What each ``TRAIN_PRECISION`` needs from the engines, read in their source, refused before anything runs.

``TRAIN_PRECISION=fp16`` is FP16 precision alignment (Qi et al. 2025, arXiv 2510.26788): the trainer and the rollout
engines both compute in float16, the engines on the BF16 checkpoint. The launcher passes ``--fp16`` and
``--hf-checkpoint MODEL_DIR``; slime does the rest (slime 624b824a):

- ``slime/backends/megatron_utils/arguments.py:157``: ``args.bf16 = not args.fp16`` (``--fp16`` is the only switch;
  a ``--bf16`` of the user's has no effect; Megatron asserts the two exclusive,
  ``megatron/training/arguments.py:701-711``);
- ``slime/backends/sglang_utils/sglang_engine.py:571-572``: with ``args.fp16`` the SGLang engines get ``dtype =
  "float16"``; the loop right after (``:577-581``) copies a ``--sglang-<field>`` only where the field is not set yet,
  so a ``--sglang-dtype`` is ignored then; without ``--fp16`` it sets the engines' dtype (SGLang's ``auto`` reads the
  checkpoint's, bfloat16 for Qwen3; SGLang casts bfloat16 to float16 with a warning,
  ``python/sglang/srt/configs/model_config.py::_get_and_verify_dtype``);
- ``sglang_engine.py:528``: SGLang loads ``--hf-checkpoint`` (``model_path``) and takes its quantisation from its
  ``config.json``; the actor re-quantises every weight sync to the ``quantization_config`` of that checkpoint
  (``slime/backends/megatron_utils/actor.py:181``). An FP8 checkpoint would give FP8 rollouts, not FP16 ones.

Megatron-LM 1dcf0daf with ``--fp16``: parameters in float16 (``arguments.py:701-703``), a dynamic loss scaler unless
``--loss-scale`` fixes one (``megatron/core/optimizer/__init__.py:419-444``, defaults ``arguments.py:2213-2224``:
initial 2^32, hysteresis 2, window 1000), and the NaN check of loss and gradients turned off so that an overflow
reaches the scaler (``arguments.py:704-708``). slime skips a step whose gradients overflow only on that path
(``slime/backends/megatron_utils/model.py:661-664``); with the check on, it asserts every step succeeds (``:685``).

Each rule is one function of the settings and the words after ``--``; a line per violation, naming the setting and
the fix.
"""

from __future__ import annotations

from typing import Sequence

from ..architecture import read_hf_config
from ..errors import ConfigError
from .context_length import flag_text
from .preflight import user_flags
from .settings import Settings

DYNAMIC_SCALING_FLAGS = ("--initial-loss-scale", "--min-loss-scale", "--loss-scale-window", "--hysteresis")
"""Megatron's dynamic loss-scaling settings (``arguments.py:2217-2224``): read only with ``--fp16``."""
LOW_PRECISION_TRAINING_FLAGS = ("--fp8-format", "--fp8-recipe", "--fp8-param-gather", "--fp4-format")
"""Transformer Engine FP8 / FP4 GEMMs in training (TRAIN_PRECISION=fp8 sets the FP8 ones)."""
FP16_KV_CACHE = ("auto", "float16", "fp16", "half")
"""``--sglang-kv-cache-dtype`` values that keep the KV cache in the model's float16."""


def precision_problems(s: Settings, extra: Sequence[str]) -> list[str]:
    """Every rule of the module docstring for ``s['TRAIN_PRECISION']`` and the user's words after ``--``."""
    fp16 = s["TRAIN_PRECISION"] == "fp16"
    flags = set(user_flags(extra))
    out = served_checkpoint_problems(s) if fp16 else []
    for flag in sorted(flags & {"--fp16", "--bf16"}):
        if flag == "--bf16" or not fp16:  # --fp16 with fp16 is the launcher's own flag: the duplicate check names it
            out.append(f"{flag} after -- picks the training precision behind TRAIN_PRECISION={s['TRAIN_PRECISION']}'s "
                       "back (slime sets bf16 = not fp16, slime/backends/megatron_utils/arguments.py:157): set "
                       "TRAIN_PRECISION=fp16 or bf16 instead")
    if "--sglang-dtype" in flags:
        out.append("--sglang-dtype after -- sets the rollout engines' dtype apart from the trainer's: "
                   + ("with --fp16 slime sets dtype float16 itself and ignores --sglang-dtype "
                      "(slime/backends/sglang_utils/sglang_engine.py:571-581)" if fp16 else
                      "a float16 engine against a BF16/FP8 trainer is neither the FP8 recipe nor FP16 alignment")
                   + "; TRAIN_PRECISION sets both (fp16: float16 everywhere)")
    if fp16:
        out += _fp16_flag_problems(flags, extra)
    else:
        out += [f"{flag} after -- is a dynamic loss-scaling setting, which Megatron reads only with --fp16 "
                "(megatron/core/optimizer/__init__.py:419-444): with TRAIN_PRECISION="
                f"{s['TRAIN_PRECISION']} it would be ignored; set TRAIN_PRECISION=fp16 or drop it"
                for flag in DYNAMIC_SCALING_FLAGS if flag in flags]
        if "--fp16-lm-cross-entropy" in flags:
            out.append("--fp16-lm-cross-entropy after -- needs --fp16 (Megatron asserts it, megatron/training/"
                       "arguments.py:845-846): set TRAIN_PRECISION=fp16 or drop it")
    return out


def served_checkpoint_problems(s: Settings) -> list[str]:
    """FP16 alignment serves the BF16 checkpoint: a ``MODEL_DIR`` whose ``config.json`` declares a quantisation (an
    FP8 checkpoint) is refused; one that does not exist yet is left to the path checks."""
    try:
        path, config = read_hf_config(s["MODEL_DIR"])
    except ConfigError:
        return []
    quant = config.get("quantization_config")
    if quant is None:
        return []
    method = quant.get("quant_method") if isinstance(quant, dict) else quant
    return [f"TRAIN_PRECISION=fp16 serves MODEL_DIR={s['MODEL_DIR']} in float16, but {path} declares a "
            f"quantization_config (quant_method {method!r}): SGLang would load quantised weights and slime would "
            "re-quantise every weight sync to them (slime/backends/sglang_utils/sglang_engine.py:528, "
            "slime/backends/megatron_utils/actor.py:181), so the rollouts would not be FP16. Point MODEL_DIR at the "
            "BF16 Hugging Face checkpoint (FP16 alignment needs no FP8 conversion)"]


def _fp16_flag_problems(flags: set[str], extra: Sequence[str]) -> list[str]:
    out = []
    if "--sglang-quantization" in flags:
        out.append("--sglang-quantization after -- quantises the rollout engines: TRAIN_PRECISION=fp16 aligns float16 "
                   "rollouts with float16 training; drop it (FP8 rollouts: TRAIN_PRECISION=bf16)")
    kv_cache = flag_text(extra, "--sglang-kv-cache-dtype")
    if kv_cache is not None and kv_cache.lower() not in FP16_KV_CACHE:
        out.append(f"--sglang-kv-cache-dtype {kv_cache} after -- stores the engines' KV cache below float16: "
                   "TRAIN_PRECISION=fp16 keeps it in float16 (auto); drop it")
    out += [f"{flag} after -- runs Transformer Engine's low-precision GEMMs in training, not FP16: drop it (FP8 "
            "training: TRAIN_PRECISION=fp8)" for flag in LOW_PRECISION_TRAINING_FLAGS if flag in flags]
    if "--loss-scale" in flags:
        out.append("--loss-scale after -- fixes Megatron's loss scale: Megatron then keeps its NaN check on "
                   "(megatron/training/arguments.py:704-708) and slime 624b824a asserts that every step succeeds "
                   "(slime/backends/megatron_utils/model.py:661, :685), so the first float16 overflow stops the run; "
                   "leave dynamic scaling on (--initial-loss-scale, --hysteresis, ... tune it)")
    if "--use-torch-fsdp2" in flags:
        out.append("--use-torch-fsdp2 after -- is not supported with --fp16 (Megatron asserts it, megatron/training/"
                   "arguments.py:620-621): drop it")
    return out
