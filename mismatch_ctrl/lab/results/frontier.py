"""The dose-response frontier: how far each method's late accuracy and reward fall below the exact engine's as the
rollout engine's measured mismatch grows, and where a controller differs from GRPO on the same engine.

A *dose* is a rollout engine (the ``quant`` of a run: ``none``, ``e4m3``, ``e5m2``, ... any name); doses are ordered by
their measured mismatch, the early discrepancy ``C_bar`` (``discrepancy_first``: the mean |p_train - p_rollout| over
the first quarter of the rollouts) averaged over the dose's runs without routing replay (R3 changes the trainer's
side; a dose with only R3 runs uses those) and their seeds. A *line* is a method with or without R3 (``grpo``,
``dcgrpo+r3``). Gaps are paired per seed (every run of a seed starts from that seed's warm-up): the ``Spread`` of
run[seed] - reference[seed] over the seeds both have, mean with the 95% t interval (``aggregate``; none for one
seed). The exact-engine reference is ``grpo@none`` (else the line's own ``@none`` run).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from ..training.methods import REPLAY_SUFFIX
from .stats import Spread, paired, sign, spread

EXACT = "none"
"""The dose of the exact engine (no quantisation)."""

MISMATCH_KEY = "discrepancy_first"
MISMATCH_NAME = "early C_bar (mean |p_train - p_rollout|, first quarter of the rollouts)"

GAPS = (("late_acc_engine", "late engine accuracy"), ("late_acc_fp32", "late fp32 accuracy"),
        ("late_reward", "late reward"))
"""Quantities of the frontier: gap of each run against the exact engine. The engine accuracy is what a coarse engine
serves (its own inference error included: it is lower from the first rollout); the fp32 accuracy is the trained
policy's, evaluated exactly: what the mismatch did to training."""

VERSUS = GAPS + (("discrepancy_last", "late discrepancy"),)
"""Quantities of the controller-vs-GRPO table."""


def line_name(entry: dict[str, Any]) -> str:
    """The method of a run with ``+r3`` when it replays the engine's routing."""
    return entry["method"] + (REPLAY_SUFFIX if entry["replay"] else "")


def dose_mismatch(aggregated: dict[str, dict[str, Any]]) -> dict[str, Spread]:
    """Per dose, the ``Spread`` of ``MISMATCH_KEY`` over its runs without R3 (all its runs if it has only R3 runs)
    and their seeds, ordered by the mean (then by name)."""
    values: dict[str, dict[bool, list[float]]] = {}
    for entry in aggregated.values():
        seeds = entry["by_seed"].get(MISMATCH_KEY, {})
        values.setdefault(entry["quant"], {False: [], True: []})[entry["replay"]].extend(seeds.values())
    out = {dose: spread(v[False] or v[True]) for dose, v in values.items() if v[False] or v[True]}
    return dict(sorted(out.items(), key=lambda item: (item[1].mean, item[0])))


def exact_reference(entry: dict[str, Any], labels: list[str] | dict[str, Any]) -> str | None:
    """``grpo@none`` if it was run, else the line's own run on the exact engine, else None."""
    own = f"{entry['method']}@{EXACT}" + (REPLAY_SUFFIX if entry["replay"] else "")
    return next((label for label in (f"grpo@{EXACT}", own) if label in labels), None)


def frontier(aggregated: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The frontier of a lab output, None with fewer than two doses: ``doses`` (name, mismatch ``Spread``, in
    mismatch order) and ``points``, one per run: line, dose, label, reference (None for the reference itself or
    without an exact-engine run), the seeds both ran, per ``GAPS`` quantity the paired gap ``Spread`` (None without
    common seeds) and its ``sign``, and the collapse count and rate over the run's seeds."""
    doses = dose_mismatch(aggregated)
    if len(doses) < 2:
        return None
    order = list(doses)
    points = []
    for label, entry in sorted(aggregated.items(), key=lambda item: order.index(item[1]["quant"])):
        reference = exact_reference(entry, aggregated)
        reference = None if reference == label else reference
        gaps = {key: paired(entry["by_seed"][key], aggregated[reference]["by_seed"][key]) if reference else None
                for key, _ in GAPS}
        common = set(entry["seeds"]) & set(aggregated[reference]["seeds"]) if reference else set()
        points.append({"line": line_name(entry), "dose": entry["quant"], "label": label, "reference": reference,
                       "paired_seeds": sorted(common), "gaps": gaps,
                       "signs": {k: 0 if g is None else sign(g) for k, g in gaps.items()},
                       "collapses": entry["collapses"], "seeds": len(entry["seeds"]),
                       "collapse_rate": entry["collapses"] / len(entry["seeds"])})
    return {"mismatch": MISMATCH_NAME, "doses": doses, "points": points}


def versus_grpo(aggregated: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run that is not plain GRPO against ``grpo@<its dose>``, per ``VERSUS`` quantity: the paired difference
    (run - GRPO) ``Spread`` and its ``sign`` (+1 / -1: the interval lies above / below 0; 0 also for one seed)."""
    out = []
    for label, entry in aggregated.items():
        reference = f"grpo@{entry['quant']}"
        if reference == label or reference not in aggregated:
            continue
        for key, _ in VERSUS:
            difference = paired(entry["by_seed"].get(key, {}), aggregated[reference]["by_seed"].get(key, {}))
            if difference is not None:
                out.append({"run": label, "reference": reference, "quantity": key, "difference": difference,
                            "sign": sign(difference)})
    return out


def missing_references(aggregated: dict[str, dict[str, Any]], found: dict[str, Any] | None) -> list[str]:
    """One line per comparison the report cannot make: a run that is not plain GRPO without ``grpo@<its engine>``
    (or without a seed in common with it), and, on a frontier, a run without an exact-engine run to pair with."""
    out = []
    for label, entry in aggregated.items():
        reference = f"grpo@{entry['quant']}"
        if reference == label:
            continue
        if reference not in aggregated:
            out.append(f"`{label}` is not compared with GRPO: `{reference}` is missing")
        elif not set(entry["seeds"]) & set(aggregated[reference]["seeds"]):
            out.append(f"`{label}` is not compared with GRPO: no seed in common with `{reference}`")
    for point in (found or {"points": []})["points"]:
        if point["reference"] is None and point["dose"] != EXACT:
            own = f"{point['line'].removesuffix(REPLAY_SUFFIX)}@{EXACT}" + (
                REPLAY_SUFFIX if point["line"].endswith(REPLAY_SUFFIX) else "")
            out.append(f"`{point['label']}` has no exact-engine run on the frontier: `grpo@{EXACT}` and `{own}` are "
                       "missing")
        elif point["reference"] is not None and not point["paired_seeds"]:
            out.append(f"`{point['label']}` has no seed in common with its exact-engine run `{point['reference']}`")
    return out


def frontier_json(found: dict[str, Any]) -> dict[str, Any]:
    """``frontier`` with every ``Spread`` as a dict (for ``summary.json``)."""
    return {"mismatch": found["mismatch"], "doses": {d: s.as_dict() for d, s in found["doses"].items()},
            "points": [{**p, "gaps": {k: None if g is None else g.as_dict() for k, g in p["gaps"].items()}}
                       for p in found["points"]]}


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
