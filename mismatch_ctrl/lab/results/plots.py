"""The lab's PNG plots over rollouts: per quantity the mean over seeds of every run, smoothed (a trailing moving
average) with the raw mean faint; the min-max band over seeds where it does not hide other runs (two runs at most),
else one small panel per run (``*_by_run.png``); flipped and unflipped discrepancy on one panel; no plot for a
setting or counter that is the same constant in every run (a flat learning rate, no rejections); legends outside the
data; log axes span the exact engine too. Every run is drawn in its own style (``style.run_style``: colour per
method, line style per engine, hollow markers for ``+r3``), the same whichever runs a plot shows; runs are drawn and
listed in the caller's order of ``runs``. Titles and legends name only what is drawn: the DC-GRPO eps line, the
min-max band, the parts of the style rule the runs shown use (``style.legend_note``). ``render`` makes the figures,
``write_plots`` saves them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...regular_files import save_figure
from ...smoothing import moving_average
from .style import legend_note, new_figure, run_style

Runs = dict[str, dict[int, list[dict[str, Any]]]]
"""label -> seed -> the run's per-rollout records."""

Curve = tuple[list[float], list[float], list[float], list[float]]
"""x, mean over seeds, min and max over seeds."""


@dataclass(frozen=True)
class Plot:
    """One quantity over rollouts: file name, record key, title, moving-average window, log axis, which runs (a
    predicate on a run's first record; None: every run that has the key), and whether it is left out when it is one
    constant in every run (a setting or a counter, not an outcome: a flat learning rate, no rejections)."""

    name: str
    key: str
    title: str
    window: int = 1
    log: bool = False
    keep: Callable[[dict[str, Any]], bool] | None = None
    optional: bool = True


DCGRPO_KEY = "lambda_next"
"""A record key present only in runs with DC-GRPO enabled."""

PLOTS = (
    Plot("reward", "reward", "training reward", 10, optional=False),
    Plot("eval_accuracy", "eval_acc_engine", "held-out greedy accuracy of the rollout engine (deployed)",
         optional=False),
    Plot("discrepancy", "discrepancy", "discrepancy C_bar = mean |p_train - p_rollout|", 5, log=True, optional=False),
    Plot("routing_flip_fraction", "routing_flip_fraction", "share of response tokens whose expert set flipped", 5),
    Plot("lambda", "lambda", "DC-GRPO multiplier lambda", keep=lambda first: DCGRPO_KEY in first),
    Plot("lr", "train/lr", "learning rate"),
    Plot("response_length", "response_length", "mean response length (tokens)", 5),
    Plot("rejected_fraction", "train/mismatch_ctrl/rejected_token_fraction", "fraction of trained tokens rejected", 5),
)
SPLIT = ("discrepancy_flipped", "discrepancy_unflipped")
"""Token mean |p_train - p_rollout| of tokens whose routing flipped / did not: drawn on one panel."""
SPLIT_NAME = "discrepancy_by_routing"
BY_RUN = ("reward", "eval_accuracy")
"""Quantities that get one small panel per run when bands of several runs would overlap."""
OVERVIEW = ("reward", "eval_accuracy", "discrepancy", SPLIT_NAME, "routing_flip_fraction", "lambda",
            "response_length")
MAX_BANDS = 2
"""Most runs whose min-max bands share one panel."""


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
    return list(steps), moving_average(list(values), window)


def band(seed_series: list[tuple[list[float], list[float]]]) -> Curve:
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


def informative(curves: list[tuple[str, Curve]]) -> bool:
    """False when every run's values are one and the same constant (the panel would say nothing)."""
    values = {v for _, (_, _, low, high) in curves for v in low + high}
    return len(values) > 1


def curves_of(runs: Runs, key: str, window: int, keep: Callable[[dict[str, Any]], bool] | None = None
              ) -> list[tuple[str, Curve, Curve]]:
    """(label, smoothed curve, raw curve) of every run (passing ``keep``) whose seeds all have ``key``."""
    out = []
    for label, seeds in runs.items():
        if keep is not None and not keep(next(iter(seeds.values()))[0]):
            continue
        raw = [_series(records, key, 1) for records in seeds.values()]
        if all(x for x, _ in raw):
            smooth = [(x, moving_average(y, window)) for x, y in raw]
            out.append((label, band(smooth), band(raw)))
    return out


def far_below(curves: list[tuple[str, Curve, Curve]]) -> set[str]:
    """Runs whose curve lies entirely more than two decades below every other run's (the exact engine's discrepancy,
    ~1e-7 against ~1e-2): a log panel shows them on a separate strip below a break."""
    tops = {label: max(high) for label, (_, _, _, high), _ in curves}
    bottoms = {label: min(low) for label, (_, _, low, _), _ in curves}
    ordered = sorted(tops, key=tops.get)
    for i in range(1, len(ordered)):
        lower, upper = ordered[:i], ordered[i:]
        if max(tops[k] for k in lower) * 100 < min(bottoms[k] for k in upper):
            return set(lower)
    return set()


EPS_NOTE = "wide faint: DC-GRPO eps"
"""Said in the discrepancy panel's title only when it draws a run's eps."""
BAND_NOTE = "shaded: min-max over seeds"
"""Said in a legend's title only when a band is drawn."""


def _draw(ax: Any, plot: Plot, curves: list[tuple[str, Curve, Curve]], styles: dict[str, dict[str, Any]],
          eps: dict[str, Curve]) -> bool:
    """One quantity on one axis: smoothed means, raw means faint (in the run's line style), bands only for few runs,
    eps as a wide faint line (named in the title only when one is drawn); on a log axis, runs far below the others
    (``far_below``) on a strip under a break. Returns whether a band was drawn."""
    same = twins([(label, smooth) for label, smooth, _ in curves])
    low_runs = far_below(curves) if plot.log else set()
    strip, banded, notes = None, False, []
    if low_runs:
        import matplotlib.ticker
        from mpl_toolkits.axes_grid1 import make_axes_locatable

        strip = make_axes_locatable(ax).append_axes("bottom", size="22%", pad=0.12, sharex=ax)
    for label, (x, mean, low, high), (rx, rmean, _, _) in curves:
        target = strip if label in low_runs else ax
        color = styles[label]["color"]
        if plot.window > 1:
            target.plot(rx, rmean, color=color, ls=styles[label]["ls"], lw=0.7, alpha=0.3)
        target.plot(x, mean, label=f"{label} (= {same[label]})" if label in same else label, **styles[label])
        if plot.name == "eval_accuracy":
            target.plot(x[-1:], mean[-1:], marker="o", ms=4, color=color)
        if len(curves) <= MAX_BANDS and low != high:
            target.fill_between(x, low, high, color=color, alpha=0.12, lw=0)
            banded = True
        if label in eps and eps[label][0]:
            target.plot(eps[label][0], eps[label][1], color=color, lw=5, alpha=0.25, solid_capstyle="butt")
            notes += [] if EPS_NOTE in notes else [EPS_NOTE]
    if plot.window > 1:
        notes.append(f"{plot.window}-rollout moving average; faint: raw")
    ax.set_title(plot.title + (f" ({'; '.join(notes)})" if notes else ""), fontsize=9)
    _finish(ax, plot.log)
    if strip is not None:
        _finish(strip, True)
        ax.set_xlabel("")
        ax.tick_params(labelbottom=False)
        ax.spines["bottom"].set_visible(False)
        strip.spines["top"].set_visible(False)
        for axis, y in ((ax, 0.0), (strip, 1.0)):
            axis.plot([0, 1], [y, y], transform=axis.transAxes, color="k", lw=0.8, ls=(0, (3, 3)), clip_on=False)
        strip.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        strip.yaxis.set_major_locator(matplotlib.ticker.LogLocator(numticks=3))
    return banded


def _finish(ax: Any, log: bool) -> None:
    ax.set_xlabel("rollout")
    ax.grid(alpha=0.3)
    if log:
        ax.set_yscale("log")


def _draw_split(ax: Any, curves: dict[str, list[tuple[str, Curve, Curve]]], styles: dict[str, dict[str, Any]]
                ) -> bool:
    """Flipped (bold) and unflipped (thin) discrepancy of each run with routing flips on one log panel; the legend
    gives their ratio."""
    unflipped = {label: smooth for label, smooth, _ in curves[SPLIT[1]]}
    for label, (x, mean, _, _), _ in curves[SPLIT[0]]:
        other = unflipped.get(label)
        ratio = (f", {sum(mean) / len(mean) / (sum(other[1]) / len(other[1])):.1f}x" if other and sum(other[1]) > 0
                 else "")
        ax.plot(x, mean, label=f"{label}{ratio}", **styles[label])
        if other:
            ax.plot(other[0], other[1], **{**styles[label], "lw": 0.8, "alpha": 0.7})
    ax.set_title("mean |p_train - p_rollout| of tokens whose routing flipped (bold) / did not (thin); "
                 "5-rollout m.a.", fontsize=9)
    _finish(ax, True)
    return False


def render(runs: Runs) -> list[tuple[str, Any]]:
    """(file stem, figure) of every plot: ``overview`` first, then one per informative quantity of :data:`PLOTS`, the
    flipped/unflipped panel and per-run panels where bands would overlap."""
    from matplotlib.lines import Line2D

    styles = {label: run_style(label) for label in runs}
    specs = {plot.name: plot for plot in PLOTS}
    drawn = {plot.name: curves_of(runs, plot.key, plot.window, plot.keep) for plot in PLOTS}
    drawn = {name: c for name, c in drawn.items()
             if c and (not specs[name].optional or informative([(label, s) for label, s, _ in c]))}
    split = {key: [c for c in curves_of(runs, key, 5) if any(v > 0 for v in c[1][1])] for key in SPLIT}
    eps = {label: smooth for label, smooth, _ in curves_of(runs, "eps", 1) if "discrepancy" in drawn}

    def draw(ax: Any, name: str) -> bool:
        if name == SPLIT_NAME:
            return _draw_split(ax, split, styles)
        return _draw(ax, specs[name], drawn[name], styles, eps if name == "discrepancy" else {})

    names = list(drawn) + ([SPLIT_NAME] if split[SPLIT[0]] else [])
    order = {label: i for i, label in enumerate(runs)}  # legends list runs in the caller's order (strips too)
    figures = []
    for name in names:
        fig = new_figure(110, figsize=(9, 4.5))
        ax = fig.subplots()
        banded = draw(ax, name)
        found = {label: h for axis in fig.axes for h, label in zip(*axis.get_legend_handles_labels())}
        found = {text: found[text] for text in sorted(found, key=lambda text: order[text.split(" ")[0].rstrip(",")])}
        shown = [text.split(" ")[0].rstrip(",") for text in found]
        ax.legend(list(found.values()), list(found), fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  frameon=False, title_fontsize=8, alignment="left",
                  title="\n".join((["run, flipped / unflipped"] if name == SPLIT_NAME else []) +
                                  ([BAND_NOTE] if banded else []) + [legend_note(shown)]))
        figures.append((name, fig))
    several = any(len(seeds) > 1 for seeds in runs.values())
    if several and len(runs) > MAX_BANDS:
        figures += [(f"{name}_by_run", _per_run_figure(runs, styles, specs[name])) for name in BY_RUN if name in drawn]
    panels = [name for name in OVERVIEW if name in names]
    if not panels:
        return figures
    rows = (len(panels) + 2) // 2
    overview = new_figure(90, figsize=(14, 4 * rows))
    axes = overview.subplots(rows, 2, squeeze=False)
    banded = [draw(ax, name) for name, ax in zip(panels, axes.flat)]
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    handles = [Line2D([], [], **styles[label]) for label in runs]
    title = ("mean over seeds" + (f"; {BAND_NOTE}" if any(banded) else "") if several else "one seed per run")
    axes.flat[-1].legend(handles, list(runs), loc="center", fontsize=11, frameon=False, title_fontsize=10,
                         alignment="left", title=f"{title}\n{legend_note(list(runs))}")
    overview.tight_layout()
    return [("overview", overview), *figures]


def write_plots(runs: Runs, out_dir: Path) -> list[Path]:
    """Every figure of :func:`render` as ``<out_dir>/<name>.png``, ``overview.png`` first."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in render(runs):
        save_figure(fig, out_dir / f"{name}.png", dpi=fig.dpi, bbox_inches="tight")
        written.append(out_dir / f"{name}.png")
    return written


def _per_run_figure(runs: Runs, styles: dict[str, dict[str, Any]], plot: Plot) -> Any:
    """``<name>_by_run``: one small panel per run with each seed (thin grey), their mean (bold, in the run's style)
    and, thin in its own style, the mean of the GRPO run on the same engine (``grpo@<engine>``) for comparison."""
    columns = min(4, len(runs))
    rows = -(-len(runs) // columns)
    fig = new_figure(90, figsize=(3.6 * columns, 2.8 * rows))
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    means = {label: band([_series(records, plot.key, plot.window) for records in seeds.values()])
             for label, seeds in runs.items()}
    for ax, (label, seeds) in zip(axes.flat, runs.items()):
        for records in seeds.values():
            ax.plot(*_series(records, plot.key, plot.window), color="0.7", lw=0.8)
        base = "grpo@" + label.partition("@")[2].removesuffix("+r3")
        compared = base != label and base in means
        if compared:
            ax.plot(means[base][0], means[base][1], **{**styles[base], "lw": 1.0})
        ax.plot(means[label][0], means[label][1], **{**styles[label], "lw": 2.2})
        ax.set_title(label + (f" (thin: {base})" if compared else ""), fontsize=8)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(runs):]:
        ax.axis("off")
    smoothed = f", {plot.window}-rollout moving average" if plot.window > 1 else ""
    fig.suptitle(f"{plot.title}{smoothed}: each seed (grey) and the mean", fontsize=10)
    fig.tight_layout()
    return fig
