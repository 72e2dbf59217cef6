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

from ...batch import TokenBatch
from ...metrics import METRIC_COLUMNS, SeqMetrics, mismatch_metrics
from ...seqstats import SeqStats
from ...signals import token_signal
from .engine import Rollout, RolloutEngine
from .policy import TinyPolicy
from .precision import precision_model
from .quant import as_quant_config
from .routing import routing_metrics
from .task import Task


def _metrics(lp_train: Tensor, lp_rollout: Tensor, mask: Tensor) -> tuple[TokenBatch, SeqMetrics]:
    """The padded ``[N, R]`` log-probs as the core's batch, and its section-6 metrics (summarised)."""
    batch = TokenBatch.from_padded(lp_train, lp_rollout, mask.float())
    metrics = mismatch_metrics(SeqStats.build(batch, METRIC_COLUMNS))
    metrics.summarize()
    return batch, metrics


def c_bar(lp_train: Tensor, lp_rollout: Tensor, mask: Tensor) -> float:
    """``C_bar`` as the DC-GRPO dual update reads it (the core's ``prob_diff_mean``: per-sequence token mean of
    ``|p_train - p_rollout|``, averaged over sequences, one without response tokens counting 0)."""
    return _metrics(lp_train, lp_rollout, mask)[1].summary["prob_diff_mean"]


def mismatch_stats(lp_train: Tensor, lp_rollout: Tensor, mask: Tensor) -> dict[str, float]:
    """``C_bar``, the token mean, 99th percentile and maximum of ``|log p_train - log p_rollout|`` (clamped as the
    core clamps it), and the 99th percentile over sequences of the absolute geometric-mean log-ratio (what a Geo-RS
    band tests: ``|log_ppl_diff|`` per sequence)."""
    batch, metrics = _metrics(lp_train, lp_rollout, mask)
    abs_tokens = token_signal(batch, "log_diff")[batch.mask > 0]
    return {
        "c_bar": metrics.summary["prob_diff_mean"],
        "log_ratio_abs_mean": float(abs_tokens.mean()),
        "log_ratio_abs_p99": float(torch.quantile(abs_tokens, 0.99)),
        "log_ratio_abs_max": float(abs_tokens.max()),
        "geo_log_ratio_abs_p99": float(torch.quantile(metrics.per_sequence("mean")["log_ppl_abs_diff"], 0.99)),
    }


def rollout_floor(policy: TinyPolicy, rollout: Rollout, temperature: float = 1.0) -> dict[str, float | None]:
    """Mismatch statistics of one rollout recomputed by ``policy`` (the trainer's forward: the fp32 policy or its
    ``precision.precision_model``): ``<stat>`` with the trainer's own routing, ``<stat>_r3`` with the engine's
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
    ``seed``), recomputed in the trainer precision the mode names (``+train-P``; fp32 by default), their medians
    (``floor`` = median ``C_bar``, ``floor_r3`` with replay) and the engine's sample accuracy; ``per_rollout`` keeps
    every rollout's numbers."""
    engine = RolloutEngine(policy, quant)
    trainer = precision_model(policy, as_quant_config(quant).train)
    generator = torch.Generator().manual_seed(seed)
    rows, rewards = [], []
    for _ in range(rollouts):
        rollout = engine.generate(task.make_prompts(prompts, generator), samples, 1.0, task.generation_len, generator)
        rows.append(rollout_floor(trainer, rollout))
        rewards.append(float(task.reward(rollout.prompts, rollout.responses).mean()))
    medians = {key: statistics.median(r[key] for r in rows if r.get(key) is not None)
               for key in rows[0] if any(r.get(key) is not None for r in rows)}
    out: dict[str, Any] = {"floor": medians["c_bar"], "sample_accuracy": statistics.fmean(rewards),
                           "medians": medians, "per_rollout": rows}
    if "c_bar_r3" in medians:
        out["floor_r3"] = medians["c_bar_r3"]
        out["replay_reduction"] = statistics.fmean(1 - r["c_bar_r3"] / r["c_bar"] for r in rows if r["c_bar"] > 0)
    return out
