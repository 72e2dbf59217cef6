"""The surge section of a lab report and its plot (``surge.png``), for runs that log the mismatch by response length
(``--task digitsum``): per run label over seeds, the surge (``surge.surged``), the detector's onset and the LR cuts,
the slope of the mismatch on the length within rollouts, its means per length bucket, and ``C_bar`` before and after
the surge. Definitions: ``results.surge``."""

from __future__ import annotations

from pathlib import Path

from .stats import Spread, spread
from .style import new_figure, run_style
from .surge import (
    BUCKETS,
    QUANTITIES,
    SMOOTH,
    SURGE_FRACTION,
    WINDOW,
    before_after,
    bucket_means,
    detector,
    lengths,
    length_profile,
    lr_cuts,
    surged,
    within_rollout_difference,
    within_rollout_slope,
)
from .table import RunTable

PLOT_NAME = "surge.png"
PROFILE_NAME = "mismatch_by_length.png"
PROFILE = ("discrepancy_sum", "max_abs_log_ratio_sum", "abs_log_ratio_sum")
"""The quantities of ``mismatch_by_length.png``, one panel each."""
PROFILE_MIN_COUNT = 20
"""Lengths a run sampled fewer times than this are left out of ``mismatch_by_length.png`` (their means are noise)."""


def has_length_records(table: RunTable) -> bool:
    """Whether some run of the table logged the mismatch by response length."""
    return any("length_buckets" in record for run in table for record in run.records[:1])


def _cell(values: list[float], digits: int = 3, signed: bool = False) -> str:
    """Mean [95% t interval] of ``values`` (the mean alone for one value; '-' for none); ``signed``: with a sign."""
    if not values:
        return "-"
    s: Spread = spread(values)
    form = f"{'+' if signed else ''}.{digits}g"
    if s.low is None:
        return f"{s.mean:{form}}"
    return f"{s.mean:{form}} [{s.low:{form}}, {s.high:{form}}]"


def _range(values: list[int]) -> str:
    return "-" if not values else f"{sum(values) / len(values):.0f} ({min(values)}-{max(values)})"


def surge_lines(table: RunTable) -> list[str]:
    """Markdown: the surge table, the slope table, the bucket table and C_bar before / after the surge."""
    groups = table.groups()
    lines = ["", "## The response-length surge", "",
             f"Length: the rollout-mean response length, {SMOOTH}-rollout trailing mean. Surged: it at least doubles "
             f"within {SURGE_FRACTION:.0%} of the run. Onset / trigger: the surge detector the advantage hook runs "
             "(`lr_decay.surge`); T_d = round(1.8 x onset). First LR cut: the first rollout whose logged `lr_scale` "
             "fell (`length_decay`). Rollouts: mean (min-max) over the seeds where it applies.", "",
             "| run | seeds | length start | length peak | scratchpad share late | surged | detector fired | onset | "
             "trigger | first LR cut |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, runs in groups.items():
        series = [lengths(run.records) for run in runs]
        found = [detector(run.records) for run in runs]
        cuts = [lr_cuts(run.records) for run in runs]
        late = [sum(r.get("scratch_fraction", 0.0) for r in run.records[-len(run.records) // 4:])
                / max(1, len(run.records[-len(run.records) // 4:])) for run in runs]
        lines.append(
            f"| `{label}` | {len(runs)} | {_cell([sum(s[:SMOOTH]) / len(s[:SMOOTH]) for s in series])} | "
            f"{_cell([max(s) for s in series])} | {_cell(late)} | {sum(surged(run.records) for run in runs)}/"
            f"{len(runs)} | {sum(o is not None for o, _ in found)}/{len(runs)} | "
            f"{_range([o for o, _ in found if o is not None])} | {_range([t for _, t in found if t is not None])} | "
            f"{_range([c[0] for c in cuts if c])} |")
    lines += ["", "## The mismatch against response length", "",
              "Slope per token of response length, least squares with one intercept per rollout (each sequence "
              "compared with the sequences of its own rollout), one value per run; mean [95% t interval] over "
              "seeds.", "", "| run | " + " | ".join(QUANTITIES.values()) + " |", "|---|" + "---|" * len(QUANTITIES)]
    for label, runs in groups.items():
        cells = [_cell([v for v in (within_rollout_slope(run.records, key) for run in runs) if v is not None], 2,
                       signed=True) for key in QUANTITIES]
        lines.append(f"| `{label}` | " + " | ".join(cells) + " |")
    lines += ["", "Scratchpads (7-14 tokens) minus direct answers (1-2 tokens) of the same rollout, averaged over the "
                  "rollouts that sampled both, one value per run:", "",
              "| run | seeds | " + " | ".join(QUANTITIES.values()) + " |", "|---|---|" + "---|" * len(QUANTITIES)]
    for label, runs in groups.items():
        gaps = {key: [v for v in (within_rollout_difference(run.records, key) for run in runs) if v is not None]
                for key in QUANTITIES}
        lines.append(f"| `{label}` | {max(len(v) for v in gaps.values())} | " + " | ".join(
            _cell(gaps[key], 2, signed=True) for key in QUANTITIES) + " |")
    names = [f"{low}-{high}" if high else f"{low}+" for low, high in BUCKETS]
    lines += ["", "Per length bucket (tokens), the mean over the run's sequences, then mean [interval] over seeds:",
              "", "| run | quantity | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for label, runs in groups.items():
        for key, name in QUANTITIES.items():
            columns = list(zip(*(bucket_means(run.records, key) for run in runs)))
            lines.append(f"| `{label}` | {name} | " + " | ".join(
                _cell([v for v in column if v is not None], 2, signed=key == "log_ratio_sum") for column in columns)
                + " |")
    lines += ["", f"`C_bar` of the {WINDOW} rollouts before the detector's onset and of the {WINDOW} from its "
                  "trigger on, in the runs where it fired; after - before paired per seed:", "",
              "| run | seeds | before | after | after - before |", "|---|---|---|---|---|"]
    for label, runs in groups.items():
        pairs = [p for p in (before_after(run.records) for run in runs) if p is not None]
        lines.append(f"| `{label}` | {len(pairs)} | {_cell([b for b, _ in pairs])} | {_cell([a for _, a in pairs])} "
                     f"| {_cell([a - b for b, a in pairs], signed=True)} |")
    return lines


def write_surge_plot(table: RunTable, path: Path) -> Path:
    """``surge.png``: one panel per run label, each seed's smoothed response length over rollouts, the detector's
    onset (triangle) and trigger (cross) on it, and the LR cuts as dotted vertical lines in the seed's colour."""
    from ...smoothing import moving_average

    groups = table.groups()
    columns = min(3, len(groups))
    rows = -(-len(groups) // columns)
    fig = new_figure(90, figsize=(4.6 * columns, 3.2 * rows))
    axes = fig.subplots(rows, columns, squeeze=False, sharex=True, sharey=True)
    seeds = table.seeds()
    for ax, (label, runs) in zip(axes.flat, groups.items()):
        for run in runs:
            colour = f"C{seeds.index(run.seed) % 10}"  # one colour per seed in every panel
            smooth = moving_average(lengths(run.records), SMOOTH)
            ax.plot(range(len(smooth)), smooth, color=colour, lw=1.0, label=f"seed {run.seed}")
            onset, trigger = detector(run.records)
            for at, marker in ((onset, "v"), (trigger, "x")):
                if at is not None and at < len(smooth):
                    ax.plot([at], [smooth[at]], marker=marker, color=colour, ms=7, mew=1.5, ls="none")
            for cut in lr_cuts(run.records):
                ax.axvline(cut, color=colour, ls=":", lw=1.0)
        ax.set_title(label, fontsize=9, color=run_style(label)["color"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False, loc="lower right")
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("rollout")
    fig.suptitle(f"mean response length ({SMOOTH}-rollout trailing mean) per seed; v: surge onset, x: detector "
                 "trigger; dotted: LR halved", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=fig.dpi, bbox_inches="tight")
    return path


def write_profile_plot(table: RunTable, path: Path) -> Path:
    """``mismatch_by_length.png``: per quantity of :data:`PROFILE`, its mean over each run's sequences of each response
    length (``length_profile``, lengths sampled at least :data:`PROFILE_MIN_COUNT` times), averaged over the seeds
    that have that length, one line per run label in its style; log axis. Runs on the exact engine are left out
    (their mismatch is rounding, ~1e-8)."""
    groups = {label: runs for label, runs in table.groups().items() if runs[0].quant != "none"}
    fig = new_figure(90, figsize=(15, 4))
    axes = fig.subplots(1, len(PROFILE), squeeze=False)[0]
    for ax, key in zip(axes, PROFILE):
        for label, runs in groups.items():
            profiles = [length_profile(run.records, key, PROFILE_MIN_COUNT) for run in runs]
            xs = sorted({x for profile in profiles for x in profile})
            ys = [sum(p[x] for p in profiles if x in p) / sum(x in p for p in profiles) for x in xs]
            ax.plot(xs, ys, label=label, **{**run_style(label), "marker": "o", "ms": 3})
        ax.set_yscale("log")
        ax.set_xlabel("response length (tokens)")
        ax.set_title(f"{QUANTITIES[key]} per sequence", fontsize=9)
        ax.grid(alpha=0.3)
    axes[-1].legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle("the mismatch by response length: mean over each run's sequences of that length, then over seeds",
                 fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=fig.dpi, bbox_inches="tight")
    return path


def surge_outputs(table: RunTable, plot_dir: Path) -> tuple[list[str], list[Path]]:
    """The report section and the plots, or nothing when no run logged the mismatch by length."""
    if not has_length_records(table):
        return [], []
    plots = [write_surge_plot(table, plot_dir / PLOT_NAME)]
    if any(run.quant != "none" for run in table):
        plots.append(write_profile_plot(table, plot_dir / PROFILE_NAME))
    return surge_lines(table), plots

