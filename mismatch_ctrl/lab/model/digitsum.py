"""The digit-sum task with an optional scratchpad: answers that RL makes longer, for the length surge
(docs/lab-surge.md)."""

from __future__ import annotations

import torch
from torch import Tensor

from .task import BOS, DIGIT0, EOS, EQUALS, PAD, PLUS, Responses, Task, pad_responses


class DigitSumTask(Task):
    """A sum of 3-8 digits modulo 4, with an optional scratchpad of running sums: a task where longer answers earn
    more reward.

    Prompt ``<bos> d_1 .. d_k <pad>.. =`` (length ``max_terms + 2``; k uniform in [min_terms, max_terms], the digits
    uniform in [0, modulus), left-aligned). The answer is ``a = (d_1 + .. + d_k) mod modulus``. Two correct forms:

    - direct: ``a <eos>`` (2 tokens): the whole sum in one forward pass, which the 2-layer policy learns little of;
    - scratchpad: ``+ s_1 .. s_k = a <eos>`` (k + 4 tokens) with the running sums ``s_j = (d_1 + .. + d_j) mod
      modulus`` (so ``s_k = a``): each token adds one digit, fetched at a fixed offset, to the previous one.

    Reward [ours]: cut the response at its first EOS (none: 0); 1.0 iff what remains is the direct form ``a`` or a
    scratchpad (opened by ``+``) whose last ``=`` is followed by exactly ``a``. The scratchpad's content is not
    scored: only the final answer is. (Without the opening ``+`` a response such as ``3 0 1 = a`` scores 0: in a
    first version it did not, and RL at lr 1e-3 grew such responses, which guess ``a`` no better than the direct
    form, before the scratchpad took over.)
    ``answers`` gives the scratchpad form; the warm-up's ``demonstrations`` (see there) teach both forms and a
    policy that opens a scratchpad for ``opening_share`` (1.5%) of the prompts. ``generation_len`` (36) is 3x the
    longest scratchpad and ~15x the mean length of a policy that answers directly 98.5% of the time (~2.1): room for
    the surge.
    """

    name = "digitsum"
    length_records = True
    skill_prefix = (PLUS,)

    def __init__(self, min_terms: int = 3, max_terms: int = 8, modulus: int = 4, scratch_share: float = 0.5,
                 opening_share: float = 0.015, seed: int = 0, eval_seed: int = 1_000_003) -> None:
        super().__init__(seed=seed, eval_seed=eval_seed)
        if not 1 <= min_terms <= max_terms:
            raise ValueError(f"need 1 <= min_terms <= max_terms, got {min_terms}, {max_terms}")
        if not 2 <= modulus <= 10:
            raise ValueError(f"modulus must be in 2..10 (digits 0 .. modulus - 1), got {modulus}")
        for name, share in (("scratch_share", scratch_share), ("opening_share", opening_share)):
            if not 0.0 < share < 1.0:
                raise ValueError(f"{name} must be in (0, 1), got {share}")
        self.min_terms, self.max_terms, self.modulus = min_terms, max_terms, modulus
        self.scratch_share, self.opening_share = scratch_share, opening_share
        self.prompt_len = max_terms + 2
        self.max_response_len = max_terms + 4
        self.generation_len = 3 * self.max_response_len

    def make_prompts(self, n: int, generator: torch.Generator) -> Tensor:
        terms = torch.randint(self.min_terms, self.max_terms + 1, (n,), generator=generator)
        digits = DIGIT0 + torch.randint(0, self.modulus, (n, self.max_terms), generator=generator)
        prompts = torch.empty((n, self.prompt_len), dtype=torch.long)
        prompts[:, 0] = BOS
        prompts[:, 1:-1] = digits.masked_fill(torch.arange(self.max_terms) >= terms[:, None], PAD)
        prompts[:, -1] = EQUALS
        return prompts

    def running_sums(self, prompts: Tensor) -> tuple[Tensor, Tensor]:
        """The running sums ``s_1 .. s_max_terms`` mod ``modulus`` (LongTensor [n, max_terms]; past k they stay
        ``a``) and the number of terms k [n]."""
        self._check_prompts(prompts)
        digits = prompts[:, 1:-1]
        present = digits != PAD
        return ((digits - DIGIT0) * present).cumsum(dim=1) % self.modulus, present.sum(dim=1)

    def targets(self, prompts: Tensor) -> Tensor:
        """The final answers as digit tokens, LongTensor [n]."""
        return DIGIT0 + self.running_sums(prompts)[0][:, -1]

    def answers(self, prompts: Tensor) -> Tensor:
        sums, terms = self.running_sums(prompts)
        position = torch.arange(self.max_response_len)
        out = torch.full((prompts.shape[0], self.max_response_len), PAD, dtype=torch.long)
        out[:, 0] = PLUS
        out[:, 1:1 + self.max_terms] = DIGIT0 + sums
        out = torch.where(position == terms[:, None] + 1, EQUALS, out)
        out = torch.where(position == terms[:, None] + 2, DIGIT0 + sums[:, -1:], out)
        out = torch.where(position == terms[:, None] + 3, EOS, out)
        return out.masked_fill(position > terms[:, None] + 3, PAD)

    def direct_answers(self, prompts: Tensor) -> Tensor:
        """The direct form ``a <eos>``, LongTensor [n, max_response_len]."""
        out = torch.full((prompts.shape[0], self.max_response_len), PAD, dtype=torch.long)
        out[:, 0] = self.targets(prompts)
        out[:, 1] = EOS
        return out

    def demonstrations(self, prompts: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
        """The scratchpad form for a share ``scratch_share`` of the prompts (drawn from ``generator``), the direct form
        for the rest; the first token of a scratchpad weighs ``w = o (1 - s) / (s (1 - o))`` in the loss (s =
        ``scratch_share``, o = ``opening_share``), every other token 1, so that the weighted cross-entropy is lowest
        where the policy opens a scratchpad with probability o, while a share s of the examples teach it."""
        scratch = torch.rand(prompts.shape[0], generator=generator) < self.scratch_share
        labels = torch.where(scratch[:, None], self.answers(prompts), self.direct_answers(prompts))
        s, o = self.scratch_share, self.opening_share
        weights = torch.ones(labels.shape)
        weights[:, 0] = torch.where(scratch, o * (1 - s) / (s * (1 - o)), 1.0)
        return labels, weights

    def reward(self, prompts: Tensor, responses: Responses) -> Tensor:
        """1.0 iff the response has an EOS and before it is exactly the answer digit, or ``+``, anything, ``=`` and
        exactly the answer digit (the last ``=`` before the EOS decides); else 0.0. Float32 [n]."""
        got = pad_responses(responses)
        target = self.targets(prompts)
        if got.shape[0] != prompts.shape[0]:
            raise ValueError(f"responses: {got.shape[0]} rows for {prompts.shape[0]} prompts; pass one per prompt")
        width = got.shape[1]
        if width == 0:
            return torch.zeros(got.shape[0])
        position = torch.arange(width)
        is_eos = got == EOS
        eos = torch.where(is_eos.any(dim=1), is_eos.long().argmax(dim=1), width)
        last_equals = torch.where((got == EQUALS) & (position < eos[:, None]), position, -1).max(dim=1).values
        answer = got.gather(1, (last_equals + 1).clamp(max=width - 1)[:, None]).squeeze(1)
        well_formed = (last_equals == -1) | (got[:, 0] == PLUS)
        return ((eos < width) & (eos == last_equals + 2) & (answer == target) & well_formed).float()

    def rollout_metrics(self, responses: Tensor) -> dict[str, float]:
        """``scratch_fraction``: the share of the responses that open a scratchpad (first token ``+``)."""
        opened = pad_responses(responses, 1)[:, 0] == PLUS
        return {"scratch_fraction": float(opened.float().mean())}
