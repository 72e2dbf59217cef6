"""The lab's outputs a person reads: PNG plots per quantity and ``report.md`` with one row per run."""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

from ..formatting import fmt

DCGRPO_KEY = "lambda_next"
"""A record key present only in runs with DC-GRPO enabled."""

PLOTS: list[tuple[str, str, str, int, bool]] = [
    # file, record key, title, moving-average window, DC-GRPO runs only
    ("reward", "reward", "training reward (10-rollout moving average)", 10, False),
    ("eval_accuracy", "eval_acc_engine", "held-out greedy accuracy of the rollout engine (deployed)", 1, False),
    ("discrepancy", "discrepancy", "discrepancy C_bar = mean |p_train - p_rollout| (dashed: DC-GRPO eps)", 1, False),
    ("lambda", "lambda", "DC-GRPO multiplier lambda", 1, True),
    ("lr", "train/lr", "learning rate", 1, False),
    ("response_length", "response_length", "mean response length (tokens, 5-rollout moving average)", 5, False),
    ("rejected_fraction", "train/mismatch_ctrl/rejected_token_fraction", "fraction of trained tokens rejected", 1,
     False),
]


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The per-step records of one run (``metrics.jsonl``)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def write_plots(runs: dict[str, list[dict[str, Any]]], out_dir: Path) -> list[Path]:
    """One PNG per quantity of :data:`PLOTS` (runs without the quantity are left out) and ``overview.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    overview, axes = plt.subplots(4, 2, figsize=(14, 16))
    for (name, key, title, window, dcgrpo_only), overview_ax in zip(PLOTS, axes.flat):
        fig, ax = plt.subplots(figsize=(8, 4.5))
        for target in (ax, overview_ax):
            for k, (label, records) in enumerate(runs.items()):
                is_dcgrpo = DCGRPO_KEY in records[0]
                points = [(r["step"], r[key]) for r in records if key in r]
                if not points or (dcgrpo_only and not is_dcgrpo):
                    continue
                steps, values = zip(*points)
                color = f"C{k % 10}"
                target.plot(steps, _moving_average(list(values), window), label=label, color=color, lw=1.4)
                if key == "discrepancy" and is_dcgrpo:
                    eps = [(r["step"], r["eps"]) for r in records if "eps" in r]
                    if eps:
                        target.plot(*zip(*eps), ls="--", color=color, lw=1)
            target.set_title(title, fontsize=10)
            target.set_xlabel("rollout")
            target.grid(alpha=0.3)
            if key == "discrepancy":
                target.set_yscale("log")
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    axes.flat[-1].axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    axes.flat[-1].legend(handles, labels, loc="center", fontsize=11)
    overview.tight_layout()
    path = out_dir / "overview.png"
    overview.savefig(path, dpi=90)
    plt.close(overview)
    return [path, *written]


def write_report(summaries: list[dict[str, Any]], plots: list[Path], out_dir: Path, command: str) -> Path:
    """``report.md``: settings, one row per run, the plots."""
    settings = summaries[0]["settings"]
    lines = [
        "# mismatch_ctrl CPU lab report",
        "",
        f"Generated {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `{command}`.",
        "",
        f"Task `{settings['task']}`, {settings['steps']} rollouts of {settings['prompts_per_step']} prompts x "
        f"{settings['samples_per_prompt']} samples, {settings['optimizer_steps']} Adam steps per rollout, "
        f"lr {settings['lr']}, seed {settings['seed']}. The rollout engine samples with the quantisation after `@`; "
        "training recomputes log-probs in fp32. Accuracies are greedy exact-match on held-out prompts.",
        "",
        "| run | acc engine: start / final / best | acc fp32: final / best | final reward | discrepancy mean / max "
        "| collapse step | s / rollout | wall s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        lines.append(
            f"| `{s['label']}` | {s['initial_acc_engine']:.3f} / {s['final_acc_engine']:.3f} / "
            f"{s['best_acc_engine']:.3f} | {s['final_acc_fp32']:.3f} / {s['best_acc_fp32']:.3f} | "
            f"{s['final_reward']:.3f} | {fmt(s['discrepancy_mean'])} / {fmt(s['discrepancy_max'])} | "
            f"{fmt(s['collapse_step'])} | {s['seconds_per_step']:.2f} | {s['seconds']:.0f} |")
    lines += [
        "",
        "Discrepancy: `C_bar`, the mean over sequences of the per-token mean |p_train - p_rollout| of a rollout. "
        "Collapse step: first rollout where the 10-rollout moving average of the training reward falls below half "
        "of its best and never recovers three quarters of it.",
        "",
        "## Plots",
        "",
    ]
    lines += [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in plots]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    (out_dir / "summary.json").write_text(json.dumps(summaries, indent=1))
    return path
