"""Comparisons across lab output directories, as pure functions of one run table whose runs carry their directory
(``Run.source``).

- ``pooled_versus``: each controller against GRPO on its engine (run - ``grpo@<engine>``, paired per seed) in each
  directory, and pooled over the directories: their seeds differ, so the pairs are independent and the pooled
  interval is the t interval of all the paired differences together.
- ``interactions``: does a controller's gain over GRPO depend on a setting? Directories come in pairs (A: the
  reference setting, B: one setting changed, same methods, engines and seeds); per seed both hold, the gain
  ``g = run - grpo@<engine>`` in A and in B and the interaction ``g_B - g_A`` (a difference in differences, paired by
  seed); for plain GRPO the change of the run itself, B - A. More pairs (other seeds) are pooled.

Collapsed runs count as they are (their metric is what they reached).
"""

from __future__ import annotations

from dataclasses import dataclass

from .frontier import versus_grpo
from .groups import aggregate_runs
from .stats import Spread, spread
from .table import RunTable

POOLED = "pooled"
"""The ``source`` of a pooled row."""


@dataclass(frozen=True)
class VersusRow:
    """One controller against GRPO on its engine, in one directory or pooled: the paired differences of the metric
    and how many seeds of the run and of its GRPO reference collapsed."""

    run: str
    reference: str
    source: str
    difference: Spread
    collapsed: int
    collapsed_reference: int


def pooled_versus(table: RunTable, metric: str) -> list[VersusRow]:
    """Per directory (table order) the rows of ``versus_grpo`` for ``metric``; with several directories, then one
    pooled row per run (sorted by run) over every directory that compared it."""
    rows = []
    for source in table.sources():
        aggregated = aggregate_runs(table.where(source))
        for c in versus_grpo(aggregated):
            if c["quantity"] == metric:
                rows.append(VersusRow(c["run"], c["reference"], source, c["difference"],
                                      aggregated[c["run"]]["collapses"], aggregated[c["reference"]]["collapses"]))
    if len(table.sources()) < 2:
        return rows
    pooled = []
    for run in sorted({row.run for row in rows}):
        parts = [row for row in rows if row.run == run]
        pooled.append(VersusRow(run, parts[0].reference, POOLED,
                                spread(v for row in parts for v in row.difference.values),
                                sum(row.collapsed for row in parts), sum(row.collapsed_reference for row in parts)))
    return rows + pooled


@dataclass(frozen=True)
class InteractionRow:
    """One run's gains over GRPO in A and in B and their difference (for plain GRPO: only ``change``, B - A of the run
    itself), pooled over the pairs of directories."""

    run: str
    gain_a: Spread | None
    gain_b: Spread | None
    change: Spread

    @property
    def n(self) -> int:
        return self.change.n


def _paired_gains(a: RunTable, b: RunTable, metric: str) -> dict[str, tuple[list[float], list[float], list[float]]]:
    """Per run of both tables, over the seeds where all four numbers exist: gains in A, gains in B, B - A (plain
    GRPO: [], [], its own B - A)."""
    runs_a, runs_b = aggregate_runs(a), aggregate_runs(b)
    out = {}
    for label in sorted(runs_a.keys() & runs_b.keys()):
        run_a, run_b = runs_a[label]["by_seed"].get(metric, {}), runs_b[label]["by_seed"].get(metric, {})
        reference = f"grpo@{runs_a[label]['quant']}"
        if label == reference:
            seeds = sorted(run_a.keys() & run_b.keys())
            if seeds:
                out[label] = ([], [], [run_b[s] - run_a[s] for s in seeds])
            continue
        if reference not in runs_a or reference not in runs_b:
            continue
        ref_a, ref_b = runs_a[reference]["by_seed"].get(metric, {}), runs_b[reference]["by_seed"].get(metric, {})
        seeds = sorted(run_a.keys() & run_b.keys() & ref_a.keys() & ref_b.keys())
        if seeds:
            gain_a = [run_a[s] - ref_a[s] for s in seeds]
            gain_b = [run_b[s] - ref_b[s] for s in seeds]
            out[label] = (gain_a, gain_b, [y - x for x, y in zip(gain_a, gain_b)])
    return out


def interactions(table: RunTable, pairs: list[tuple[str, str]], metric: str) -> list[InteractionRow]:
    """``InteractionRow`` per run (sorted), pooled over the (A, B) pairs of sources of ``table``."""
    pooled: dict[str, tuple[list[float], list[float], list[float]]] = {}
    for source_a, source_b in pairs:
        for label, parts in _paired_gains(table.where(source_a), table.where(source_b), metric).items():
            for into, values in zip(pooled.setdefault(label, ([], [], [])), parts):
                into.extend(values)
    return [InteractionRow(label, spread(a) if a else None, spread(b) if b else None, spread(change))
            for label, (a, b, change) in sorted(pooled.items())]
