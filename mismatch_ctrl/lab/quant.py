"""Simulated low-precision inference: FP8 (e4m3 / e5m2) block-scaled weights, per-token activations, BF16.

Weights (slime ``tools/convert_hf_to_fp8.py`` ``block_fp8``, re-applied at every weight sync): per tile of
128x128, ``scale = absmax(tile) / fmax`` (fp32) and ``q = cast_fp8(clamp(w / scale, -fmax, fmax))``; the engine
computes with ``q * scale`` in fp32 (fake quantisation: the same values an FP8 GEMM multiplies). A matrix with
fewer rows than a block gets one scale per row (tiles of 1 x 128): a 64x64 matrix would otherwise be a single
per-tensor tile, far coarser than a 128x128 tile of a large model.

Activations (SGLang's dynamic ``per_token_group_quant_fp8``): the input of each quantised linear layer gets one
scale per token and group of 128 features (= per token row when the width is <= 128).

Rounding is round-to-nearest-even by casting to ``torch.float8_e4m3fn`` (max 448) / ``torch.float8_e5m2``
(max 57344) and back, which works on CPU. ``bf16`` rounds weights, linear inputs and outputs and the embedding
tables to bfloat16 (a mild, BF16-engine-like mismatch).

Mixture-of-experts layers: every expert's two matrices are quantised like the other linears (one block-scaled
matrix per expert, activations per token and expert); the router ``gate`` is never quantised, as FP8 checkpoints
of Qwen3-MoE keep ``mlp.gate`` out of the FP8 conversion. Routing flips therefore come from the quantised hidden
states the router reads, as on the real stack.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .policy import Experts

FP8_FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}
FORMATS = ("none", "bf16", *FP8_FORMATS)
BLOCK = 128
ROUTER_NAME = "gate"
"""Name of the MoE router's linear layer, which the engine keeps in full precision."""


def _fp8(fmt: str) -> tuple[torch.dtype, float]:
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt: expected one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    return FP8_FORMATS[fmt]


def round_fp8(x: Tensor, fmt: str) -> Tensor:
    """Nearest FP8 value (ties to even) of x, saturated to +-fmax, returned in x's dtype."""
    dtype, fmax = _fp8(fmt)
    return x.clamp(-fmax, fmax).to(dtype).to(x.dtype)


def round_bf16(x: Tensor) -> Tensor:
    """Nearest bfloat16 value of x, returned in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def block_shape(rows: int, cols: int, block: int = BLOCK) -> tuple[int, int]:
    """Tile of one weight scale: (block, block), or (1, block) when the matrix has fewer than ``block`` rows.
    Tiles are clipped at the matrix edge, so a matrix narrower than ``block`` has one tile per row band."""
    return (block if rows >= block else 1), block


def _tiles(weight: Tensor, tile: tuple[int, int]) -> Tensor:
    """Zero-padded weight viewed as [row_tiles, tile_rows, col_tiles, tile_cols]."""
    rows, cols = weight.shape
    tr, tc = tile
    n_r, n_c = -(-rows // tr), -(-cols // tc)
    padded = F.pad(weight, (0, n_c * tc - cols, 0, n_r * tr - rows))
    return padded.view(n_r, tr, n_c, tc)


def quantize_weight(weight: Tensor, fmt: str, block: int = BLOCK) -> tuple[Tensor, Tensor]:
    """Block FP8 quantisation of a 2-D weight: codes (float8 dtype, weight's shape) and fp32 scales
    [row_tiles, col_tiles] with ``scale = absmax(tile) / fmax`` (1.0 for an all-zero tile)."""
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D matrix, got shape {tuple(weight.shape)}")
    dtype, fmax = _fp8(fmt)
    rows, cols = weight.shape
    tiles = _tiles(weight.float(), block_shape(rows, cols, block))
    absmax = tiles.abs().amax(dim=(1, 3), keepdim=True)
    scale = torch.where(absmax > 0, absmax / fmax, torch.ones_like(absmax))
    codes = (tiles / scale).clamp(-fmax, fmax).to(dtype)
    codes = codes.view(tiles.shape[0] * tiles.shape[1], -1)[:rows, :cols]
    return codes, scale.view(tiles.shape[0], tiles.shape[2])


def dequantize_weight(codes: Tensor, scale: Tensor, block: int = BLOCK) -> Tensor:
    """fp32 weight ``codes * scale`` of ``quantize_weight``'s output."""
    rows, cols = codes.shape
    tr, tc = block_shape(rows, cols, block)
    expanded = scale.repeat_interleave(tr, dim=0).repeat_interleave(tc, dim=1)[:rows, :cols]
    return codes.float() * expanded


def fake_quantize_weight(weight: Tensor, fmt: str, block: int = BLOCK) -> Tensor:
    """fp32 weight as the rollout engine sees it in format ``fmt`` (``none`` copies, ``bf16`` rounds)."""
    if fmt == "none":
        return weight.detach().float().clone()
    if fmt == "bf16":
        return round_bf16(weight.detach().float())
    return dequantize_weight(*quantize_weight(weight.detach(), fmt, block), block)


def quantize_activations(x: Tensor, fmt: str, group: int = BLOCK) -> Tensor:
    """Dynamic FP8 fake quantisation of activations [..., features]: one scale ``absmax / fmax`` per token and
    group of ``group`` features (per token row when features <= group)."""
    _, fmax = _fp8(fmt)
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

    fmt: ``none`` (exact fp32 copy), ``bf16``, ``e4m3`` or ``e5m2``.
    activations: quantise the inputs of quantised linear layers per token (FP8) / round them (bf16).
    lm_head: quantise the LM head like the block linears (slime keeps it BF16; including it makes the tiny
      model's mismatch large-model-like).
    embeddings: quantise the token and position tables (FP8 per row / block, or bf16 rounding).
    block: weight tile size.
    """

    fmt: str = "e4m3"
    activations: bool = True
    lm_head: bool = True
    embeddings: bool = False
    block: int = BLOCK

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"QuantConfig.fmt: expected one of {list(FORMATS)}, got {self.fmt!r}")
        if self.block < 1:
            raise ValueError(f"QuantConfig.block must be >= 1, got {self.block}")

    @classmethod
    def from_mode(cls, mode: str) -> QuantConfig:
        """Named mode, see ``QUANT_MODES``."""
        if mode not in QUANT_MODES:
            raise ValueError(f"quant mode: unknown {mode!r}; choose one of {list(QUANT_MODES)}")
        return QUANT_MODES[mode]

    @property
    def mode(self) -> str:
        """Name of the matching mode in ``QUANT_MODES``, or a description of a custom config."""
        for name, config in QUANT_MODES.items():
            if config == self:
                return name
        return "custom(" + ",".join(f"{k}={v}" for k, v in asdict(self).items()) + ")"


QUANT_MODES: dict[str, QuantConfig] = {
    "none": QuantConfig(fmt="none", activations=False, lm_head=False),
    "bf16": QuantConfig(fmt="bf16", activations=True, lm_head=True, embeddings=True),
    "e4m3-w": QuantConfig(fmt="e4m3", activations=False, lm_head=False),
    "e4m3": QuantConfig(fmt="e4m3", activations=True, lm_head=True),
    "e5m2-w": QuantConfig(fmt="e5m2", activations=False, lm_head=False),
    "e5m2": QuantConfig(fmt="e5m2", activations=True, lm_head=True),
}
"""``e4m3`` (default): block weights + per-token activations + LM head. ``*-w``: block weights of the transformer
linears only (slime's converter scope). ``e5m2``: as ``e4m3`` in the coarser format (a stress setting)."""


def as_quant_config(quant: str | QuantConfig) -> QuantConfig:
    """A QuantConfig from a mode name or a config."""
    return quant if isinstance(quant, QuantConfig) else QuantConfig.from_mode(quant)


def _quantize_input(x: Tensor, config: QuantConfig) -> Tensor:
    """A linear layer's input as the engine feeds it: FP8 per token (and group), or bf16-rounded."""
    if config.activations and config.fmt in FP8_FORMATS:
        return quantize_activations(x, config.fmt, config.block)
    if config.activations and config.fmt == "bf16":
        return round_bf16(x)
    return x


def _round_output(y: Tensor, config: QuantConfig) -> Tensor:
    return round_bf16(y) if config.fmt == "bf16" else y


class QuantLinear(nn.Module):
    """Stand-in for an ``nn.Linear`` computing with quantised weights (and optionally inputs); no gradients."""

    def __init__(self, linear: nn.Linear, config: QuantConfig) -> None:
        super().__init__()
        self.config = config
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.empty_like(linear.weight, dtype=torch.float32))
        self.register_buffer("bias", None if linear.bias is None else torch.empty_like(linear.bias))
        self.load_from(linear)

    @torch.no_grad()
    def load_from(self, linear: nn.Linear) -> None:
        """Re-quantise from the fp32 layer (a weight sync)."""
        self.weight.copy_(fake_quantize_weight(linear.weight, self.config.fmt, self.config.block))
        if self.bias is not None:
            bias = linear.bias.detach().float()
            self.bias.copy_(round_bf16(bias) if self.config.fmt == "bf16" else bias)

    def forward(self, x: Tensor) -> Tensor:
        return _round_output(F.linear(_quantize_input(x, self.config), self.weight, self.bias), self.config)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, mode={self.config.mode}"


class QuantExperts(nn.Module):
    """Stand-in for ``policy.Experts``: each expert's fc1 / fc2 matrix block-quantised on its own, the input of each
    expert matrix quantised per token (fc2's per token and expert); biases as ``QuantLinear``'s; no gradients."""

    def __init__(self, experts: Experts, config: QuantConfig) -> None:
        super().__init__()
        self.config = config
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
            bias = getattr(experts, name).detach().float()
            getattr(self, name).copy_(round_bf16(bias) if fmt == "bf16" else bias)

    def forward(self, x: Tensor, weights: Tensor) -> Tensor:
        config = self.config
        hidden = torch.einsum("...d,efd->...ef", _quantize_input(x, config), self.fc1_weight) + self.fc1_bias
        hidden = F.gelu(_round_output(hidden, config))
        out = torch.einsum("...ef,edf->...ed", _quantize_input(hidden, config), self.fc2_weight) + self.fc2_bias
        return torch.einsum("...e,...ed->...d", weights, _round_output(out, config))

    def extra_repr(self) -> str:
        return f"experts={self.fc1_weight.shape[0]}, mode={self.config.mode}"


def _quantize_table(table: Tensor, config: QuantConfig) -> Tensor:
    if not config.embeddings or config.fmt == "none":
        return table.detach().float().clone()
    return fake_quantize_weight(table, config.fmt, config.block)


def quantize_model(model: nn.Module, quant: str | QuantConfig, head_name: str = "lm_head") -> nn.Module:
    """A frozen copy of ``model`` whose linear layers are ``QuantLinear`` and whose experts are ``QuantExperts`` per
    ``quant`` (the LM head, named ``head_name``, only if ``quant.lm_head``; MoE routers, named ``ROUTER_NAME``,
    never); keep it in step with ``sync_quantized``."""
    config = as_quant_config(quant)
    quantized = copy.deepcopy(model)
    if config.fmt != "none":
        for name, module in list(quantized.named_modules()):
            child = name.rpartition(".")[2]
            if isinstance(module, Experts):
                replacement: nn.Module = QuantExperts(module, config)
            elif isinstance(module, nn.Linear) and child != ROUTER_NAME and (config.lm_head or name != head_name):
                replacement = QuantLinear(module, config)
            else:
                continue
            parent_name = name.rpartition(".")[0]
            parent = quantized.get_submodule(parent_name) if parent_name else quantized
            setattr(parent, child, replacement)
    quantized.requires_grad_(False).eval()
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
