"""Does a controller's effect depend on a setting? Its paired gain over GRPO in two lab directories, and the change.

The two directories are ``--out``s of ``mismatch-ctrl lab`` run with the same methods, engines and seeds and one
setting changed (e.g. ``--num-steps-per-rollout 1`` and ``4``: whether routing replay matters more with off-policy
updates). Per run that is not plain GRPO and per seed both directories hold, with ``g = run - grpo@<its engine>``
on ``--metric``: ``g_A``, ``g_B`` and the interaction ``g_B - g_A`` (a difference in differences, paired by seed),
each as mean [95% t interval]; and GRPO itself in B against A. More pairs of directories (other seeds) are pooled.
Collapsed runs count as they are (their metric is what they reached). This is how the README's off-policy answer was
made.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lab_pooled import check_distinct, read_summary  # benchmarks/ is this script's directory
from mismatch_ctrl.lab.results.stats import Spread, spread
from mismatch_ctrl.lab.results.frontier import VERSUS
from mismatch_ctrl.lab.results.report import aggregate_runs


def runs_by_seed(summary: dict, metric: str) -> dict[str, tuple[str, dict[int, float]]]:
    """Per run label of a lab summary (checked by ``read_summary``): its engine and ``{seed: metric}`` (from the
    per-run rows, ``runs``)."""
    aggregated = aggregate_runs(summary["runs"])
    return {label: (entry["quant"], entry["by_seed"].get(metric, {})) for label, entry in aggregated.items()}


def paired_values(a: dict, b: dict, metric: str) -> dict[str, dict[str, list[float]]]:
    """Per run of both summaries, over the seeds where all four numbers exist: ``A`` (gains over GRPO in a), ``B``
    (in b) and ``B - A``; for plain GRPO (``grpo@<engine>``) only ``B - A`` of the run itself."""
    runs_a, runs_b = runs_by_seed(a, metric), runs_by_seed(b, metric)
    out = {}
    for label in sorted(runs_a.keys() & runs_b.keys()):
        (quant, run_a), (_, run_b) = runs_a[label], runs_b[label]
        reference = f"grpo@{quant}"
        if label == reference:
            seeds = sorted(run_a.keys() & run_b.keys())
            if seeds:
                out[label] = {"A": [], "B": [], "B - A": [run_b[s] - run_a[s] for s in seeds]}
            continue
        if reference not in runs_a or reference not in runs_b:
            continue
        ref_a, ref_b = runs_a[reference][1], runs_b[reference][1]
        seeds = sorted(run_a.keys() & run_b.keys() & ref_a.keys() & ref_b.keys())
        if seeds:
            gain_a = [run_a[s] - ref_a[s] for s in seeds]
            gain_b = [run_b[s] - ref_b[s] for s in seeds]
            out[label] = {"A": gain_a, "B": gain_b, "B - A": [y - x for x, y in zip(gain_a, gain_b)]}
    return out


def interactions(pairs: list[tuple[dict, dict]], metric: str) -> list[tuple[str, dict[str, Spread | None]]]:
    """``paired_values`` of each (A, B) pair of summaries, pooled over the pairs (their seeds differ, so the pairs'
    values are independent), as spreads per run."""
    pooled: dict[str, dict[str, list[float]]] = {}
    for a, b in pairs:
        for label, values in paired_values(a, b, metric).items():
            for key, xs in values.items():
                pooled.setdefault(label, {}).setdefault(key, []).extend(xs)
    return [(label, {key: spread(xs) if xs else None for key, xs in values.items()})
            for label, values in sorted(pooled.items())]


def _cell(s: Spread | None) -> str:
    if s is None:
        return f"{'':27s}"
    interval = f"[{s.low:+.3f}, {s.high:+.3f}]" if s.low is not None else "(one seed)"
    return f"{s.mean:+.3f} {interval:19s}  "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directories", type=Path, nargs="+", metavar="A B",
                        help="lab output directories in pairs: A (the reference setting), B (the changed setting); "
                             "more pairs (other seeds) are pooled")
    parser.add_argument("--metric", default="late_acc_engine", choices=[key for key, _ in VERSUS],
                        help="the per-run number compared (default late_acc_engine)")
    ns = parser.parse_args(argv)
    if len(ns.directories) % 2:
        parser.error(f"give the directories in pairs A B (got {len(ns.directories)})")
    dirs = ns.directories
    summaries = [read_summary(directory, "lab_interaction") for directory in dirs]
    check_distinct(dirs, summaries, "lab_interaction")
    pairs = list(zip(summaries[::2], summaries[1::2]))
    rows = interactions(pairs, ns.metric)
    if not rows:
        print("lab_interaction: the two directories share no run with seeds in both", file=sys.stderr)
        return 2
    names = "; ".join(f"A = {a}, B = {b}" for a, b in zip(dirs[::2], dirs[1::2]))
    print(f"{ns.metric}: gain = run - grpo on the same engine, paired by seed; {names}")
    print(f"{'run':24s} {'n':>3s}  {'gain in A':27s}{'gain in B':27s}{'B - A (grpo: the run itself)':27s}")
    for label, cells in rows:
        n = next(s.n for s in cells.values() if s is not None)
        print(f"{label:24s} {n:3d}  " + "".join(_cell(cells[k]) for k in ("A", "B", "B - A")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
