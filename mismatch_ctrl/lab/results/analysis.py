"""Every comparison the lab's report makes, as one pure function of the run table: per-label statistics over seeds,
the frontier against the exact engine, each controller against GRPO on its engine, the comparisons a missing
reference run prevents, and each run's controller state. ``report``, ``summary_json`` and the plots render it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .controllers import controller_rows
from .frontier import frontier, missing_references, versus_grpo
from .groups import aggregate_runs
from .table import RunTable


@dataclass(frozen=True)
class Comparison:
    """What the lab concludes from one table of runs (``compare``)."""

    table: RunTable
    aggregated: dict[str, dict[str, Any]]
    """Per label: ``groups.aggregate_runs``."""
    frontier: dict[str, Any] | None
    """``frontier.frontier`` (None with fewer than two engines)."""
    versus: list[dict[str, Any]]
    """``frontier.versus_grpo``: each controller against GRPO on its engine, paired per seed."""
    missing: list[str]
    """``frontier.missing_references``: the comparisons a missing reference run prevents."""
    controllers: list[dict[str, Any]]
    """``controllers.controller_rows``: each run's controller state."""

    @property
    def seeds(self) -> list[int]:
        return self.table.seeds()

    @property
    def settings(self) -> Mapping[str, Any]:
        """The settings of the table's first run (one report is for one set of settings)."""
        return self.table.runs[0].settings


def compare(table: RunTable) -> Comparison:
    """Every analysis of ``table`` (at least one run)."""
    if not table.runs:
        raise ValueError("compare: no runs")
    aggregated = aggregate_runs(table)
    found = frontier(aggregated)
    return Comparison(table, aggregated, found, versus_grpo(aggregated), missing_references(aggregated, found),
                      controller_rows(table))
