"""Four-bit fake quantisation past FP8: NVFP4, MXFP4 (both E2M1 values) and symmetric INT4, along the last dimension.

E2M1 (OCP MX v1.0, section 5.3.3) has the non-negative values ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``; ``round_e2m1`` rounds
to the nearest one, ties to the value with an even mantissa bit (0, 1, 2, 4), and saturates at +-6.

- ``nvfp4`` (NVIDIA, as ModelOpt / TensorRT-LLM quantise): one fp32 scale per tensor ``g = absmax / (6 * 448)`` and
  one E4M3 scale per block of 16 elements ``s = round_e4m3(absmax(block) / 6 / g)``; values ``round_e2m1(x / (s g))``,
  dequantised as ``q * s * g``. A block whose E4M3 scale rounds to 0 dequantises to 0.
- ``mxfp4`` (OCP MX v1.0): one E8M0 (power-of-two) scale per block of 32, ``2 ** (floor(log2(absmax(block))) - 2)``
  (2 = E2M1's largest exponent), exponent clipped to [-127, 127]; values ``round_e2m1(x / scale)``, so the block's
  largest elements (up to 8 x scale) saturate at 6 x scale as the spec says.
- ``int4`` (weights only, symmetric, GPTQ/AWQ-style groups): one fp32 scale ``absmax / 7`` per group of ``group``
  elements of a row; values ``clamp(round(x / scale), -7, 7)``, ties to even.

Shared rules: the last dimension is cut into blocks from its start; a last block shorter than the block size (a tail,
or the whole row when the row is shorter) gets a scale of its own; an all-zero block stays zero; a block holding a
NaN or an infinity comes out all NaN (its scale is undefined), other blocks are unaffected.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

E2M1_MAX = 6.0
E4M3_MAX = 448.0
NVFP4_BLOCK = 16
MXFP4_BLOCK = 32
INT4_MAX = 7
E2M1_EMAX = 2
"""Exponent of E2M1's largest power of two (4 = 2**2); MX scales are 2**(floor(log2 absmax) - E2M1_EMAX)."""


def round_e2m1(x: Tensor) -> Tensor:
    """Nearest E2M1 value of x (ties to an even mantissa), saturated to +-6; NaN stays NaN. Spacing is 0.5 below 2,
    1 in [2, 4) and 2 from 4, so the ties-to-even integer rounding of ``|x| / spacing`` is E2M1's own."""
    magnitude = x.abs().clamp(max=E2M1_MAX)
    spacing = torch.where(magnitude < 2, 0.5, torch.where(magnitude < 4, 1.0, 2.0))
    return torch.sign(x) * torch.round(magnitude / spacing) * spacing


def _blocks(x: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """``x`` zero-padded along its last dimension to a multiple of ``size``, viewed as [..., n_blocks, size], and a
    BoolTensor [..., n_blocks, 1] marking blocks that hold a NaN or an infinity."""
    if size < 1:
        raise ValueError(f"block size must be >= 1, got {size}")
    pad = -x.shape[-1] % size
    blocks = F.pad(x.float(), (0, pad)).unflatten(-1, (-1, size))
    return blocks, ~blocks.isfinite().all(dim=-1, keepdim=True)


def _unblock(blocks: Tensor, bad: Tensor, like: Tensor) -> Tensor:
    """Inverse of ``_blocks``: NaN in the bad blocks, the padding cut off, ``like``'s dtype."""
    out = blocks.masked_fill(bad, float("nan")).flatten(-2)[..., : like.shape[-1]]
    return out.to(like.dtype)


def _finite_absmax(blocks: Tensor, bad: Tensor) -> Tensor:
    return blocks.masked_fill(bad, 0.0).abs().amax(dim=-1, keepdim=True)


def fake_quantize_nvfp4(x: Tensor, block: int = NVFP4_BLOCK, per_row: bool = False) -> Tensor:
    """NVFP4 quantise-dequantise of x along its last dimension (see module): one fp32 scale for the whole tensor
    (a weight), or with ``per_row`` one per row of the last dimension (activations: per token, a dynamic stand-in for
    the calibrated per-tensor activation scale that keeps each sample independent of its batch)."""
    blocks, bad = _blocks(x, block)
    absmax = _finite_absmax(blocks, bad)
    tensor_max = absmax.amax(dim=(-2, -1), keepdim=True) if per_row else absmax.amax()
    global_scale = torch.where(tensor_max > 0, tensor_max / (E2M1_MAX * E4M3_MAX), torch.ones_like(tensor_max))
    block_scale = (absmax / E2M1_MAX / global_scale).clamp(max=E4M3_MAX).to(torch.float8_e4m3fn).float()
    scale = block_scale * global_scale
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    values = torch.where(scale > 0, round_e2m1(blocks / safe) * scale, torch.zeros_like(blocks))
    return _unblock(values, bad, x)


def fake_quantize_mxfp4(x: Tensor, block: int = MXFP4_BLOCK) -> Tensor:
    """MXFP4 quantise-dequantise of x along its last dimension (see module)."""
    blocks, bad = _blocks(x, block)
    absmax = _finite_absmax(blocks, bad)
    exponent = torch.frexp(absmax).exponent.float() - 1 - E2M1_EMAX  # frexp: absmax = m 2**e, m in [0.5, 1)
    scale = torch.where(absmax > 0, torch.exp2(exponent.clamp(-127, 127)), torch.ones_like(absmax))
    return _unblock(round_e2m1(blocks / scale) * scale, bad, x)


def fake_quantize_int4(x: Tensor, group: int = 128) -> Tensor:
    """Symmetric INT4 quantise-dequantise of x along its last dimension, one scale per ``group`` (see module)."""
    blocks, bad = _blocks(x, group)
    absmax = _finite_absmax(blocks, bad)
    scale = torch.where(absmax > 0, absmax / INT4_MAX, torch.ones_like(absmax))
    return _unblock(torch.round(blocks / scale).clamp(-INT4_MAX, INT4_MAX) * scale, bad, x)
