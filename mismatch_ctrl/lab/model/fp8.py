"""FP8 block quantisation of weights, as slime's ``tools/convert_hf_to_fp8.py`` ``block_fp8`` writes it and re-applies
at every weight sync: per tile of 128x128, ``scale = absmax(tile) / fmax`` (fp32) and
``q = cast_fp8(clamp(w / scale, -fmax, fmax))``; the engine computes with ``q * scale`` in fp32 (fake quantisation:
the same values an FP8 GEMM multiplies). A matrix with fewer rows than a block gets one scale per row (tiles of
1 x 128): a 64x64 matrix would otherwise be a single per-tensor tile, far coarser than a 128x128 tile of a large
model. Rounding is round-to-nearest-even by casting to ``torch.float8_e4m3fn`` (max 448) / ``torch.float8_e5m2``
(max 57344) and back, which works on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

FP8_FORMATS: dict[str, tuple[torch.dtype, float]] = {
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}
BLOCK = 128


def fp8_format(fmt: str) -> tuple[torch.dtype, float]:
    """(torch dtype, largest finite value) of an FP8 format, ValueError naming the formats for another."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt: expected one of {sorted(FP8_FORMATS)}, got {fmt!r}")
    return FP8_FORMATS[fmt]


def round_fp8(x: Tensor, fmt: str) -> Tensor:
    """Nearest FP8 value (ties to even) of x, saturated to +-fmax, returned in x's dtype."""
    dtype, fmax = fp8_format(fmt)
    return x.clamp(-fmax, fmax).to(dtype).to(x.dtype)


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
    dtype, fmax = fp8_format(fmt)
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
