"""Verifiable lab tasks with variable-length answers: their shared vocabulary and base class, reversed addition
(short), digit reversal (long) and long digit reversal (64-128-token answers). The digit sum with an optional
scratchpad (answers that RL makes longer) is in ``digitsum.py``; ``tasks.py`` names them all.

The tasks share one vocabulary, have a fixed prompt length, and score a response 1.0 iff it is exactly the answer
followed by EOS (tokens after the first EOS are ignored, a response without EOS scores 0); ``digitsum`` scores only the
final answer after an optional scratchpad. The long task offers a documented partial-credit variant.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch
from torch import Tensor

PAD, BOS, EOS, PLUS, EQUALS = 0, 1, 2, 3, 4
DIGIT0 = 5
VOCAB_SIZE = DIGIT0 + 10
TOKEN_NAMES = ("<pad>", "<bos>", "<eos>", "+", "=", *"0123456789")

Responses = Tensor | Sequence[Sequence[int]] | Sequence[Tensor]


def detokenize(ids: Sequence[int] | Tensor) -> str:
    """Readable text of token ids, e.g. ``"<bos>0012+0345=" ``."""
    return "".join(TOKEN_NAMES[int(i)] for i in ids)


def pad_responses(responses: Responses, width: int | None = None) -> Tensor:
    """Responses as a LongTensor [n, R] padded with PAD; with ``width``, cut or padded to that many columns."""
    if isinstance(responses, Tensor):
        if responses.dim() != 2:
            raise ValueError(f"responses: expected a 2-D LongTensor [n, R], got shape {tuple(responses.shape)}")
        padded = responses.long()
    else:
        rows = [torch.as_tensor(r, dtype=torch.long).reshape(-1) for r in responses]
        longest = max((len(r) for r in rows), default=0)
        padded = torch.full((len(rows), longest), PAD, dtype=torch.long)
        for i, row in enumerate(rows):
            padded[i, : len(row)] = row
    if width is None:
        return padded
    if padded.shape[1] >= width:
        return padded[:, :width]
    return torch.nn.functional.pad(padded, (0, width - padded.shape[1]), value=PAD)


def cut_after_eos(responses: Tensor) -> Tensor:
    """Replace every token after the first EOS of each row by PAD."""
    is_eos = responses == EOS
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return responses.masked_fill(after_eos, PAD)


class Task(ABC):
    """A verifiable task: fixed-length prompts, answers ending in EOS, and a vectorised reward.

    ``seed`` seeds the training prompt stream (``generator()``); ``eval_seed`` the held-out ``eval_prompts``.
    ``max_response_len`` bounds the answers; ``generation_len`` (larger) bounds what a policy may generate, leaving
    room for the response-length surge of a degrading policy.
    """

    name: str
    prompt_len: int
    max_response_len: int
    generation_len: int
    vocab_size: int = VOCAB_SIZE
    length_records: bool = False
    """Whether a lab run logs the mismatch by response length per rollout (``length_stats.length_buckets``)."""
    skill_prefix: tuple[int, ...] = ()
    """Tokens the warm-up's sample accuracy forces at the start of each response (``warmup.sample_accuracy``)."""

    def __init__(self, seed: int = 0, eval_seed: int = 1_000_003) -> None:
        if seed == eval_seed:
            raise ValueError(f"eval_seed must differ from seed (both {seed}) so eval prompts are held out")
        self.seed = seed
        self.eval_seed = eval_seed

    @abstractmethod
    def make_prompts(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` prompts as a LongTensor [n, prompt_len]."""

    @abstractmethod
    def answers(self, prompts: Tensor) -> Tensor:
        """Correct responses as a LongTensor [n, max_response_len]: answer tokens, EOS, then PAD."""

    def demonstrations(self, prompts: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
        """The warm-up's labels for ``prompts`` and the weight of each label token in its loss (None: all 1):
        ``answers``, unweighted. A task with several correct forms draws among them from ``generator``; this one
        draws nothing from it."""
        return self.answers(prompts), None

    def rollout_metrics(self, responses: Tensor) -> dict[str, float]:
        """The task's own per-rollout metrics of sampled responses [N, R] (a lab run logs them; none here)."""
        return {}

    def generator(self) -> torch.Generator:
        """A fresh generator seeded with ``seed`` for the training prompt stream."""
        return torch.Generator().manual_seed(self.seed)

    def eval_prompts(self, n: int) -> Tensor:
        """Held-out prompts, drawn from ``eval_seed`` (the same ``n`` always gives the same prompts)."""
        return self.make_prompts(n, torch.Generator().manual_seed(self.eval_seed))

    def answer_lengths(self, prompts: Tensor) -> Tensor:
        """Number of answer tokens including EOS, LongTensor [n]."""
        return (self.answers(prompts) != PAD).sum(dim=1)

    def reward(self, prompts: Tensor, responses: Responses) -> Tensor:
        """1.0 iff the response up to its first EOS equals the answer plus EOS, else 0.0; float32 [n]."""
        target, got = self._aligned(prompts, responses)
        return (got == target).all(dim=1).float()

    def _aligned(self, prompts: Tensor, responses: Responses) -> tuple[Tensor, Tensor]:
        self._check_prompts(prompts)
        got = cut_after_eos(pad_responses(responses))
        if got.shape[0] != prompts.shape[0]:
            raise ValueError(f"responses: {got.shape[0]} rows for {prompts.shape[0]} prompts; pass one per prompt")
        target = self.answers(prompts)
        width = max(got.shape[1], target.shape[1])
        return pad_responses(target, width), pad_responses(got, width)

    def _check_prompts(self, prompts: Tensor) -> None:
        if prompts.dim() != 2 or prompts.shape[1] != self.prompt_len:
            raise ValueError(
                f"prompts: expected a LongTensor [n, {self.prompt_len}] for task {self.name!r}, "
                f"got shape {tuple(prompts.shape)}"
            )


def _digits_to_int(digit_tokens: Tensor) -> Tensor:
    """Integer value of rows of digit tokens, most significant first."""
    n_digits = digit_tokens.shape[1]
    powers = 10 ** torch.arange(n_digits - 1, -1, -1, dtype=torch.long)
    return ((digit_tokens - DIGIT0) * powers).sum(dim=1)


def _int_to_digits(values: Tensor, n_digits: int) -> Tensor:
    """Digit tokens of values, most significant first, zero-padded to n_digits."""
    powers = 10 ** torch.arange(n_digits - 1, -1, -1, dtype=torch.long)
    return DIGIT0 + (values[:, None] // powers) % 10


class AdditionTask(Task):
    """Reversed addition: prompt ``<bos> a + b =`` with zero-padded operands of 1..max_digits digits (number of digits
    uniform, then the value uniform); answer = digits of a+b least-significant first, no leading zeros, then EOS.

    max_digits=4: prompt length 11, answers of 2..6 tokens (1..5 digits + EOS).
    """

    name = "add"

    def __init__(self, max_digits: int = 4, seed: int = 0, eval_seed: int = 1_000_003) -> None:
        super().__init__(seed=seed, eval_seed=eval_seed)
        if not 1 <= max_digits <= 9:
            raise ValueError(f"max_digits must be in 1..9, got {max_digits}")
        self.max_digits = max_digits
        self.a_slice = slice(1, 1 + max_digits)
        self.b_slice = slice(2 + max_digits, 2 + 2 * max_digits)
        self.prompt_len = 2 * max_digits + 3
        self.max_response_len = max_digits + 2
        self.generation_len = 2 * self.max_response_len + 4

    def _operands(self, n: int, generator: torch.Generator) -> Tensor:
        n_digits = torch.randint(1, self.max_digits + 1, (n,), generator=generator)
        low = torch.where(n_digits == 1, 0, 10 ** (n_digits - 1))
        high = 10**n_digits
        u = torch.rand(n, generator=generator, dtype=torch.float64)
        return low + (u * (high - low)).long().clamp(max=(high - low - 1))

    def make_prompts(self, n: int, generator: torch.Generator) -> Tensor:
        a = self._operands(n, generator)
        b = self._operands(n, generator)
        return self.encode(a, b)

    def encode(self, a: Tensor, b: Tensor) -> Tensor:
        """Prompts for operand values a, b (LongTensors [n])."""
        a, b = torch.as_tensor(a, dtype=torch.long), torch.as_tensor(b, dtype=torch.long)
        limit = 10**self.max_digits
        if ((a < 0) | (a >= limit) | (b < 0) | (b >= limit)).any():
            raise ValueError(f"operands must be in [0, {limit}) for max_digits={self.max_digits}")
        n = a.shape[0]
        prompts = torch.empty((n, self.prompt_len), dtype=torch.long)
        prompts[:, 0] = BOS
        prompts[:, self.a_slice] = _int_to_digits(a, self.max_digits)
        prompts[:, 1 + self.max_digits] = PLUS
        prompts[:, self.b_slice] = _int_to_digits(b, self.max_digits)
        prompts[:, -1] = EQUALS
        return prompts

    def operands(self, prompts: Tensor) -> tuple[Tensor, Tensor]:
        """Operand values (a, b) of prompts."""
        self._check_prompts(prompts)
        return _digits_to_int(prompts[:, self.a_slice]), _digits_to_int(prompts[:, self.b_slice])

    def answers(self, prompts: Tensor) -> Tensor:
        a, b = self.operands(prompts)
        total = a + b
        width = self.max_digits + 1
        powers = 10 ** torch.arange(width, dtype=torch.long)
        digits = DIGIT0 + (total[:, None] // powers) % 10
        n_digits = 1 + (total[:, None] >= powers[1:]).sum(dim=1)
        position = torch.arange(self.max_response_len)
        answer = torch.full((prompts.shape[0], self.max_response_len), PAD, dtype=torch.long)
        answer[:, :width] = digits
        answer = answer.masked_fill(position >= n_digits[:, None], PAD)
        return answer.masked_fill(position == n_digits[:, None], EOS)


class ReverseTask(Task):
    """Long-answer stress task: prompt ``<bos> <pad>.. d_1 .. d_L =`` (left-padded to max_digits, L uniform in
    [min_digits, max_digits]); answer = d_L .. d_1 then EOS, i.e. 32..64 tokens by default (prompt length 65).

    ``reward_mode="exact"`` (default): 1.0 iff exact. ``reward_mode="partial"``: the fraction of the answer's
    positions (EOS included) whose token the response matches, after cutting the response at its first EOS, so an
    exact answer scores 1.0 and a response that stops early or late loses the positions it misses.
    """

    name = "reverse"

    def __init__(
        self,
        min_digits: int = 31,
        max_digits: int = 63,
        reward_mode: str = "exact",
        seed: int = 0,
        eval_seed: int = 1_000_003,
    ) -> None:
        super().__init__(seed=seed, eval_seed=eval_seed)
        if not 1 <= min_digits <= max_digits:
            raise ValueError(f"need 1 <= min_digits <= max_digits, got {min_digits}, {max_digits}")
        if reward_mode not in ("exact", "partial"):
            raise ValueError(f"reward_mode must be 'exact' or 'partial', got {reward_mode!r}")
        self.min_digits = min_digits
        self.max_digits = max_digits
        self.reward_mode = reward_mode
        self.prompt_len = max_digits + 2
        self.max_response_len = max_digits + 1
        self.generation_len = self.max_response_len

    def make_prompts(self, n: int, generator: torch.Generator) -> Tensor:
        lengths = torch.randint(self.min_digits, self.max_digits + 1, (n,), generator=generator)
        digits = DIGIT0 + torch.randint(0, 10, (n, self.max_digits), generator=generator)
        is_pad = torch.arange(self.max_digits) < (self.max_digits - lengths)[:, None]
        prompts = torch.empty((n, self.prompt_len), dtype=torch.long)
        prompts[:, 0] = BOS
        prompts[:, 1:-1] = digits.masked_fill(is_pad, PAD)
        prompts[:, -1] = EQUALS
        return prompts

    def answers(self, prompts: Tensor) -> Tensor:
        self._check_prompts(prompts)
        reversed_digits = prompts[:, 1:-1].flip(dims=[1])
        n_digits = (reversed_digits != PAD).sum(dim=1)
        answer = torch.nn.functional.pad(reversed_digits, (0, 1), value=PAD)
        return answer.scatter(1, n_digits[:, None], EOS)

    def reward(self, prompts: Tensor, responses: Responses) -> Tensor:
        if self.reward_mode == "exact":
            return super().reward(prompts, responses)
        target, got = self._aligned(prompts, responses)
        in_answer = target != PAD
        return ((got == target) & in_answer).sum(dim=1).float() / in_answer.sum(dim=1).float()


class LongReverseTask(ReverseTask):
    """``ReverseTask`` with 63..127 digits: answers of 64..128 tokens (EOS included), prompt length 129. The regime
    where the mismatch is expected to hurt: long answers whose exact match needs every token right."""

    name = "reverse-long"

    def __init__(self, min_digits: int = 63, max_digits: int = 127, reward_mode: str = "exact", seed: int = 0,
                 eval_seed: int = 1_000_003) -> None:
        super().__init__(min_digits, max_digits, reward_mode, seed, eval_seed)
