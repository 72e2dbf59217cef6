"""What the lab prints: ``mismatch-ctrl lab``'s closing table (one line per run label, means over its seeds) and
``mismatch-ctrl lab compare``'s tables (pooled differences against GRPO, interactions)."""

from __future__ import annotations

from ...formatting import count_and_values, fmt
from .pooling import POOLED, InteractionRow, VersusRow, against_name
from .stats import Spread
from .table import Run, RunTable


def summary_table(table: RunTable) -> str:
    """A plain-text table, one line per run label: seeds (how many, and which: ``5 (70-74)``), means over seeds of
    late accuracy (engine), late reward and discrepancy, and how many seeds collapsed."""
    header = ("run", "seeds", "late acc", "late reward", "discrepancy", "collapsed")
    lines = [header]
    for label, runs in table.groups().items():
        def mean(key: str, runs: list[Run] = runs) -> str:
            values = [run.value(key) for run in runs if run.value(key) is not None]
            return fmt(sum(values) / len(values)) if values else "-"

        collapsed = sum(run.value("collapse_step") is not None for run in runs)
        lines.append((label, count_and_values([run.seed for run in runs]), mean("late_acc_engine"), mean("late_reward"),
                      mean("discrepancy_mean"), f"{collapsed}/{len(runs)}"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in
                               enumerate(zip(line, widths))).rstrip() for line in lines)


def signed(s: Spread | None) -> str:
    """``+0.054 [+0.014, +0.095]``; ``(one seed)`` without an interval; ``-`` for nothing."""
    if s is None:
        return "-"
    return f"{s.mean:+.3f} " + (f"[{s.low:+.3f}, {s.high:+.3f}]" if s.low is not None else "(one seed)")


def pooled_table(rows: list[VersusRow], metric: str, against: str = "grpo") -> str:
    """``pooling.pooled_versus`` as a markdown table: run, reference, directory (or pooled), seeds, the paired
    difference, and collapsed seeds of the run and of its reference."""
    lines = [f"{metric}: run - {against_name(against)}, paired by seed, mean [95% t interval]", "",
             "| run | reference | directory | seeds | run - reference | collapsed: run, reference |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        where = r.source if r.source != POOLED else "**pooled**" + (
            f" ({r.shared_seeds} of its seeds measured in several directories: each seed's mean)" if r.shared_seeds
            else "")
        lines.append(f"| `{r.run}` | `{r.reference}` | {where} | {r.difference.n} | {signed(r.difference)} | "
                     f"{r.collapsed}/{r.seeds}, {r.collapsed_reference}/{r.reference_seeds} |")
    return "\n".join(lines)


def interaction_table(rows: list[InteractionRow], metric: str, pairs: list[tuple[str, str]]) -> str:
    """``pooling.interactions`` as a markdown table: run, seeds, gain in A, gain in B, B - A."""
    names = "; ".join(f"A = {a}, B = {b}" for a, b in pairs)
    lines = [f"{metric}: gain = run - GRPO on the same engine, paired by seed; {names}", "",
             "| run | seeds | gain in A | gain in B | B - A (for GRPO: the run's own change) |",
             "|---|---|---|---|---|"]
    lines += [f"| `{r.run}` | {r.n} | {signed(r.gain_a)} | {signed(r.gain_b)} | {signed(r.change)} |" for r in rows]
    return "\n".join(lines)
