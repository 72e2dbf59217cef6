"""Parallel-layout rules, each taken from the engine that enforces it at load, checked before any GPU is touched.

Versions: Megatron-LM 1dcf0daf, SGLang 0.5.15.post1 and slime 624b824a (the docker image's). Every message names the
numbers and a fix. The trainer rules read Megatron's model arguments (what Megatron is given); the engine rules read
the FP8 checkpoint's shape (what SGLang loads), or the profile's recorded shape before the checkpoint exists.

Trainer (Megatron):

- world size divisible by TP x PP x CP (``megatron/training/arguments.py:318``, ``validate_args``: "world size is
  not divisible by total_model_size"); GLOBAL_BATCH_SIZE divisible by the data-parallel size x micro batch 1
  (``megatron/core/num_microbatches_calculator.py:341``, "global batch size is not divisible by micro batch size
  times data parallel size");
- MoE: world size divisible by EP x ETP x PP (``megatron/core/parallel_state.py:796``,
  ``initialize_model_parallel``: "world_size is not divisible by expert_tensor_model_pipeline_parallel size") and
  num_experts by EP (``arguments.py:1026-1027``, "Number of experts should be a multiple of expert model
  parallel_size"); dense: EP = ETP = 1 (``arguments.py:1025``, "num_experts must be non None to use expert model
  parallelism");
- heads divisible by TP, query groups a multiple or a divisor of TP
  (``megatron/core/transformer/transformer_config.py:939-941`` and ``:951-959``, ``__post_init__``); layers
  divisible by PP (``arguments.py:543`` / ``:570``);
- whole optimizer steps per rollout (slime trains ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT samples per rollout in
  steps of GLOBAL_BATCH_SIZE).

Rollout engines (SGLang, engine TP = ROLLOUT_GPUS_PER_ENGINE, EP = ROLLOUT_EP:
``slime/backends/sglang_utils/sglang_engine.py::_compute_server_args`` passes ``tp_size`` and ``ep_size``):

- engines tile the GPUs without straddling a node unless they take whole nodes (``_compute_server_args``:
  ``nnodes = max(1, gpus_per_engine // num_gpus_per_node)``);
- attention heads divisible by TP, KV heads a multiple or a divisor of TP
  (``python/sglang/srt/models/qwen3_moe.py::Qwen3MoeAttention``, ``qwen3.py::Qwen3Attention``);
- dense MLP: intermediate_size divisible by TP (``MergedColumnParallelLinear`` shards gate and up evenly); the same
  for a MoE layer's shared expert (``shared_expert_intermediate_size``, Qwen3.5-MoE: SGLang builds it as a plain MLP
  over the engine TP, ``models/qwen2_moe.py::Qwen2MoeSparseMoeBlock``, which ``qwen3_next.py`` reuses);
- FP8 block-quantised linear layers: every merged output shard (q, k, v; gate, up) a multiple of ``block_n`` and,
  with TP > 1, every row-parallel input shard (o_proj, down_proj) a multiple of ``block_k``
  (``python/sglang/srt/layers/quantization/fp8.py::Fp8LinearMethod.validate_block_quant_shapes``);
- MoE: ``moe_tp = TP / EP`` (``python/sglang/srt/distributed/parallel_state.py::initialize_model_parallel``,
  ``moe_tp_size = tensor_model_parallel_size // moe_ep_size // moe_dp_size``), so EP must divide TP; num_experts
  divisible by EP and moe_intermediate_size by moe_tp (``layers/moe/fused_moe_triton/layer.py::FusedMoE.__init__``);
  the expert shard ``moe_intermediate_size / moe_tp`` a multiple of ``block_n`` and, with TP > 1, of ``block_k``
  (``fp8.py::Fp8MoEMethod.create_weights``: "The output_size of gate's and up's weight = 192 is not divisible by
  weight quantization block_n = 128").
"""

from __future__ import annotations

from dataclasses import dataclass

from .model_shape import MegatronModel, ModelShape
from .settings import Settings

SGLANG_FP8 = "SGLang 0.5.15.post1 layers/quantization/fp8.py"


@dataclass(frozen=True)
class Layout:
    """The parallel layout of one run: the trainer's and the rollout engines' on ``num_nodes`` x ``gpus_per_node``."""

    num_nodes: int = 1
    gpus_per_node: int = 8
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    rollout_gpus_per_engine: int = 1
    rollout_ep: int = 1
    global_batch_size: int = 128
    rollout_batch_size: int = 64
    n_samples_per_prompt: int = 8
    routing_replay: bool = False

    @classmethod
    def from_settings(cls, s: Settings) -> Layout:
        return cls(num_nodes=s.int("NUM_NODES"), gpus_per_node=s.int("GPUS_PER_NODE"), tp=s.int("TP"),
                   pp=s.int("PP"), cp=s.int("CP"), ep=s.int("EP"), etp=s.int("ETP"),
                   rollout_gpus_per_engine=s.int("ROLLOUT_GPUS_PER_ENGINE"), rollout_ep=s.int("ROLLOUT_EP"),
                   global_batch_size=s.int("GLOBAL_BATCH_SIZE"), rollout_batch_size=s.int("ROLLOUT_BATCH_SIZE"),
                   n_samples_per_prompt=s.int("N_SAMPLES_PER_PROMPT"), routing_replay=s.flag("ROUTING_REPLAY"))

    @property
    def gpus(self) -> int:
        return self.num_nodes * self.gpus_per_node

    @property
    def gpus_text(self) -> str:
        return f"the GPUs (NUM_NODES x GPUS_PER_NODE = {self.num_nodes} x {self.gpus_per_node})"

    @property
    def dp(self) -> int:
        """Megatron's data-parallel size ``world / (TP x PP x CP)``."""
        return self.gpus // (self.tp * self.pp * self.cp)

    @property
    def engines(self) -> int:
        return self.gpus // self.rollout_gpus_per_engine

    @property
    def moe_tp(self) -> int:
        """SGLang's expert tensor-parallel size ``TP / EP`` of one engine."""
        return self.rollout_gpus_per_engine // self.rollout_ep


def _divides(a: int, a_text: str, b: int, b_text: str, fix: str = "") -> list[str]:
    return [] if b % a == 0 else [f"{a_text} = {a} must divide {b_text} = {b}" + (f"; {fix}" if fix else "")]


def _multiple_or_divisor(a: int, b: int) -> bool:
    return a % b == 0 or b % a == 0


def trainer_problems(layout: Layout, model: MegatronModel) -> list[str]:
    """Megatron's layout rules (see the module docstring) for ``model``'s arguments; a line per violation."""
    lo = layout
    gpus = lo.gpus
    out = _divides(lo.tp * lo.pp * lo.cp, f"TP x PP x CP = {lo.tp} x {lo.pp} x {lo.cp}", gpus, lo.gpus_text,
                   "Megatron's model-parallel groups must tile the GPUs; choose TP, PP, CP whose product divides it")
    if not out:  # the data-parallel size exists
        out += _divides(lo.dp, "the data-parallel size (GPUs / (TP x PP x CP))", lo.global_batch_size,
                        "GLOBAL_BATCH_SIZE", f"Megatron's micro-batch calculator needs whole micro-batches per rank: "
                        f"set GLOBAL_BATCH_SIZE to a multiple of {lo.dp}")
    experts = model.num_experts
    if model.is_moe:
        out += _divides(lo.ep * lo.etp * lo.pp, f"EP x ETP x PP = {lo.ep} x {lo.etp} x {lo.pp}", gpus, lo.gpus_text,
                        "Megatron's expert grid must tile the GPUs; choose EP among the divisors of the GPU count")
        out += _divides(lo.ep, "EP", experts, "the experts of the model (--num-experts)",
                        "each trainer rank holds num_experts / EP whole experts")
    else:
        if lo.ep != 1 or lo.etp != 1:
            out.append(f"the model is dense (no --num-experts): EP and ETP must be 1 (got EP={lo.ep} ETP={lo.etp})")
        if lo.routing_replay:
            out.append("ROUTING_REPLAY=1 needs a MoE model; this model is dense")
    heads, groups, layers = model.num_attention_heads, model.num_query_groups, model.num_layers
    if heads:
        out += _divides(lo.tp, "TP", heads, "the attention heads of the model",
                        "choose TP among the divisors of the head count")
    if groups and not _multiple_or_divisor(groups, lo.tp):
        out.append(f"TP = {lo.tp} must be a multiple or a divisor of the query groups of the model = {groups} "
                   "(Megatron TransformerConfig); choose TP among the divisors or multiples of the group count")
    if layers:
        out += _divides(lo.pp, "PP", layers, "the layers of the model", "each pipeline stage holds whole layers")
    samples = lo.rollout_batch_size * lo.n_samples_per_prompt
    if samples % lo.global_batch_size:
        out.append(f"ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT = {lo.rollout_batch_size} x {lo.n_samples_per_prompt} "
                   f"= {samples} must be a multiple of GLOBAL_BATCH_SIZE = {lo.global_batch_size} (whole optimizer "
                   "steps per rollout)")
    return out


def valid_rollout_eps(tp: int, shape: ModelShape) -> list[int]:
    """The SGLang EP sizes an engine of TP ``tp`` can load ``shape`` with (the MoE rules of the module docstring)."""
    return [ep for ep in range(1, tp + 1) if tp % ep == 0 and not _expert_problems(tp, ep, shape)]


def _expert_problems(tp: int, ep: int, shape: ModelShape) -> list[str]:
    """SGLang's MoE rules for an engine of TP ``tp`` and EP ``ep`` (EP dividing TP)."""
    moe_tp, width = tp // ep, shape.moe_intermediate_size
    out = []
    if shape.num_experts % ep:
        out.append(f"num_experts {shape.num_experts} is not divisible by ROLLOUT_EP = {ep} (SGLang FusedMoE gives "
                   "each EP rank whole experts)")
    if width % moe_tp:
        out.append(f"moe_intermediate_size {width} is not divisible by moe_tp = {tp} / {ep} = {moe_tp} "
                   "(SGLang FusedMoE)")
    elif (block := _misfit_block(width // moe_tp, tp, shape)) is not None:
        out.append(f"each expert's moe_intermediate_size {width} is split over moe_tp = {tp} / {ep} = {moe_tp} "
                   f"into shards of {width // moe_tp}, not a multiple of the FP8 weight block {block}: "
                   f"Fp8MoEMethod.create_weights refuses to load the checkpoint ({SGLANG_FP8})")
    return out


def _misfit_block(shard: int, tp: int, shape: ModelShape) -> int | None:
    """The FP8 weight block an MLP shard of ``shard`` columns fails under engine TP ``tp`` (a merged gate/up output
    shard must be a multiple of ``block_n``; with TP > 1 the down projection's input shard, the same width, of
    ``block_k``), or None when it fits or the checkpoint is not block-quantised."""
    if shape.weight_block_size is None:
        return None
    block_n, block_k = shape.weight_block_size
    if shard % block_n:
        return block_n
    return block_k if tp > 1 and shard % block_k else None


def _mlp_problems(what: str, width: int, tp: int, lo: Layout, shape: ModelShape) -> list[str]:
    """An MLP of ``width`` columns sharded over the whole engine TP (a dense layer's, or a MoE layer's shared
    expert): gate/up split evenly (``MergedColumnParallelLinear``), each shard a fit for the FP8 blocks."""
    if width % tp:
        return [f"{what} {width} is not divisible by the engine TP = {tp} (SGLang MergedColumnParallelLinear); "
                "choose an engine size that divides it"]
    block = _misfit_block(width // tp, tp, shape)
    if block is None:
        return []
    fits = [t for t in range(1, lo.gpus_per_node + 1) if width % t == 0 and _misfit_block(width // t, t, shape) is None]
    fix = (f"set ROLLOUT_GPUS_PER_ENGINE to one of {', '.join(map(str, fits))}" if fits else
           "no engine size within a node fits: serve a BF16 checkpoint or another block size")
    return [f"{what} {width} over the engine TP = {tp} gives shards of {width // tp}, not a multiple of the FP8 weight "
            f"block {block} (Fp8LinearMethod.validate_block_quant_shapes, {SGLANG_FP8}); {fix}"]


def engine_problems(layout: Layout, shape: ModelShape, source: str) -> list[str]:
    """SGLang's rules (see the module docstring) for the rollout engines on ``shape``; ``source`` says where the
    shape comes from and ends every shape-dependent message."""
    lo, tp, ep = layout, layout.rollout_gpus_per_engine, layout.rollout_ep
    out = _divides(tp, "ROLLOUT_GPUS_PER_ENGINE", lo.gpus, lo.gpus_text,
                   "colocated engines tile all GPUs")
    if tp <= lo.gpus_per_node:
        out += _divides(tp, "ROLLOUT_GPUS_PER_ENGINE", lo.gpus_per_node, "GPUS_PER_NODE (engines must not straddle "
                        "nodes)")
    else:
        out += _divides(lo.gpus_per_node, "GPUS_PER_NODE", tp, "ROLLOUT_GPUS_PER_ENGINE (multi-node engines use "
                        "whole nodes)")
    shaped: list[str] = []
    heads, kv, head_dim = shape.num_attention_heads, shape.num_key_value_heads, shape.head_dim
    if heads % tp:
        shaped.append(f"attention heads {heads} are not divisible by the engine TP = ROLLOUT_GPUS_PER_ENGINE = {tp} "
                      "(SGLang Qwen3 attention); choose an engine size that divides the head count")
    if kv and not _multiple_or_divisor(kv, tp):
        shaped.append(f"KV heads {kv} are neither a multiple nor a divisor of the engine TP = {tp} (SGLang Qwen3 "
                      "attention); choose an engine size that divides or is a multiple of the KV head count")
    if shape.weight_block_size is not None and not heads % tp:
        block_n, block_k = shape.weight_block_size
        q_shard, kv_shard = heads // tp * head_dim, max(1, kv // tp) * head_dim
        shards = [("q", q_shard, block_n), ("k/v", kv_shard, block_n)] + ([("o_proj input", q_shard, block_k)]
                                                                          if tp > 1 else [])
        for name, size, block in shards:
            if size % block:
                shaped.append(f"the {name} shard of an engine of TP {tp} is {size} columns, not a multiple of the FP8 "
                              f"weight block {block} (Fp8LinearMethod.validate_block_quant_shapes, {SGLANG_FP8}); "
                              "choose another ROLLOUT_GPUS_PER_ENGINE")
    if shape.dense_layers:
        shaped += _mlp_problems("the dense MLP's intermediate_size", shape.intermediate_size, tp, lo, shape)
    if shape.is_moe and shape.shared_expert_intermediate_size:
        shaped += _mlp_problems("the shared expert's shared_expert_intermediate_size",
                                shape.shared_expert_intermediate_size, tp, lo, shape)
    if shape.is_moe:
        if tp % ep:
            shaped.append(f"ROLLOUT_EP = {ep} must divide the engine TP = ROLLOUT_GPUS_PER_ENGINE = {tp} (SGLang: "
                          "moe_tp = TP / EP); choose ROLLOUT_EP among the divisors of ROLLOUT_GPUS_PER_ENGINE")
        else:
            found = _expert_problems(tp, ep, shape)
            if found:
                choices = valid_rollout_eps(tp, shape)
                fix = (f"set ROLLOUT_EP to {' or '.join(map(str, choices))} (moe_tp "
                       f"{', '.join(str(tp // e) for e in choices)})" if choices else
                       "no ROLLOUT_EP works with this engine size; change ROLLOUT_GPUS_PER_ENGINE")
                shaped += [f"SGLang engines of ROLLOUT_GPUS_PER_ENGINE = {tp} GPUs with ROLLOUT_EP = {ep}: {line}; "
                           f"{fix}" for line in found]
    elif ep != 1:
        shaped.append(f"ROLLOUT_EP = {ep} needs a MoE model; this model is dense: set ROLLOUT_EP=1")
    return out + [f"{line} [model shape: {source}]" for line in shaped]
