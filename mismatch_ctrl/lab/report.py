"""The lab's outputs a person reads: ``report.md`` (one row per method, mean and 95% interval over seeds, and which
differences the intervals support), ``summary.json`` (per-seed and aggregated numbers) and PNG plots (mean over
seeds with a min-max band)."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..formatting import fmt
from .aggregate import Spread, aggregate
from .frontier import GAPS, VERSUS, frontier, frontier_json, versus_grpo, write_frontier_plot
from .trainer import LAYER_FLIPS

DCGRPO_KEY = "lambda_next"
"""A record key present only in runs with DC-GRPO enabled."""

AGGREGATED = ("initial_acc_engine", "final_acc_engine", "late_acc_engine", "acc_change_engine", "best_acc_engine",
              "final_acc_fp32", "late_acc_fp32", "final_reward", "late_reward",
              "discrepancy_mean", "discrepancy_first", "discrepancy_last", "discrepancy_max", "routing_flip_fraction",
              "discrepancy_flipped", "discrepancy_unflipped", "seconds_per_step")
"""Run-summary quantities aggregated over seeds."""

INTERVAL = "95% t interval of the mean over seeds"

# file, record key, title, moving-average window, which runs (None: all that have the key)
PlotSpec = tuple[str, str, str, int, Callable[[dict[str, Any]], bool] | None]
PLOTS: list[PlotSpec] = [
    ("reward", "reward", "training reward (10-rollout moving average)", 10, None),
    ("eval_accuracy", "eval_acc_engine", "held-out greedy accuracy of the rollout engine (deployed)", 1, None),
    ("discrepancy", "discrepancy", "discrepancy C_bar = mean |p_train - p_rollout| (dotted: DC-GRPO eps)", 1,
     None),
    ("routing_flip_fraction", "routing_flip_fraction", "share of response tokens whose expert set flipped "
     "(5-rollout moving average)", 5, None),
    ("discrepancy_flipped", "discrepancy_flipped", "mean |p_train - p_rollout| of tokens whose routing flipped "
     "(5-rollout m.a.)", 5, None),
    ("discrepancy_unflipped", "discrepancy_unflipped", "mean |p_train - p_rollout| of tokens whose routing did not "
     "flip", 1, None),
    ("lambda", "lambda", "DC-GRPO multiplier lambda", 1, lambda first: DCGRPO_KEY in first),
    ("lr", "train/lr", "learning rate", 1, None),
    ("response_length", "response_length", "mean response length (tokens, 5-rollout moving average)", 5, None),
    ("rejected_fraction", "train/mismatch_ctrl/rejected_token_fraction", "fraction of trained tokens rejected", 1,
     None),
]
OVERVIEW = ("reward", "eval_accuracy", "discrepancy", "routing_flip_fraction", "discrepancy_flipped", "lambda",
            "response_length")
LINESTYLES = ["-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)), (0, (8, 2, 1, 2))]
LOG_SCALE = {"discrepancy", "discrepancy_flipped", "discrepancy_unflipped"}

Runs = dict[str, dict[int, list[dict[str, Any]]]]
"""label -> seed -> the run's per-rollout records."""


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-step records of one run (``metrics.jsonl``)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def aggregate_runs(summaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per label (in first-seen order): method, quantisation, replay, the seeds, the ``Spread`` of every
    ``AGGREGATED`` quantity, how many seeds collapsed, and ``by_seed``: quantity -> seed -> value."""
    out: dict[str, dict[str, Any]] = {}
    for s in summaries:
        entry = out.setdefault(s["label"], {"method": s["method"], "quant": s["quant"], "replay": s["replay"],
                                            "rows": []})
        entry["rows"].append(s)
    for entry in out.values():
        rows = entry.pop("rows")
        keys = AGGREGATED + tuple(sorted(k for k in rows[0] if k.startswith(LAYER_FLIPS)))
        entry["seeds"] = [r["seed"] for r in rows]
        entry["spreads"] = aggregate(rows, keys)
        entry["by_seed"] = {key: {r["seed"]: r[key] for r in rows if r.get(key) is not None} for key in keys}
        entry["collapses"] = sum(r["collapse_step"] is not None for r in rows)
    return out


def _cell(s: Spread | None, digits: int = 3) -> str:
    if s is None:
        return "-"
    if s.low is None:
        return fmt(s.mean, digits)
    return f"{fmt(s.mean, digits)} [{fmt(s.low, digits)}, {fmt(s.high, digits)}]"


def _series(records: list[dict[str, Any]], key: str, window: int) -> tuple[list[float], list[float]]:
    """(x, y) of one run: the key's values by rollout, moving-averaged; for the engine accuracy, the evaluation after
    the last update is drawn at x = number of rollouts."""
    points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
    final = f"final_{key}"
    if final in records[-1]:
        points.append((records[-1]["step"] + 1, records[-1][final]))
    if not points:
        return [], []
    steps, values = zip(*points)
    return list(steps), _moving_average(list(values), window)


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def band(seed_series: list[tuple[list[float], list[float]]]) -> tuple[list[float], list[float], list[float],
                                                                      list[float]]:
    """x, mean, min and max over seeds at the x values every seed has."""
    common = sorted(set.intersection(*(set(x) for x, _ in seed_series)))
    lookup = [dict(zip(x, y)) for x, y in seed_series]
    columns = [[table[x] for table in lookup] for x in common]
    return common, [sum(c) / len(c) for c in columns], [min(c) for c in columns], [max(c) for c in columns]


def twins(curves: list[tuple[str, tuple[list[float], ...]]]) -> dict[str, str]:
    """For each curve (label, (x, mean, ...)) identical in x and mean to an earlier one, that earlier label."""
    first: dict[tuple, str] = {}
    out = {}
    for label, (x, mean, *_) in curves:
        twin = first.setdefault((tuple(x), tuple(mean)), label)
        if twin != label:
            out[label] = twin
    return out


def _style(index: int) -> dict[str, Any]:
    return {"color": f"C{index % 10}", "ls": LINESTYLES[index % len(LINESTYLES)], "lw": 1.5}


def _log_bottom(curves: list[tuple[str, tuple[list[float], ...]]], extra: list[float]) -> float | None:
    """The lower limit of a log axis that shows the quantised engines' curves and ``extra`` values (eps): the exact
    engine's (``@none``, orders of magnitude lower) are left below it; None when there is no exact engine."""
    quantised = [v for label, (_, _, low, _) in curves if "@none" not in label for v in low if v > 0]
    exact = [label for label, _ in curves if "@none" in label]
    return min(quantised + [v for v in extra if v > 0]) / 1.5 if quantised and exact else None


def write_plots(runs: Runs, out_dir: Path) -> list[Path]:
    """One PNG per quantity of :data:`PLOTS` that some run has, and ``overview.png``. Each run has its own colour and
    line style; a run whose mean curve equals an earlier one's is labelled ``(= that run)``; the band is the min-max
    over seeds; legends sit outside the axes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    styles = {label: _style(i) for i, label in enumerate(runs)}
    drawn: dict[str, list[tuple[str, tuple[list[float], ...]]]] = {}
    for name, key, _, window, keep in PLOTS:
        curves = []
        for label, seeds in runs.items():
            first = next(iter(seeds.values()))[0]
            if keep is not None and not keep(first):
                continue
            series = [_series(records, key, window) for records in seeds.values()]
            if all(x for x, _ in series):
                curves.append((label, band(series)))
        if curves:
            drawn[name] = curves
    eps_lines = {label: band([_series(records, "eps", 1) for records in seeds.values()])
                 for label, seeds in runs.items() if all(any("eps" in r for r in rec) for rec in seeds.values())}

    def draw(ax: Any, name: str) -> None:
        spec = next(p for p in PLOTS if p[0] == name)
        same = twins(drawn[name])
        eps = [v for label, _ in drawn[name] if name == "discrepancy" and label in eps_lines
               for v in eps_lines[label][1]]
        bottom = _log_bottom(drawn[name], eps) if name in LOG_SCALE else None
        below = [label for label, (_, _, _, high) in drawn[name] if bottom is not None and max(high) < bottom]
        for label, (x, mean, low, high) in drawn[name]:
            text = f"{label} (= {same[label]})" if label in same else label
            ax.plot(x, mean, label=text, **styles[label])
            if name == "eval_accuracy":
                ax.plot(x[-1:], mean[-1:], marker="o", ms=4, color=styles[label]["color"])
            if low != high:
                ax.fill_between(x, low, high, color=styles[label]["color"], alpha=0.08, lw=0)
            if name == "discrepancy" and label in eps_lines and eps_lines[label][0]:
                ax.plot(eps_lines[label][0], eps_lines[label][1], color="0.15", ls=":", lw=1.4, zorder=5)
        ax.set_title(spec[2] + (f"; below the axis: {', '.join(below)}" if below else ""), fontsize=9)
        ax.set_xlabel("rollout")
        ax.grid(alpha=0.3)
        if name in LOG_SCALE:
            ax.set_yscale("log")
            if bottom is not None:
                ax.set_ylim(bottom=bottom)

    written = []
    for name in drawn:
        fig, ax = plt.subplots(figsize=(9, 4.5))
        draw(ax, name)
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)
    if "eval_accuracy" in drawn and any(len(seeds) > 1 for seeds in runs.values()):
        written.append(_per_run_plot(plt, runs, styles, out_dir))
    panels = [name for name in OVERVIEW if name in drawn]
    if not panels:
        return written
    rows = (len(panels) + 2) // 2
    overview, axes = plt.subplots(rows, 2, figsize=(14, 4 * rows), squeeze=False)
    for name, ax in zip(panels, axes.flat):
        draw(ax, name)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    several = any(len(seeds) > 1 for seeds in runs.values())
    axes.flat[-1].legend(handles, labels, loc="center", fontsize=11, frameon=False,
                         title="mean over seeds; band: min-max" if several else "one seed")
    overview.tight_layout()
    path = out_dir / "overview.png"
    overview.savefig(path, dpi=90)
    plt.close(overview)
    return [path, *written]


def _per_run_plot(plt: Any, runs: Runs, styles: dict[str, dict[str, Any]], out_dir: Path) -> Path:
    """``eval_accuracy_by_run.png``: one panel per run with each seed's engine accuracy (thin) and their mean."""
    columns = min(4, len(runs))
    rows = -(-len(runs) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.8 * rows), squeeze=False, sharex=True,
                             sharey=True)
    for ax, (label, seeds) in zip(axes.flat, runs.items()):
        series = [_series(records, "eval_acc_engine", 1) for records in seeds.values()]
        for x, y in series:
            ax.plot(x, y, color="0.6", lw=0.8)
        x, mean, _, _ = band(series)
        ax.plot(x, mean, color=styles[label]["color"], lw=2)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    fig.suptitle("held-out greedy accuracy of the rollout engine: each seed (grey) and the mean", fontsize=10)
    fig.tight_layout()
    path = out_dir / "eval_accuracy_by_run.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


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


CONTROLLER_COLUMNS = ("eps_start", "eps_end", "lambda_start", "lambda_peak", "lambda_end", "penalty_share",
                      "routing_flip_fraction")


def controller_row(records: list[dict[str, Any]]) -> dict[str, float | None]:
    """One run's controller state from its ``metrics.jsonl`` records: DC-GRPO's eps at the first and last rollout,
    lambda at the start, its peak and its end (the multiplier after the last update, ``lambda_next``), the mean
    ``penalty_share`` (|lambda c| / |A|) and the mean share of tokens whose routing flipped; None where not logged."""

    def values(key: str) -> list[float]:
        return [r[key] for r in records if r.get(key) is not None]

    eps, lam, share, flips = values("eps"), values("lambda"), values("penalty_share"), values("routing_flip_fraction")
    lam_end = values("lambda_next")[-1:] or lam[-1:]
    return {"eps_start": eps[0] if eps else None, "eps_end": eps[-1] if eps else None,
            "lambda_start": lam[0] if lam else None, "lambda_peak": max(lam + lam_end) if lam else None,
            "lambda_end": lam_end[0] if lam_end else None,
            "penalty_share": sum(share) / len(share) if share else None,
            "routing_flip_fraction": sum(flips) / len(flips) if flips else None}


def controller_rows(summaries: list[dict[str, Any]], out_dir: Path) -> list[dict[str, Any]]:
    """``controller_row`` of every run whose ``OUT/<label>/seed<k>/metrics.jsonl`` exists, with label and seed."""
    out = []
    for s in summaries:
        path = out_dir / s["label"] / f"seed{s['seed']}" / "metrics.jsonl"
        if path.is_file():
            out.append({"label": s["label"], "seed": s["seed"], **controller_row(read_metrics(path))})
    return out


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


def write_report(summaries: list[dict[str, Any]], aggregated: dict[str, dict[str, Any]], plots: list[Path],
                 out_dir: Path, commands: list[str]) -> Path:
    """``report.md`` (settings, one row per method with mean [95% interval] over seeds, the differences the
    intervals support, the plots) and ``summary.json`` (every run's summary and the aggregate)."""
    settings = summaries[0]["settings"]
    found = frontier(aggregated)
    if found is not None:
        plots = [write_frontier_plot(found, out_dir / "plots" / "frontier.png"), *plots]
    controllers = controller_rows(summaries, out_dir)
    seeds = sorted({s["seed"] for s in summaries})
    lines = [
        "# mismatch_ctrl CPU lab report",
        "",
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} from the runs of "
        + ", ".join(f"`{c}`" for c in commands) + ".",
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
        "figures depend on the CPU's floating-point kernels; compare intervals, not digits.",
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
    lines += _frontier_lines(found)
    versus = versus_grpo(aggregated)
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
    lines += _controller_lines(controllers)
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
    lines += [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in plots]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    summary = {
        "commands": commands, "seeds": seeds, "interval": INTERVAL, "runs": summaries,
        "aggregate": {label: {**{k: v for k, v in entry.items() if k not in ("spreads", "by_seed")},
                              "metrics": {k: s.as_dict() for k, s in entry["spreads"].items()}}
                      for label, entry in aggregated.items()},
        "frontier": None if found is None else frontier_json(found),
        "versus_grpo": [{**c, "difference": c["difference"].as_dict()} for c in versus],
        "controllers": controllers,
    }
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    return path

