"""The float16 engine and the BF16 / FP16 trainer against roundings written here with numpy (an implementation of
IEEE half precision independent of torch's), the dynamic loss scaler against Megatron's rules, overflow counting,
and an FP16 run end to end."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mismatch_ctrl.lab.model.engine import RolloutEngine
from mismatch_ctrl.lab.model.policy import PolicyConfig, TinyPolicy
from mismatch_ctrl.lab.model.precision import (
    DynamicLossScaler,
    OverflowCounter,
    PrecisionExperts,
    PrecisionLinear,
    precision_model,
    round_half,
)
from mismatch_ctrl.lab.model.quant import QuantConfig, QuantExperts
from mismatch_ctrl.lab.model.tasks import make_task
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.training.settings import LabSettings
from mismatch_ctrl.lab.training.trainer import Trainer
from mismatch_ctrl.slime import hooks



def numpy_round(x: np.ndarray, fmt: str) -> np.ndarray:
    """float32 values rounded to the format, independently of torch: float16 by numpy's own IEEE half; bfloat16 by
    rounding the float32 bit pattern to its upper 16 bits, to nearest, ties to even (finite inputs)."""
    x = np.asarray(x, dtype=np.float32)
    if fmt == "fp16":
        with np.errstate(over="ignore"):
            return x.astype(np.float16).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def rnd(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x rounded to the format by ``numpy_round``, back as an fp32 tensor."""
    return torch.from_numpy(numpy_round(x.detach().numpy(), fmt))


def policy(kind: str, seed: int = 3, std: float = 0.2) -> TinyPolicy:
    shape = dict(d_model=32, n_layers=2, n_heads=2, d_ff=64) if kind == "dense" else \
        dict(d_model=32, n_layers=2, n_heads=2, d_ff=16, n_experts=4, top_k=2)
    model = TinyPolicy(PolicyConfig.for_task(make_task("add"), **shape), seed=seed)
    with torch.no_grad():  # weights large enough that rounding moves the logits visibly
        for name, param in model.named_parameters():
            if param.dim() >= 2 or name.endswith("bias"):
                param.normal_(0.0, std, generator=torch.Generator().manual_seed(seed + len(name)))
    return model


def reference_dense_logits(model: TinyPolicy, tokens: torch.Tensor, fmt: str, shards: int) -> torch.Tensor:
    """The dense policy's logits with every value the documented half-precision stack stores rounded by numpy:
    embedding tables, weights, biases, linear inputs and outputs, LM head; norms, softmax and residual in fp32;
    ``shards`` > 1: attention ``proj`` and ``fc2`` summed from that many partial GEMMs, each sum rounded."""
    r = lambda t: rnd(t, fmt)  # noqa: E731

    def linear(x, layer, k=1):
        x, w = r(x), r(layer.weight)
        b = None if layer.bias is None else r(layer.bias)
        if k == 1:
            return r(F.linear(x, w, b))
        total = None
        for xs, ws in zip(x.chunk(k, -1), w.chunk(k, 1)):
            part = r(F.linear(xs, ws))
            total = part if total is None else r(total + part)
        return r(total + b)

    t = tokens.shape[1]
    x = F.embedding(tokens, r(model.tok_emb.weight)) + r(model.pos_emb.weight)[:t]
    for block in model.blocks:
        n, _, d = x.shape
        heads = block.attn.n_heads
        q, k, v = linear(block.ln1(x), block.attn.qkv).view(n, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(n, t, d)
        x = x + linear(attended, block.attn.proj, shards)
        x = x + linear(F.gelu(linear(block.ln2(x), block.fc1)), block.fc2, shards)
    return linear(model.norm(x), model.lm_head)


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_round_half_is_ieee_round_to_nearest_even_with_float16_overflow(fmt):
    rng = np.random.default_rng(0)
    x = np.concatenate([np.exp(rng.uniform(-30, 12, 20000)), [65504.0, 65519.99, 65520.0, 1e5, 6e-8, 2.9e-8]])
    x = np.concatenate([x, -x]).astype(np.float32)
    got = round_half(torch.from_numpy(x), fmt).numpy()
    np.testing.assert_array_equal(got, numpy_round(x, fmt))
    if fmt == "fp16":
        special = round_half(torch.tensor([65504.0, 65519.99, 65520.0, -7e4]), fmt).tolist()
        assert special == [65504.0, 65504.0, math.inf, -math.inf]  # from 65520 (half a unit above 65504): inf
        assert round_half(torch.tensor([1.0 + 2**-11, 1.0 + 3 * 2**-11]), fmt).tolist() == [1.0, 1.0 + 2**-9]


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_the_half_engine_is_the_fp32_forward_rounded_where_documented(fmt):
    model = policy("dense")
    tokens = torch.randint(0, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(1))
    engine = RolloutEngine(model, fmt)
    with torch.inference_mode():
        got = engine.model(tokens)
    expected = reference_dense_logits(model, tokens, fmt, shards=1)
    assert torch.equal(got, expected)
    assert not torch.equal(got, model(tokens).detach())  # the rounding changed something


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_the_half_trainer_sums_row_parallel_partials_in_the_format(fmt):
    model = policy("dense")
    tokens = torch.randint(0, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(2))
    trainer = precision_model(model, fmt)
    expected = reference_dense_logits(model, tokens, fmt, shards=2)
    assert torch.equal(trainer(tokens).detach(), expected)
    engine_side = reference_dense_logits(model, tokens, fmt, shards=1)
    gap = (expected - engine_side).abs()
    ulp = 2.0 ** -(10 if fmt == "fp16" else 7)  # relative spacing of the format
    assert 0 < gap.max() < 50 * ulp * engine_side.abs().max()  # the kernel difference: small, not zero


@pytest.mark.parametrize("fmt", ["fp16", "bf16"])
def test_trainer_experts_round_where_the_engine_experts_round(fmt):
    model = policy("moe")
    experts = model.blocks[0].moe.experts
    x = torch.randn(5, 7, 32, generator=torch.Generator().manual_seed(4))
    weights = torch.softmax(torch.randn(5, 7, 4, generator=torch.Generator().manual_seed(5)), -1)
    trainer = PrecisionExperts(experts, fmt, None)(x, weights)
    engine = QuantExperts(experts, QuantConfig.from_mode(fmt))(x, weights)
    hidden = torch.einsum("...d,efd->...ef", rnd(x, fmt), rnd(experts.fc1_weight, fmt)) + rnd(experts.fc1_bias, fmt)
    hidden = rnd(F.gelu(rnd(hidden, fmt)), fmt)
    out = rnd(torch.einsum("...ef,edf->...ed", hidden, rnd(experts.fc2_weight, fmt)) + rnd(experts.fc2_bias, fmt), fmt)
    expected = torch.einsum("...e,...ed->...d", weights, out)
    assert torch.equal(trainer.detach(), expected) and torch.equal(engine, expected)


def test_trainer_shares_the_policy_parameters_and_the_router_stays_fp32():
    model = policy("moe")
    trainer = precision_model(model, "fp16")
    assert {id(p) for p in trainer.parameters()} == {id(p) for p in model.parameters()}
    assert precision_model(model, "fp32") is model
    assert type(trainer.blocks[0].moe.gate) is torch.nn.Linear
    assert isinstance(trainer.blocks[0].attn.proj, PrecisionLinear) and trainer.blocks[0].attn.proj.shards == 2
    assert trainer.blocks[0].attn.qkv.shards == 1
    with torch.no_grad():
        model.lm_head.weight.mul_(2.0)  # an optimizer step on the master weights is seen by the trainer's forward
    tokens = torch.randint(0, model.config.vocab_size, (2, 6), generator=torch.Generator().manual_seed(0))
    assert torch.equal(trainer.lm_head.linear.weight, model.lm_head.weight)
    with pytest.raises(ValueError, match="expected one of"):
        precision_model(model, "fp8")
    assert trainer(tokens).shape == (2, 6, model.config.vocab_size)


def test_activation_gradients_are_rounded_weight_gradients_are_not():
    linear = torch.nn.Linear(4, 3, bias=False)
    layer = PrecisionLinear(linear, "fp16", None)
    x = torch.randn(2, 4, requires_grad=True, generator=torch.Generator().manual_seed(0))
    scale = torch.tensor([[1e-9, 1.0 + 2**-13, 3.0]] * 2)  # 1e-9 underflows float16; 1 + 2^-13 rounds to 1
    (layer(x) * scale).sum().backward()
    upstream = rnd(scale, "fp16")  # the gradient reaching the GEMM output, rounded
    np.testing.assert_array_equal(x.grad.numpy(), rnd(upstream @ rnd(linear.weight, "fp16"), "fp16").numpy())
    np.testing.assert_array_equal(linear.weight.grad.numpy(), (upstream.T @ rnd(x, "fp16")).numpy())
    assert (upstream[:, 0] == 0).all()  # why FP16 training scales its loss


def test_overflow_counter_counts_values_that_became_infinite():
    counter = OverflowCounter()
    before = torch.tensor([1e5, -7e4, 65504.0, math.inf, 1.0])
    counter.add(before, round_half(before, "fp16"))
    counter.add(torch.ones(3), torch.ones(3))
    assert counter.take() == (8, 2) and counter.take() == (0, 0)  # an input already infinite is not an overflow
    model = policy("dense", std=0.2)
    with torch.no_grad():  # weights that stay finite in float16, logits past 65504
        model.lm_head.weight.mul_(1e3)
        model.norm.weight.mul_(1e3)
    engine = RolloutEngine(model, "fp16")
    tokens = torch.randint(0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert not engine.model(tokens).isfinite().all() and model(tokens).isfinite().all()
    values, overflows = engine.overflow.take()
    assert 0 < overflows < values
    assert RolloutEngine(model, "bf16").overflow is None and RolloutEngine(model, "e4m3").overflow is None


def reference_scales(events: list[bool], initial: float, interval: int, hysteresis: int) -> list[float]:
    """Megatron's DynamicGradScaler.update written out: an overflow spends hysteresis and, when none is left,
    halves the scale (floor 1); ``interval`` clean steps in a row double it and restore the hysteresis."""
    scale, clean, left, out = initial, 0, hysteresis, []
    for overflow in events:
        if overflow:
            clean, left = 0, left - 1
            scale = max(scale / 2, 1.0) if left <= 0 else scale
        else:
            clean += 1
            if clean == interval:
                clean, left, scale = 0, hysteresis, scale * 2
        out.append(scale)
    return out


def test_dynamic_loss_scaler_follows_megatron():
    rng = np.random.default_rng(0)
    events = [bool(e) for e in rng.random(400) < 0.3] + [False] * 20 + [True] * 40
    scaler = DynamicLossScaler(initial_scale=2.0**20, growth_interval=7, hysteresis=3)
    got = []
    for event in events:
        scaler.update(event)
        got.append(scaler.scale)
    assert got == reference_scales(events, 2.0**20, 7, 3)
    assert got[-1] == 1.0 and any(b == 2 * a for a, b in zip(got, got[1:]))  # floor reached, growth seen
    default = DynamicLossScaler()
    assert (default.scale, default.growth_interval, default.hysteresis, default.min_scale) == (2.0**32, 1000, 2, 1.0)
    with pytest.raises(ValueError, match="min_scale"):
        DynamicLossScaler(initial_scale=0.5)


def test_unscale_divides_and_reports_non_finite_gradients():
    a, b = torch.zeros(2, requires_grad=True), torch.zeros(3, requires_grad=True)
    a.grad, b.grad = torch.tensor([4.0, 8.0]), torch.tensor([2.0, 0.0, 6.0])
    scaler = DynamicLossScaler(initial_scale=4.0)
    assert scaler.unscale([a, b]) is False and a.grad.tolist() == [1.0, 2.0] and b.grad.tolist() == [0.5, 0.0, 1.5]
    b.grad[1] = math.inf
    assert scaler.unscale([a, b]) is True


def test_train_suffix_names_the_trainer_precision():
    assert QuantConfig.from_mode("fp16+train-fp16").train == "fp16"
    assert QuantConfig.from_mode("e4m3+train-fp32").mode == "e4m3"
    assert QuantConfig.from_mode("nvfp4+train-bf16+router").mode == "nvfp4+router+train-bf16"
    for bad, message in (("fp16+train-fp8", "names no trainer precision"), ("bf16+train-bf16+train-fp16", "repeats"),
                         ("fp16+router+router", "repeats")):
        with pytest.raises(ValueError, match=message):
            QuantConfig.from_mode(bad)
    spec = RunSpec.parse("grpo@e4m3+train-bf16+r3", "e4m3", 8)
    assert (spec.quant, spec.replay, spec.label) == ("e4m3+train-bf16", True, "grpo@e4m3+train-bf16+r3")


def moe_state() -> dict:
    model = policy("moe")
    return {"policy_config": model.config.to_dict(), "state_dict": model.state_dict()}


SMALL = LabSettings(steps=2, prompts_per_step=4, samples_per_prompt=4, eval_every=2, eval_prompts=8)


def trained_rollout(trainer: Trainer) -> dict:
    """One rollout trained with rewards +1 / -1 by sample (a random policy earns none, and zero advantages leave
    nothing to overflow)."""
    data, rollout, _, _ = trainer.rollout_data(0)
    data["rewards"] = [float(i % 2) * 2 - 1 for i in range(len(data["rewards"]))]
    hooks.advantages(trainer.args, data)
    return trainer.train_rollout(0, data, rollout)


def test_fp16_training_scales_its_loss_and_skips_the_steps_whose_gradients_overflow(tmp_path):
    trainer = Trainer(RunSpec.parse("grpo@fp16+train-fp16", "e4m3", 4), SMALL, moe_state(), tmp_path)
    assert trainer.scaler.scale == 2.0**16  # the lab's first scale (LAB_INITIAL_LOSS_SCALE)
    trainer.scaler.scale = 2.0**32  # Megatron's first scale
    before = [p.detach().clone() for p in trainer.policy.parameters()]
    first = trained_rollout(trainer)
    # 2^32 times the loss overflows the float16 gradients: both steps skipped, no update; Megatron's hysteresis 2
    # lets the first overflow pass, the second halves the scale.
    assert (first["skipped_steps"], first["loss_scale"]) == (2, 2.0**31)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.policy.parameters()))
    trainer.scaler.scale = 2.0**6  # a scale whose gradients fit: every step is taken
    second = trained_rollout(trainer)
    assert (second["skipped_steps"], second["loss_scale"]) == (0, 2.0**6)
    assert not torch.equal(before[-1], trainer.policy.lm_head.weight)


def test_a_bf16_trainer_takes_every_step_without_loss_scaling(tmp_path):
    trainer = Trainer(RunSpec.parse("grpo@bf16+train-bf16", "e4m3", 4), SMALL, moe_state(), tmp_path)
    before = trainer.policy.lm_head.weight.detach().clone()
    metrics = trained_rollout(trainer)
    assert trainer.scaler is None and "skipped_steps" not in metrics
    assert not torch.equal(before, trainer.policy.lm_head.weight)


def test_float16_runs_log_overflows_and_the_loss_scale_other_runs_do_not(tmp_path):
    Trainer(RunSpec.parse("grpo@fp16+train-fp16", "e4m3", 4), SMALL, moe_state(), tmp_path / "fp16").run()
    Trainer(RunSpec.parse("grpo@e4m3+train-bf16", "e4m3", 4), SMALL, moe_state(), tmp_path / "bf16").run()
    rows = {name: [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
            for name in ("fp16", "bf16")}
    for row in rows["fp16"]:
        assert row["train/loss_scale"] > 0 and row["train/skipped_steps"] in (0, 1, 2)
        assert 0 <= row["engine_overflow_fraction"] <= 1 and 0 <= row["train_overflow_fraction"] <= 1
    assert not {"train/loss_scale", "train/skipped_steps", "engine_overflow_fraction",
                "train_overflow_fraction"} & set(rows["bf16"][0])
