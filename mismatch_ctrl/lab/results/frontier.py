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


def reference_of(label: str, aggregated: dict[str, dict[str, Any]], against: str = "grpo") -> str | None:
    """The run ``label`` is compared with: ``grpo`` - GRPO on its engine (``grpo@<dose>``), ``exact`` - the exact
    engine (``exact_reference``), a run label - that run; None for the reference itself or when it was not run."""
    entry = aggregated[label]
    reference = (f"grpo@{entry['quant']}" if against == "grpo" else
                 exact_reference(entry, aggregated) if against == "exact" else against)
    return reference if reference in aggregated and reference != label else None


def versus_grpo(aggregated: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Every run that is not plain GRPO against ``grpo@<its dose>``, per ``VERSUS`` quantity: the paired difference
    (run - GRPO) ``Spread`` and its ``sign`` (+1 / -1: the interval lies above / below 0; 0 also for one seed)."""
    out = []
    for label, entry in aggregated.items():
        reference = reference_of(label, aggregated)
        if reference is None:
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
