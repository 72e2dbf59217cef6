"""What the lab prints: ``mismatch-ctrl lab``'s closing table (one line per run label, means over its seeds) and
``mismatch-ctrl lab compare``'s tables (pooled differences against GRPO, interactions)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...formatting import count_and_values, fmt
from .controllers import controller_row
from .pooling import POOLED, InteractionRow, VersusRow, against_name
from .stats import Spread
from .table import Run, RunTable


def _mean(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def summary_table(table: RunTable) -> str:
    """A plain-text table, one line per run label: seeds (how many, and which: ``5 (70-74)``), means over seeds of
    late accuracy (engine), late reward and discrepancy, and how many seeds collapsed."""
    header = ("run", "seeds", "late acc", "late reward", "discrepancy", "collapsed")
    lines = [header]
    for label, runs in table.groups().items():
        def mean(key: str, runs: list[Run] = runs) -> str:
            return fmt(_mean([run.value(key) for run in runs]))

        collapsed = sum(run.value("collapse_step") is not None for run in runs)
        lines.append((label, count_and_values([run.seed for run in runs]), mean("late_acc_engine"), mean("late_reward"),
                      mean("discrepancy_mean"), f"{collapsed}/{len(runs)}"))
    return _aligned(lines)


CORRECTION_KEYS = ("train/mismatch_ctrl/is_clip_high_fraction", "train/mismatch_ctrl/rejected_seq_fraction")
"""The correction hook's metrics behind the mechanism table's last two columns (docs/metrics.md)."""


def mechanism_table(table: RunTable) -> str:
    """What the mismatch and the controllers did, one line per run label, means over its seeds: the share of response
    tokens whose expert set flipped between engine and trainer, how many times more discrepancy a flipped token
    carries than an unflipped one (mean |p_train - p_rollout| of each), DC-GRPO's eps at the first -> last rollout,
    its multiplier's peak and its penalty's share of the advantage (mean |lambda c| / |A|), and what a rollout
    correction did: the share of token weights clipped at the upper bound (TIS) and of sequences rejected (the
    rejection presets); ``-`` where a run does not have it. Empty when no run flipped a token or ran DC-GRPO."""
    header = ("run", "routing flips", "flipped / unflipped", "eps first -> last", "lambda peak", "penalty share",
              "clipped", "rejected")
    lines, shown = [header], False
    for label, runs in table.groups().items():
        rows = [controller_row(run.records) for run in runs]
        ratios = [run.value("discrepancy_flipped") / run.value("discrepancy_unflipped") for run in runs
                  if run.value("discrepancy_flipped") is not None and run.value("discrepancy_unflipped")]
        flips = _mean([run.value("routing_flip_fraction") for run in runs])
        eps = [_mean([row[key] for row in rows]) for key in ("eps_start", "eps_end")]
        ratio = _mean(ratios)
        shown = shown or bool(flips) or None not in eps
        lines.append((label, fmt(flips), "-" if ratio is None else f"{ratio:.1f}x",
                      "-" if None in eps else f"{fmt(eps[0])} -> {fmt(eps[1])}",
                      fmt(_mean([row["lambda_peak"] for row in rows])),
                      fmt(_mean([row["penalty_share"] for row in rows])),
                      *(fmt(_mean([_record_mean(run.records, key) for run in runs])) for key in CORRECTION_KEYS)))
    return _aligned(lines) if shown else ""


def _record_mean(records: Sequence[Mapping[str, Any]], key: str) -> float | None:
    """The mean of ``key`` over a run's rollouts that logged it; None when none did."""
    return _mean([record.get(key) for record in records])


def _aligned(lines: list[tuple[str, ...]]) -> str:
    """Columns padded to their widest cell: the first left-aligned, the others right-aligned."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
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
