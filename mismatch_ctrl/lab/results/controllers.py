"""Each run's controller state from its per-rollout records: DC-GRPO's eps and lambda, the penalty's share of the
advantage, and routing flips (the report's per-run controller table)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .table import RunTable

CONTROLLER_COLUMNS = ("eps_start", "eps_end", "lambda_start", "lambda_peak", "lambda_end", "penalty_share",
                      "routing_flip_fraction")


def controller_row(records: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """One run's controller state: DC-GRPO's eps at the first and last rollout, lambda at the start, its peak and its
    end (the multiplier after the last update, ``lambda_next``), the mean ``penalty_share`` (|lambda c| / |A|) and
    the mean share of tokens whose routing flipped; None where not logged."""

    def values(key: str) -> list[float]:
        return [r[key] for r in records if r.get(key) is not None]

    eps, lam, share, flips = values("eps"), values("lambda"), values("penalty_share"), values("routing_flip_fraction")
    lam_end = values("lambda_next")[-1:] or lam[-1:]
    return {"eps_start": eps[0] if eps else None, "eps_end": eps[-1] if eps else None,
            "lambda_start": lam[0] if lam else None, "lambda_peak": max(lam + lam_end) if lam else None,
            "lambda_end": lam_end[0] if lam_end else None,
            "penalty_share": sum(share) / len(share) if share else None,
            "routing_flip_fraction": sum(flips) / len(flips) if flips else None}


def controller_rows(table: RunTable) -> list[dict[str, Any]]:
    """``controller_row`` of every run of the table that has its records, with label and seed."""
    return [{"label": run.label, "seed": run.seed, **controller_row(run.records)} for run in table if run.records]
