"""Rollout engine: samples from a quantised copy of the policy and returns its own log-probs (``rollout_log_probs``).

Mirrors SGLang in slime: the engine holds FP8 (or BF16) weights re-quantised from the trainer's fp32 weights at every
``sync``; each sampled token's log-prob is ``log_softmax(logits / temperature)`` from the same forward that sampled
it (the logits divided by the engine's own ``engine_temperature`` too, 1 unless a ``tempX`` mode asks otherwise);
a response stops at EOS, which is its last token. Each prompt is prefilled once and its KV cache shared by its
samples; decoding runs one batch over all prompts x samples. For a mixture-of-experts policy the engine records the
expert set it used at every position it computed, prompt positions included (SGLang's ``return_routed_experts``,
slime's ``Sample.rollout_routed_experts`` of shape [tokens - 1, layers, top_k]).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .policy import TinyPolicy
from .precision import OverflowCounter
from .quant import QuantConfig, as_quant_config, quantize_model, sync_quantized
from .task import EOS, PAD


@dataclass
class Rollout:
    """Sampled responses; the ``n_samples`` samples of prompt ``i`` are rows ``i*n_samples .. (i+1)*n_samples-1``.

    prompts: LongTensor [N, P]; responses: LongTensor [N, R], PAD after each response's last token;
    response_lengths: LongTensor [N], tokens generated (EOS included); rollout_log_probs: float32 [N, R],
    the engine's log-prob of each generated token, 0 after the end; truncated: BoolTensor [N], True when the
    response hit ``max_new_tokens`` without EOS; routing (MoE only, else None): LongTensor [N, P + R - 1, layers,
    top_k], the expert sets of the positions the engine fed (``tokens[:, :-1]``; after a response's end, whatever
    the engine computed there); nonfinite: BoolTensor [N], True when the engine's logits turned NaN or infinite
    during the response (a blown-up policy; the response was ended with EOS there, see ``_next_token``).
    """

    prompts: Tensor
    responses: Tensor
    response_lengths: Tensor
    rollout_log_probs: Tensor
    truncated: Tensor
    n_samples: int
    routing: Tensor | None = None
    nonfinite: Tensor | None = None

    @property
    def prompt_len(self) -> int:
        return self.prompts.shape[1]

    @property
    def tokens(self) -> Tensor:
        """Prompt and response, LongTensor [N, P + R]."""
        return torch.cat([self.prompts, self.responses], dim=1)

    @property
    def response_mask(self) -> Tensor:
        """BoolTensor [N, R], True on generated tokens."""
        return torch.arange(self.responses.shape[1], device=self.responses.device) < self.response_lengths[:, None]

    @property
    def group_ids(self) -> Tensor:
        """Index of each sample's prompt, LongTensor [N]."""
        return torch.arange(self.prompts.shape[0], device=self.prompts.device) // self.n_samples

    def response_lists(self) -> list[list[int]]:
        """Generated token ids per sample (slime's ``response`` tokens)."""
        return [row[:n].tolist() for row, n in zip(self.responses, self.response_lengths.tolist())]

    def log_prob_lists(self) -> list[Tensor]:
        """Per-sample 1-D tensors of ``rollout_log_probs`` (slime's ``Sample.rollout_log_probs``)."""
        return [row[:n].clone() for row, n in zip(self.rollout_log_probs, self.response_lengths.tolist())]


class RolloutEngine:
    """Quantised inference copy of a ``TinyPolicy``.

    quant: a mode of ``quant.QUANT_MODES`` (``"e4m3"`` default, ``"e4m3-w"``, ``"e5m2"``, ``"bf16"``, ``"fp16"``,
    ``"none"``, ...) or a ``QuantConfig`` (its trainer precision, ``train``, is the trainer's business).
    """

    def __init__(self, policy: TinyPolicy, quant: str | QuantConfig = "e4m3") -> None:
        self.quant = as_quant_config(quant)
        self.model: TinyPolicy = quantize_model(policy, self.quant)

    @property
    def overflow(self) -> OverflowCounter | None:
        """A float16 engine's count of the values it rounded and of those that overflowed to infinity (None for
        other engines)."""
        return self.model.overflow

    def sync(self, policy: TinyPolicy) -> None:
        """Load the policy's current fp32 weights, re-quantising them (slime's weight sync)."""
        sync_quantized(self.model, policy, self.quant)

    def generate(
        self,
        prompts: Tensor,
        n_samples: int = 1,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        generator: torch.Generator | None = None,
    ) -> Rollout:
        """Sample ``n_samples`` responses per prompt at ``temperature`` (> 0); deterministic given ``generator``.
        ``max_new_tokens`` defaults to the positions left after the prompt."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0 for sampling, got {temperature}; use greedy()")
        return self._decode(prompts, n_samples, temperature, max_new_tokens, generator)

    def greedy(self, prompts: Tensor, max_new_tokens: int | None = None) -> Rollout:
        """Greedy (argmax) responses, one per prompt; log-probs at temperature 1 (times the engine temperature)."""
        return self._decode(prompts, 1, None, max_new_tokens, None)

    def score(
        self,
        tokens: Tensor,
        prompt_len: int,
        response_mask: Tensor | None = None,
        temperature: float = 1.0,
    ) -> tuple[Tensor, Tensor | None]:
        """The engine's teacher-forced log-probs and routing (see ``TinyPolicy.score``), without the KV cache."""
        with torch.inference_mode():
            log_probs, routing, _ = self.model.score(tokens, prompt_len, response_mask,
                                                     temperature * self.quant.engine_temperature)
        return log_probs.clone(), None if routing is None else routing.clone()

    def _decode(
        self,
        prompts: Tensor,
        n_samples: int,
        temperature: float | None,
        max_new_tokens: int | None,
        generator: torch.Generator | None,
    ) -> Rollout:
        if prompts.dim() != 2 or prompts.shape[1] < 1:
            raise ValueError(f"prompts: expected a LongTensor [n, P], got shape {tuple(prompts.shape)}")
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        prompt_len = prompts.shape[1]
        room = self.model.config.max_len - prompt_len
        max_new = room if max_new_tokens is None else max_new_tokens
        if not 1 <= max_new <= room:
            raise ValueError(
                f"max_new_tokens must be in 1..{room} (policy max_len {self.model.config.max_len} minus prompt "
                f"length {prompt_len}), got {max_new}"
            )
        device = prompts.device
        scale = self.quant.engine_temperature * (1.0 if temperature is None else temperature)
        with torch.inference_mode():
            prefill = self.model.new_cache(prompts.shape[0], prompt_len)
            forward = self.model.run(prompts.long(), prefill)
            hidden = forward.hidden[:, -1].repeat_interleave(n_samples, dim=0)
            routes = [] if forward.routing is None else [forward.routing.repeat_interleave(n_samples, dim=0)]
            cache = prefill.repeat_rows(n_samples, prompt_len + max_new)
            repeated = prompts.long().repeat_interleave(n_samples, dim=0)
            n = repeated.shape[0]
            responses = torch.full((n, max_new), PAD, dtype=torch.long, device=device)
            log_probs = torch.zeros(n, max_new, device=device)
            finished = torch.zeros(n, dtype=torch.bool, device=device)
            nonfinite = torch.zeros(n, dtype=torch.bool, device=device)
            lengths = torch.zeros(n, dtype=torch.long, device=device)
            steps = 0
            while True:
                token, token_log_prob, broken = _next_token(self.model.lm_head(hidden) / scale,
                                                            temperature is not None, generator)
                nonfinite |= broken & ~finished
                responses[:, steps] = token.masked_fill(finished, PAD)
                log_probs[:, steps] = token_log_prob.masked_fill(finished, 0.0)
                lengths += ~finished
                finished |= token == EOS
                steps += 1
                if steps == max_new or bool(finished.all()):
                    break
                forward = self.model.run(token[:, None], cache)
                hidden = forward.hidden[:, -1]
                if forward.routing is not None:
                    routes.append(forward.routing)
        return Rollout(
            prompts=repeated.clone(),
            responses=responses[:, :steps].clone(),
            response_lengths=lengths.clone(),
            rollout_log_probs=log_probs[:, :steps].clone(),
            truncated=~finished,
            n_samples=n_samples,
            routing=torch.cat(routes, dim=1).clone() if routes else None,
            nonfinite=nonfinite.clone(),
        )


def _next_token(logits: Tensor, sample: bool, generator: torch.Generator | None) -> tuple[Tensor, Tensor, Tensor]:
    """One decoding step from logits [n, V] (already divided by the temperature): the token (sampled, or the argmax),
    its log-prob, and a BoolTensor [n] marking rows whose logits hold a NaN or an infinity (a blown-up policy). Such a
    row is not sampled: it emits EOS with log-prob 0 (the guard chose it with certainty), so the response ends there
    instead of ``torch.multinomial`` failing on an invalid distribution."""
    broken = ~torch.isfinite(logits).all(dim=-1)
    logits = logits.masked_fill(broken[:, None], 0.0)
    step_log_probs = torch.log_softmax(logits, dim=-1)
    if sample:
        token = torch.multinomial(step_log_probs.exp(), 1, generator=generator).squeeze(1)
    else:
        token = logits.argmax(dim=-1)
    token = token.masked_fill(broken, EOS)
    token_log_prob = step_log_probs.gather(1, token[:, None]).squeeze(1).masked_fill(broken, 0.0)
    return token, token_log_prob, broken
