"""Controllers against GRPO on the same engine, per lab output directory and pooled over several.

Each directory is the ``--out`` of ``mismatch-ctrl lab``; its ``summary.json`` holds, per run, the paired per-seed
differences against ``grpo@<its engine>`` (``versus_grpo``, :func:`mismatch_ctrl.lab.frontier.versus_grpo`; run
``lab --report-only --out DIR`` first for a directory written by an older version or trained into twice). The pooled
row concatenates a run's differences of every directory (seeds differ between directories, so the pairs are
independent). Printed per run: mean [95% t interval] of the differences of ``--metric`` and how many of its seeds
collapsed (GRPO's count on the same engine in brackets). This is how the README's DC-GRPO evidence table was made.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mismatch_ctrl.lab.aggregate import spread
from mismatch_ctrl.lab.frontier import VERSUS


def read_summary(directory: Path) -> dict:
    """The lab's ``summary.json`` of ``directory``, with its ``versus_grpo`` table."""
    path = directory / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        summary, problem = None, str(exc)
    else:
        problem = "no versus_grpo table"
    if not isinstance(summary, dict) or not {"versus_grpo", "aggregate"} <= summary.keys():
        raise SystemExit(f"lab_pooled: {path}: not a lab summary ({problem}); run `mismatch-ctrl lab --report-only "
                         f"--out {directory}` first")
    return summary


def pooled_rows(directories: list[Path], metric: str) -> list[str]:
    """One line per run and directory, then, over several directories, its pooled line."""
    pooled: dict[str, list[tuple[list[float], int, int]]] = {}
    lines = []
    for directory in directories:
        summary = read_summary(directory)
        aggregate = summary["aggregate"]
        for row in summary["versus_grpo"]:
            if row["quantity"] != metric:
                continue
            values = row["difference"]["values"]
            part = (values, aggregate[row["run"]]["collapses"], aggregate[row["reference"]]["collapses"])
            pooled.setdefault(row["run"], []).append(part)
            lines.append(_line(row["run"], str(directory), *part))
    if len(directories) > 1:
        for run, parts in sorted(pooled.items()):
            lines.append(_line(run, "pooled", [v for values, _, _ in parts for v in values],
                               sum(p[1] for p in parts), sum(p[2] for p in parts)))
    return lines


def _line(run: str, where: str, values: list[float], collapsed: int, collapsed_grpo: int) -> str:
    s = spread(values)
    interval = f"[{s.low:+.3f}, {s.high:+.3f}]" if s.low is not None else "(one seed)"
    return f"{run:34s} {where:24s} n={s.n:<3d} {s.mean:+.3f} {interval}  collapsed {collapsed} (GRPO {collapsed_grpo})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", nargs="+", type=Path, help="lab output directories (--out of mismatch-ctrl lab)")
    parser.add_argument("--metric", default="late_acc_engine", choices=[key for key, _ in VERSUS],
                        help="the per-run number compared (default late_acc_engine)")
    ns = parser.parse_args(argv)
    lines = pooled_rows(ns.directories, ns.metric)
    if not lines:
        print("lab_pooled: no run has a GRPO run on its engine with a common seed", file=sys.stderr)
        return 2
    print(f"{ns.metric}: run - grpo on the same engine, paired by seed, mean [95% t interval]")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
