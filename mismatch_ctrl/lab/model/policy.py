"""Tiny decoder-only transformer policy (fp32): pre-norm blocks, learned positions, KV cache, response log-probs.

Kinds (``POLICY_KINDS``): ``dense`` (each block's MLP is fc1 -> GELU -> fc2), ``moe`` and ``moe-large`` (each
block's MLP is a top-k mixture of experts, Qwen3-MoE style: a linear router ``gate``, the top-k experts of its
logits, their outputs weighted by the softmax over the chosen logits). A forward pass returns the expert sets it used
(``Forward.routing``) and can be told to use given ones instead (``replay``: slime's rollout routing replay, R3).

Every matrix multiply is an ``nn.Linear`` (attention qkv/proj, dense MLP fc1/fc2, router gate, untied ``lm_head``)
or the stacked expert weights of ``Experts``, so that ``quant.quantize_model`` can swap them for quantised copies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .task import Task

PolicyKind = Literal["dense", "moe"]
POLICY_KINDS: dict[str, dict[str, int]] = {
    "dense": {"d_ff": 256},
    "moe": {"d_ff": 32, "n_experts": 8, "top_k": 2},
    "moe-large": {"d_model": 256, "n_layers": 4, "n_heads": 8, "d_ff": 128, "n_experts": 16, "top_k": 2},
}
"""Shape of each policy kind (what it leaves out is ``PolicyConfig``'s default). On ``add`` the MoE has 105,664
parameters and the dense 103,744 (the MoE's 8 experts of width 32 hold as many weights as the dense MLP of width 256;
each token uses 2 of them). ``moe-large``, for a GPU: 4 layers of width 256, 16 experts of width 128, top-2; 5.3M
parameters on ``add`` (``test_lab_engine``)."""


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of the policy. The defaults (width 64, 2 layers, 4 heads, MLP 256) give 103,744 parameters on ``add``.

    ``n_experts`` = 0: dense MLP of width ``d_ff``; ``n_experts`` > 0: that many experts of width ``d_ff`` each, of
    which every token uses ``top_k``.
    """

    vocab_size: int
    max_len: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    n_experts: int = 0
    top_k: int = 2

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "d_ff", "top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"PolicyConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_experts < 0 or (self.n_experts and self.top_k > self.n_experts):
            raise ValueError(f"PolicyConfig: need n_experts = 0 (dense) or top_k <= n_experts, got n_experts "
                             f"{self.n_experts}, top_k {self.top_k}")

    @property
    def kind(self) -> PolicyKind:
        return "moe" if self.n_experts else "dense"

    @classmethod
    def for_task(cls, task: Task, **shape: int) -> PolicyConfig:
        """Config sized for a task: its vocabulary and prompt_len + generation_len positions."""
        return cls(vocab_size=task.vocab_size, max_len=task.prompt_len + task.generation_len, **shape)

    @classmethod
    def of_kind(cls, kind: str, task: Task, **shape: int) -> PolicyConfig:
        """Config of a policy kind (``POLICY_KINDS``) for a task; ``shape`` overrides the kind's shape."""
        if kind not in POLICY_KINDS:
            raise ValueError(f"policy: unknown kind {kind!r}; choose one of {sorted(POLICY_KINDS)}")
        return cls.for_task(task, **{**POLICY_KINDS[kind], **shape})

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


class KVCache:
    """Keys and values [n_layers, batch, n_heads, max_len, head_dim]; the first ``length`` positions are filled.

    For inference only (written in place; use under ``torch.inference_mode()`` or ``torch.no_grad()``).
    """

    def __init__(self, keys: Tensor, values: Tensor, length: int = 0) -> None:
        if keys.shape != values.shape or keys.dim() != 5:
            raise ValueError(f"keys and values must share a 5-D shape, got {tuple(keys.shape)}, {tuple(values.shape)}")
        self.keys, self.values, self.length = keys, values, length

    @classmethod
    def empty(cls, config: PolicyConfig, batch: int, max_len: int | None = None,
              device: torch.device | str = "cpu") -> KVCache:
        """Zeroed cache for ``batch`` rows and ``max_len`` positions (default: all the policy's) on ``device``."""
        max_len = config.max_len if max_len is None else max_len
        if not 1 <= max_len <= config.max_len:
            raise ValueError(f"KVCache max_len must be in 1..{config.max_len} (the policy's positions), got {max_len}")
        shape = (config.n_layers, batch, config.n_heads, max_len, config.d_model // config.n_heads)
        return cls(torch.zeros(shape, device=device), torch.zeros(shape, device=device))

    @property
    def max_len(self) -> int:
        return self.keys.shape[3]

    def repeat_rows(self, repeats: int, max_len: int) -> KVCache:
        """A new cache of ``max_len`` positions holding each row of this one ``repeats`` times in a row (a prompt
        prefilled once, shared by its samples)."""
        if max_len < self.length:
            raise ValueError(f"max_len ({max_len}) must hold the {self.length} filled positions")
        n_layers, batch, n_heads, _, head_dim = self.keys.shape
        keys = torch.zeros(n_layers, batch * repeats, n_heads, max_len, head_dim, device=self.keys.device)
        values = torch.zeros_like(keys)
        keys[:, :, :, : self.length] = self.keys[:, :, :, : self.length].repeat_interleave(repeats, dim=1)
        values[:, :, :, : self.length] = self.values[:, :, :, : self.length].repeat_interleave(repeats, dim=1)
        return KVCache(keys, values, self.length)


class SelfAttention(nn.Module):
    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        n, t, d = x.shape
        q, k, v = self.qkv(x).view(n, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        if cache is None or cache.length == 0:
            if cache is not None:
                cache.keys[layer, :, :, :t] = k
                cache.values[layer, :, :, :t] = v
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            start, end = cache.length, cache.length + t
            cache.keys[layer, :, :, start:end] = k
            cache.values[layer, :, :, start:end] = v
            keys, values = cache.keys[layer, :, :, :end], cache.values[layer, :, :, :end]
            mask = None if t == 1 else (torch.arange(end, device=x.device)
                                        <= torch.arange(start, end, device=x.device)[:, None])
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class Experts(nn.Module):
    """``n_experts`` GELU MLPs of width ``d_ff`` with stacked weights (``fc1_weight`` [E, d_ff, d], ``fc2_weight``
    [E, d, d_ff], as ``nn.Linear`` stores them). ``forward(x, weights)`` = sum_e weights[..., e] fc2_e(gelu(fc1_e(x))),
    computed for every expert at once (the tiny experts make that cheaper than dispatching tokens); an expert with
    weight 0 contributes exactly 0 and receives no gradient."""

    def __init__(self, n_experts: int, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.fc1_weight = nn.Parameter(torch.empty(n_experts, d_ff, d_model))
        self.fc1_bias = nn.Parameter(torch.empty(n_experts, d_ff))
        self.fc2_weight = nn.Parameter(torch.empty(n_experts, d_model, d_ff))
        self.fc2_bias = nn.Parameter(torch.empty(n_experts, d_model))

    def forward(self, x: Tensor, weights: Tensor) -> Tensor:
        hidden = F.gelu(torch.einsum("...d,efd->...ef", x, self.fc1_weight) + self.fc1_bias)
        out = torch.einsum("...ef,edf->...ed", hidden, self.fc2_weight) + self.fc2_bias
        return torch.einsum("...e,...ed->...d", weights, out)


class MoE(nn.Module):
    """Top-k mixture of experts (Qwen3-MoE with ``norm_topk_prob``): router logits ``g = gate(x)``; expert set
    ``S`` = the top-k of ``g`` (or the replayed set); weights ``softmax(g[S])``, i.e. the softmax over all experts
    renormalised over ``S``; output = the weighted sum of the experts in ``S``."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.top_k = config.top_k
        self.gate = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = Experts(config.n_experts, config.d_model, config.d_ff)

    def forward(self, x: Tensor, replay: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Output [..., d], the expert sets used (LongTensor [..., top_k], ascending) and the router logits
        [..., n_experts]. ``replay`` (LongTensor [..., top_k]) replaces the router's own choice."""
        logits = self.gate(x)
        if replay is None:
            chosen = logits.topk(self.top_k, dim=-1).indices.sort(dim=-1).values
        else:
            if replay.shape != (*logits.shape[:-1], self.top_k):
                raise ValueError(f"replay: expected expert sets of shape {(*logits.shape[:-1], self.top_k)}, got "
                                 f"{tuple(replay.shape)}")
            chosen = replay.long()
        gate_weights = torch.softmax(logits.gather(-1, chosen), dim=-1)
        weights = torch.zeros_like(logits).scatter(-1, chosen, gate_weights)
        return self.experts(x, weights), chosen, logits


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)) with mlp = fc2(gelu(fc1(.))) (dense) or
    a mixture of experts (MoE)."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        if config.n_experts:
            self.moe = MoE(config)
        else:
            self.fc1 = nn.Linear(config.d_model, config.d_ff)
            self.fc2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: Tensor, cache: KVCache | None, layer: int,
                replay: Tensor | None = None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """New residual stream, and for MoE the expert sets and router logits of each position (else None)."""
        x = x + self.attn(self.ln1(x), cache, layer)
        if not hasattr(self, "moe"):
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)))), None, None
        out, chosen, logits = self.moe(self.ln2(x), replay)
        return x + out, chosen, logits


@dataclass
class Forward:
    """One forward pass: final-norm hidden states [n, T, d_model]; for MoE the expert sets used at every position
    and layer (``routing``, LongTensor [n, T, n_layers, top_k], ascending) and the router logits
    ([n, T, n_layers, n_experts]); None for a dense policy."""

    hidden: Tensor
    routing: Tensor | None
    router_logits: Tensor | None


class Scored(NamedTuple):
    """Teacher-forced response log-probs [n, R] and, for MoE, the routing and router logits of the input positions
    ([n, T - 1, n_layers, top_k] and [n, T - 1, n_layers, n_experts]; None for a dense policy)."""

    log_probs: Tensor
    routing: Tensor | None
    router_logits: Tensor | None


def load_balance_loss(router_logits: Tensor, routing: Tensor, mask: Tensor | None = None) -> Tensor:
    """Switch-Transformer auxiliary loss per layer, averaged over layers: ``E * sum_e f_e * P_e`` with ``f_e`` the
    share of the (position, slot) assignments routed to expert e and ``P_e`` the mean softmax probability of e over
    positions (``mask``, BoolTensor [n, T], selects positions). 1.0 when the load is uniform.

    router_logits [n, T, L, E], routing [n, T, L, k] as in :class:`Forward`."""
    n_experts = router_logits.shape[-1]
    keep = (torch.ones(router_logits.shape[:2], dtype=torch.bool, device=router_logits.device) if mask is None
            else mask.bool())
    logits, chosen = router_logits[keep], routing[keep]
    probs = torch.softmax(logits, dim=-1).mean(dim=0)
    counts = F.one_hot(chosen, n_experts).sum(dim=(0, 2)).float()
    share = counts / counts.sum(dim=-1, keepdim=True)
    return n_experts * (share * probs).sum(dim=-1).mean()


class TinyPolicy(nn.Module):
    """Decoder-only transformer over token ids; fp32. ``seed`` makes the initialisation reproducible (GPT-2 style:
    N(0, 0.02) weights, residual output projections scaled by 1/sqrt(2 n_layers), zero biases)."""

    def __init__(self, config: PolicyConfig, seed: int = 0) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.max_len, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        for name, param in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(param)
            elif ".ln" in name or name.startswith("norm."):
                nn.init.ones_(param)
            else:
                std = residual_std if name.endswith(("proj.weight", "fc2.weight", "fc2_weight")) else 0.02
                nn.init.normal_(param, 0.0, std, generator=generator)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for ``batch`` rows and up to ``max_len`` positions (default: all the policy's), on the
        policy's device."""
        return KVCache.empty(self.config, batch, max_len, self.lm_head.weight.device)

    def forward(self, tokens: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits [n, T, V] for tokens [n, T]. With a cache the tokens continue its ``length`` positions and are
        appended to it (prefill: pass the whole prompt to an empty cache; decode: one token per call)."""
        return self.lm_head(self.run(tokens, cache).hidden)

    def run(self, tokens: Tensor, cache: KVCache | None = None, replay: Tensor | None = None) -> Forward:
        """The forward pass up to the final norm, with the MoE routing (same cache contract as ``forward``).
        ``replay`` (LongTensor [n, T, n_layers, top_k]) makes every MoE layer use those expert sets."""
        n, t = tokens.shape
        start = 0 if cache is None else cache.length
        limit = self.config.max_len if cache is None else cache.max_len
        if start + t > limit:
            raise ValueError(f"sequence of {start + t} positions exceeds the limit of {limit}; raise max_len")
        if replay is not None and not self.config.n_experts:
            raise ValueError("replay: a dense policy has no experts to replay")
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(start, start + t, device=tokens.device))
        routes, logits = [], []
        for layer, block in enumerate(self.blocks):
            x, chosen, router_logits = block(x, cache, layer, None if replay is None else replay[:, :, layer])
            routes.append(chosen)
            logits.append(router_logits)
        if cache is not None:
            cache.length += t
        if not self.config.n_experts:
            return Forward(self.norm(x), None, None)
        return Forward(self.norm(x), torch.stack(routes, dim=2), torch.stack(logits, dim=2))

    def score(
        self,
        tokens: Tensor,
        prompt_len: int,
        response_mask: Tensor | None = None,
        temperature: float = 1.0,
        replay: Tensor | None = None,
    ) -> Scored:
        """Teacher-forced log-probs [n, R] of the response tokens ``tokens[:, prompt_len:]`` (R = T - prompt_len):
        ``log_softmax(logits / temperature)`` at the next token, fp32, 0 where ``response_mask`` is False, with the
        routing the forward used at the input positions ``tokens[:, :-1]`` (:class:`Scored`). Differentiable; wrap
        in ``torch.inference_mode()`` for a recompute without gradients. ``replay``: expert sets of the input
        positions ([n, T - 1, n_layers, top_k], see ``run``)."""
        if tokens.dim() != 2 or not 1 <= prompt_len < tokens.shape[1]:
            raise ValueError(
                f"tokens [n, T] with 1 <= prompt_len < T required, got shape {tuple(tokens.shape)}, "
                f"prompt_len {prompt_len}"
            )
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        forward = self.run(tokens[:, :-1], replay=replay)
        logits = self.lm_head(forward.hidden[:, prompt_len - 1 :])
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        taken = log_probs.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)
        if response_mask is not None:
            if response_mask.shape != taken.shape:
                raise ValueError(f"response_mask: expected shape {tuple(taken.shape)}, got "
                                 f"{tuple(response_mask.shape)}")
            taken = taken.masked_fill(~response_mask.bool(), 0.0)
        return Scored(taken, forward.routing, forward.router_logits)
