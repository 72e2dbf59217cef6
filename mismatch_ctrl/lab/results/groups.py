"""Each run label's numbers over its seeds: the ``Spread`` (mean, 95% t interval) of every summary quantity, the
values per seed (what the paired comparisons pair), and how many seeds collapsed."""

from __future__ import annotations

from typing import Any

from ..training.summary import LAYER_FLIPS
from .stats import aggregate
from .table import RunTable

AGGREGATED = ("initial_acc_engine", "final_acc_engine", "late_acc_engine", "acc_change_engine", "best_acc_engine",
              "final_acc_fp32", "late_acc_fp32", "final_reward", "late_reward",
              "discrepancy_mean", "discrepancy_first", "discrepancy_last", "discrepancy_max", "routing_flip_fraction",
              "discrepancy_flipped", "discrepancy_unflipped", "seconds_per_step")
"""Run-summary quantities aggregated over seeds."""


def aggregate_runs(table: RunTable) -> dict[str, dict[str, Any]]:
    """Per label (in table order): method, engine (``quant``), replay, the seeds, the ``Spread`` of every
    ``AGGREGATED`` quantity and per-layer routing flips (``spreads``), how many seeds collapsed, and ``by_seed``:
    quantity -> seed -> value (seeds where the run measured it)."""
    out: dict[str, dict[str, Any]] = {}
    for label, runs in table.groups().items():
        rows = [run.summary for run in runs]
        keys = AGGREGATED + tuple(sorted(k for k in rows[0] if k.startswith(LAYER_FLIPS)))
        first = runs[0]
        out[label] = {"method": first.method, "quant": first.quant, "replay": first.replay,
                      "seeds": [run.seed for run in runs], "spreads": aggregate(rows, keys),
                      "by_seed": {key: {r["seed"]: r[key] for r in rows if r.get(key) is not None} for key in keys},
                      "collapses": sum(r["collapse_step"] is not None for r in rows)}
    return out
