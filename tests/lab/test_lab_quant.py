import numpy as np
import pytest
import torch
from torch import nn

from mismatch_ctrl.lab.model.fp8 import block_shape, dequantize_weight, quantize_weight, round_fp8
from mismatch_ctrl.lab.model.policy import PolicyConfig, TinyPolicy
from mismatch_ctrl.lab.model.quant import (
    QUANT_MODES,
    QuantConfig,
    QuantLinear,
    fake_quantize_weight,
    quantize_activations,
    quantize_model,
    round_bf16,
    sync_quantized,
)

# (exponent bits, mantissa bits, bias, largest finite code) of the positive half of each format
FORMATS = {"e4m3": (4, 3, 7, 126), "e5m2": (5, 2, 15, 123)}
FMAX = {"e4m3": 448.0, "e5m2": 57344.0}


def grid(fmt: str) -> np.ndarray:
    """All non-negative finite values, in code order (so code parity = mantissa parity)."""
    _, m_bits, bias, last = FORMATS[fmt]
    values = []
    for code in range(last + 1):
        e, m = code >> m_bits, code & ((1 << m_bits) - 1)
        frac = m / (1 << m_bits)
        values.append(frac * 2.0 ** (1 - bias) if e == 0 else (1 + frac) * 2.0 ** (e - bias))
    return np.array(values)


def reference_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """Round to nearest representable value, ties to the even code, saturating at the largest finite value."""
    g = grid(fmt)
    a = np.minimum(np.abs(x), g[-1])
    upper = np.clip(np.searchsorted(g, a), 1, len(g) - 1)
    lower = upper - 1
    d_low, d_up = a - g[lower], g[upper] - a
    pick_up = (d_up < d_low) | ((d_up == d_low) & (upper % 2 == 0))
    return np.sign(x) * np.where(pick_up, g[upper], g[lower])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_fp8_rounding_matches_reference_grid(fmt):
    g = grid(fmt)
    assert g[-1] == FMAX[fmt]
    mids = (g[1:] + g[:-1]) / 2
    rng = np.random.default_rng(0)
    random = np.exp(rng.uniform(np.log(g[1] / 4), np.log(g[-1] * 4), 4000))
    x = np.concatenate([g, mids, np.nextafter(mids, 0), np.nextafter(mids, np.inf), random]).astype(np.float32)
    x = np.concatenate([x, -x])
    got = round_fp8(torch.from_numpy(x), fmt).numpy()
    np.testing.assert_array_equal(got, reference_round(x.astype(np.float64), fmt).astype(np.float32))


def test_bf16_rounding_keeps_eight_significant_bits():
    x = torch.tensor([1.0 + 2**-8, 1.0 + 3 * 2**-8, 1.0 + 2**-7, 3.14159265])
    assert round_bf16(x).tolist() == [1.0, 1.0 + 2**-6, 1.0 + 2**-7, 3.140625]


def test_block_scale_per_128_tile():
    torch.manual_seed(0)
    w = torch.randn(300, 260) * torch.linspace(0.1, 3, 260)
    w[128:256, 128:256] = 0.0
    assert block_shape(300, 260) == (128, 128)
    codes, scale = quantize_weight(w, "e4m3")
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == w.shape
    assert scale.shape == (3, 3)
    deq = dequantize_weight(codes, scale)
    for i in range(3):
        for j in range(3):
            tile = w[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)]
            absmax = tile.abs().max()
            expected = absmax / 448 if absmax > 0 else torch.tensor(1.0)
            assert scale[i, j] == pytest.approx(expected.item(), rel=1e-7)
            tile_codes = codes[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)].float()
            if absmax > 0:
                assert tile_codes.abs().max() == 448
            expected_tile = round_fp8(tile / scale[i, j], "e4m3") * scale[i, j]
            torch.testing.assert_close(deq[128 * i : 128 * (i + 1), 128 * j : 128 * (j + 1)], expected_tile)
    assert torch.equal(deq, fake_quantize_weight(w, "e4m3"))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_small_matrix_scales_per_row(fmt):
    torch.manual_seed(1)
    w = torch.randn(64, 200) * torch.logspace(-2, 1, 64)[:, None]
    assert block_shape(64, 200) == (1, 128)
    codes, scale = quantize_weight(w, fmt)
    assert scale.shape == (64, 2)
    for r in range(64):
        for j, cols in enumerate([slice(0, 128), slice(128, 200)]):
            assert scale[r, j] == pytest.approx((w[r, cols].abs().max() / FMAX[fmt]).item(), rel=1e-7)
    deq = fake_quantize_weight(w, fmt)
    per_element = scale.repeat_interleave(128, dim=1)[:, :200]
    torch.testing.assert_close(deq, round_fp8(w / per_element, fmt) * per_element)
    normal = (w / per_element).abs() >= (2**-6 if fmt == "e4m3" else 2**-14)
    rel = ((deq - w).abs() / w.abs())[normal].max()
    assert 0 < rel <= (2**-4 if fmt == "e4m3" else 2**-3) * 1.0001


def test_activation_scale_per_token_and_group():
    torch.manual_seed(2)
    x = torch.randn(3, 5, 64) * torch.logspace(-3, 2, 5)[:, None]
    got = quantize_activations(x, "e4m3")
    scale = x.abs().amax(dim=-1, keepdim=True) / 448
    torch.testing.assert_close(got, round_fp8(x / scale, "e4m3") * scale)
    wide = torch.randn(4, 300)
    got = quantize_activations(wide, "e5m2")
    for g, cols in enumerate([slice(0, 128), slice(128, 256), slice(256, 300)]):
        s = wide[:, cols].abs().amax(dim=-1, keepdim=True) / 57344
        torch.testing.assert_close(got[:, cols], round_fp8(wide[:, cols] / s, "e5m2") * s)
    assert torch.equal(quantize_activations(torch.zeros(2, 8), "e4m3"), torch.zeros(2, 8))


def small_policy() -> TinyPolicy:
    return TinyPolicy(PolicyConfig(vocab_size=15, max_len=20, d_model=32, n_layers=2, n_heads=4, d_ff=64), seed=3)


def test_quantize_model_scope_per_mode():
    policy = small_policy()
    linear_names = {n for n, m in policy.named_modules() if isinstance(m, nn.Linear)}
    for mode, config in QUANT_MODES.items():
        model = quantize_model(policy, mode)
        quantized = {n for n, m in model.named_modules() if isinstance(m, QuantLinear)}
        if mode == "none":
            assert quantized == set()
        elif config.lm_head:
            assert quantized == linear_names
        else:
            assert quantized == linear_names - {"lm_head"}
        assert not any(p.requires_grad for p in model.parameters())
        for name in quantized:
            source = policy.get_submodule(name).weight
            assert torch.equal(model.get_submodule(name).weight, fake_quantize_weight(source, config.fmt))
        table = policy.tok_emb.weight
        expected = fake_quantize_weight(table, config.fmt) if config.embeddings else table
        assert torch.equal(model.tok_emb.weight, expected)


def test_sync_requantizes_current_weights():
    policy = small_policy()
    model = quantize_model(policy, "e4m3")
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05)
    assert not torch.equal(model.blocks[0].fc1.weight, fake_quantize_weight(policy.blocks[0].fc1.weight, "e4m3"))
    sync_quantized(model, policy, "e4m3")
    assert torch.equal(model.blocks[0].fc1.weight, fake_quantize_weight(policy.blocks[0].fc1.weight, "e4m3"))
    assert torch.equal(model.blocks[1].ln2.weight, policy.blocks[1].ln2.weight)
    assert torch.equal(model.pos_emb.weight, policy.pos_emb.weight)
    assert torch.equal(model.blocks[0].attn.qkv.bias, policy.blocks[0].attn.qkv.bias)


def test_quant_config_modes_and_errors():
    assert QuantConfig.from_mode("e4m3") == QuantConfig()
    assert all(QuantConfig.from_mode(name).mode == name for name in QUANT_MODES)
    assert QuantConfig(fmt="e5m2", lm_head=False).mode.startswith("custom(")
    with pytest.raises(ValueError, match="unknown 'fp4'"):
        QuantConfig.from_mode("fp4")
    with pytest.raises(ValueError, match="QuantConfig.fmt"):
        QuantConfig(fmt="int8")
    with pytest.raises(ValueError, match="fmt"):
        round_fp8(torch.ones(2), "e3m4")


def moe_policy() -> TinyPolicy:
    config = PolicyConfig(vocab_size=15, max_len=20, d_model=32, n_layers=2, n_heads=4, d_ff=16, n_experts=4, top_k=2)
    return TinyPolicy(config, seed=3)


def test_mode_names_parse_to_configs_and_back():
    assert QuantConfig.from_mode("nvfp4+router") == QuantConfig(fmt="nvfp4", router=True)
    assert QuantConfig.from_mode("temp1.05") == QuantConfig(fmt="none", activations=False, lm_head=False,
                                                            engine_temperature=1.05)
    assert QuantConfig.from_mode("e4m3+router+temp0.9").engine_temperature == 0.9
    for name in ("nvfp4+router", "temp1.05", "e5m2+router+temp1.3", "int4+temp2.0", "mxfp4", "e4m3-w+router"):
        assert QuantConfig.from_mode(QuantConfig.from_mode(name).mode) == QuantConfig.from_mode(name)
    assert QuantConfig.from_mode("e4m3+temp1.3+router").mode == "e4m3+router+temp1.3"
    assert QuantConfig.from_mode("temp1").mode == "none"
    for bad, message in (("temp-1", "engine temperature from 0.001"), ("tempinf", "engine temperature from 0.001"),
                         ("temp1e300", "to 1000"),
                         ("e4m3+router+router", "repeats"), ("e4m3+temp1.1+temp1.2", "repeats"),
                         ("int4x", "unknown"), ("none+router", "needs a quantised engine")):
        with pytest.raises(ValueError, match=message):
            QuantConfig.from_mode(bad)
    with pytest.raises(ValueError, match="int4 quantises weights only"):
        QuantConfig(fmt="int4", activations=True)


@pytest.mark.parametrize("mode", ["e4m3", "nvfp4", "int4"])
def test_router_quantised_only_with_the_router_suffix(mode):
    policy = moe_policy()
    plain, routed = quantize_model(policy, mode), quantize_model(policy, f"{mode}+router")
    gates = [f"blocks.{i}.moe.gate" for i in range(2)]
    for name in gates:
        assert isinstance(plain.get_submodule(name), nn.Linear)
        assert torch.equal(plain.get_submodule(name).weight, policy.get_submodule(name).weight)
        quantized = routed.get_submodule(name)
        assert isinstance(quantized, QuantLinear)
        assert torch.equal(quantized.weight, fake_quantize_weight(policy.get_submodule(name).weight, mode))
        assert not torch.equal(quantized.weight, policy.get_submodule(name).weight)


def test_fp4_modes_quantise_weights_per_row_blocks_and_activations():
    policy = small_policy()
    for mode, block in (("nvfp4", 16), ("mxfp4", 32), ("int4", 32)):
        model = quantize_model(policy, mode)
        weight, source = model.blocks[0].fc1.weight, policy.blocks[0].fc1.weight  # [64, 32]: rows of 32
        assert torch.equal(weight, fake_quantize_weight(source, mode))
        distinct = [len(set((weight[0, i:i + block] / weight[0, i:i + block].abs().max()).tolist()))
                    for i in range(0, 32, block)]
        assert max(distinct) <= 15  # E2M1 and symmetric INT4 both have 15 signed levels
        x = torch.randn(3, 32)
        layer = model.blocks[0].fc1
        expected = x if mode == "int4" else quantize_activations(x, mode)
        torch.testing.assert_close(layer(x), torch.nn.functional.linear(expected, layer.weight, layer.bias))
