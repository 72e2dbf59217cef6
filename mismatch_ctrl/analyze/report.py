"""The analysis a person reads: ``report.md`` (recommendations first, then per-rollout tables) and PNG plots.

Every number comes from the result of :func:`.analysis.analyze_dumps`, the same dict ``--json`` prints.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..formatting import code_span, fmt
from ..regular_files import save_figure, write_atomic
from ..smoothing import moving_average
from .eps_changes import CALIBRATION, INFEASIBLE_BUDGET
from .stats import PRESET_NAMES


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + \
        ["| " + " | ".join(cell if isinstance(cell, str) else fmt(cell) for cell in row) + " |" for row in rows]


def _recommendations(result: dict[str, Any]) -> list[str]:
    rec, replay, surge = result["recommendation"], result["dcgrpo_replay"], result["surge"]
    lines = ["## Recommendations", ""]
    if rec["eps_auto"] is None:
        lines += [not_measured(result["counts"]) + " So the discrepancy, eps and the DC-GRPO replay are not "
                  "available.", ""]
    else:
        partial = (f" (from only {rec['rollouts_measured']} rollouts: the rule needs {rec['calibration_rollouts']})"
                   if rec["partial"] else "")
        lines.append(f"**eps.** The `eps: auto` rule, {rec['rule']}, gives **eps = {fmt(rec['eps_auto'], 4)}**"
                     f"{partial}.")
        spread = rec["window_spread"]
        if spread:
            lines.append(f"Applied to each of the {spread['windows']} windows of {rec['calibration_rollouts']} "
                         f"consecutive rollouts it gives {fmt(spread['min'], 4)} to {fmt(spread['max'], 4)} "
                         f"(median {fmt(spread['median'], 4)}).")
        c = rec["c_bar_over_rollouts"]
        lines += [f"C_bar over rollouts: p10 {fmt(c['p10'], 4)}, median {fmt(c['p50'], 4)}, p90 {fmt(c['p90'], 4)}. "
                  f"Infeasible-budget floor (median C_bar of the first {replay['settings']['floor_rollouts']} "
                  f"rollouts): {fmt(rec['eps_floor'], 4)}; an eps below it makes lambda climb to lambda_max.", ""]
        lines += _table(["eps candidate", "eps", "rollouts with C_bar > eps"],
                        [[f"`{x['name']}`", fmt(x["eps"], 4), _pct(x["fraction_above"])] for x in rec["candidates"]])
        lines += ["", "Architecture defaults (configs/arch; docs/algorithms.md section 2):", ""]
        lines += _table(["architecture", "lambda_0", "eta", "eps", "lambda_max"],
                        [[arch, d["lambda_0"], d["eta"], d["eps"], d["lambda_max"]]
                         for arch, d in rec["arch_defaults"].items()])
        s = replay["settings"]
        eps_text = fmt(s["eps"], 4) if not isinstance(s["eps"], str) else s["eps"]
        lines += ["", f"**DC-GRPO replay** (`ControllerSet.step` over the recorded rollouts; signal `{s['signal']}`, "
                      f"penalty `{s['penalty_form']}`, C_bar `{s['aggregation']}`): lambda_0 {fmt(s['lambda_0'])}, "
                      f"eta {fmt(s['eta'])}, eps {eps_text}, lambda_max {fmt(s['lambda_max'])}."]
        if not result["method"]["dcgrpo"]:
            lines.append(f"Method `{result['method']['name']}` does not run DC-GRPO: this is what DC-GRPO with these "
                         "settings would do on the recorded rollouts.")
        if replay["drift_guard_lifts"]:
            lines.append(f"The drift guard (`drift_guard: {s['drift_guard']}`, window {s['drift_window']}) lifted eps "
                         f"after rollouts {', '.join(map(str, replay['drift_guard_lifts']))}.")
        if replay["eps_changes"]:
            lines += ["", "eps changed in the replay:", ""]
            lines += [f"- {eps_change_text(change)}" for change in replay["eps_changes"]] + [""]
        if replay["fraction_capped"]:
            lines.append(f"The penalty cap (`penalty_cap: {s['penalty_cap']}`) held the shaping lambda below lambda in "
                         f"{_pct(replay['fraction_capped'])} of the rollouts.")
        lines.append(f"C_bar exceeded eps in {_pct(replay['fraction_above_eps'])} of the rollouts; lambda ends at "
                     f"{fmt(replay['lambda_final'], 4)} and sits at lambda_max after "
                     f"{_pct(replay['fraction_at_lambda_max'])} of them; {_penalty_share_text(replay)}.")
        lines.append(_replay_verdict(replay))
        lines += ["", "**Rollout correction presets** (what each would have rejected on these rollouts; TIS presets "
                      "reject nothing and truncate the weights of the 'truncated' fraction):", ""]
        lines += _table(["preset", "tokens rejected: mean / max", "sequences rejected: mean / max",
                         "IS weights truncated"],
                        [[f"`{name}`", f"{_pct(p['tokens_mean'])} / {_pct(p['tokens_max'])}",
                          f"{_pct(p['sequences_mean'])} / {_pct(p['sequences_max'])}", _pct(p["clipped_mean"])]
                         for name, p in result["presets"].items()])
    max_len = result["max_response_len"]
    lines += ["", f"**LR decay.** Surge detector: {surge['verdict']}."]
    if surge["T_d"] is not None:
        lines.append(f"The learning rate would be multiplied by {fmt(surge['factor'])} at rollout "
                     f"{surge['first_halving']} and every {surge['T_d']} rollouts after it, down to "
                     f"{fmt(surge['min_scale'])} x lr_0.")
    if surge["configured_period"] is not None:
        lines.append(f"The method sets a manual period of {surge['configured_period']} rollouts.")
    lines.append(f"Maximum response length: {fmt(max_len['value'])}" +
                 (f" ({max_len['source']})." if max_len["source"] else
                  ": unknown (no truncation recorded; pass --max-response-len for the truncation rate and the "
                  "detector's truncation cap)."))
    return lines + [""]


def eps_change_text(change: dict[str, Any]) -> str:
    """One eps change of the replay (:mod:`.eps_changes`) in words: the rollout, the old and new eps, the rule that
    changed it and the numbers it acted on."""
    e, old, new = change["evidence"], fmt(change["old_eps"], 4), fmt(change["new_eps"], 4)
    where = f"Rollout {change['rollout_id']}: "
    first = f"the first {e.get('measured_rollouts')} rollouts"
    if change["guard"] == CALIBRATION:
        return (f"{where}`eps: auto` set eps to {new} = {e['factor']:g} x the median C_bar "
                f"{fmt(e['median_c_bar'], 4)} of {first}.")
    if change["guard"] == INFEASIBLE_BUDGET:
        return (f"{where}the infeasible-budget guard (`eps_guard: clamp`) raised eps {old} -> {new} = "
                f"{e['factor']:g} x the floor {fmt(e['median_c_bar'], 4)} (median C_bar of {first}): the chosen eps "
                "was below the floor, which no policy can meet (unguarded, lambda climbs to lambda_max and DC-GRPO "
                "acts as a constant penalty); train with `eps: auto` or an eps above the floor (the recommendation "
                "above).")
    rollouts = e["rollouts"]
    span = f"the {len(rollouts)} updates of rollouts {rollouts[0]} to {rollouts[-1]}"
    halves = (f"the violation C_bar - eps did not halve ({fmt(e['violation_first_half'], 4)} in the first half, "
              f"{fmt(e['violation_last_half'], 4)} in the second)")
    rule = (f" = {e['factor']:g} x the streak's median C_bar" if change["new_eps"] > change["old_eps"] else
            f" ({e['factor']:g} x the streak's median C_bar is not above it: kept)")
    if e["mode"] == "saturated":
        evidence = (f"lambda sat at lambda_max {fmt(e['lambda_max'])} on {span}, {halves}; their median C_bar "
                    f"{fmt(e['median_c_bar'], 4)} against eps {old}")
    else:
        at_max = e["lambda_before"] >= e["lambda_max"]
        before = f"before rollout {rollouts[-1]}'s update"
        lam = (f"lambda was at lambda_max {fmt(e['lambda_max'])} {before}" if at_max else
               f"lambda was {fmt(e['lambda_before'], 4)} {before} (lambda_max {fmt(e['lambda_max'])})")
        evidence = (f"C_bar stayed above eps on {span} (median C_bar {fmt(e['median_c_bar'], 4)} against eps {old}) "
                    f"and {halves}; {lam}")
    return (f"{where}the drift guard (`drift_guard: {e['mode']}`, window {e['window']}) lifted eps {old} -> {new}"
            f"{rule}: {evidence}. lambda went back to lambda_0.")


def not_measured(counts: dict[str, Any]) -> str:
    """Why no rollout could be measured, from the most basic missing piece on."""
    if not counts["with_train_log_probs"]:
        return ("No rollout has the training engine's log-probs (`log_probs` of a train dump): dump with "
                "`--dump-details` (slime since 681b3ad writes `train_data/` with the training forward's log-probs), "
                "not `--save-debug-rollout-data` alone.")
    if not counts["with_rollout_log_probs"]:
        return ("No rollout has the rollout engine's log-probs (`rollout_log_probs`, from SGLang): the rollouts must "
                "return log-probs (a custom generate function must set `sample.rollout_log_probs`).")
    if not counts["with_both_log_probs"]:
        return ("No rollout has both engines' log-probs: the rollouts with the training engine's lack the rollout "
                "engine's and the other way round.")
    return (f"No rollout has a trained token with usable log-probs: every loss mask is 0, every response is empty, or "
            f"every trained token's log-prob is NaN/inf ({counts['nonfinite_tokens']} tokens) or impossible, above 0 "
            f"({counts['impossible_tokens']} tokens).")


def _data_problems(counts: dict[str, Any]) -> list[str]:
    """The report's lines on unusable data (empty when there is none)."""
    parts = [f"{counts[key]} {what}" for key, what in (
        ("nonfinite_tokens", "trained tokens with a NaN/inf log-prob"),
        ("impossible_tokens", "trained tokens with an impossible log-prob (above 0: a probability above 1)"),
        ("nonfinite_rewards", "samples with a NaN/inf reward (left out of the reward mean; replayed with advantage "
                              "0)")) if counts[key]]
    if not parts:
        return []
    return [f"**Unusable data**: {'; '.join(parts)}. Such tokens are left out of every statistic (as the hooks leave "
            "them out of the loss, counting them in `nonfinite_tokens`); check the engine that produced them.", ""]


def _penalty_share_text(replay: dict[str, Any]) -> str:
    """The mean penalty share, and which rollouts it leaves out: without rewards the replay's advantages are zeros."""
    missing = replay.get("rollouts_without_rewards", 0)
    if replay["penalty_share_mean"] is None:
        if not missing:
            return "no penalty share measured"
        return (f"the penalty share (|lambda c| / |A|) is not measured: the dumps of {missing} rollout(s) hold no "
                "`rewards` (the group-normalised rewards of slime's train dump, GRPO's advantages |A|)")
    text = f"mean penalty share (|lambda c| / |A|) {fmt(replay['penalty_share_mean'])}"
    return text + (f" over the rollouts whose dumps hold rewards ({missing} without)" if missing else "")


def _replay_verdict(replay: dict[str, Any]) -> str:
    at_max, above = replay["fraction_at_lambda_max"], replay["fraction_above_eps"]
    if at_max is not None and at_max >= 0.5:
        return ("Verdict: the budget is too tight for this stack (lambda saturates; docs/algorithms.md section 2: eps "
                "too small -> lambda at lambda_max). Use a larger eps, e.g. the `eps: auto` value.")
    if above is not None and above <= 0.05 and replay["lambda_final"] == 0.0:
        return ("Verdict: the budget is loose (lambda decays to 0 and DC-GRPO acts like GRPO); a smaller eps would "
                "let the constraint act.")
    return "Verdict: the budget binds on part of the rollouts: lambda reacts without saturating."


def _distribution(result: dict[str, Any]) -> list[str]:
    pooled = result["prob_diff_pooled"]
    if pooled is None:
        return []
    q, tail = pooled["quantiles"], pooled["tail"]
    return ["## Per-token |p_train - p_rollout|, all rollouts", "",
            f"Over {int(pooled['tokens'])} trained tokens (quantiles from a log-histogram, about 6% resolution; values "
            "below 1e-8 read as 1e-8):", ""] + \
        _table([*q, *(f"fraction {k}" for k in tail)], [[*(fmt(v) for v in q.values()), *map(_pct, tail.values())]]) \
        + [""]


def _per_rollout(result: dict[str, Any]) -> list[str]:
    rows = result["rollouts"]
    header = ["rollout", "samples", "mean length", "truncated", "reward", "C_bar", "prob_diff_max", "Δp p50",
              "Δp p99", "Δp > 0.1", "logprob_abs_diff", "log_ppl_abs_diff", "kl", "k3_kl", "training_log_ppl",
              "rollout_log_ppl", "lambda", "eps in force", "tokens NaN/inf / > 0"]
    table = []
    for r in rows:
        q, tail = r.get("prob_diff_quantiles") or {}, r.get("prob_diff_tail") or {}
        chosen = (r["replay"] or {}).get("chosen") or {}
        table.append([r["rollout_id"], r["samples"], r["mean_response_length"], _pct(r["truncation_rate"]),
                      r["reward_mean"], r.get("prob_diff_mean"), r.get("prob_diff_max"), q.get("p50"), q.get("p99"),
                      _pct(tail.get(">0.1")), r.get("logprob_abs_diff"), r.get("log_ppl_abs_diff"), r.get("kl"),
                      r.get("k3_kl"), r.get("training_log_ppl"), r.get("rollout_log_ppl"), chosen.get("lambda"),
                      chosen.get("eps"), f"{fmt(r['nonfinite_tokens'])} / {fmt(r['impossible_tokens'])}"])
    lines = ["## Per rollout", "",
             "Metrics with slime/verl names (docs/algorithms.md section 6); C_bar = prob_diff_mean, the DC-GRPO "
             "signal; Δp = per-token |p_train - p_rollout|. '-' = not in the dump (without training log-probs only the "
             "rollout-side statistics exist).", ""]
    lines += _table(header, table)
    measured = [r for r in rows if "rejection" in r]
    if measured:
        lines += ["", "Rejected by each preset, tokens / sequences:", ""]
        lines += _table(["rollout", *PRESET_NAMES],
                        [[r["rollout_id"], *(f"{_pct(r['rejection'][p]['tokens'])} / "
                                             f"{_pct(r['rejection'][p]['sequences'])}" for p in PRESET_NAMES)]
                         for r in measured])
    return lines + [""]


def write_report(result: dict[str, Any], out_dir: str | Path, command: str = "mismatch-ctrl analyze") -> Path:
    """Write ``out_dir/report.md`` and ``out_dir/plots/*.png``; returns the report's path."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    counts, method = result["counts"], result["method"]
    missing = counts["missing"]
    lines = [f"# Mismatch analysis of `{result['source']}`", "",
             f"Generated {result['generated']} by {code_span(command)}. Method `{method['name']}` ({method['file']}), "
             f"architecture {method['architecture']} ({method['architecture_source']}).", "",
             f"Read {counts['rollouts']} rollouts ({counts['first']} to {counts['last']}"
             + (f"; {missing['count']} missing: {_ranges(missing)}" if missing["count"] else "")
             + f"): {counts['with_train_log_probs']} with the training engine's log-probs, "
               f"{counts['with_rollout_log_probs']} with the rollout engine's, {counts['measured']} measured (both, "
               "and trained tokens).", ""]
    if result.get("consistency"):
        lines += ["**These dumps may not be one run's:**", "", *(f"- {line}" for line in result["consistency"]), ""]
    lines += _data_problems(counts) + _recommendations(result) + _distribution(result)
    try:
        plots = write_plots(result, out_dir / "plots")
    except ImportError:
        plots = []
        lines += ["Plots skipped: matplotlib is not installed (pip install 'mismatch-ctrl[lab]').", ""]
    if plots:
        lines += ["## Plots", ""] + [f"![{p.stem}]({p.relative_to(out_dir).as_posix()})" for p in plots] + [""]
    lines += _per_rollout(result)
    notes = [(r["rollout_id"], note) for r in result["rollouts"] for note in r["notes"]]
    if result["skipped"] or notes:
        lines += ["## Skipped files and notes", ""]
        lines += [f"- skipped `{s['path']}`: {s['reason']}" for s in result["skipped"]]
        lines += [f"- rollout {rid}: {note}" for rid, note in notes]
    path = out_dir / "report.md"
    write_atomic(path, ("\n".join(lines) + "\n").encode())
    return path


def _ranges(missing: dict[str, Any]) -> str:
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in missing["ranges"])
    return text + (f" and {missing['more_ranges']} more ranges" if missing["more_ranges"] else "")


def write_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """The five plots of the report (those without data are left out); ImportError without matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = result["rollouts"]
    measured = [r for r in rows if r["measured"]]
    written = []

    def save(fig: Any, name: str, ax: Any) -> None:
        axes = ax if isinstance(ax, (list, tuple)) else [ax]
        for axis in axes:
            axis.set_xlabel("rollout")
            axis.grid(alpha=0.3)
        handles, labels = axes[-1].get_legend_handles_labels()
        if handles:  # outside the data, right of the last panel
            axes[-1].legend(handles, labels, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        save_figure(fig, path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(path)

    if measured:
        ids = [r["rollout_id"] for r in measured]
        window = smoothing_window(len(ids))
        suffix = f" ({window}-rollout moving average; faint: raw)" if window > 1 else ""
        rec = result["recommendation"]
        fig, ax = plt.subplots(figsize=(9, 4.5))
        _smoothed(ax, ids, [r["prob_diff_mean"] for r in measured], window, color="C0", lw=1.4,
                  label="C_bar (prob_diff_mean)")
        if rec["eps_auto"] is not None:
            ax.axhline(rec["eps_auto"], color="C2", lw=1.5, label=f"eps: auto = {rec['eps_auto']:.3g}")
        if rec["window_spread"]:
            ax.axhspan(rec["window_spread"]["min"], rec["window_spread"]["max"], color="C2", alpha=0.15,
                       label=f"eps: auto over {rec['calibration_rollouts']}-rollout windows")
        for k, (arch, d) in enumerate(rec["arch_defaults"].items()):
            ax.axhline(d["eps"], color=f"C{4 + k}", ls=":", lw=1.2, label=f"{arch} default eps {d['eps']:g}")
        eps = [(r["rollout_id"], r["replay"]["chosen"]["eps"]) for r in measured if r["replay"]["chosen"]["eps"]]
        if eps:
            ax.step(*zip(*eps), where="post", color="C3", ls="--", lw=1.2, label="eps in force (replay)")
        ax.set_yscale("log")
        ax.set_title("discrepancy per rollout and the eps band" + suffix, fontsize=10)
        save(fig, "discrepancy", ax)

        fig, ax = plt.subplots(figsize=(9, 4.5))
        for k, name in enumerate(("chosen", "auto")):
            ax.plot(ids, [r["replay"][name]["lambda"] for r in measured], lw=1.4, color=f"C{k}",
                    label=f"lambda, {'chosen eps' if name == 'chosen' else 'eps: auto'}")
        ax.axhline(result["dcgrpo_replay"]["settings"]["lambda_max"], color="gray", ls="--", lw=1, label="lambda_max")
        ax.set_title("DC-GRPO multiplier replayed over the recorded discrepancies")
        save(fig, "lambda", ax)

        fig, ax = plt.subplots(figsize=(9, 4.5))
        for k, key in enumerate(measured[0]["prob_diff_quantiles"]):
            _smoothed(ax, ids, [r["prob_diff_quantiles"][key] for r in measured], window, color=f"C{k}", lw=1.2,
                      label=key)
        _smoothed(ax, ids, [r["prob_diff_max"] for r in measured], window, color="k", ls=":", lw=1, label="max")
        ax.set_yscale("log")
        ax.set_title("per-token |p_train - p_rollout| quantiles" + suffix, fontsize=10)
        save(fig, "prob_diff_quantiles", ax)

        rejecting = [name for name in PRESET_NAMES
                     if any(r["rejection"][name][part] for r in measured for part in ("tokens", "sequences"))]
        if rejecting:
            never = [name for name in PRESET_NAMES if name not in rejecting]
            fig, axes = plt.subplots(1, 2, figsize=(13, 4.5), sharey=True)
            for ax, part in zip(axes, ("tokens", "sequences")):
                for k, name in enumerate(PRESET_NAMES):
                    if name in rejecting:
                        ax.plot(ids, [r["rejection"][name][part] for r in measured], lw=1.4, color=f"C{k}",
                                label=name, ls=("-", "--", ":", "-.")[k % 4])
                ax.set_yscale("symlog", linthresh=1e-3)
                ax.set_ylim(0.0, 1.3)
                ax.set_title(f"fraction of {part} each preset rejects (linear below 0.001)", fontsize=10)
            if never:
                fig.suptitle(f"never reject on these rollouts (not drawn): {', '.join(never)}", fontsize=9)
            save(fig, "rejection", list(axes))

    surge = result["surge"]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.plot([r["rollout_id"] for r in rows], [r["mean_response_length"] for r in rows], lw=1.4,
            label="mean response length")
    baseline = [(i, b) for i, b in zip(surge["series"]["rollout_id"], surge["series"]["baseline"]) if b is not None]
    if baseline:
        ax.plot(*zip(*baseline), color="gray", lw=1, ls="--", label="detector baseline")
    if surge["onset"] is not None:
        ax.axvline(surge["onset"], color="C1", lw=1.2, label=f"surge onset {surge['onset']}")
        ax.axvline(surge["triggered_at"], color="C3", lw=1.2, label=f"trigger {surge['triggered_at']}")
    if surge["max_response_len"]:
        ax.axhline(surge["max_response_len"], color="k", ls=":", lw=1, label="max response length")
    truncation = [(r["rollout_id"], r["truncation_rate"]) for r in rows if r["truncation_rate"] is not None]
    if any(rate for _, rate in truncation):
        twin = ax.twinx()
        twin.plot(*zip(*truncation), color="C2", lw=0.8, alpha=0.7)
        twin.set_ylabel("truncation rate (green)")
        twin.set_ylim(0, 1)
    ax.set_title(f"response length and the surge detector: {surge['verdict'].split(':')[0]}"
                 + ("" if any(rate for _, rate in truncation) else "; no response truncated"), fontsize=10)
    save(fig, "response_length", ax)
    return written


def smoothing_window(rollouts: int) -> int:
    """Moving-average window of the per-rollout curves: 1 (raw) below 40 rollouts, then rollouts / 20, at most 10."""
    return min(10, max(1, rollouts // 20))


def _smoothed(ax: Any, x: list[int], y: list[float], window: int, **style: Any) -> None:
    """``y`` against ``x``: the trailing ``window``-point mean, with the raw values faint when ``window`` > 1."""
    if window > 1:
        ax.plot(x, y, color=style["color"], lw=0.7, alpha=0.3)
    ax.plot(x, moving_average(y, window), **style)
