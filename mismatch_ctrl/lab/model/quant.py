"""Simulated low-precision inference: FP8 (e4m3 / e5m2) block-scaled weights (``fp8.py``), per-token activations,
BF16 and FP16.

Activations (SGLang's dynamic ``per_token_group_quant_fp8``): the input of each quantised linear layer gets one
scale per token and group of 128 features (= per token row when the width is <= 128).

``bf16`` rounds weights, linear inputs and outputs and the embedding
tables to bfloat16 (a mild, BF16-engine-like mismatch); ``fp16`` does the same in IEEE float16 (10 mantissa bits
against bfloat16's 7, largest finite value 65504): every value a linear layer, an expert or the LM head produces is
stored in the format, computed from format inputs with an fp32 accumulation (what a tensor-core GEMM does), norms,
softmax and the residual sum staying fp32 as in ``bf16``. A value past 65504 becomes infinite there, as in a real
float16 kernel: the engine counts those overflows (``RolloutEngine.overflow``), it does not clamp them.
The trainer's precision (``+train-bf16`` / ``+train-fp16``, ``precision.py``) is part of a dose: the mismatch is made
by the pair, the engine and the trainer that recomputes its samples.

Mixture-of-experts layers: every expert's two matrices are quantised like the other linears (one block-scaled
matrix per expert, activations per token and expert); by default the router ``gate`` is not quantised, as FP8
checkpoints of Qwen3-MoE keep ``mlp.gate`` out of the FP8 conversion. Routing flips therefore come from the
quantised hidden states the router reads, as on the real stack; ``router=True`` (mode suffix ``+router``) quantises
the router like the other linears, a configuration people run, which flips more experts.

Past FP8 (``fp4.py``): ``nvfp4`` and ``mxfp4`` (E2M1 values with 16- / 32-element block scales; weights, activations
and LM head) and ``int4`` (symmetric weights in groups of ``block`` = 128 per row, LM head included, activations
exact). Their blocks run along each weight row (the input dimension, as a GEMM reduces) and along each token's
features; an NVFP4 weight has one fp32 scale per matrix (per expert matrix in a MoE layer), an NVFP4 activation one
per token.

A continuous dose, ``engine_temperature`` x (modes ``tempX``, or a suffix ``+tempX``): the engine divides its logits
by x on top of the sampling temperature while the trainer does not - a real bug class (an engine that applies a
different temperature or logit scale than the trainer). The gap grows smoothly from 0 at x = 1: ``C_bar`` about
linearly in |x - 1|, ``k3_kl`` about quadratically.
"""

from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .fp4 import MXFP4_BLOCK, NVFP4_BLOCK, fake_quantize_int4, fake_quantize_mxfp4, fake_quantize_nvfp4
from .fp8 import BLOCK, FP8_FORMATS, dequantize_weight, fp8_format, quantize_weight, round_fp8
from .policy import Experts
from .precision import HALF_FORMATS, ROUTER_NAME, TRAIN_PRECISIONS, OverflowCounter, round_half

FP4_FORMATS = ("nvfp4", "mxfp4", "int4")
WEIGHT_ONLY_FORMATS = ("int4",)
FORMATS = ("none", *HALF_FORMATS, *FP8_FORMATS, *FP4_FORMATS)


def round_bf16(x: Tensor) -> Tensor:
    """Nearest bfloat16 value of x, returned in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def fake_quantize_weight(weight: Tensor, fmt: str, block: int = BLOCK) -> Tensor:
    """fp32 weight as the rollout engine sees it in format ``fmt`` (``none`` copies, ``bf16`` rounds; ``int4`` groups
    of ``block`` per row; ``nvfp4`` / ``mxfp4`` their own block sizes)."""
    weight = weight.detach().float()
    if fmt == "none":
        return weight.clone()
    if fmt in HALF_FORMATS:
        return round_half(weight, fmt)
    if fmt == "nvfp4":
        return fake_quantize_nvfp4(weight, NVFP4_BLOCK)
    if fmt == "mxfp4":
        return fake_quantize_mxfp4(weight, MXFP4_BLOCK)
    if fmt == "int4":
        return fake_quantize_int4(weight, block)
    return dequantize_weight(*quantize_weight(weight, fmt, block), block)


def quantize_activations(x: Tensor, fmt: str, group: int = BLOCK) -> Tensor:
    """Dynamic fake quantisation of activations [..., features]. FP8: one scale ``absmax / fmax`` per token and
    group of ``group`` features (per token row when features <= group). ``nvfp4`` / ``mxfp4``: their 16- / 32-element
    blocks along the features (NVFP4's fp32 scale per token)."""
    if fmt == "nvfp4":
        return fake_quantize_nvfp4(x, NVFP4_BLOCK, per_row=True)
    if fmt == "mxfp4":
        return fake_quantize_mxfp4(x, MXFP4_BLOCK)
    _, fmax = fp8_format(fmt)
    features = x.shape[-1]
    if features <= group:
        grouped = x.unsqueeze(-2)
    else:
        n_groups = -(-features // group)
        grouped = F.pad(x, (0, n_groups * group - features)).unflatten(-1, (n_groups, group))
    absmax = grouped.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(absmax > 0, absmax / fmax, torch.ones_like(absmax))
    rounded = round_fp8(grouped / scale, fmt) * scale
    return rounded.flatten(-2)[..., :features]


@dataclass(frozen=True)
class QuantConfig:
    """What the rollout engine quantises, and how.

    fmt: ``none`` (exact fp32 copy), ``bf16``, ``fp16``, ``e4m3``, ``e5m2``, ``nvfp4``, ``mxfp4`` or ``int4`` (weights
      only).
    activations: quantise the inputs of quantised linear layers per token (FP8, FP4) / round them (bf16, fp16).
    lm_head: quantise the LM head like the block linears (slime keeps it BF16; including it makes the tiny
      model's mismatch large-model-like).
    embeddings: quantise the token and position tables (FP8 per row / block, or bf16 rounding).
    block: FP8 weight tile size and INT4 group size (NVFP4 and MXFP4 blocks are fixed by their formats).
    router: quantise the MoE router ``gate`` too (mode suffix ``+router``).
    engine_temperature: the engine divides its logits by this on top of the sampling temperature (mode ``tempX`` or
      suffix ``+tempX``); 1 = as the trainer.
    train: the precision of the trainer that recomputes and trains on this engine's samples (suffix
      ``+train-bf16`` / ``+train-fp16``; ``fp32``, the lab's trainer, by default): ``precision.precision_model``.
    """

    fmt: str = "e4m3"
    activations: bool = True
    lm_head: bool = True
    embeddings: bool = False
    block: int = BLOCK
    router: bool = False
    engine_temperature: float = 1.0
    train: str = "fp32"

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"QuantConfig.fmt: expected one of {list(FORMATS)}, got {self.fmt!r}")
        if self.block < 1:
            raise ValueError(f"QuantConfig.block must be >= 1, got {self.block}")
        if self.activations and self.fmt in WEIGHT_ONLY_FORMATS:
            raise ValueError(f"QuantConfig: {self.fmt} quantises weights only; set activations=False")
        if self.train not in TRAIN_PRECISIONS:
            raise ValueError(f"QuantConfig.train: expected one of {list(TRAIN_PRECISIONS)}, got {self.train!r}")
        if not (math.isfinite(self.engine_temperature) and self.engine_temperature > 0):
            raise ValueError(f"QuantConfig.engine_temperature must be a finite number > 0, got "
                             f"{self.engine_temperature}")

    @classmethod
    def from_mode(cls, mode: str) -> QuantConfig:
        """Config of a mode name ``BASE[+router][+tempX][+train-P]`` (BASE a name of ``QUANT_MODES``; ``+router``
        not on ``none``; P a precision of ``TRAIN_PRECISIONS``) or ``tempX`` (exact weights; x a number > 0), e.g.
        ``nvfp4+router``, ``temp1.05``, ``e4m3+temp1.01``, ``fp16+train-fp16``."""
        base, *suffixes = mode.strip().split("+")
        config = _temperature_mode(base, mode)
        if config is None:
            if base not in QUANT_MODES:
                raise ValueError(f"quant mode: unknown {mode!r}; choose one of {', '.join(QUANT_MODES)} or tempX (an "
                                 "engine temperature x from 0.001 to 1000, e.g. temp1.05), optionally followed by "
                                 f"+router, +tempX and/or +{TRAIN_PREFIX}P (P one of {', '.join(TRAIN_PRECISIONS)})")
            config = QUANT_MODES[base]
        seen: set[str] = set()
        for suffix in suffixes:
            temperature = _temperature_mode(suffix, mode)
            kind = "train" if suffix.startswith(TRAIN_PREFIX) else "temp" if temperature is not None else suffix
            if kind in seen or kind not in ("router", "temp", "train"):
                raise ValueError(f"quant mode {mode!r}: suffix {suffix!r} is not +router, +tempX or "
                                 f"+{TRAIN_PREFIX}P, or repeats one")
            seen.add(kind)
            if kind == "router":
                if config.fmt == "none":
                    raise ValueError(f"quant mode {mode!r}: +router needs a quantised engine (an exact one has nothing "
                                     "to quantise); use e.g. e4m3+router")
                config = replace(config, router=True)
            elif kind == "temp":
                config = replace(config, engine_temperature=temperature.engine_temperature)
            else:
                precision = suffix[len(TRAIN_PREFIX):]
                if precision not in TRAIN_PRECISIONS:
                    raise ValueError(f"quant mode {mode!r}: {suffix!r} names no trainer precision; use "
                                     f"{', '.join(TRAIN_PREFIX + p for p in TRAIN_PRECISIONS)}")
                config = replace(config, train=precision)
        return config

    @property
    def mode(self) -> str:
        """Canonical mode name (``from_mode(config.mode) == config``), or a description of a custom config."""
        plain = replace(self, router=False, engine_temperature=1.0, train="fp32")
        base = next((name for name, config in QUANT_MODES.items() if config == plain), None)
        if base is None:
            fields = {k: v for k, v in asdict(self).items() if k != "train" or v != "fp32"}
            return "custom(" + ",".join(f"{k}={v}" for k, v in fields.items()) + ")"
        temperature = f"temp{self.engine_temperature!r}" if self.engine_temperature != 1.0 else ""
        parts = [temperature if base == "none" and temperature else base]
        parts += ["router"] if self.router else []
        parts += [temperature] if temperature and base != "none" else []
        parts += [TRAIN_PREFIX + self.train] if self.train != "fp32" else []
        return "+".join(parts)


TRAIN_PREFIX = "train-"
"""Mode suffix ``+train-P``: the trainer of the run computes in precision P (``precision.TRAIN_PRECISIONS``)."""
TEMPERATURE_PREFIX = "temp"
TEMPERATURE_RANGE = (1e-3, 1e3)
"""Engine temperatures ``tempX`` accepts: beyond them the engine samples one token or uniform noise, and the name
would print in exponent notation (``1e+300``), whose ``+`` reads as a suffix."""


def _temperature_mode(text: str, mode: str) -> QuantConfig | None:
    """``tempX`` as an exact engine at temperature x, None when ``text`` does not start with ``temp``."""
    if not text.startswith(TEMPERATURE_PREFIX):
        return None
    try:
        value = float(text[len(TEMPERATURE_PREFIX):])
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and TEMPERATURE_RANGE[0] <= value <= TEMPERATURE_RANGE[1]):
        raise ValueError(f"quant mode {mode!r}: {text!r} needs an engine temperature from {TEMPERATURE_RANGE[0]:g} "
                         f"to {TEMPERATURE_RANGE[1]:g}, e.g. temp1.05")
    return replace(QUANT_MODES["none"], engine_temperature=value)


QUANT_MODES: dict[str, QuantConfig] = {
    "none": QuantConfig(fmt="none", activations=False, lm_head=False),
    "bf16": QuantConfig(fmt="bf16", activations=True, lm_head=True, embeddings=True),
    "fp16": QuantConfig(fmt="fp16", activations=True, lm_head=True, embeddings=True),
    "e4m3-w": QuantConfig(fmt="e4m3", activations=False, lm_head=False),
    "e4m3": QuantConfig(fmt="e4m3", activations=True, lm_head=True),
    "e5m2-w": QuantConfig(fmt="e5m2", activations=False, lm_head=False),
    "e5m2": QuantConfig(fmt="e5m2", activations=True, lm_head=True),
    "nvfp4": QuantConfig(fmt="nvfp4", activations=True, lm_head=True),
    "mxfp4": QuantConfig(fmt="mxfp4", activations=True, lm_head=True),
    "int4": QuantConfig(fmt="int4", activations=False, lm_head=True),
}
"""``e4m3`` (default): block weights + per-token activations + LM head. ``*-w``: block weights of the transformer
linears only (slime's converter scope). ``e5m2``: as ``e4m3`` in the coarser format (a stress setting). ``nvfp4`` /
``mxfp4``: as ``e4m3`` in those FP4 formats. ``int4``: weights and LM head in INT4 groups of 128, activations exact
(W4A16). ``bf16`` / ``fp16``: weights, embeddings, linear inputs and outputs and the LM head in that format."""


def as_quant_config(quant: str | QuantConfig) -> QuantConfig:
    """A QuantConfig from a mode name or a config."""
    return quant if isinstance(quant, QuantConfig) else QuantConfig.from_mode(quant)


def _quantize_input(x: Tensor, config: QuantConfig, counter: OverflowCounter | None = None) -> Tensor:
    """A linear layer's input as the engine feeds it: FP8 per token (and group), or rounded to bf16 / fp16."""
    if config.activations and config.fmt in (*FP8_FORMATS, *FP4_FORMATS):
        return quantize_activations(x, config.fmt, config.block)
    if config.activations and config.fmt in HALF_FORMATS:
        return _half(x, config, counter)
    return x


def _round_output(y: Tensor, config: QuantConfig, counter: OverflowCounter | None = None) -> Tensor:
    return _half(y, config, counter) if config.fmt in HALF_FORMATS else y


def _half(x: Tensor, config: QuantConfig, counter: OverflowCounter | None) -> Tensor:
    rounded = round_half(x, config.fmt)
    if counter is not None:
        counter.add(x, rounded)
    return rounded


def _round_bias(bias: Tensor, config: QuantConfig) -> Tensor:
    return round_half(bias, config.fmt) if config.fmt in HALF_FORMATS else bias


class QuantLinear(nn.Module):
    """Stand-in for an ``nn.Linear`` computing with quantised weights (and optionally inputs); no gradients.
    ``counter``: where a float16 engine counts the values it rounded and those that overflowed."""

    def __init__(self, linear: nn.Linear, config: QuantConfig, counter: OverflowCounter | None = None) -> None:
        super().__init__()
        self.config, self.counter = config, counter
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.empty_like(linear.weight, dtype=torch.float32))
        self.register_buffer("bias", None if linear.bias is None else torch.empty_like(linear.bias))
        self.load_from(linear)

    @torch.no_grad()
    def load_from(self, linear: nn.Linear) -> None:
        """Re-quantise from the fp32 layer (a weight sync)."""
        self.weight.copy_(fake_quantize_weight(linear.weight, self.config.fmt, self.config.block))
        if self.bias is not None:
            self.bias.copy_(_round_bias(linear.bias.detach().float(), self.config))

    def forward(self, x: Tensor) -> Tensor:
        config, counter = self.config, self.counter
        return _round_output(F.linear(_quantize_input(x, config, counter), self.weight, self.bias), config, counter)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.config.mode}"


class QuantExperts(nn.Module):
    """Stand-in for ``policy.Experts``: each expert's fc1 / fc2 matrix block-quantised on its own, the input of each
    expert matrix quantised per token (fc2's per token and expert); biases and ``counter`` as ``QuantLinear``'s; no
    gradients."""

    def __init__(self, experts: Experts, config: QuantConfig, counter: OverflowCounter | None = None) -> None:
        super().__init__()
        self.config, self.counter = config, counter
        for name, param in experts.named_parameters(recurse=False):
            self.register_buffer(name, torch.empty_like(param, dtype=torch.float32))
        self.load_from(experts)

    @torch.no_grad()
    def load_from(self, experts: Experts) -> None:
        """Re-quantise from the fp32 experts (a weight sync)."""
        fmt, block = self.config.fmt, self.config.block
        for name in ("fc1_weight", "fc2_weight"):
            stacked = getattr(experts, name)
            getattr(self, name).copy_(torch.stack([fake_quantize_weight(w, fmt, block) for w in stacked]))
        for name in ("fc1_bias", "fc2_bias"):
            getattr(self, name).copy_(_round_bias(getattr(experts, name).detach().float(), self.config))

    def forward(self, x: Tensor, weights: Tensor) -> Tensor:
        config, counter = self.config, self.counter
        hidden = torch.einsum("...d,efd->...ef", _quantize_input(x, config, counter), self.fc1_weight) + self.fc1_bias
        hidden = F.gelu(_round_output(hidden, config, counter))
        out = torch.einsum("...ef,edf->...ed", _quantize_input(hidden, config, counter), self.fc2_weight) + \
            self.fc2_bias
        return torch.einsum("...e,...ed->...d", weights, _round_output(out, config, counter))

    def extra_repr(self) -> str:
        return f"experts={self.fc1_weight.shape[0]}, mode={self.config.mode}"


def _quantize_table(table: Tensor, config: QuantConfig) -> Tensor:
    if not config.embeddings or config.fmt == "none":
        return table.detach().float().clone()
    return fake_quantize_weight(table, config.fmt, config.block)


def quantize_model(model: nn.Module, quant: str | QuantConfig, head_name: str = "lm_head") -> nn.Module:
    """A frozen copy of ``model`` whose linear layers are ``QuantLinear`` and whose experts are ``QuantExperts`` per
    ``quant`` (the LM head, named ``head_name``, only if ``quant.lm_head``; MoE routers, named ``ROUTER_NAME``,
    only if ``quant.router``); keep it in step with ``sync_quantized``. A float16 engine's modules share one
    ``OverflowCounter``, the copy's ``overflow`` attribute (None for other formats)."""
    config = as_quant_config(quant)
    quantized = copy.deepcopy(model)
    counter = OverflowCounter() if config.fmt == "fp16" else None
    if config.fmt != "none":
        for name, module in list(quantized.named_modules()):
            child = name.rpartition(".")[2]
            if isinstance(module, Experts):
                replacement: nn.Module = QuantExperts(module, config, counter)
            elif (isinstance(module, nn.Linear) and (config.router or child != ROUTER_NAME)
                  and (config.lm_head or name != head_name)):
                replacement = QuantLinear(module, config, counter)
            else:
                continue
            parent_name = name.rpartition(".")[0]
            parent = quantized.get_submodule(parent_name) if parent_name else quantized
            setattr(parent, child, replacement)
    quantized.requires_grad_(False).eval()
    quantized.overflow = counter
    sync_quantized(quantized, model, config)
    return quantized


@torch.no_grad()
def sync_quantized(quantized: nn.Module, model: nn.Module, quant: str | QuantConfig) -> None:
    """Copy the current weights of ``model`` into ``quantized`` (made by ``quantize_model``), re-quantising."""
    config = as_quant_config(quant)
    for name, source in model.named_modules():
        target = quantized.get_submodule(name) if name else quantized
        if isinstance(target, (QuantLinear, QuantExperts)):
            target.load_from(source)
        elif isinstance(source, nn.Embedding):
            target.weight.copy_(_quantize_table(source.weight, config))
        else:
            for param_name, param in source.named_parameters(recurse=False):
                getattr(target, param_name).copy_(param.detach())
