"""A model's numbers, from the two places a launch finds them: the Hugging Face ``config.json`` SGLang loads
(:class:`ModelShape`) and the Megatron model arguments slime trains with (:class:`MegatronModel`).

slime compares the two at start-up (``slime/backends/megatron_utils/arguments.py::_hf_validate_args``, 624b824a:
hidden size, heads, layers, FFN widths, tied embeddings); :func:`shape_mismatches` does the same before any GPU is
touched, plus the expert count, KV heads and vocabulary. Dense or MoE is :mod:`mismatch_ctrl.architecture`'s rule.
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from .. import regular_files
from ..architecture import architecture_of, expert_count, read_hf_config
from ..errors import ConfigError
from ..formatting import brief, clip
from .context_length import DEFAULT_CONTEXT_LENGTH, sglang_context_length


@dataclass(frozen=True)
class ModelShape:
    """The numbers the layout rules and the memory estimate need, named as in a Qwen3 ``config.json``.

    ``dense_layers`` counts the layers with a dense MLP (all of them for a dense model; for Qwen3-MoE the layers in
    ``mlp_only_layers`` or off the ``decoder_sparse_step`` grid). ``shared_expert_intermediate_size`` is the width of
    the shared expert every MoE layer adds (Qwen3.5-MoE; 0 without). A multimodal checkpoint's numbers are those of
    its ``text_config`` (as slime's ``_hf_validate_args`` and SGLang read them). ``weight_block_size`` is
    ``quantization_config.weight_block_size`` (``None`` for an unquantised checkpoint). ``context_length`` is the one
    SGLang derives from the file (:func:`~.context_length.sglang_context_length`).
    """

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    dense_layers: int
    num_experts: int = 0
    moe_intermediate_size: int = 0
    num_experts_per_tok: int = 0
    shared_expert_intermediate_size: int = 0
    tie_word_embeddings: bool = False
    weight_block_size: tuple[int, int] | None = None
    context_length: int = DEFAULT_CONTEXT_LENGTH

    @property
    def is_moe(self) -> bool:
        return architecture_of(self.num_experts) == "moe"

    @property
    def moe_layers(self) -> int:
        return self.num_hidden_layers - self.dense_layers

    @classmethod
    def from_hf_config(cls, config: Mapping[str, Any], source: str) -> ModelShape:
        """Read a parsed ``config.json``; :class:`ConfigError` naming ``source`` and the key if one is missing."""
        text = config.get("text_config")
        quant = config.get("quantization_config")
        if isinstance(text, Mapping) and "num_hidden_layers" not in config:
            config = text  # a multimodal checkpoint: the language model's numbers (its quantization stays outside)

        def integer(key: str, default: int | None = None, minimum: int = 1) -> int:
            value = config.get(key, default)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ConfigError(f"{source} has {key} = {brief(value)}; expected an integer >= {minimum} (is it the "
                                  f"model's config.json?)")
            return value

        heads = integer("num_attention_heads")
        hidden = integer("hidden_size")
        layers = integer("num_hidden_layers")
        experts = expert_count(config)
        dense = layers
        if experts:
            step = integer("decoder_sparse_step", 1)
            only = config.get("mlp_only_layers") or []
            if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
                raise ConfigError(f"{source} has mlp_only_layers = {brief(only)}; expected a list of layer indices")
            dense = sum(1 for i in range(layers) if i in only or (i + 1) % step != 0)
        block = quant.get("weight_block_size") if isinstance(quant, dict) else None
        if block is not None and not (isinstance(block, list) and len(block) == 2 and
                                      all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
            raise ConfigError(f"{source} has quantization_config.weight_block_size = {brief(block)}; expected [n, k]")
        return cls(
            hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
            num_key_value_heads=integer("num_key_value_heads", heads),
            head_dim=integer("head_dim", hidden // heads),
            intermediate_size=integer("intermediate_size", None if dense else 0, 0 if not dense else 1),
            vocab_size=integer("vocab_size"), dense_layers=dense, num_experts=experts,
            moe_intermediate_size=integer("moe_intermediate_size") if experts else 0,
            num_experts_per_tok=integer("num_experts_per_tok") if experts else 0,
            shared_expert_intermediate_size=integer("shared_expert_intermediate_size", 0, 0) if experts else 0,
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            weight_block_size=tuple(block) if block else None,
            context_length=sglang_context_length(config),
        )


@dataclass(frozen=True)
class MegatronModel:
    """The Megatron model arguments (``MODEL_ARGS`` of ``recipes/<model>/model.sh``), read as slime passes them."""

    args: tuple[str, ...]

    def value(self, flag: str) -> str | None:
        """The word after ``flag`` (its last occurrence, as argparse keeps), else ``None``."""
        found = None
        for i, word in enumerate(self.args[:-1]):
            if word == flag:
                found = self.args[i + 1]
        return found

    def integer(self, flag: str, default: int = 0) -> int:
        text = self.value(flag)
        if text is None:
            return default
        if not text.isdigit():
            raise ConfigError(f"MODEL_ARGS_FILE gives {flag} {brief(text)}, not a non-negative integer")
        return int(text)

    @property
    def num_layers(self) -> int:
        return self.integer("--num-layers")

    @property
    def num_attention_heads(self) -> int:
        return self.integer("--num-attention-heads")

    @property
    def num_query_groups(self) -> int:
        """``--num-query-groups``; Megatron uses the head count without it (``TransformerConfig.__post_init__``)."""
        return self.integer("--num-query-groups", self.num_attention_heads)

    @property
    def num_experts(self) -> int:
        return self.integer("--num-experts")

    @property
    def is_moe(self) -> bool:
        """The package's one rule (:func:`mismatch_ctrl.architecture.architecture_of`) on ``--num-experts``."""
        return architecture_of(self.num_experts) == "moe"

    @property
    def moe_layers(self) -> int:
        """How many layers are MoE: ``--moe-layer-freq`` as Megatron reads it (an integer N: every N-th layer from
        layer 0; a pattern such as ``[1]*48`` or ``([0]*3+[1]*45)``: 1 marks a MoE layer; absent: every layer), 0
        for a dense model."""
        if not self.is_moe:
            return 0
        text, layers = self.value("--moe-layer-freq"), self.num_layers
        if text is None or text.strip().isdigit():
            every = int(text or 1)
            if every < 1:
                raise ConfigError(f"MODEL_ARGS_FILE gives --moe-layer-freq {brief(text)}; expected an integer >= 1 "
                                  "or a pattern such as [1]*48")
            return sum(1 for i in range(layers) if i % every == 0)
        pattern = _layer_pattern(text)
        if pattern is None or len(pattern) != layers:
            raise ConfigError(f"MODEL_ARGS_FILE gives --moe-layer-freq {brief(text)}; expected an integer or a list "
                              f"of {layers} zeros and ones (--num-layers), e.g. [1]*{layers}")
        return sum(pattern)

    def validate(self) -> None:
        """Every number the checks read is an integer, the MoE layer pattern readable: :class:`ConfigError`
        otherwise."""
        for flag in ("--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
                     "--num-query-groups", "--num-experts", "--moe-ffn-hidden-size", "--vocab-size",
                     "--moe-shared-expert-intermediate-size"):
            self.integer(flag)
        self.moe_layers  # raises ConfigError for an unreadable --moe-layer-freq


def _layer_pattern(text: str) -> list[int] | None:
    """A ``--moe-layer-freq`` pattern (list literals of 0 and 1, ``*`` by an integer, ``+``) without evaluating
    code; None when it is something else."""
    try:
        tree = ast.parse(text.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None

    def value(node: ast.AST) -> list[int] | int | None:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.List):
            items = [value(item) for item in node.elts]
            return items if all(item in (0, 1) for item in items) else None  # type: ignore[return-value]
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
                return left + right
            if isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, list):
                left, right = right, left
            if isinstance(node.op, ast.Mult) and isinstance(left, list) and isinstance(right, int) and \
                    0 <= right <= 100_000 and len(left) * right <= 100_000:
                return left * right
        return None

    try:
        found = value(tree)
    except RecursionError:
        return None
    return found if isinstance(found, list) else None


def read_model_args(path: str | Path) -> MegatronModel:
    """``MODEL_ARGS`` of a bash file, read by bash itself (the file may use any bash syntax)."""
    path = Path(path)
    what = regular_files.what_is(path)
    if what is not None:  # bash would wait on a FIFO's writer, or read a device forever
        raise ConfigError(f"MODEL_ARGS_FILE={path} " + ("does not exist" if what == "missing" else
                                                        f"is {what}, not a regular file") +
                          " (expected recipes/<model>/model.sh, a bash file defining MODEL_ARGS)")
    script = 'source "$1" >&2 && ((${#MODEL_ARGS[@]})) && printf "%s\\0" "${MODEL_ARGS[@]}"'
    done = subprocess.run(["bash", "-c", script, "model_args", str(path)], capture_output=True)
    words = done.stdout.decode(errors="replace").split("\0")[:-1]
    if done.returncode != 0 or not words:
        said = done.stderr.decode(errors="replace").strip().splitlines()  # bash's errors and the file's own output
        errors = [line for line in said if re.search(r": line \d+: ", line)]
        raise ConfigError(f"MODEL_ARGS_FILE={path} does not define a MODEL_ARGS array" +
                          (f" (bash: {clip(errors[-1], 200)})" if errors else
                           f" (its last output: {clip(said[-1], 200)})" if said else ""))
    model = MegatronModel(tuple(words))
    model.validate()
    return model


# (config.json key, Megatron flag) pairs that must agree; intermediate_size only when some layer is dense.
_COMPARED = (("num_hidden_layers", "--num-layers"), ("hidden_size", "--hidden-size"),
             ("num_attention_heads", "--num-attention-heads"), ("num_key_value_heads", "--num-query-groups"),
             ("num_experts", "--num-experts"), ("moe_intermediate_size", "--moe-ffn-hidden-size"),
             ("intermediate_size", "--ffn-hidden-size"), ("vocab_size", "--vocab-size"),
             ("shared_expert_intermediate_size", "--moe-shared-expert-intermediate-size"))


def shape_mismatches(shape: ModelShape, megatron: MegatronModel) -> list[str]:
    """``"<key> <hf value>, MODEL_ARGS_FILE says <value> (<flag>)"`` for every number that differs."""
    megatron_values = {
        "--num-layers": megatron.num_layers, "--hidden-size": megatron.integer("--hidden-size"),
        "--num-attention-heads": megatron.num_attention_heads, "--num-query-groups": megatron.num_query_groups,
        "--num-experts": megatron.num_experts, "--moe-ffn-hidden-size": megatron.integer("--moe-ffn-hidden-size"),
        "--ffn-hidden-size": megatron.integer("--ffn-hidden-size"), "--vocab-size": megatron.integer("--vocab-size"),
        "--moe-shared-expert-intermediate-size": megatron.integer("--moe-shared-expert-intermediate-size"),
    }
    out = []
    for key, flag in _COMPARED:
        if key == "intermediate_size" and shape.dense_layers == 0:
            continue
        if megatron.value(flag) is None and flag not in ("--num-experts", "--num-query-groups",
                                                         "--moe-shared-expert-intermediate-size"):
            continue
        if getattr(shape, key) != megatron_values[flag]:
            out.append(f"{key} {getattr(shape, key)}, MODEL_ARGS_FILE says {megatron_values[flag]} ({flag})")
    if shape.is_moe and megatron.is_moe and shape.num_hidden_layers == megatron.num_layers and \
            shape.moe_layers != megatron.moe_layers:
        out.append(f"{shape.moe_layers} MoE layers of {shape.num_hidden_layers} (mlp_only_layers, "
                   f"decoder_sparse_step), MODEL_ARGS_FILE says {megatron.moe_layers} (--moe-layer-freq "
                   f"{megatron.value('--moe-layer-freq') or 1})")
    untie = "--untie-embeddings-and-output-weights" in megatron.args
    if shape.tie_word_embeddings == untie:
        out.append(f"tie_word_embeddings {str(shape.tie_word_embeddings).lower()}, MODEL_ARGS_FILE "
                   f"{'has' if untie else 'lacks'} --untie-embeddings-and-output-weights")
    return out


@dataclass(frozen=True)
class CheckpointReport:
    """What a checkpoint's ``config.json`` says: its problems (one line each), if readable its shape, and the numbers
    in which it differs from Megatron's model arguments (``mismatches``, one line each, naming the variable)."""

    problems: list[str]
    shape: ModelShape | None = None
    mismatches: list[str] = field(default_factory=list)

    @property
    def all_problems(self) -> list[str]:
        return self.problems + self.mismatches


def inspect_checkpoint(directory: str | Path, kind: str, variable: str, megatron: MegatronModel) -> CheckpointReport:
    """Read ``directory/config.json`` of an ``fp8`` (block-quantised, for SGLang) or ``bf16`` checkpoint.

    Problems: unreadable, not a JSON object, missing numbers, the wrong quantisation (fp8: ``quant_method fp8`` and
    ``weight_block_size [128, 128]``, what ``tools/convert_hf_to_fp8.py --strategy block --block-size 128 128`` and
    the Qwen ``-FP8`` releases write; bf16: none), numbers that differ from Megatron's model arguments.
    """
    path = Path(directory) / "config.json"
    try:
        config_path, config = read_hf_config(directory)
    except ConfigError as exc:
        message = f"{path} does not exist" if not path.exists() else str(exc)
        return CheckpointReport([f"{variable}: {message}"])
    problems = []
    quant = config.get("quantization_config")
    if kind == "fp8":
        if not isinstance(quant, dict):
            problems.append(f"{variable}: {config_path} has no quantization_config; SGLang needs an FP8 checkpoint "
                            "with quant_method fp8 and weight_block_size [128, 128] (run --prepare, or use the "
                            "Qwen/*-FP8 release)")
        elif quant.get("quant_method") != "fp8" or list(quant.get("weight_block_size") or []) != [128, 128]:
            problems.append(f"{variable}: {config_path} quantization_config has quant_method "
                            f"{brief(quant.get('quant_method'))} and weight_block_size "
                            f"{brief(quant.get('weight_block_size'))}; "
                            "expected fp8 and [128, 128] (block e4m3, which slime re-quantizes to at every sync)")
    elif quant is not None:
        problems.append(f"{variable}: {config_path} has a quantization_config; it must be the BF16 model")
    try:
        shape = ModelShape.from_hf_config(config, str(config_path))
    except ConfigError as exc:
        return CheckpointReport([*problems, f"{variable}: {exc}"])
    mismatches = [f"{variable}: {config_path} has {line}" for line in shape_mismatches(shape, megatron)]
    return CheckpointReport(problems, shape, mismatches)

