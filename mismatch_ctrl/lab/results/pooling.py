"""Comparisons across lab output directories, as pure functions of one run table whose runs carry their directory
(``Run.source``).

- ``pooled_versus``: each run against its reference - GRPO on the same engine (``grpo@<engine>``, as the report's
  controller table) or the exact engine (``grpo@none``, else the run's own ``@none``, as the frontier) - paired per
  seed, in each directory, and pooled over the directories that measured it.
- ``interactions``: does a run's gain over GRPO depend on a setting? Directories come in pairs (A: the reference
  setting, B: one setting changed, same methods, engines and seeds); per seed both hold, the gain
  ``g = run - grpo@<engine>`` in A and in B and the interaction ``g_B - g_A`` (a difference in differences, paired by
  seed); for plain GRPO the change of the run itself, B - A. More pairs (other seeds) are pooled.

Pooling counts each seed once: a seed measured in several directories (e.g. the MoE and the dense policy pooled on
purpose from the same seeds, which share their prompts and sampling) gives the mean of its differences, so the
pooled t interval is over independent seeds. Collapsed runs count as they are (their metric is what they reached).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from .frontier import reference_of
from .groups import aggregate_runs
from .stats import Spread, differences, spread
from .table import RunTable

POOLED = "pooled"
"""The ``source`` of a pooled row."""
AGAINST = {"grpo": "GRPO on the same engine", "exact": "the exact engine"}
"""What ``pooled_versus`` compares each run with; any other reference is a run label (``METHOD@ENGINE[+r3]``) that
every run is compared with, e.g. ``grpo@fp16+train-fp16``."""


def against_name(against: str) -> str:
    """How a table names the reference ``against`` (an ``AGAINST`` key or a run label)."""
    return AGAINST.get(against, f"`{against}`")


def per_seed(parts: Iterable[dict[int, float]]) -> dict[int, float]:
    """One value per seed from several ``{seed: value}``: the mean where a seed appears more than once."""
    values: dict[int, list[float]] = {}
    for part in parts:
        for seed, value in part.items():
            values.setdefault(seed, []).append(value)
    return {seed: sum(v) / len(v) for seed, v in sorted(values.items())}


@dataclass(frozen=True)
class VersusRow:
    """One run against its reference, in one directory or pooled: the paired differences of the metric (one per
    seed), how many seeds the run had, and how many of them and of the reference's collapsed."""

    run: str
    reference: str
    source: str
    difference: Spread
    seeds: int
    collapsed: int
    reference_seeds: int
    collapsed_reference: int
    shared_seeds: int = 0
    """Pooled rows: seeds measured in more than one directory (their differences averaged)."""


def pooled_versus(table: RunTable, metric: str, against: str = "grpo") -> list[VersusRow]:
    """Per directory (table order) each run against its reference (``AGAINST``) on ``metric``; with several
    directories, then one pooled row per run (sorted) measured in two or more of them."""
    if against not in AGAINST and "@" not in against:
        raise ValueError(f"against: expected one of {sorted(AGAINST)} or a run label METHOD@ENGINE, got {against!r}")
    rows, parts = [], {}
    for source in table.sources():
        aggregated = aggregate_runs(table.where(source))
        for label, entry in aggregated.items():
            reference = reference_of(label, aggregated, against)
            found = differences(entry["by_seed"].get(metric, {}),
                                aggregated[reference]["by_seed"].get(metric, {})) if reference else {}
            if found:
                parts.setdefault(label, []).append(found)
                rows.append(VersusRow(label, reference, source, spread(found.values()), len(entry["seeds"]),
                                      entry["collapses"], len(aggregated[reference]["seeds"]),
                                      aggregated[reference]["collapses"]))
    if len(table.sources()) < 2:
        return rows
    pooled = []
    for label in sorted(label for label, found in parts.items() if len(found) > 1):
        mine = [row for row in rows if row.run == label]
        seeds = per_seed(parts[label])
        pooled.append(VersusRow(label, " / ".join(dict.fromkeys(row.reference for row in mine)), POOLED,
                                spread(seeds.values()), sum(row.seeds for row in mine),
                                sum(row.collapsed for row in mine), sum(row.reference_seeds for row in mine),
                                sum(row.collapsed_reference for row in mine),
                                sum(len(found) for found in parts[label]) - len(seeds)))
    return rows + pooled


@dataclass(frozen=True)
class InteractionRow:
    """One run's gains over GRPO in A and in B and their difference (for plain GRPO: only ``change``, B - A of the run
    itself), pooled over the pairs of directories, one value per seed."""

    run: str
    gain_a: Spread | None
    gain_b: Spread | None
    change: Spread

    @property
    def n(self) -> int:
        return self.change.n


Gains = tuple[dict[int, float], dict[int, float], dict[int, float]]


def _paired_gains(a: RunTable, b: RunTable, metric: str) -> dict[str, Gains]:
    """Per run of both tables, over the seeds where all four numbers exist: gains in A, gains in B, B - A, each per
    seed (plain GRPO: {}, {}, its own B - A)."""
    runs_a, runs_b = aggregate_runs(a), aggregate_runs(b)
    out: dict[str, Gains] = {}
    for label in sorted(runs_a.keys() & runs_b.keys()):
        run_a, run_b = runs_a[label]["by_seed"].get(metric, {}), runs_b[label]["by_seed"].get(metric, {})
        reference = f"grpo@{runs_a[label]['quant']}"
        if label == reference:
            change = differences(run_b, run_a)
            if change:
                out[label] = ({}, {}, change)
            continue
        if reference not in runs_a or reference not in runs_b:
            continue
        ref_a, ref_b = runs_a[reference]["by_seed"].get(metric, {}), runs_b[reference]["by_seed"].get(metric, {})
        seeds = sorted(run_a.keys() & run_b.keys() & ref_a.keys() & ref_b.keys())
        if seeds:
            gain_a = differences({s: run_a[s] for s in seeds}, ref_a)
            gain_b = differences({s: run_b[s] for s in seeds}, ref_b)
            out[label] = (gain_a, gain_b, differences(gain_b, gain_a))
    return out


def interactions(table: RunTable, pairs: list[tuple[str, str]], metric: str) -> list[InteractionRow]:
    """``InteractionRow`` per run (sorted), pooled over the (A, B) pairs of sources of ``table`` (``per_seed``)."""
    pooled: dict[str, list[Gains]] = {}
    for source_a, source_b in pairs:
        for label, gains in _paired_gains(table.where(source_a), table.where(source_b), metric).items():
            pooled.setdefault(label, []).append(gains)
    out = []
    for label, parts in sorted(pooled.items()):
        a, b, change = (per_seed(part[i] for part in parts) for i in range(3))
        out.append(InteractionRow(label, spread(a.values()) if a else None, spread(b.values()) if b else None,
                                  spread(change.values())))
    return out
