"""A lab output directory's rendered files from its run table, in one pass: compare (``analysis``), then draw the
frontier, the curves and, for a task that logs the mismatch by length, the surge (``frontier_plot``, ``plots``,
``surge_report``), write ``report.md`` (``report``) and ``summary.json``
(``summary_json``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .analysis import Comparison, compare
from .frontier_plot import write_frontier_plot
from .plots import write_plots
from .report import write_report
from .summary_json import write_summary
from .surge_report import surge_outputs
from .table import RunTable


@dataclass(frozen=True)
class Outputs:
    """The comparison and the files written for it."""

    comparison: Comparison
    report: Path
    summary: Path
    plots: list[Path]


def write_outputs(table: RunTable, out_dir: Path, commands: list[str]) -> Outputs:
    """``report.md``, ``summary.json`` and ``plots/*.png`` of ``table`` in ``out_dir``; ``commands`` are the lab
    commands that trained the runs (named in the report)."""
    comparison = compare(table)
    plots = write_plots(table.records(), out_dir / "plots")
    if comparison.frontier is not None:
        plots = [write_frontier_plot(comparison.frontier, out_dir / "plots" / "frontier.png"), *plots]
    surge, surge_plots = surge_outputs(table, out_dir / "plots")
    plots = [*surge_plots, *plots]
    report = write_report(comparison, plots, out_dir, commands, surge)
    return Outputs(comparison, report, write_summary(comparison, commands, out_dir / "summary.json"), plots)
