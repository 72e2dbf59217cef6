"""Controllers against GRPO on the same engine, per lab output directory and pooled over several.

Each directory is the ``--out`` of ``mismatch-ctrl lab``; its ``summary.json`` holds, per run, the paired per-seed
differences against ``grpo@<its engine>`` (``versus_grpo``, :func:`mismatch_ctrl.lab.results.frontier.versus_grpo`; run
``lab --report-only --out DIR`` first for a directory written by an older version or trained into twice). The pooled
row concatenates a run's differences of every directory (seeds differ between directories, so the pairs are
independent). Printed per run: mean [95% t interval] of the differences of ``--metric`` and how many of its seeds
collapsed (GRPO's count on the same engine in brackets). This is how the README's DC-GRPO evidence table was made.
A directory given twice, or a seed trained with the same settings in two directories (a copy), is refused: it would
count twice. A ``summary.json`` that is not as the lab writes it is named with its first unusable field.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from mismatch_ctrl.formatting import brief, clip
from mismatch_ctrl.lab.results.stats import spread
from mismatch_ctrl.lab.results.frontier import VERSUS
from mismatch_ctrl.lab.results.report import AGGREGATED
from mismatch_ctrl.lab.training.summary import LAYER_FLIPS


def read_summary(directory: Path, program: str = "lab_pooled") -> dict:
    """The lab's ``summary.json`` of ``directory``, checked field by field (``check_summary``); SystemExit naming the
    file (and the field) when it is not one the lab wrote."""
    path = directory / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        summary, problem = None, clip(str(exc) or type(exc).__name__, 120)
    else:
        problem = "no runs, versus_grpo or aggregate table"
    if not isinstance(summary, dict) or not {"runs", "versus_grpo", "aggregate"} <= summary.keys():
        raise SystemExit(f"{program}: {path}: not a lab summary ({problem}); run `mismatch-ctrl lab --report-only "
                         f"--out {directory}` first")
    problem = check_summary(summary)
    if problem:
        raise SystemExit(f"{program}: {path}: {problem}; not as the lab writes it: run `mismatch-ctrl lab "
                         f"--report-only --out {directory}` to write it again from the runs")
    return summary


def _number(value: object, minimum: float = -math.inf) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and minimum <= value < math.inf


def _run_problem(i: int, row: object) -> str | None:
    """What is wrong with ``runs[i]`` of a summary, or None."""
    if not isinstance(row, dict):
        return f"runs[{i}] = {brief(row, 40)}: expected a table"
    for key, kind in (("label", str), ("method", str), ("quant", str), ("replay", bool), ("settings", dict)):
        if not isinstance(row.get(key), kind):
            return f"runs[{i}].{key} = {brief(row.get(key), 40)}: expected a {kind.__name__}"
    if not (isinstance(row.get("seed"), int) and _number(row["seed"], 0)):
        return f"runs[{i}].seed = {brief(row.get('seed'), 40)}: expected an integer >= 0"
    if row.get("collapse_step") is not None and not (isinstance(row["collapse_step"], int) and
                                                     _number(row["collapse_step"], 0)):
        return f"runs[{i}].collapse_step = {brief(row['collapse_step'], 40)}: expected an integer >= 0 or null"
    for key in (*AGGREGATED, *(k for k in row if k.startswith(LAYER_FLIPS))):
        if row.get(key) is not None and not _number(row[key]):
            return f"runs[{i}].{key} = {brief(row[key], 40)}: expected a finite number or null"
    return None


def check_summary(summary: dict) -> str | None:
    """The first field of a parsed ``summary.json`` that ``lab_pooled`` and ``lab_interaction`` cannot use, as
    ``field = value: expected ...``; None when every field they read is as the lab writes it."""
    runs, aggregate, versus = summary["runs"], summary["aggregate"], summary["versus_grpo"]
    if not isinstance(runs, list) or not isinstance(aggregate, dict) or not isinstance(versus, list):
        return "runs and versus_grpo must be lists, aggregate a table"
    seen = set()
    for i, row in enumerate(runs):
        problem = _run_problem(i, row)
        if problem:
            return problem
        if (row["label"], row["seed"]) in seen:
            return f"runs[{i}]: run {brief(row['label'], 60)} seed {row['seed']} is listed twice"
        seen.add((row["label"], row["seed"]))
    for label, entry in aggregate.items():
        if not (isinstance(entry, dict) and isinstance(entry.get("collapses"), int) and _number(entry["collapses"], 0)):
            return f"aggregate[{brief(label, 60)}].collapses: expected an integer >= 0"
    labels = {label for label, _ in seen}
    for i, row in enumerate(versus):
        if not isinstance(row, dict) or not all(isinstance(row.get(key), str) for key in ("run", "reference",
                                                                                          "quantity")):
            return f"versus_grpo[{i}]: expected a table with the strings run, reference and quantity"
        for key in ("run", "reference"):
            if row[key] not in aggregate or row[key] not in labels:
                return f"versus_grpo[{i}].{key} = {brief(row[key], 60)}: not a run of the runs and aggregate tables"
        values = row.get("difference", {}).get("values") if isinstance(row.get("difference"), dict) else None
        if not (isinstance(values, list) and values and all(_number(v) for v in values)):
            return f"versus_grpo[{i}].difference.values = {brief(values, 40)}: expected a list of finite numbers"
    return None


def check_distinct(directories: list[Path], summaries: list[dict], program: str) -> None:
    """Refuse (SystemExit) a directory given twice and a seed trained with the same settings in two directories:
    pooling counts every run once, so each (settings, seed) may come from one directory only."""
    given: dict[Path, Path] = {}
    for directory in directories:
        if directory.resolve() in given:
            raise SystemExit(f"{program}: {directory} is given twice (also as {given[directory.resolve()]}); its seeds "
                             "would count twice in the pooled intervals")
        given[directory.resolve()] = directory
    found: dict[tuple[str, int], Path] = {}
    for directory, summary in zip(directories, summaries):
        for row in summary["runs"]:
            settings = json.dumps({k: v for k, v in row["settings"].items() if k != "seed"}, sort_keys=True)
            other = found.setdefault((settings, row["seed"]), directory)
            if other != directory:
                raise SystemExit(f"{program}: {other} and {directory} both hold seed {row['seed']} trained with the "
                                 "same settings (a copied directory, or two --out trained with the same seeds); "
                                 "pooling would count those runs twice: give directories of other seeds")


def pooled_rows(directories: list[Path], metric: str) -> list[str]:
    """One line per run and directory, then, over several directories, its pooled line."""
    pooled: dict[str, list[tuple[list[float], int, int]]] = {}
    lines = []
    summaries = [read_summary(directory) for directory in directories]
    check_distinct(directories, summaries, "lab_pooled")
    for directory, summary in zip(directories, summaries):
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
