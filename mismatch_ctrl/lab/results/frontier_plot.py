"""``plots/frontier.png``: the frontier (``frontier.frontier``) drawn against the engines' measured mismatch. Every
point's data x is its engine's; lines are told apart by their style (``style.line_style``), and the engines' names on
the top axis alternate between two rows, or nearly equal ones share a tick, where they would overprint
(``dose_ticks``), measured on the rendered figure. At each engine the lines' points and thin error bars stand side by
side (``dodges``), and the collapsed seeds are a table of counts (``collapse_table``)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...regular_files import save_figure
from .frontier import EXACT, GAPS
from .stats import Spread
from .style import line_note, line_style, new_figure, order_key


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


ROWS = 2
"""Rows of engine names on the top axis: neighbours alternate between them where one row would overprint."""


def dose_ticks(x: dict[str, float], names: dict[str, str], fits: Callable[[list[tuple[float, str]], int], bool],
               span: float = 0.02) -> tuple[list[tuple[float, str]], int]:
    """The top axis's ticks in x order, and on how many rows their labels alternate. Doses within ``span`` of the
    x range (log x on a log axis) of the previous one are one tick at their mean x (geometric on a log axis,
    arithmetic on a linear one: an x <= 0), named ``a / b``: to the eye they are one point. The ticks go on one row
    if ``fits(ticks, 1)``, else on up to :data:`ROWS` rows (tick ``i`` on row ``i % rows``) if that fits; else the two
    neighbouring ticks closest in x become one, and so on until the labels fit. So engines at nearly the same
    ``C_bar`` (e4m3, int4 and temp1.3) share a tick, engines near each other keep their own on alternate rows, and no
    name prints over another."""
    order = sorted(x, key=lambda dose: (x[dose], dose))
    log = bool(order) and min(x.values()) > 0
    where = {dose: math.log10(x[dose]) if log else x[dose] for dose in order}

    def at(group: list[str]) -> float:
        mean = sum(where[dose] for dose in group) / len(group)
        return x[group[0]] if len(group) == 1 else 10 ** mean if log else mean

    width = max(where[order[-1]] - where[order[0]], 1e-12) if order else 1.0
    groups: list[list[str]] = []
    for dose in order:
        if groups and (where[dose] - where[groups[-1][-1]]) / width < span:
            groups[-1].append(dose)
        else:
            groups.append([dose])
    while True:
        ticks = [(at(group), " / ".join(names[dose] for dose in group)) for group in groups]
        rows = next((rows for rows in range(1, ROWS + 1) if fits(ticks, rows)), None)
        if rows is not None or len(groups) < 2:
            return ticks, rows or 1
        centres = [sum(where[dose] for dose in group) / len(group) for group in groups]
        steps = [b - a for a, b in zip(centres, centres[1:])]
        i = steps.index(min(steps))
        groups[i:i + 2] = [groups[i] + groups[i + 1]]


def label_rows(fig: Any, axes: list[Any], pad: float = 4.0) -> Callable[[list[tuple[float, str]], int], bool]:
    """``dose_ticks``'s test on a figure: gives every axes of ``axes`` :data:`ROWS` top axes, one per row of names
    (each row above the tallest label of the rows below), and returns the test: put tick ``i`` on row ``i % rows``,
    lay the figure out, draw it and say whether no two labels come within ``pad`` pixels of each other."""
    tops = [[ax.secondary_xaxis("top") for _ in range(ROWS)] for ax in axes]
    for top in (top for row in tops for top in row):
        top.minorticks_off()

    def fits(ticks: list[tuple[float, str]], rows: int) -> bool:
        shown = [ticks[row::rows] if row < rows else [] for row in range(ROWS)]
        if any(len({at for at, _ in row}) < len(row) for row in shown):
            return False  # two ticks at one x on one row (a degenerate lab: every engine at 0) overprint
        above = 3.5  # points: matplotlib's default tick label pad
        for row, row_ticks in enumerate(shown):
            for axis in tops:
                axis[row].set_xticks([at for at, _ in row_ticks], [name for _, name in row_ticks], fontsize=8)
                axis[row].tick_params(axis="x", pad=above)
            above += max((name.count("\n") + 1 for _, name in row_ticks), default=0) * 8 * 1.25 + 4
        fig.tight_layout()
        fig.canvas.draw()
        for axis in tops:
            boxes = [label.get_window_extent().padded(pad / 2) for top in axis for label in top.get_xticklabels()
                     if label.get_visible() and label.get_text()]
            if any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2)):
                return False
        return True

    return fits


DODGE = 4.0
"""Horizontal distance (points) between the lines' points at one engine: each line is shifted by a fixed multiple of
it in every gap panel, so the error bars of one engine stand side by side instead of on one another."""
BAR = {"elinewidth": 1.1, "capsize": 1.5, "capthick": 1.1}
"""Error bars: thin, with caps narrower than :data:`DODGE` (a cap is ``2 capsize`` points wide), so neighbours'
bars and caps never touch."""


def dodges(lines: list[str], step: float = DODGE) -> dict[str, float]:
    """Each line's horizontal shift in points: ``(i - (n - 1) / 2) step`` for the ``i``-th of ``n`` lines (in
    ``order_key`` order), centred on the engine's x."""
    return {line: (i - (len(lines) - 1) / 2) * step for i, line in enumerate(lines)}


def _shifted(ax: Any, points: float) -> Any:
    """``ax``'s data transform moved ``points`` to the right on the rendered figure (data x unchanged)."""
    from matplotlib.transforms import ScaledTranslation

    return ax.transData + ScaledTranslation(points / 72, 0, ax.figure.dpi_scale_trans)


def collapse_table(ax: Any, lines: list[str], points: list[dict[str, Any]], order: list[str]) -> None:
    """The share of seeds that collapsed as a table: one row per line (``lines`` order, its name in its colour), one
    column per engine (``order``: by measured mismatch), each cell ``k/n`` shaded by ``k/n``; ``-`` where the line
    did not run on that engine. A table, not markers: equal rates at one engine never hide each other."""
    import numpy as np

    cells = {(p["line"], p["dose"]): p for p in points}
    rates = np.full((len(lines), len(order)), np.nan)
    for (i, line), (j, dose) in itertools.product(enumerate(lines), enumerate(order)):
        p = cells.get((line, dose))
        if p is not None:
            rates[i, j] = p["collapse_rate"]
            k = round(p["collapse_rate"] * p["seeds"])
            ax.text(j, i, f"{k}/{p['seeds']}", ha="center", va="center", fontsize=8,
                    color="white" if p["collapse_rate"] > 0.6 else "black")
        else:
            ax.text(j, i, "-", ha="center", va="center", fontsize=8, color="0.5")
    ax.imshow(np.ma.masked_invalid(rates), cmap="Reds", vmin=0.0, vmax=1.0, aspect="auto")
    ax.set_xticks(range(len(order)), order, fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
    ax.set_yticks(range(len(lines)), lines, fontsize=8)
    for label, line in zip(ax.get_yticklabels(), lines):
        label.set_color(line_style(line)["color"])
    ax.set_xticks(np.arange(len(order) + 1) - 0.5, minor=True)
    ax.set_yticks(np.arange(len(lines) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", lw=1.5)
    ax.tick_params(which="minor", length=0)
    ax.set_title("seeds that collapsed (k/n), engines by early C_bar", fontsize=9)


def frontier_figure(found: dict[str, Any]) -> Any:
    """The frontier's figure: per ``GAPS`` quantity the paired gap against the exact engine (mean, 95% t interval as
    a thin error bar) against the dose's measured mismatch on a log axis, one line per method (``style.line_style``)
    with every point at its dose's x, drawn :data:`DODGE` points apart per line (``dodges``); then the collapsed
    seeds as a table (``collapse_table``); the gap panels' top axis names the doses."""
    x, broken = x_positions(found["doses"])
    lines = sorted({p["line"] for p in found["points"]}, key=order_key)
    shift = dodges(lines)
    fig = new_figure(100, figsize=(5.2 * len(GAPS) + 0.45 * len(x) + 3.4, 4.6))
    axes = list(fig.subplots(1, len(GAPS) + 1, width_ratios=[5.2] * len(GAPS) + [0.45 * len(x) + 1.2]))
    gap_axes = axes[:-1]
    for ax in gap_axes[1:]:
        ax.sharex(gap_axes[0])
    references = sorted({p["reference"] for p in found["points"] if p["reference"]})
    exact = [dose for dose in x if dose == EXACT]
    for ax, (key, name) in zip(gap_axes, GAPS):
        ax.axhline(0.0, color="0.3", lw=1, ls="--")
        if exact and references:
            ax.plot([x[EXACT]], [0.0], marker="D", ms=7, color="k", ls="none", label="exact engine (reference)")
        for line in lines:
            pts = [p for p in found["points"] if p["line"] == line and p["gaps"][key] is not None]
            if not pts:
                continue
            gaps = [p["gaps"][key] for p in pts]
            err = [[g.mean - g.low if g.low is not None else 0.0 for g in gaps],
                   [g.high - g.mean if g.high is not None else 0.0 for g in gaps]]
            drawn = ax.errorbar([x[p["dose"]] for p in pts], [g.mean for g in gaps], yerr=err, label=line,
                                **BAR, **line_style(line))
            moved = _shifted(ax, shift[line])
            for artist in (drawn[0], *drawn[1], *drawn[2]):
                artist.set_transform(moved)
        ax.set_title(f"{name}: run - exact engine, paired per seed", fontsize=9)
        ax.set_ylabel(f"{name} gap")
    order = sorted(x, key=lambda dose: (found["doses"][dose].mean, dose))
    collapse_table(axes[-1], lines, found["points"], order)
    seeds = sorted({p["seeds"] for p in found["points"]})
    log = min(x.values()) > 0  # every engine measured at 0 (a degenerate lab): a linear axis
    for ax in gap_axes:
        ax.set_xscale("log" if log else "linear")
        ax.set_xlabel("early C_bar of the engine" + (" (log" + (", broken at //)" if broken else ")") if log else ""))
        ax.grid(alpha=0.3, which="both")
        if broken:
            ax.set_xlim(min(x.values()) / 2, max(x.values()) * 2)
            ax.text(min(x.values()) * 2.2, 0.0, "//", transform=ax.get_xaxis_transform(), ha="center",
                    va="center", fontsize=12, clip_on=False, bbox={"color": "white", "pad": 0})
    handles, labels = gap_axes[0].get_legend_handles_labels()
    axes[-1].legend(handles, labels, loc="upper left", bbox_to_anchor=(1.04, 1.0), frameon=False, fontsize=9,
                    alignment="left", title=f"mean, bar: 95% t interval\nseeds per run: {'/'.join(map(str, seeds))}\n"
                                            f"reference: {', '.join(references) or 'none run'}\n"
                                            f"{line_note(lines)};\nat each engine side by side, in this order",
                    title_fontsize=8)
    names = {dose: f"{dose}\n({found['doses'][dose].mean:.1e})" if broken and x[dose] != found["doses"][dose].mean
             else dose for dose in x}
    dose_ticks(x, names, label_rows(fig, gap_axes))
    return fig


def write_frontier_plot(found: dict[str, Any], path: Path) -> Path:
    """``frontier.png``: the figure of :func:`frontier_figure`. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = frontier_figure(found)
    save_figure(fig, path, dpi=fig.dpi, bbox_inches="tight")
    return path
