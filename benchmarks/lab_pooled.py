"""Paired differences of lab runs against a reference method, per lab output directory and pooled over several.

Each directory is the ``--out`` of ``mismatch-ctrl lab`` (its ``summary.json``; run ``lab --report-only --out DIR``
first if more runs were trained into it). A method's run at seed k is paired with the reference method's run at seed
k of the same directory (same warm-up, same first prompts); the pooled row takes every pair of every directory.
Printed per method: mean [95% t interval] of the paired differences of ``--metric`` and how many runs collapsed
(the reference's count in brackets). This is how the README's DC-GRPO evidence table was made.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mismatch_ctrl.lab.aggregate import spread

METRICS = ("late_acc_engine", "late_reward", "late_acc_fp32", "discrepancy_last")


def runs_of(directory: Path) -> dict[tuple[str, int], dict]:
    """(method[+r3], seed) -> the run's summary row, for each engine ``@quant`` (a run pairs only with the
    reference on the same engine)."""
    path = directory / "summary.json"
    try:
        rows = json.loads(path.read_text())["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"lab_pooled: {path}: not a lab summary ({exc}); run `mismatch-ctrl lab --report-only "
                         f"--out {directory}` first") from None
    return {(f"{row['method']}{'+r3' if row['replay'] else ''}@{row['quant']}", row["seed"]): row for row in rows}


def paired_rows(directories: list[Path], reference: str, metric: str) -> list[str]:
    """One line per method and directory, then its pooled line."""
    tables = {d: runs_of(d) for d in directories}
    methods = sorted({m for rows in tables.values() for m, _ in rows if not m.startswith(f"{reference}@")})
    lines = []
    for method in methods:
        pooled, collapsed, collapsed_ref = [], 0, 0
        ref = f"{reference}@{method.rpartition('@')[2]}"
        for directory, rows in tables.items():
            seeds = sorted(s for m, s in rows if m == method and (ref, s) in rows)
            if not seeds:
                continue
            diffs = [rows[(method, s)][metric] - rows[(ref, s)][metric] for s in seeds]
            c = sum(rows[(method, s)]["collapse_step"] is not None for s in seeds)
            c_ref = sum(rows[(ref, s)]["collapse_step"] is not None for s in seeds)
            pooled += diffs
            collapsed, collapsed_ref = collapsed + c, collapsed_ref + c_ref
            lines.append(_line(method, str(directory), diffs, c, c_ref))
        if pooled and len(tables) > 1:
            lines.append(_line(method, "pooled", pooled, collapsed, collapsed_ref))
    return lines


def _line(method: str, where: str, diffs: list[float], collapsed: int, collapsed_ref: int) -> str:
    s = spread(diffs)
    interval = f"[{s.low:+.3f}, {s.high:+.3f}]" if s.low is not None else "(one seed)"
    return (f"{method:34s} {where:24s} n={s.n:<3d} {s.mean:+.3f} {interval}  collapsed {collapsed}/{s.n} "
            f"(reference {collapsed_ref}/{s.n})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", nargs="+", type=Path, help="lab output directories (--out of mismatch-ctrl lab)")
    parser.add_argument("--reference", default="grpo", help="the method every other is paired with (default grpo)")
    parser.add_argument("--metric", default="late_acc_engine", choices=METRICS, help="the per-run number compared")
    ns = parser.parse_args(argv)
    lines = paired_rows(ns.directories, ns.reference, ns.metric)
    if not lines:
        print(f"lab_pooled: no run is paired with a {ns.reference!r} run of the same seed", file=sys.stderr)
        return 2
    print(f"{ns.metric}: method - {ns.reference}, paired by seed, mean [95% t interval]")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
