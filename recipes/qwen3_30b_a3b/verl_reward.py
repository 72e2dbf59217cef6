"""The recipe's math reward for verl: ``reward.custom_reward_function.path=recipes/qwen3_30b_a3b/verl_reward.py``
(``name`` defaults to ``compute_score``). verl 0.9.1 calls it per response as ``compute_score(data_source,
solution_str, ground_truth, extra_info)`` (its ``utils/reward_score`` signature); the score is
:func:`recipes.qwen3_30b_a3b.reward.score` (math-verify, never raises), the same as slime's ``rm``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # verl loads the file by path: make the recipe package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from recipes.qwen3_30b_a3b.reward import score  # noqa: E402


def compute_score(data_source: Any, solution_str: Any, ground_truth: Any, extra_info: Any = None,
                  **kwargs: Any) -> float:
    """1.0 iff the response's final answer equals ``ground_truth`` (math-verify), else 0.0."""
    return score(solution_str, ground_truth)
