"""``summary.json``: every number of the lab's comparison (``analysis.Comparison``) for programs - each run's summary,
the aggregate per label with its spreads, the frontier, each controller against GRPO, the controller table and the
comparisons a missing reference prevents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ... import regular_files
from .analysis import Comparison
from .frontier import frontier_json
from .report import INTERVAL


def summary_of(comparison: Comparison, commands: list[str]) -> dict[str, Any]:
    """The content of ``summary.json``; every ``Spread`` as a dict."""
    return {
        "commands": commands, "seeds": comparison.seeds, "interval": INTERVAL,
        "runs": [dict(run.summary) for run in comparison.table],
        "aggregate": {label: {**{k: v for k, v in entry.items() if k not in ("spreads", "by_seed")},
                              "metrics": {k: s.as_dict() for k, s in entry["spreads"].items()}}
                      for label, entry in comparison.aggregated.items()},
        "frontier": None if comparison.frontier is None else frontier_json(comparison.frontier),
        "versus_grpo": [{**c, "difference": c["difference"].as_dict()} for c in comparison.versus],
        "controllers": comparison.controllers,
        "missing_comparisons": comparison.missing,
    }


def write_summary(comparison: Comparison, commands: list[str], path: Path) -> Path:
    """``summary_of`` written to ``path``."""
    regular_files.write_atomic(path, json.dumps(summary_of(comparison, commands), indent=1).encode())
    return path
