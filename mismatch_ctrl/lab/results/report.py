"""``report.md``: the lab's comparison (``analysis.Comparison``) as a page a person reads - one row per run with mean
and 95% interval over seeds, the frontier against the exact engine and each controller against GRPO (paired per
seed), each run's controller state, and the plots."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ... import regular_files
from ...formatting import code_span, fmt
from ..training.summary import LAYER_FLIPS
from .analysis import Comparison
from .controllers import CONTROLLER_COLUMNS
from .frontier import GAPS, VERSUS
from .stats import Spread

INTERVAL = "95% t interval of the mean over seeds"


def _cell(s: Spread | None, digits: int = 3) -> str:
    if s is None:
        return "-"
    if s.low is None:
        return fmt(s.mean, digits)
    return f"{fmt(s.mean, digits)} [{fmt(s.low, digits)}, {fmt(s.high, digits)}]"


def _verdict(difference: Spread | None, direction: int) -> str:
    """A table cell: mean [interval] (n), with **higher** / **lower** where the interval excludes 0."""
    if difference is None:
        return "-"
    mark = {1: " **higher**", -1: " **lower**", 0: ""}[direction]
    return f"{_cell(difference)} ({difference.n}){mark}"


def _frontier_lines(found: dict[str, Any] | None) -> list[str]:
    """The frontier table of ``report.md`` (nothing with fewer than two engines)."""
    if found is None:
        return []
    lines = ["", "## Frontier: each engine against the exact engine", "",
             f"Engines ordered by their measured mismatch, the {found['mismatch']}, mean over the engine's runs "
             "without R3 and their seeds. Gaps: run - exact-engine run (`grpo@none`, else the method's own `@none`), "
             "paired per seed: mean [95% t interval] (n seeds); **higher** / **lower** where the interval excludes 0. "
             "Plot: `plots/frontier.png`.", "",
             "| run | engine | early C_bar of the engine | exact-engine run | "
             + " | ".join(f"{name} gap" for _, name in GAPS) + " | collapsed |",
             "|---|---|---|---|" + "---|" * len(GAPS) + "---|"]
    for p in found["points"]:
        gaps = [_verdict(p["gaps"][key], p["signs"][key]) for key, _ in GAPS]
        lines.append(f"| `{p['label']}` | {p['dose']} | {fmt(found['doses'][p['dose']].mean, 3)} | "
                     f"{'`' + p['reference'] + '`' if p['reference'] else '-'} | " + " | ".join(gaps)
                     + f" | {p['collapses']}/{p['seeds']} |")
    return lines


def _controller_lines(rows: list[dict[str, Any]]) -> list[str]:
    """The per-run controller table (nothing when no run logged any of its columns)."""
    if not any(row[key] is not None for row in rows for key in CONTROLLER_COLUMNS):
        return []
    lines = ["", "## Controller state per run", "",
             "eps: DC-GRPO's budget in force at the first -> last rollout; lambda: DC-GRPO's multiplier at the start, "
             "its peak and after the last update; penalty share: mean |lambda c| / |A|; routing flips: mean share of "
             "response tokens whose expert set flipped. '-': not logged by that run.", "",
             "| run | seed | eps | lambda start / peak / end | penalty share | routing flips |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        eps = "-" if row["eps_start"] is None else fmt(row["eps_start"], 3) + (
            "" if row["eps_end"] == row["eps_start"] else f" -> {fmt(row['eps_end'], 3)}")
        lam = "-" if row["lambda_start"] is None else " / ".join(
            fmt(row[k], 3) for k in ("lambda_start", "lambda_peak", "lambda_end"))
        lines.append(f"| `{row['label']}` | {row['seed']} | {eps} | {lam} | {fmt(row['penalty_share'], 3)} | "
                     f"{fmt(row['routing_flip_fraction'], 3)} |")
    return lines


def write_report(comparison: Comparison, plots: list[Path], out_dir: Path, commands: list[str],
                 sections: Sequence[str] = ()) -> Path:
    """``out_dir/report.md``: the settings, one row per run with mean [95% interval] over seeds, the differences the
    intervals support, the controller table, ``sections`` (more markdown lines) and ``plots`` (paths under
    ``out_dir``)."""
    path = out_dir / "report.md"
    regular_files.write_atomic(path, ("\n".join(_lines(comparison, plots, out_dir, commands, sections)) + "\n")
                               .encode())
    return path


def _lines(comparison: Comparison, plots: list[Path], out_dir: Path, commands: list[str],
           sections: Sequence[str]) -> list[str]:
    settings, seeds, aggregated = comparison.settings, comparison.seeds, comparison.aggregated
    lines = [
        "# mismatch_ctrl lab report",
        "",
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} from the runs of "
        + ", ".join(map(code_span, commands)) + ".",
        "",
        f"Policy `{settings['policy']}`, task `{settings['task']}`, {settings['steps']} rollouts of "
        f"{settings['prompts_per_step']} prompts x {settings['samples_per_prompt']} samples, "
        f"{settings['optimizer_steps']} Adam steps per rollout, lr {settings['lr']}, seeds "
        f"{', '.join(map(str, seeds))}. The rollout engine samples with the quantisation after `@`; training "
        "recomputes log-probs in fp32 (`+r3`: with the engine's expert sets). Accuracies are greedy exact-match on "
        "held-out prompts. Each seed has its own warm-up.",
        "",
        (f"Cells: mean [{INTERVAL}] over {len(seeds)} seeds. Exact " if len(seeds) > 1 else "Cells: the value of "
         "the one seed. Exact ") +
        "figures depend on the machine's floating-point kernels (the CPU's or the GPU's); compare intervals, not "
        "digits.",
        "",
        "| run | engine acc start | engine acc late | change | fp32 acc late | reward late | discrepancy first "
        "quarter | discrepancy late | routing flips | disc. flipped / unflipped | collapsed | s / rollout |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, entry in aggregated.items():
        sp = entry["spreads"]
        split = f"{_cell(sp.get('discrepancy_flipped'))} / {_cell(sp.get('discrepancy_unflipped'))}"
        cells = [_cell(sp.get(key)) for key in ("initial_acc_engine", "late_acc_engine", "acc_change_engine",
                                                "late_acc_fp32", "late_reward", "discrepancy_first",
                                                "discrepancy_last", "routing_flip_fraction")]
        cells += [split if "discrepancy_flipped" in sp else "-", f"{entry['collapses']}/{len(entry['seeds'])}",
                  fmt(sp["seconds_per_step"].mean, 2)]
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    per_layer = []
    for label, entry in aggregated.items():
        layers = [(k[len(LAYER_FLIPS):], s) for k, s in entry["spreads"].items() if k.startswith(LAYER_FLIPS)]
        if layers and any(s.mean for _, s in layers):
            per_layer.append(f"`{label}` " + ", ".join(f"layer {j}: {fmt(s.mean)}" for j, s in layers))
    if per_layer:
        lines += ["", "Routing flips per layer (mean over seeds): " + "; ".join(per_layer) + "."]
    lines += _frontier_lines(comparison.frontier)
    versus = comparison.versus
    lines += ["", "## Each controller against GRPO on the same engine", ""]
    if not versus:
        lines.append("No run has a GRPO run on the same engine (`grpo@<engine>`) to compare with.")
    else:
        if len(seeds) < 2:
            lines += ["One seed: no interval, so no difference is claimed. Run with `--seeds 0,1,2`.", ""]
        lines += ["Run - GRPO at the same engine, paired per seed: mean [95% t interval] (n seeds). **higher** / "
                  "**lower** only where the interval excludes 0.", "",
                  "| run | GRPO run | " + " | ".join(name for _, name in VERSUS) + " |",
                  "|---|---|" + "---|" * len(VERSUS)]
        for run in dict.fromkeys(c["run"] for c in versus):
            cells = {c["quantity"]: c for c in versus if c["run"] == run}
            lines.append(f"| `{run}` | `{cells[next(iter(cells))]['reference']}` | " + " | ".join(
                _verdict(cells[key]["difference"], cells[key]["sign"]) if key in cells else "-"
                for key, _ in VERSUS) + " |")
    missing = comparison.missing
    if missing:
        lines += ["", "Not compared (a reference run is missing from this directory): " + "; ".join(missing) + "."]
    lines += _controller_lines(comparison.controllers)
    lines += sections
    lines += [
        "",
        "Late: over the last quarter of the rollouts (accuracy: the mean of the evaluations there and the final "
        "one; change: late minus start). Discrepancy: `C_bar`, the mean over sequences of the per-token mean "
        "|p_train - p_rollout| of a rollout. Routing flips: share of response tokens whose top-k expert set in "
        "some layer differs between the trainer's recompute and the engine (at the position that scores the "
        "token); disc. flipped / unflipped: token mean |p_train - p_rollout| of those tokens / the others. "
        "Collapsed: seeds whose 10-rollout mean reward fell below half its best and never recovered three quarters "
        "of it.",
        "",
        "## Plots",
        "",
    ]
    return lines + [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in plots]
