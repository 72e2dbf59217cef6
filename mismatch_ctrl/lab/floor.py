"""The engine's discrepancy floor: the mismatch of a warmed-up policy before any RL update, with and without routing
replay, on the same rollouts.

The floor is what DC-GRPO's infeasible-budget guard measures (median ``C_bar`` over the first rollouts) and what
``eps: auto`` calibrates on. For each rollout the fp32 policy recomputes the engine's samples twice - with its own
routing and with the engine's expert sets (R3) - so replay on/off is a paired comparison on identical tokens.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch
from torch import Tensor

from .engine import Rollout, RolloutEngine
from .policy import TinyPolicy
from .routing import routing_metrics
from .task import Task


def c_bar(lp_train: Tensor, lp_rollout: Tensor, mask: Tensor) -> float:
    """``C_bar``: mean over sequences of the per-sequence token mean of ``|p_train - p_rollout|`` (sequences without
    response tokens count 0), the discrepancy the DC-GRPO dual update uses (ALGORITHMS.md section 1)."""
    diff = (lp_train.exp() - lp_rollout.exp()).abs() * mask
    return float((diff.sum(dim=1) / mask.sum(dim=1).clamp_min(1)).mean())


def mismatch_stats(lp_train: Tensor, lp_rollout: Tensor, mask: Tensor) -> dict[str, float]:
    """``C_bar``, the token mean, 99th percentile and maximum of ``|log p_train - log p_rollout|``, and the 99th
    percentile over sequences of the absolute geometric-mean log-ratio (what a Geo-RS band tests)."""
    mask = mask.bool()
    log_ratio = (lp_train - lp_rollout).clamp(-20, 20) * mask
    abs_tokens = log_ratio.abs()[mask]
    per_sequence = log_ratio.sum(dim=1) / mask.sum(dim=1).clamp_min(1)
    return {
        "c_bar": c_bar(lp_train, lp_rollout, mask.float()),
        "log_ratio_abs_mean": float(abs_tokens.mean()),
        "log_ratio_abs_p99": float(torch.quantile(abs_tokens, 0.99)),
        "log_ratio_abs_max": float(abs_tokens.max()),
        "geo_log_ratio_abs_p99": float(torch.quantile(per_sequence.abs(), 0.99)),
    }


def rollout_floor(policy: TinyPolicy, rollout: Rollout, temperature: float = 1.0) -> dict[str, float | None]:
    """Mismatch statistics of one rollout: ``<stat>`` with the trainer's own routing, ``<stat>_r3`` with the engine's
    expert sets (MoE only), and the routing metrics of the own-routing recompute."""
    mask = rollout.response_mask
    with torch.inference_mode():
        own = policy.score(rollout.tokens, rollout.prompt_len, mask, temperature)
    out: dict[str, float | None] = dict(mismatch_stats(own.log_probs, rollout.rollout_log_probs, mask))
    if own.routing is None:
        return out
    prob_diff = (own.log_probs.exp() - rollout.rollout_log_probs.exp()).abs()
    out.update(routing_metrics(own.routing, rollout.routing, rollout.prompt_len, mask, prob_diff))
    with torch.inference_mode():
        replayed = policy.score(rollout.tokens, rollout.prompt_len, mask, temperature, rollout.routing).log_probs
    out.update({f"{k}_r3": v for k, v in mismatch_stats(replayed, rollout.rollout_log_probs, mask).items()})
    return out


def measure_floor(policy: TinyPolicy, task: Task, quant: str, rollouts: int = 10, prompts: int = 32,
                  samples: int = 8, seed: int = 0) -> dict[str, Any]:
    """``rollout_floor`` of ``rollouts`` rollouts of the policy's ``quant`` engine (prompts and sampling seeded by
    ``seed``), their medians (``floor`` = median ``C_bar``, ``floor_r3`` with replay) and the engine's sample
    accuracy; ``per_rollout`` keeps every rollout's numbers."""
    engine = RolloutEngine(policy, quant)
    generator = torch.Generator().manual_seed(seed)
    rows, rewards = [], []
    for _ in range(rollouts):
        rollout = engine.generate(task.make_prompts(prompts, generator), samples, 1.0, task.generation_len, generator)
        rows.append(rollout_floor(policy, rollout))
        rewards.append(float(task.reward(rollout.prompts, rollout.responses).mean()))
    medians = {key: statistics.median(r[key] for r in rows if r.get(key) is not None)
               for key in rows[0] if any(r.get(key) is not None for r in rows)}
    out: dict[str, Any] = {"floor": medians["c_bar"], "sample_accuracy": statistics.fmean(rewards),
                           "medians": medians, "per_rollout": rows}
    if "c_bar_r3" in medians:
        out["floor_r3"] = medians["c_bar_r3"]
        out["replay_reduction"] = statistics.fmean(1 - r["c_bar_r3"] / r["c_bar"] for r in rows if r["c_bar"] > 0)
    return out
