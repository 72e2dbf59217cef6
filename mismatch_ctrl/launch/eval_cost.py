"""What evaluation costs a run, in generated tokens, next to training: printed by ``--dry-run`` and a launch.

Per evaluation: ``sum over datasets of prompts x n_samples_per_eval_prompt`` responses of up to ``max_response_len``
tokens (a dataset's own values, else the file's ``defaults``, else slime's flags: one sample,
``--eval-max-response-len`` after ``--`` or ``MAX_RESPONSE_LEN``; :func:`~.preflight.eval_sets`). Evaluations per
run: one every ``EVAL_INTERVAL`` rollouts, plus one before training unless ``SKIP_EVAL_BEFORE_TRAIN=1``. Training:
``NUM_ROLLOUT x ROLLOUT_BATCH_SIZE x N_SAMPLES_PER_PROMPT`` responses of up to ``MAX_RESPONSE_LEN``. Both are upper
bounds (responses stop early); the share compares like with like.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .preflight import eval_sets
from .settings import Settings

RECORDED_PROMPTS = {"aime24": 30, "aime25": 30, "amc23": 40, "math500": 500, "minerva": 272, "olympiadbench": 675}
"""Problems per evaluation set of the recipe (the published sets ``recipes/qwen3_30b_a3b/data.py`` writes), used
until the files exist."""

SHARE_WARNING = 0.25
"""Evaluation above this share of the run's generated tokens gets a warning."""


@dataclass(frozen=True)
class EvalCost:
    responses: int
    tokens_per_evaluation: int
    evaluations: int
    training_tokens: int
    unknown_sets: tuple[str, ...]

    @property
    def tokens(self) -> int:
        return self.tokens_per_evaluation * self.evaluations

    @property
    def share(self) -> float:
        return self.tokens / max(self.tokens + self.training_tokens, 1)

    def lines(self, protocol: str) -> list[str]:
        unknown = f" (not counted: {', '.join(self.unknown_sets)}, size unknown)" if self.unknown_sets else ""
        return [f"evaluation (EVAL_PROTOCOL={protocol}): {self.responses:,} responses of up to "
                f"{self.tokens_per_evaluation // max(self.responses, 1):,} tokens per evaluation, {self.evaluations} "
                f"evaluations: at most {self.tokens / 1e9:.2f}B tokens, {self.share:.0%} of the run's generated tokens "
                f"(training at most {self.training_tokens / 1e9:.2f}B){unknown}"]

    def warnings(self) -> list[str]:
        if self.share <= SHARE_WARNING:
            return []
        return [f"evaluation would generate {self.share:.0%} of the run's tokens: raise EVAL_INTERVAL or use "
                "EVAL_PROTOCOL=light"]


def _prompts(path: str, name: str) -> int | None:
    file = Path(path)
    if file.is_file():
        with file.open("rb") as f:
            return sum(1 for line in f if line.strip())
    return RECORDED_PROMPTS.get(name)


def eval_cost(s: Settings, extra: Sequence[str] = ()) -> EvalCost | None:
    """The cost of ``s``'s evaluation (None with ``EVAL_INTERVAL=0``); ``EVAL_CONFIG`` must be readable; ``extra``:
    train.py's arguments after ``--`` (``--eval-max-response-len``)."""
    interval = s.int("EVAL_INTERVAL")
    if interval == 0:
        return None
    responses = tokens = 0
    unknown = []
    for dataset in eval_sets(s, extra):
        prompts = _prompts(dataset.path, dataset.name)
        if prompts is None:
            unknown.append(dataset.name)
            continue
        samples, length = dataset.samples, dataset.max_response_len
        responses += prompts * samples
        tokens += prompts * samples * length
    rollouts = s.int("NUM_ROLLOUT")
    evaluations = rollouts // interval + (0 if s.flag("SKIP_EVAL_BEFORE_TRAIN") else 1)
    training = rollouts * s.int("ROLLOUT_BATCH_SIZE") * s.int("N_SAMPLES_PER_PROMPT") * s.int("MAX_RESPONSE_LEN")
    return EvalCost(responses, tokens, evaluations, training, tuple(unknown))
