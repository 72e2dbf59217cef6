"""Does a controller's effect depend on a setting? Its paired gain over GRPO in two lab directories, and the change.

The two directories are ``--out``s of ``mismatch-ctrl lab`` run with the same methods, engines and seeds and one
setting changed (e.g. ``--num-steps-per-rollout 1`` and ``4``: whether routing replay matters more with off-policy
updates). Per run that is not plain GRPO and per seed both directories hold, with ``g = run - grpo@<its engine>``
on ``--metric``: ``g_A``, ``g_B`` and the interaction ``g_B - g_A`` (a difference in differences, paired by seed),
each as mean [95% t interval]; and GRPO itself in B against A. Collapsed runs count as they are (their metric is
what they reached). This is how the README's off-policy answer was made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab_pooled import read_summary  # benchmarks/ is this script's directory
from mismatch_ctrl.lab.aggregate import Spread, spread
from mismatch_ctrl.lab.frontier import VERSUS
from mismatch_ctrl.lab.report import aggregate_runs


def runs_by_seed(summary: dict, metric: str) -> dict[str, tuple[str, dict[int, float]]]:
    """Per run label of a lab summary: its engine and ``{seed: metric}`` (from the per-run rows, ``runs``)."""
    try:
        aggregated = aggregate_runs(summary["runs"])
    except (KeyError, TypeError) as exc:
        raise SystemExit(f"lab_interaction: a summary without its per-run rows ({exc}); run `mismatch-ctrl lab "
                         "--report-only --out DIR` first") from None
    return {label: (entry["quant"], entry["by_seed"].get(metric, {})) for label, entry in aggregated.items()}


def interactions(a: dict, b: dict, metric: str) -> list[tuple[str, dict[str, Spread | None]]]:
    """Per run of both summaries: the spreads ``A`` (gain over GRPO in a), ``B`` (in b) and ``B - A``, over the seeds
    where all four numbers exist; for plain GRPO (``grpo@<engine>``), ``B - A`` of the run itself."""
    runs_a, runs_b = runs_by_seed(a, metric), runs_by_seed(b, metric)
    rows = []
    for label in sorted(runs_a.keys() & runs_b.keys()):
        (quant, run_a), (_, run_b) = runs_a[label], runs_b[label]
        reference = f"grpo@{quant}"
        if label == reference:
            seeds = sorted(run_a.keys() & run_b.keys())
            if seeds:
                rows.append((label, {"A": None, "B": None, "B - A": spread(run_b[s] - run_a[s] for s in seeds)}))
            continue
        if reference not in runs_a or reference not in runs_b:
            continue
        ref_a, ref_b = runs_a[reference][1], runs_b[reference][1]
        seeds = sorted(run_a.keys() & run_b.keys() & ref_a.keys() & ref_b.keys())
        if not seeds:
            continue
        gain_a = [run_a[s] - ref_a[s] for s in seeds]
        gain_b = [run_b[s] - ref_b[s] for s in seeds]
        rows.append((label, {"A": spread(gain_a), "B": spread(gain_b),
                             "B - A": spread(y - x for x, y in zip(gain_a, gain_b))}))
    return rows


def _cell(s: Spread | None) -> str:
    if s is None:
        return f"{'':27s}"
    interval = f"[{s.low:+.3f}, {s.high:+.3f}]" if s.low is not None else "(one seed)"
    return f"{s.mean:+.3f} {interval:19s}  "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("a", type=Path, help="lab output directory A (the reference setting)")
    parser.add_argument("b", type=Path, help="lab output directory B (the changed setting)")
    parser.add_argument("--metric", default="late_acc_engine", choices=[key for key, _ in VERSUS],
                        help="the per-run number compared (default late_acc_engine)")
    ns = parser.parse_args(argv)
    rows = interactions(read_summary(ns.a), read_summary(ns.b), ns.metric)
    if not rows:
        print("lab_interaction: the two directories share no run with seeds in both", file=sys.stderr)
        return 2
    print(f"{ns.metric}: gain = run - grpo on the same engine, paired by seed; A = {ns.a}, B = {ns.b}")
    print(f"{'run':24s} {'n':>3s}  {'gain in A':27s}{'gain in B':27s}{'B - A (grpo: the run itself)':27s}")
    for label, cells in rows:
        n = next(s.n for s in cells.values() if s is not None)
        print(f"{label:24s} {n:3d}  " + "".join(_cell(cells[k]) for k in ("A", "B", "B - A")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
