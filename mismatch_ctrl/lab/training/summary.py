"""One run's summary from its per-rollout records: the numbers the report aggregates over seeds, and when (if ever)
the run collapsed."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from .methods import RunSpec
from .settings import LabSettings

LAYER_FLIPS = "routing_flip_fraction_layer"
"""Record key prefix of the routing flips of one layer (``routing_flip_fraction_layer<j>``)."""
OVERFLOWS = ("engine_overflow_fraction", "train_overflow_fraction")
"""Record keys of a float16 engine's / trainer's overflow share (only in runs with float16)."""


def collapse_step(rewards: list[float], window: int) -> int | None:
    """First step where the trailing ``window``-step mean training reward falls below half its best so far (a best
    of at least 0.1) and never recovers above three quarters of it [ours]."""
    best, candidate, total = 0.0, None, 0.0
    for i, reward in enumerate(rewards):
        total += reward - (rewards[i - window] if i >= window else 0.0)
        value = total / min(i + 1, window)
        if candidate is not None and value >= 0.75 * best:
            candidate = None
        best = max(best, value)
        if candidate is None and best >= 0.1 and value < 0.5 * best:
            candidate = i
    return candidate


def blow_up_step(records: list[dict[str, Any]]) -> int | None:
    """First rollout whose engine logits turned NaN or infinite in some sample (a blown-up policy), else None."""
    return next((i for i, r in enumerate(records) if r.get("engine_nonfinite_fraction", 0.0) > 0), None)


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(spec: RunSpec, settings: LabSettings, records: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the report: accuracies (start, final, best, and ``late``: the mean over the evaluations of the last
    quarter of the rollouts and the final one), reward, discrepancy (mean, max, first and last quarter), routing
    flips, collapse step (``collapse_step`` on the rewards or ``blow_up_step``, whichever comes first), the share of
    samples whose engine logits turned non-finite (a blown-up policy), in runs with float16 the overflow shares, the
    FP16 trainer's skipped steps and last loss scale, and wall
    time of a run."""
    evals = [r for r in records if "eval_acc_engine" in r]
    last = records[-1]
    evals.append({"step": len(records), "eval_acc_engine": last["final_eval_acc_engine"],
                  "eval_acc_fp32": last["final_eval_acc_fp32"]})
    quarter = max(1, len(records) // 4)
    late_evals = [r for r in evals if r["step"] >= len(records) - quarter]
    discrepancy = [r["discrepancy"] for r in records if "discrepancy" in r]
    rewards = [r["reward"] for r in records]

    def mean_of(key: str, rows: list[dict[str, Any]] = records) -> float | None:
        return _mean([r[key] for r in rows if r.get(key) is not None])

    layer_keys = sorted(k for k in records[0] if k.startswith(LAYER_FLIPS))
    return {
        "label": spec.label, "method": spec.method, "quant": spec.quant, "replay": spec.replay,
        "seed": settings.seed, "settings": asdict(settings),
        "initial_acc_engine": evals[0]["eval_acc_engine"],
        "final_acc_engine": evals[-1]["eval_acc_engine"], "best_acc_engine": max(r["eval_acc_engine"] for r in evals),
        "late_acc_engine": mean_of("eval_acc_engine", late_evals),
        "acc_change_engine": mean_of("eval_acc_engine", late_evals) - evals[0]["eval_acc_engine"],
        "final_acc_fp32": evals[-1]["eval_acc_fp32"], "best_acc_fp32": max(r["eval_acc_fp32"] for r in evals),
        "late_acc_fp32": mean_of("eval_acc_fp32", late_evals),
        "final_reward": _mean(rewards[-settings.collapse_window:]),
        "late_reward": _mean(rewards[-quarter:]),
        "discrepancy_mean": _mean(discrepancy) or 0.0,
        "discrepancy_max": max(discrepancy, default=0.0),
        "discrepancy_first": _mean(discrepancy[:quarter]) or 0.0,
        "discrepancy_last": _mean(discrepancy[-quarter:]) or 0.0,
        "routing_flip_fraction": mean_of("routing_flip_fraction"),
        **{key: mean_of(key) for key in layer_keys},
        "discrepancy_flipped": mean_of("discrepancy_flipped"),
        "discrepancy_unflipped": mean_of("discrepancy_unflipped"),
        "collapse_step": min((step for step in (collapse_step(rewards, settings.collapse_window),
                                                blow_up_step(records)) if step is not None), default=None),
        "engine_nonfinite_fraction": mean_of("engine_nonfinite_fraction") or 0.0,
        **{key: mean_of(key) for key in OVERFLOWS if key in records[0]},
        **({"skipped_steps": sum(r["train/skipped_steps"] for r in records),
            "final_loss_scale": records[-1]["train/loss_scale"]} if "train/skipped_steps" in records[0] else {}),
        "seconds": records[-1]["seconds"],
        "seconds_per_step": records[-1]["seconds"] / len(records),
    }
