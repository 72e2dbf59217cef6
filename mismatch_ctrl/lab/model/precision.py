"""The trainer's arithmetic precision: fp32 (the lab's trainer), or BF16 / FP16 mixed precision as Megatron runs it.

A run's dose names the pair that makes the mismatch: the rollout engine (``quant.QuantConfig``) and the trainer that
recomputes its samples and trains on them (``QuantConfig.train``, mode suffix ``+train-bf16`` / ``+train-fp16``).
Qi et al. 2025 ("Defeating the Training-Inference Mismatch via FP16", arXiv 2510.26788) compare two arms: BF16
everywhere and FP16 everywhere; in the lab they are ``bf16+train-bf16`` and ``fp16+train-fp16``.

``precision_model(policy, P)`` is the trainer's forward in precision P, sharing the policy's fp32 parameters (the
optimizer's master weights, as Megatron's ``Float16OptimizerWithFloat16Params`` / distributed optimizer keep them):
the values stored at the same points as the engine's ``bf16`` / ``fp16`` modes store them in the format (weights,
embedding tables, the inputs and outputs of every linear layer, expert and the LM head), the GEMMs accumulating in
fp32, norms, softmax, the router and the residual sum in fp32. Backward, the gradient of every rounded activation is
rounded to P too (the backward GEMMs write P); weight gradients stay fp32 (Megatron accumulates them in an fp32
``main_grad``, ``--accumulate-allreduce-grads-in-fp32``).

**The kernel difference.** Two stacks of one precision differ in their kernels, not their format. The lab models one
such difference, the one Megatron's tensor parallelism makes: a row-parallel layer (attention output projection,
dense ``fc2``: Megatron's ``RowParallelLinear``) computes its GEMM in ``TRAINER_TP`` = 2 shards of the input
features, each shard's partial output written in P, and sums them in P (the all-reduce of the partial outputs in the
model's dtype), before the bias; the engine computes the whole row in one fp32 accumulation and rounds once. The two
results differ by up to a few units in the last place of P, so BF16-against-BF16 and FP16-against-FP16 mismatches are
measured, not assumed zero; everything else the two sides compute alike (a real engine differs more: its own tensor
parallelism, fused kernels, attention kernels).

**FP16's range.** float16's largest finite value is 65504: a value past it becomes infinite, as in a real kernel.
The forward counts those overflows (``OverflowCounter``), and FP16 training uses Megatron's dynamic loss scaling
(``DynamicLossScaler``): the loss is multiplied by the scale before the backward, a step whose gradients hold an
infinity or a NaN is skipped and counted.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .policy import Experts

HALF_FORMATS: dict[str, torch.dtype] = {"bf16": torch.bfloat16, "fp16": torch.float16}
TRAIN_PRECISIONS = ("fp32", *HALF_FORMATS)
TRAINER_TP = 2
"""Shards of the trainer's row-parallel GEMMs (the flagship's trainer is TP2: ``launch/``'s ``qwen3_30b_a3b``)."""
ROW_PARALLEL = ("proj", "fc2")
"""Names of the ``nn.Linear`` layers Megatron runs row-parallel: ``SelfAttention.proj`` and the dense MLP's ``fc2``."""
ROUTER_NAME = "gate"
"""Name of the MoE router's linear layer: fp32 in the trainer's half precisions, and kept in full precision by the
rollout engine unless ``QuantConfig.router`` (FP8 checkpoints of Qwen3-MoE keep ``mlp.gate`` out of the
conversion)."""


def round_half(x: Tensor, fmt: str) -> Tensor:
    """Nearest value of x in ``fmt`` (``bf16`` or ``fp16``: IEEE round to nearest even, float16 past 65504 to
    +-inf), returned in x's dtype."""
    return x.to(HALF_FORMATS[fmt]).to(x.dtype)


class OverflowCounter:
    """How many values were rounded to float16 and how many of them overflowed (finite before, infinite after).
    Counts stay on the values' device until ``take``, which reads and resets them (one host sync)."""

    def __init__(self) -> None:
        self.values = 0
        self.overflows: Tensor | None = None

    def add(self, before: Tensor, after: Tensor) -> None:
        found = (after.isinf() & before.isfinite()).sum()
        self.overflows = found if self.overflows is None else self.overflows + found
        self.values += before.numel()

    def take(self) -> tuple[int, int]:
        """(values rounded, values overflowed) since the last ``take``; both 0 when nothing was rounded."""
        counts = (self.values, 0 if self.overflows is None else int(self.overflows))
        self.values, self.overflows = 0, None
        return counts


class _RoundActivation(torch.autograd.Function):
    """Forward: x rounded to the format; backward: the gradient rounded to the format (activation gradients are
    written in the trainer's precision)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, fmt: str) -> Tensor:
        ctx.fmt = fmt
        return round_half(x, fmt)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return round_half(grad, ctx.fmt), None


class _RoundWeight(torch.autograd.Function):
    """Forward: the fp32 master weight rounded to the format; backward: the gradient unchanged (fp32 weight gradients,
    accumulated into Megatron's fp32 ``main_grad``)."""

    @staticmethod
    def forward(ctx: Any, w: Tensor, fmt: str) -> Tensor:
        return round_half(w, fmt)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _Rounding(nn.Module):
    """Shared by the precision modules: the format, its rounding of activations (counted in ``counter`` for fp16)
    and of weights."""

    def __init__(self, fmt: str, counter: OverflowCounter | None) -> None:
        super().__init__()
        self.fmt, self.counter = fmt, counter

    def act(self, x: Tensor) -> Tensor:
        rounded = _RoundActivation.apply(x, self.fmt)
        if self.counter is not None:
            self.counter.add(x.detach(), rounded.detach())
        return rounded

    def weight(self, w: Tensor | None) -> Tensor | None:
        return None if w is None else _RoundWeight.apply(w, self.fmt)


class PrecisionLinear(_Rounding):
    """``nn.Linear`` in the trainer's precision, on the wrapped layer's own parameters. ``shards`` > 1: a row-parallel
    layer, ``y = round(round(sum_s round(x_s W_s^T)) + b)`` over ``shards`` slices of the input features (partial
    sums added in order, each sum rounded); else ``y = round(x W^T + b)`` (inputs rounded)."""

    def __init__(self, linear: nn.Linear, fmt: str, counter: OverflowCounter | None, shards: int = 1) -> None:
        super().__init__(fmt, counter)
        if shards < 1 or linear.in_features % shards:
            raise ValueError(f"shards: {linear.in_features} input features do not split into {shards} equal shards")
        self.linear, self.shards = linear, shards

    def forward(self, x: Tensor) -> Tensor:
        x, w, b = self.act(x), self.weight(self.linear.weight), self.weight(self.linear.bias)
        if self.shards == 1:
            return self.act(F.linear(x, w, b))
        parts = [self.act(F.linear(xs, ws)) for xs, ws in zip(x.chunk(self.shards, -1), w.chunk(self.shards, 1))]
        total = parts[0]
        for part in parts[1:]:
            total = self.act(total + part)
        return total if b is None else self.act(total + b)


class PrecisionExperts(_Rounding):
    """``policy.Experts`` in the trainer's precision, rounding where ``quant.QuantExperts`` rounds in a half format:
    inputs and outputs of each expert matrix, fp32 accumulation, the gate-weighted sum in fp32."""

    def __init__(self, experts: Experts, fmt: str, counter: OverflowCounter | None) -> None:
        super().__init__(fmt, counter)
        self.experts = experts

    def forward(self, x: Tensor, weights: Tensor) -> Tensor:
        e = self.experts
        hidden = torch.einsum("...d,efd->...ef", self.act(x), self.weight(e.fc1_weight)) + self.weight(e.fc1_bias)
        hidden = F.gelu(self.act(hidden))
        out = torch.einsum("...ef,edf->...ed", self.act(hidden), self.weight(e.fc2_weight)) + self.weight(e.fc2_bias)
        return torch.einsum("...e,...ed->...d", weights, self.act(out))


class PrecisionEmbedding(_Rounding):
    """``nn.Embedding`` whose table is read in the trainer's precision."""

    def __init__(self, embedding: nn.Embedding, fmt: str) -> None:
        super().__init__(fmt, None)
        self.embedding = embedding

    def forward(self, ids: Tensor) -> Tensor:
        return F.embedding(ids, self.weight(self.embedding.weight))


def precision_model(policy: nn.Module, precision: str) -> nn.Module:
    """The policy's forward in ``precision`` (module docstring), sharing its parameters: the policy itself for
    ``fp32``; for ``bf16`` / ``fp16`` a copy whose linear layers (the router aside), experts and embeddings compute
    in the format, row-parallel layers in ``TRAINER_TP`` shards. The copy's ``overflow`` is its ``OverflowCounter``
    (fp16) or None."""
    if precision not in TRAIN_PRECISIONS:
        raise ValueError(f"trainer precision: expected one of {list(TRAIN_PRECISIONS)}, got {precision!r}")
    if precision == "fp32":
        return policy
    model = copy.deepcopy(policy)
    for name, param in policy.named_parameters():  # the copy computes on the policy's own (master) parameters
        owner, _, leaf = name.rpartition(".")
        setattr(model.get_submodule(owner) if owner else model, leaf, param)
    counter = OverflowCounter() if precision == "fp16" else None
    for name, module in list(model.named_modules()):
        owner, _, child = name.rpartition(".")
        if isinstance(module, Experts):
            replacement: nn.Module = PrecisionExperts(module, precision, counter)
        elif isinstance(module, nn.Linear) and child != ROUTER_NAME:
            shards = TRAINER_TP if child in ROW_PARALLEL else 1
            replacement = PrecisionLinear(module, precision, counter, shards)
        elif isinstance(module, nn.Embedding):
            replacement = PrecisionEmbedding(module, precision)
        else:
            continue
        setattr(model.get_submodule(owner) if owner else model, child, replacement)
    model.overflow = counter
    return model


LAB_INITIAL_LOSS_SCALE = 2.0**16
"""The lab trainer's first loss scale: ``torch.amp.GradScaler``'s default, which the lab's gradients never overflow
(seed 150, 8 rollouts at K = 4: no step skipped). From Megatron's 2^32 the same run skipped its first 12 optimizer
steps (3 rollouts) and one more at rollout 5 while the scale came down to 2^20; in the lab's chaotic K = 4 regime
that early pause would confound the FP16 arm. The cluster launcher keeps Megatron's default, where such steps are a
small share of a run of thousands."""


class DynamicLossScaler:
    """Megatron's dynamic loss scaling for ``--fp16`` (Megatron-LM 1dcf0daf ``megatron/core/optimizer/grad_scaler.py``
    ``DynamicGradScaler``, built in ``megatron/core/optimizer/__init__.py:419-444`` with the defaults of
    ``megatron/training/arguments.py:2213-2224``): ``initial_scale`` 2^32, ``min_scale`` 1, growth factor 2, backoff
    0.5, ``growth_interval`` (``--loss-scale-window``) 1000, ``hysteresis`` 2. ``update(found_inf)``: an overflow
    resets the growth count and spends one unit of hysteresis; with none left the scale halves (not below
    ``min_scale``); ``growth_interval`` clean steps in a row double it and restore the hysteresis."""

    def __init__(self, initial_scale: float = 2.0**32, min_scale: float = 1.0, growth_interval: int = 1000,
                 hysteresis: int = 2) -> None:
        if not 0 < min_scale <= initial_scale or growth_interval < 1 or hysteresis < 1:
            raise ValueError("DynamicLossScaler: need 0 < min_scale <= initial_scale, growth_interval >= 1 and "
                             f"hysteresis >= 1, got {min_scale}, {initial_scale}, {growth_interval}, {hysteresis}")
        self.scale, self.min_scale = float(initial_scale), float(min_scale)
        self.growth_interval, self.hysteresis = growth_interval, hysteresis
        self.growth_tracker, self.hysteresis_tracker = 0, hysteresis

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * 0.5, self.min_scale)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker, self.hysteresis_tracker = 0, self.hysteresis
                self.scale *= 2.0

    def unscale(self, parameters: list[Tensor]) -> bool:
        """Divide every gradient by the scale; True when one holds an infinity or a NaN (the step must be skipped)."""
        grads = [p.grad for p in parameters if p.grad is not None]
        found = torch.stack([(~g.isfinite()).any() for g in grads]).any() if grads else torch.tensor(False)
        for g in grads:
            g.mul_(1.0 / self.scale)
        return bool(found)
