"""``plots/frontier.png``: the frontier (``frontier.frontier``) drawn against the engines' measured mismatch."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from .frontier import EXACT, GAPS
from .stats import Spread


def x_positions(doses: dict[str, Spread]) -> tuple[dict[str, float], bool]:
    """Each dose's x on the log axis, and whether the axis is broken: the exact engine (and any engine measured at
    0), when 0 or more than two decades below every other engine (~1e-7 against ~1e-2), is drawn one decade below
    the smallest of the others, so it stays visible and the axis spends its width on the engines that differ."""
    x = {dose: s.mean for dose, s in doses.items()}
    low = [dose for dose, v in x.items() if dose == EXACT or v <= 0]
    others = [v for dose, v in x.items() if dose not in low]
    if not others or not low or max(x[dose] for dose in low) * 100 > min(others):
        return x, False
    return {dose: min(others) / 10 if dose in low else v for dose, v in x.items()}, True


def dose_ticks(x: dict[str, float], names: dict[str, str], span: float = 0.05) -> list[tuple[float, str]]:
    """The top axis's ticks: doses whose log-x lies within ``span`` of the axis's log width of the previous one are
    one tick at their geometric mean, named ``a / b``, so close doses (e.g. e4m3, int4 and temp1.3 at the same
    ``C_bar``) never print over each other. ``names`` is each dose's label; a linear axis (an x <= 0) is not joined."""
    order = sorted(x, key=x.get)
    if not order or min(x.values()) <= 0:
        return [(x[dose], names[dose]) for dose in order]
    logs = {dose: math.log10(x[dose]) for dose in order}
    width = max(logs[order[-1]] - logs[order[0]], 1e-12)
    groups = [[order[0]]]
    for dose in order[1:]:
        if (logs[dose] - logs[groups[-1][-1]]) / width < span:
            groups[-1].append(dose)
        else:
            groups.append([dose])
    return [(x[group[0]] if len(group) == 1 else 10 ** (sum(logs[d] for d in group) / len(group)),
             " / ".join(names[d] for d in group)) for group in groups]


def write_frontier_plot(found: dict[str, Any], path: Path) -> Path:
    """``frontier.png``: per ``GAPS`` quantity the paired gap against the exact engine (mean, 95% t interval as an
    error bar) against the dose's measured mismatch on a log axis, one line per method, and the collapse rate; the
    top axis names the doses. Returns ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    x, broken = x_positions(found["doses"])
    lines = list(dict.fromkeys(p["line"] for p in found["points"]))
    offset = {line: 1.12 ** (i - (len(lines) - 1) / 2) for i, line in enumerate(lines)}  # keeps error bars apart
    fig, axes = plt.subplots(1, len(GAPS) + 1, figsize=(5.2 * (len(GAPS) + 1) + 2.2, 4.6), sharex=True)
    references = sorted({p["reference"] for p in found["points"] if p["reference"]})
    exact = [dose for dose in x if dose == EXACT]
    for ax, (key, name) in zip(axes, GAPS):
        ax.axhline(0.0, color="0.3", lw=1, ls="--")
        if exact and references:
            ax.plot([x[EXACT]], [0.0], marker="D", ms=7, color="k", ls="none", label="exact engine (reference)")
        for i, line in enumerate(lines):
            pts = [p for p in found["points"] if p["line"] == line and p["gaps"][key] is not None]
            if not pts:
                continue
            xs = [x[p["dose"]] * offset[line] for p in pts]
            gaps = [p["gaps"][key] for p in pts]
            means = [g.mean for g in gaps]
            err = [[g.mean - g.low if g.low is not None else 0.0 for g in gaps],
                   [g.high - g.mean if g.high is not None else 0.0 for g in gaps]]
            ax.errorbar(xs, means, yerr=err, color=f"C{i % 10}", marker="o", ms=5, lw=1.5, capsize=3, label=line)
        ax.set_title(f"{name}: run - exact engine, paired per seed", fontsize=9)
        ax.set_ylabel(f"{name} gap")
    ax = axes[-1]
    for i, line in enumerate(lines):
        pts = [p for p in found["points"] if p["line"] == line]
        ax.plot([x[p["dose"]] * offset[line] for p in pts], [p["collapse_rate"] for p in pts], color=f"C{i % 10}",
                marker="s", ms=5, lw=1.5, label=line)
    ax.set_ylim(-0.05, 1.05)
    ax.set_title("share of seeds that collapsed", fontsize=9)
    ax.set_ylabel("collapse rate")
    seeds = sorted({p["seeds"] for p in found["points"]})
    ticks = dose_ticks(x, {dose: f"{dose}\n({found['doses'][dose].mean:.1e})"
                           if broken and x[dose] != found["doses"][dose].mean else dose for dose in x})
    log = min(x.values()) > 0  # every engine measured at 0 (a degenerate lab): a linear axis
    for ax in axes:
        ax.set_xscale("log" if log else "linear")
        ax.set_xlabel("early C_bar of the engine" + (" (log" + (", broken at //)" if broken else ")") if log else ""))
        ax.grid(alpha=0.3, which="both")
        if broken:
            ax.set_xlim(min(x.values()) / 2, max(x.values()) * 2)
            ax.text(min(x.values()) * 2.2, 0.0, "//", transform=ax.get_xaxis_transform(), ha="center",
                    va="center", fontsize=12, clip_on=False, bbox={"color": "white", "pad": 0})
        top = ax.secondary_xaxis("top")
        top.set_xticks([at for at, _ in ticks], [name for _, name in ticks], fontsize=8, rotation=30, ha="left")
        top.minorticks_off()
    exact_handles = [h for h, label in zip(*axes[0].get_legend_handles_labels()) if label.startswith("exact")]
    handles, labels = axes[-1].get_legend_handles_labels()
    axes[-1].legend(exact_handles + handles, ["exact engine (reference)"][:len(exact_handles)] + labels,
                    loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False, fontsize=9,
                    title=f"mean, bar: 95% t interval\nseeds per run: {'/'.join(map(str, seeds))}\n"
                          f"reference: {', '.join(references) or 'none run'}", title_fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return path
