"""NVFP4 / MXFP4 / INT4 fake quantisation against element-by-element loops written from the format definitions."""

import math

import pytest
import torch

from mismatch_ctrl.lab.model.fp4 import fake_quantize_int4, fake_quantize_mxfp4, fake_quantize_nvfp4, round_e2m1

E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # code order: an even index has mantissa bit 0


def e2m1_loop(v: float) -> float:
    """Nearest grid value by scanning the grid, ties to the even code, saturating at 6."""
    if math.isnan(v):
        return math.nan
    a = min(abs(v), 6.0)
    best = 0
    for i, g in enumerate(E2M1_GRID):
        d, d_best = abs(a - g), abs(a - E2M1_GRID[best])
        if d < d_best or (d == d_best and i % 2 == 0 and best % 2 == 1):
            best = i
    return math.copysign(E2M1_GRID[best], v)


def e4m3_grid() -> list[float]:
    values = []
    for code in range(127):  # 0 .. 448, the largest finite code is 126
        e, m = code >> 3, code & 7
        values.append(m / 8 * 2.0**-6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return values


E4M3 = e4m3_grid()


def e4m3_loop(v: float) -> float:
    """Nearest non-negative E4M3 value, ties to the even code, saturating at 448."""
    a = min(v, 448.0)
    best = 0
    for i, g in enumerate(E4M3):
        d, d_best = abs(a - g), abs(a - E4M3[best])
        if d < d_best or (d == d_best and i % 2 == 0 and best % 2 == 1):
            best = i
    return E4M3[best]


def blocks_of(row: list[float], size: int) -> list[list[float]]:
    return [row[i:i + size] for i in range(0, len(row), size)]


def nan_block(block: list[float]) -> list[float] | None:
    return [math.nan] * len(block) if any(not math.isfinite(v) for v in block) else None


def nvfp4_loop(matrix: list[list[float]], per_row: bool = False) -> list[list[float]]:
    def global_scale(values: list[float]) -> float:
        finite = [abs(v) for v in values if math.isfinite(v)]
        top = max(finite, default=0.0)
        return top / (6 * 448) if top > 0 else 1.0

    everything = [v for row in matrix for v in row]
    out = []
    for row in matrix:
        g = global_scale(row if per_row else everything)
        new_row = []
        for block in blocks_of(row, 16):
            bad = nan_block(block)
            if bad:
                new_row += bad
                continue
            s = e4m3_loop(max(abs(v) for v in block) / 6 / g)
            new_row += [e2m1_loop(v / (s * g)) * s * g if s > 0 else 0.0 for v in block]
        out.append(new_row)
    return out


def mxfp4_loop(matrix: list[list[float]]) -> list[list[float]]:
    out = []
    for row in matrix:
        new_row = []
        for block in blocks_of(row, 32):
            bad = nan_block(block)
            if bad:
                new_row += bad
                continue
            top = max(abs(v) for v in block)
            scale = 2.0 ** max(-127, min(127, math.frexp(top)[1] - 1 - 2)) if top > 0 else 1.0
            new_row += [e2m1_loop(v / scale) * scale for v in block]
        out.append(new_row)
    return out


def int4_loop(matrix: list[list[float]], group: int) -> list[list[float]]:
    out = []
    for row in matrix:
        new_row = []
        for block in blocks_of(row, group):
            bad = nan_block(block)
            if bad:
                new_row += bad
                continue
            top = max(abs(v) for v in block)
            scale = top / 7 if top > 0 else 1.0
            new_row += [max(-7, min(7, round(v / scale))) * scale for v in block]  # round(): ties to even
        out.append(new_row)
    return out


def check(got: torch.Tensor, expected: list[list[float]]) -> None:
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), equal_nan=True, rtol=1e-6, atol=0)


def test_e2m1_rounding_matches_grid_scan_with_ties_and_saturation():
    ties = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    assert [e2m1_loop(v) for v in ties] == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    values = torch.tensor(ties + [-v for v in ties] + [6.0, 7.0, 100.0, -1e30, 0.1, -0.3, 4.9, 5.1, 1.9, 0.0])
    values = torch.cat([values, torch.randn(2000) * 3, torch.randint(-28, 29, (500,)) / 4.0])
    got = round_e2m1(values)
    assert got.tolist() == [e2m1_loop(v) for v in values.tolist()]
    assert torch.isnan(round_e2m1(torch.tensor([math.nan]))).all()
    assert round_e2m1(torch.tensor([math.inf, -math.inf])).tolist() == [6.0, -6.0]


@pytest.mark.parametrize("shape", [(5, 64), (3, 20), (4, 7), (1, 48)])
def test_nvfp4_matches_loop_per_tensor_and_per_row(shape):
    torch.manual_seed(sum(shape))
    x = torch.randn(shape) * torch.logspace(-4, 1, shape[0])[:, None]
    check(fake_quantize_nvfp4(x), nvfp4_loop(x.tolist()))
    check(fake_quantize_nvfp4(x, per_row=True), nvfp4_loop(x.tolist(), per_row=True))


@pytest.mark.parametrize("shape", [(5, 64), (3, 40), (4, 7), (2, 100)])
def test_mxfp4_matches_loop_with_power_of_two_scales(shape):
    torch.manual_seed(sum(shape))
    x = torch.randn(shape) * torch.logspace(-5, 3, shape[0])[:, None]
    got = fake_quantize_mxfp4(x)
    check(got, mxfp4_loop(x.tolist()))
    block = x[0, :32].abs().max()
    scale = 2.0 ** (math.floor(math.log2(block)) - 2)
    assert set((got[0, :32] / scale).abs().tolist()) <= set(E2M1_GRID)


@pytest.mark.parametrize(("shape", "group"), [((4, 300), 128), ((3, 50), 128), ((2, 64), 16), ((6, 129), 128)])
def test_int4_matches_loop_per_group_and_per_short_row(shape, group):
    torch.manual_seed(sum(shape))
    x = torch.randn(shape)
    got = fake_quantize_int4(x, group)
    check(got, int4_loop(x.tolist(), group))
    levels = got[0, :group] / (x[0, :group].abs().max() / 7)
    torch.testing.assert_close(levels, levels.round())
    torch.testing.assert_close(levels.abs().max(), torch.tensor(7.0))


def test_edge_cases_zeros_equal_blocks_tails_and_nonfinite():
    assert torch.equal(fake_quantize_nvfp4(torch.zeros(2, 20)), torch.zeros(2, 20))
    assert torch.equal(fake_quantize_mxfp4(torch.zeros(3, 40)), torch.zeros(3, 40))
    assert torch.equal(fake_quantize_int4(torch.zeros(1, 9)), torch.zeros(1, 9))
    equal = torch.full((2, 32), 5.0)
    assert torch.equal(fake_quantize_nvfp4(equal), equal)  # block scale 448 exactly: 5 -> 6 x 5/6
    assert torch.equal(fake_quantize_mxfp4(equal), torch.full((2, 32), 4.0))  # 5 / 2**0 ties 4 | 6 -> 4 (even)
    assert torch.equal(fake_quantize_int4(equal), equal)
    # a tail shorter than a block has a scale of its own: the 4 small values are not flushed by the large block
    row = torch.cat([torch.full((16,), 100.0), torch.tensor([0.01, 0.02, -0.03, 0.04])])[None]
    check(fake_quantize_nvfp4(row), nvfp4_loop(row.tolist()))
    assert (fake_quantize_nvfp4(row)[0, 16:] != 0).all()
    cases = ((fake_quantize_nvfp4, nvfp4_loop, 16), (fake_quantize_mxfp4, mxfp4_loop, 32),
             (lambda t: fake_quantize_int4(t, 8), lambda m: int4_loop(m, 8), 8))
    for fn, loop, size in cases:
        x = torch.randn(3, 2 * size)
        x[0, 1], x[1, size + 2] = math.nan, -math.inf
        got = fn(x)
        assert torch.isnan(got[0, :size]).all() and torch.isfinite(got[0, size:]).all()
        assert torch.isnan(got[1, size:]).all() and torch.isfinite(got[1, :size]).all()
        assert torch.isfinite(got[2]).all()
        check(got, loop(x.tolist()))


def test_mxfp4_scale_exponent_is_exact_just_below_a_power_of_two():
    below = torch.nextafter(torch.tensor(4.0), torch.tensor(0.0))  # 4 - 2**-22: floor(log2) = 1, scale 2**-1
    x = torch.stack([below, torch.tensor(4.0), torch.tensor(2.0**-130)])[:, None]  # one element per block (row)
    got = fake_quantize_mxfp4(x)
    check(got, mxfp4_loop(x.tolist()))
    assert got[0, 0] == 3.0  # below / 0.5 = 7.99.. saturates at 6 -> 3.0; a scale of 1 would give 4.0


def test_nvfp4_block_scale_that_rounds_to_zero_gives_zeros():
    x = torch.tensor([[1e6] * 16 + [1e-6] * 16])
    got = fake_quantize_nvfp4(x)
    assert got[0, 16:].eq(0).all()
    torch.testing.assert_close(got[0, :16], torch.full((16,), 1e6))
    check(got, nvfp4_loop(x.tolist()))


def test_coarser_formats_lose_more():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    error = {name: (fn(w) - w).pow(2).mean().sqrt() / w.pow(2).mean().sqrt()
             for name, fn in (("nvfp4", fake_quantize_nvfp4), ("mxfp4", fake_quantize_mxfp4),
                              ("int4", fake_quantize_int4))}
    assert 0.03 < error["nvfp4"] < error["mxfp4"] < 0.25
    assert 0.03 < error["int4"] < 0.25
