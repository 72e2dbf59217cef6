"""Memory estimate of a colocated slime run: per-GPU training memory, host RAM for CPU Adam, and the rollout engine's
FP8 (or, with ``TRAIN_PRECISION=fp16``, float16) weights. Stated allowances, not measurements; the formula and its
terms are in ``launch/README.md``.

Parameters (from the model shape, embeddings and output layer counted once each unless tied; the training terms and
host RAM count the dense / MoE layers Megatron builds from ``MODEL_ARGS_FILE``, the rollout engine those of its
``config.json``)::

    attention/layer = h*a*d + 2*h*g*d + a*d*h + 2*d + 2*h      (q, k, v, o, q/k norms, two RMSNorms)
    N_dense  = V*h*(1 or 2) + L*attention + L_dense*3*h*I + L_moe*(h*E + 3*h*I_s) + h   (I_s: shared expert, or 0)
    N_expert = L_moe * E * 3*h*I_e

Per training GPU (slime forces Megatron's distributed optimizer; ``--accumulate-allreduce-grads-in-fp32``)::

    P_gpu       = N_dense/(TP*PP) + N_expert/(EP*ETP*PP)
    weights     = 2 B * P_gpu                         (BF16 or FP16 parameters; FP8 training casts them per GEMM)
    gradients   = 4 B * P_gpu                         (fp32 main gradients)
    optimizer   = 12 B * (N_dense + N_expert) / world (fp32 master + Adam moments, sharded over data parallel);
                  0 with OPTIMIZER_CPU_OFFLOAD=1
    activations = T * [ L*h*2/TP                      (full recompute: one BF16 layer input per layer, SP-sharded)
                      + 4 * (h + 2*(a+g)*d/TP + mlp)  (one recomputed layer, forward + its gradients, BF16)
                      + 12 * V/TP ]                   (fp32 logits, the temperature-scaled copy, their gradient)
        mlp = 3*I/TP (dense layers) or 2*k*(2*h + 3*I_e/ETP)/TP (MoE: k routed copies, x2 for routing imbalance)
    reserve     = 8 GB                                (CUDA context, NCCL, what SGLang keeps while offloaded)

With FP8 training (``TRAIN_PRECISION=fp8``: Transformer Engine, blockwise e4m3) Transformer Engine also caches FP8
copies of the weights, row- and column-wise: ``fp8_weight_cache = 2 B * P_gpu`` (SLIME.md section 8).

Host RAM per node: slime's pinned CPU copy of every actor rank's parameters, ``2 B * P_gpu * GPUS_PER_NODE``
(``TensorBackuper.backup("actor")``, ``slime/backends/megatron_utils/actor.py``, ``pin_memory=True``; one more copy per
``--ref-load`` model when a KL term loads it, not in this recipe), plus with CPU Adam 16 B * (N_dense + N_expert) /
world * GPUS_PER_NODE (fp32 master copy and gradient copy, two moments;
``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``). SGLang per GPU: FP8 weights
(N - embeddings)/TP_engine * 1 B + embeddings/TP_engine * 2 B inside ``SGLANG_MEM_FRACTION * GPU_MEMORY_GB``;
float16 weights (``TRAIN_PRECISION=fp16``) N/TP_engine * 2 B. The rest of the pool is KV cache, 2 (K, V) * L *
max(1, g/TP_engine) * d * 2 B per token and GPU (BF16/FP16 cache).
"""

from __future__ import annotations

from dataclasses import dataclass

from .layout import Layout
from .model_shape import ModelShape

GB = 1e9
BYTES_WEIGHT, BYTES_GRAD, BYTES_ADAM_GPU, BYTES_ADAM_HOST = 2, 4, 12, 16
BYTES_PINNED_COPY, BYTES_FP8_CACHE = 2, 2
BYTES_LOGIT = 12
BYTES_KV = 2
ROLLOUT_WEIGHT_BYTES = {"FP8": 1, "FP16": 2}
"""Bytes per served weight outside the embeddings (kept 16-bit by the FP8 converter) by rollout precision."""
MOE_IMBALANCE = 2
RESERVE_GB = 8.0


@dataclass(frozen=True)
class ParameterCounts:
    dense: int
    expert: int
    embedding: int

    @property
    def total(self) -> int:
        return self.dense + self.expert


def parameter_counts(shape: ModelShape) -> ParameterCounts:
    """Non-expert, expert and embedding (+ output layer) parameter counts of ``shape`` (formula in the docstring)."""
    h, a, g, d = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    attention = h * a * d + 2 * h * g * d + a * d * h + 2 * d + 2 * h
    embedding = shape.vocab_size * h * (1 if shape.tie_word_embeddings else 2)
    dense = (embedding + shape.num_hidden_layers * attention + shape.dense_layers * 3 * h * shape.intermediate_size
             + shape.moe_layers * (h * shape.num_experts + 3 * h * shape.shared_expert_intermediate_size) + h)
    expert = shape.moe_layers * shape.num_experts * 3 * h * shape.moe_intermediate_size
    return ParameterCounts(dense=dense, expert=expert, embedding=embedding)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per training GPU by term, host bytes per node, and the rollout engine's weights vs its static pool."""

    params_per_gpu: float
    weights: float
    gradients: float
    optimizer: float
    checkpoints: float
    layer: float
    logits: float
    reserve: float
    fp8_weight_cache: float
    host_pinned_per_node: float
    host_adam_per_node: float
    rollout_weights: float
    rollout_static: float
    gpu_limit: float
    rollout_precision: str = "FP8"
    kv_bytes_per_token: float = 0.0
    """KV-cache bytes of one token on one GPU of an engine (0: not computed)."""

    @property
    def kv_cache(self) -> float:
        return max(self.rollout_static - self.rollout_weights, 0.0)

    @property
    def activations(self) -> float:
        return self.checkpoints + self.layer + self.logits

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations + self.reserve
                + self.fp8_weight_cache)

    @property
    def host_per_node(self) -> float:
        return self.host_pinned_per_node + self.host_adam_per_node

    def lines(self) -> list[str]:
        """Human-readable summary lines (GB = 1e9 bytes)."""
        def gb(x: float) -> str:
            return f"{x / GB:.1f}"
        cache = f" + FP8 weight cache {gb(self.fp8_weight_cache)}" if self.fp8_weight_cache else ""
        adam = (f" + CPU Adam {gb(self.host_adam_per_node)}" if self.host_adam_per_node else
                " (Adam states stay on the GPUs: OPTIMIZER_CPU_OFFLOAD=0)")
        return [
            f"memory per training GPU ~{gb(self.total)} GB of {gb(self.gpu_limit)}: weights {gb(self.weights)} + "
            f"gradients {gb(self.gradients)} + optimizer {gb(self.optimizer)} + activations {gb(self.activations)} "
            f"(checkpoints {gb(self.checkpoints)}, one layer {gb(self.layer)}, logits {gb(self.logits)}) + reserve "
            f"{gb(self.reserve)}{cache}; {self.params_per_gpu / 1e9:.2f}B parameters per GPU",
            f"host RAM per node ~{gb(self.host_per_node)} GB: slime's pinned copy of the actor weights "
            f"{gb(self.host_pinned_per_node)}{adam}",
            f"SGLang per GPU: {self.rollout_precision} weights ~{gb(self.rollout_weights)} GB of a static pool of "
            f"{gb(self.rollout_static)} GB (KV cache ~{gb(self.kv_cache)} GB)",
        ]

    def warnings(self) -> list[str]:
        out = []
        if self.total > self.gpu_limit:
            out.append(f"the estimated training memory ~{self.total / GB:.1f} GB per GPU exceeds GPU_MEMORY_GB = "
                       f"{self.gpu_limit / GB:g}: set OPTIMIZER_CPU_OFFLOAD=1, lower MAX_TOKENS_PER_GPU, or spread "
                       "the model wider (TP, EP, NUM_NODES)")
        if self.rollout_weights >= self.rollout_static:
            out.append(f"the rollout engine's {self.rollout_precision} weights ~{self.rollout_weights / GB:.1f} GB per "
                       "GPU do not fit its "
                       f"static pool {self.rollout_static / GB:.1f} GB: raise SGLANG_MEM_FRACTION or "
                       "ROLLOUT_GPUS_PER_ENGINE")
        return out


def estimate(shape: ModelShape, layout: Layout, *, max_tokens_per_gpu: int, cpu_offload: bool,
             sglang_mem_fraction: float, gpu_memory_gb: float, fp8_training: bool = False,
             trained: ModelShape | None = None, rollout_precision: str = "FP8") -> MemoryEstimate:
    """The terms of the module docstring for ``shape`` served (in ``rollout_precision``: FP8 or FP16) and ``trained``
    (default ``shape``: the model Megatron builds, whose MoE layers follow its own arguments) trained with
    ``layout``."""
    if rollout_precision not in ROLLOUT_WEIGHT_BYTES:
        raise ValueError(f"rollout_precision: expected one of {sorted(ROLLOUT_WEIGHT_BYTES)}, got "
                         f"{rollout_precision!r}")
    served = parameter_counts(shape)
    shape = trained or shape
    lo, n = layout, parameter_counts(shape)
    h, a, g, d = shape.hidden_size, shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    params = n.dense / (lo.tp * lo.pp) + n.expert / (lo.ep * lo.etp * lo.pp)
    shard = n.total / lo.gpus
    mlp = 0.0
    if shape.dense_layers:
        mlp = 3 * shape.intermediate_size / lo.tp
    if shape.moe_layers:
        mlp = max(mlp, MOE_IMBALANCE * shape.num_experts_per_tok
                  * (2 * h + 3 * shape.moe_intermediate_size / lo.etp) / lo.tp)
    tokens = max_tokens_per_gpu
    engine_tp = lo.rollout_gpus_per_engine
    return MemoryEstimate(
        params_per_gpu=params,
        weights=BYTES_WEIGHT * params,
        gradients=BYTES_GRAD * params,
        optimizer=0.0 if cpu_offload else BYTES_ADAM_GPU * shard,
        checkpoints=tokens * shape.num_hidden_layers * h * 2 / lo.tp,
        layer=tokens * 4 * (h + 2 * (a + g) * d / lo.tp + mlp),
        logits=tokens * BYTES_LOGIT * shape.vocab_size / lo.tp,
        reserve=RESERVE_GB * GB,
        fp8_weight_cache=BYTES_FP8_CACHE * params if fp8_training else 0.0,
        host_pinned_per_node=BYTES_PINNED_COPY * params * lo.gpus_per_node,
        host_adam_per_node=BYTES_ADAM_HOST * shard * lo.gpus_per_node if cpu_offload else 0.0,
        rollout_weights=((served.total - served.embedding) * ROLLOUT_WEIGHT_BYTES[rollout_precision]
                         + served.embedding * 2) / engine_tp,
        rollout_static=sglang_mem_fraction * gpu_memory_gb * GB,
        gpu_limit=gpu_memory_gb * GB,
        rollout_precision=rollout_precision,
        kv_bytes_per_token=2 * shape.num_hidden_layers * max(1, g // engine_tp) * d * BYTES_KV,
    )


def rollout_cost_lines(served: MemoryEstimate, fp8: MemoryEstimate) -> list[str]:
    """FP16 rollouts (``served``) against FP8 ones (``fp8``, the same run with FP8 weights): weights, KV cache and
    tokens it holds per engine GPU, and what a decode step or a prefill costs, from weight bytes and tensor-core peaks
    (an estimate, not a measurement)."""
    tokens = [m.kv_cache / m.kv_bytes_per_token / 1e6 if m.kv_bytes_per_token else 0.0 for m in (served, fp8)]
    return [
        f"rollout cost, {served.rollout_precision} against FP8 (estimate, not measured): weights "
        f"{served.rollout_weights / GB:.1f} against {fp8.rollout_weights / GB:.1f} GB per GPU, KV cache "
        f"{served.kv_cache / GB:.1f} against {fp8.kv_cache / GB:.1f} GB ({tokens[0]:.2f}M against {tokens[1]:.2f}M "
        "tokens per engine); a decode step reads 2 bytes per active weight against 1, and the H100's dense FP16 "
        "tensor-core peak is half its FP8 peak (989 against 1979 TFLOPS, NVIDIA H100 SXM datasheet): up to ~2x the FP8 "
        "engine's time where weight reads or GEMMs bound it; attention over the KV cache costs the same"]
