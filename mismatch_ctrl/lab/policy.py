"""Tiny decoder-only transformer policy (fp32): pre-norm blocks, learned positions, KV cache, response log-probs.

Every matrix multiply is an ``nn.Linear`` (attention qkv/proj, MLP fc1/fc2, untied ``lm_head``) so that
``quant.quantize_model`` can swap them for quantised copies.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .task import Task


@dataclass(frozen=True)
class PolicyConfig:
    """Shape of the policy. The defaults (width 64, 2 layers, 4 heads, MLP 256) give ~104k parameters on ``add``."""

    vocab_size: int
    max_len: int
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_len", "d_model", "n_layers", "n_heads", "d_ff"):
            if getattr(self, name) < 1:
                raise ValueError(f"PolicyConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"PolicyConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

    @classmethod
    def for_task(cls, task: Task, **shape: int) -> PolicyConfig:
        """Config sized for a task: its vocabulary and prompt_len + generation_len positions."""
        return cls(vocab_size=task.vocab_size, max_len=task.prompt_len + task.generation_len, **shape)

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
    def empty(cls, config: PolicyConfig, batch: int, max_len: int | None = None) -> KVCache:
        """Zeroed cache for ``batch`` rows and ``max_len`` positions (default: all the policy's)."""
        max_len = config.max_len if max_len is None else max_len
        if not 1 <= max_len <= config.max_len:
            raise ValueError(f"KVCache max_len must be in 1..{config.max_len} (the policy's positions), got {max_len}")
        shape = (config.n_layers, batch, config.n_heads, max_len, config.d_model // config.n_heads)
        return cls(torch.zeros(shape), torch.zeros(shape))

    @property
    def max_len(self) -> int:
        return self.keys.shape[3]

    def repeat_rows(self, repeats: int, max_len: int) -> KVCache:
        """A new cache of ``max_len`` positions holding each row of this one ``repeats`` times in a row (a prompt
        prefilled once, shared by its samples)."""
        if max_len < self.length:
            raise ValueError(f"max_len ({max_len}) must hold the {self.length} filled positions")
        n_layers, batch, n_heads, _, head_dim = self.keys.shape
        keys = torch.zeros(n_layers, batch * repeats, n_heads, max_len, head_dim)
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
            mask = None if t == 1 else torch.arange(end) <= torch.arange(start, end)[:, None]
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.proj(out.transpose(1, 2).reshape(n, t, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln1(x)), then x + fc2(gelu(fc1(ln2(x))))."""

    def __init__(self, config: PolicyConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)

    def forward(self, x: Tensor, cache: KVCache | None, layer: int) -> Tensor:
        x = x + self.attn(self.ln1(x), cache, layer)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


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
                std = residual_std if name.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(param, 0.0, std, generator=generator)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for ``batch`` rows and up to ``max_len`` positions (default: all the policy's)."""
        return KVCache.empty(self.config, batch, max_len)

    def forward(self, tokens: Tensor, cache: KVCache | None = None) -> Tensor:
        """Logits [n, T, V] for tokens [n, T]. With a cache the tokens continue its ``length`` positions and are
        appended to it (prefill: pass the whole prompt to an empty cache; decode: one token per call)."""
        return self.lm_head(self.hidden_states(tokens, cache))

    def hidden_states(self, tokens: Tensor, cache: KVCache | None = None) -> Tensor:
        """Final-norm hidden states [n, T, d_model] (``forward`` without the LM head; same cache contract)."""
        n, t = tokens.shape
        start = 0 if cache is None else cache.length
        limit = self.config.max_len if cache is None else cache.max_len
        if start + t > limit:
            raise ValueError(f"sequence of {start + t} positions exceeds the limit of {limit}; raise max_len")
        x = self.tok_emb(tokens) + self.pos_emb(torch.arange(start, start + t))
        for layer, block in enumerate(self.blocks):
            x = block(x, cache, layer)
        if cache is not None:
            cache.length += t
        return self.norm(x)

    def token_log_probs(
        self,
        tokens: Tensor,
        prompt_len: int,
        response_mask: Tensor | None = None,
        temperature: float = 1.0,
    ) -> Tensor:
        """Teacher-forced log-probs [n, R] of the response tokens ``tokens[:, prompt_len:]`` (R = T - prompt_len):
        ``log_softmax(logits / temperature)`` at the next token, fp32, 0 where ``response_mask`` is False.
        Differentiable; wrap in ``torch.inference_mode()`` for a recompute without gradients."""
        if tokens.dim() != 2 or not 1 <= prompt_len < tokens.shape[1]:
            raise ValueError(
                f"tokens [n, T] with 1 <= prompt_len < T required, got shape {tuple(tokens.shape)}, "
                f"prompt_len {prompt_len}"
            )
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        logits = self.lm_head(self.hidden_states(tokens[:, :-1])[:, prompt_len - 1 :])
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
        taken = log_probs.gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)
        if response_mask is None:
            return taken
        if response_mask.shape != taken.shape:
            raise ValueError(f"response_mask: expected shape {tuple(taken.shape)}, got {tuple(response_mask.shape)}")
        return taken.masked_fill(~response_mask.bool(), 0.0)
