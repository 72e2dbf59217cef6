"""The frontier's paired statistics against a straightforward loop (with the t quantile integrated numerically), its
edge cases (one seed, missing seeds, one engine, no exact-engine run), and the report and summary carrying them."""

import itertools
import json
import math
import random

import pytest

from mismatch_ctrl.lab.results.frontier import EXACT, dose_mismatch, frontier, versus_grpo
from mismatch_ctrl.lab.results.frontier_plot import dose_ticks, write_frontier_plot, x_positions
from mismatch_ctrl.lab.results.controllers import controller_row
from mismatch_ctrl.lab.results.groups import aggregate_runs as aggregate_table
from mismatch_ctrl.lab.results.outputs import write_outputs
from mismatch_ctrl.lab.results.table import Run, RunTable


def aggregate_runs(rows: list[dict]) -> dict[str, dict]:
    """The per-label aggregate of summary rows (a table without records)."""
    return aggregate_table(RunTable.from_summaries(rows))


def t_975(df: int) -> float:
    """The 97.5% quantile of Student's t by bisection on its CDF, integrated with Simpson's rule from the density."""
    c = math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))

    def cdf(t: float, n: int = 20000) -> float:  # 0.5 + integral of the density from 0 to t
        h = t / n
        f = [c * (1 + (i * h) ** 2 / df) ** (-(df + 1) / 2) for i in range(n + 1)]
        return 0.5 + h / 3 * (f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2]))

    lo, hi = 0.0, 20.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < 0.975 else (lo, mid)
    return lo


def reference_gap(a: dict, b: dict) -> tuple | None:
    """(n, mean, low, high) of a[seed] - b[seed] over the common seeds, by a loop; low/high None for one seed."""
    diffs = []
    for seed in a:
        if seed in b:
            diffs.append(a[seed] - b[seed])
    if not diffs:
        return None
    n = len(diffs)
    mean = 0.0
    for d in diffs:
        mean += d / n
    if n == 1:
        return 1, mean, None, None
    var = 0.0
    for d in diffs:
        var += (d - mean) ** 2 / (n - 1)
    half = t_975(n - 1) * math.sqrt(var / n)
    return n, mean, mean - half, mean + half


def row(label, seed, acc, reward, early, replay=False, collapse=None):
    method, _, quant = label.removesuffix("+r3").partition("@")
    return {"label": label, "method": method, "quant": quant, "replay": replay, "seed": seed,
            "late_acc_engine": acc, "late_acc_fp32": (acc + reward) / 2 + 0.01 * seed, "late_reward": reward,
            "discrepancy_first": early, "discrepancy_last": 2 * early,
            "seconds_per_step": 0.1, "collapse_step": collapse, "initial_acc_engine": 0.5}


def random_lab(rng: random.Random, seeds_of: dict[str, list[int]], early: dict[str, float]) -> list[dict]:
    rows = []
    for label, seeds in seeds_of.items():
        quant = label.removesuffix("+r3").partition("@")[2]
        for seed in seeds:
            rows.append(row(label, seed, rng.random(), rng.random(), early[quant] * (1 + 0.1 * rng.random()),
                            replay=label.endswith("+r3"), collapse=5 if rng.random() < 0.3 else None))
    return rows


def check_spread(got, want):
    if want is None:
        assert got is None
        return
    n, mean, low, high = want
    assert got.n == n and got.mean == pytest.approx(mean, abs=1e-12)
    if low is None:
        assert got.low is None and got.high is None
    else:  # the table's t quantiles have 4 significant digits: the half-widths agree to 1e-3 relative
        assert got.mean - got.low == pytest.approx(mean - low, rel=1e-3)
        assert got.high - got.mean == pytest.approx(high - mean, rel=1e-3)


def test_t_reference_matches_textbook_values():
    assert t_975(1) == pytest.approx(12.706, abs=2e-3) and t_975(4) == pytest.approx(2.776, abs=1e-3)


@pytest.mark.parametrize("trial", range(4))
def test_frontier_and_versus_grpo_against_a_loop_on_random_labs(trial):
    rng = random.Random(trial)
    early = {"none": 1e-7, "e4m3": 0.01, "weird-dose": 0.003, "nvfp4": 0.05}
    all_seeds = list(range(7))
    seeds_of = {label: sorted(rng.sample(all_seeds, rng.randint(1, 7)))
                for label in ("grpo@none", "grpo@e4m3", "dcgrpo@e4m3", "grpo@weird-dose", "token_tis@weird-dose",
                              "grpo@nvfp4", "dcgrpo@nvfp4", "grpo@nvfp4+r3", "dcgrpo@none")}
    rows = random_lab(rng, seeds_of, early)
    aggregated = aggregate_runs(rows)
    by = {(r["label"], r["seed"]): r for r in rows}

    def values(label, key):
        return {seed: by[(label, seed)][key] for seed in seeds_of[label]}

    found = frontier(aggregated)
    assert list(found["doses"]) == ["none", "weird-dose", "e4m3", "nvfp4"]  # ordered by measured mismatch
    for dose, s in found["doses"].items():  # runs without R3 only
        plain = [by[(label, seed)]["discrepancy_first"] for label in seeds_of if label.partition("@")[2] == dose
                 for seed in seeds_of[label]]
        assert s.mean == pytest.approx(sum(plain) / len(plain))
    points = {p["label"]: p for p in found["points"]}
    assert set(points) == set(seeds_of) and points["grpo@none"]["reference"] is None
    for label, p in points.items():
        assert p["collapse_rate"] == sum(by[(label, s)]["collapse_step"] is not None
                                         for s in seeds_of[label]) / len(seeds_of[label])
        if label == "grpo@none":
            continue
        assert p["reference"] == "grpo@none"
        assert p["paired_seeds"] == sorted(set(seeds_of[label]) & set(seeds_of["grpo@none"]))
        for key in ("late_acc_engine", "late_acc_fp32", "late_reward"):
            check_spread(p["gaps"][key], reference_gap(values(label, key), values("grpo@none", key)))
    versus = {(c["run"], c["quantity"]): c for c in versus_grpo(aggregated)}
    assert {run for run, _ in versus} <= {"dcgrpo@e4m3", "token_tis@weird-dose", "dcgrpo@nvfp4", "grpo@nvfp4+r3",
                                          "dcgrpo@none"}
    for run, base in (("dcgrpo@e4m3", "grpo@e4m3"), ("token_tis@weird-dose", "grpo@weird-dose"),
                      ("grpo@nvfp4+r3", "grpo@nvfp4"), ("dcgrpo@none", "grpo@none")):
        for key in ("late_acc_engine", "late_acc_fp32", "late_reward", "discrepancy_last"):
            want = reference_gap(values(run, key), values(base, key))
            check_spread(versus[(run, key)]["difference"] if (run, key) in versus else None, want)
            if want is not None:
                c = versus[(run, key)]
                assert c["reference"] == base
                assert c["sign"] == (0 if want[2] is None else 1 if want[2] > 0 else -1 if want[3] < 0 else 0)


def test_direction_one_seed_missing_seeds_and_one_dose():
    rows = [row("grpo@none", s, 0.9, 0.8, 1e-7) for s in range(4)]
    rows += [row("grpo@e5m2", s, 0.9 - d, 0.8, 0.02) for s, d in zip(range(4), (0.10, 0.12, 0.11, 0.13))]
    rows += [row("dcgrpo@e5m2", 2, 0.5, 0.8, 0.02)]
    found = frontier(aggregate_runs(rows))
    points = {p["label"]: p for p in found["points"]}
    hurt = points["grpo@e5m2"]
    assert hurt["gaps"]["late_acc_engine"].mean == pytest.approx(-0.115) and hurt["signs"]["late_acc_engine"] == -1
    assert hurt["signs"]["late_reward"] == 0  # identical rewards: interval [0, 0] does not exclude 0
    one = points["dcgrpo@e5m2"]["gaps"]["late_acc_engine"]  # one common seed: no interval, no claim
    assert one.n == 1 and one.mean == pytest.approx(-0.4) and one.low is None
    assert points["dcgrpo@e5m2"]["signs"]["late_acc_engine"] == 0
    assert frontier(aggregate_runs([r for r in rows if r["quant"] == "e5m2"])) is None  # one engine: no frontier


def test_exact_reference_falls_back_to_the_method_on_the_exact_engine():
    rows = [row(label, s, 0.5 + 0.1 * s, 0.5, early) for s in range(3)
            for label, early in (("dcgrpo@none", 1e-7), ("dcgrpo@e4m3", 0.01), ("token_tis@e4m3", 0.012))]
    points = {p["label"]: p for p in frontier(aggregate_runs(rows))["points"]}
    assert points["dcgrpo@e4m3"]["reference"] == "dcgrpo@none" and points["dcgrpo@none"]["reference"] is None
    assert points["token_tis@e4m3"]["reference"] is None and points["token_tis@e4m3"]["gaps"]["late_reward"] is None


def test_dose_mismatch_uses_r3_runs_only_for_an_engine_without_others():
    rows = [row("grpo@e4m3", 0, 0.5, 0.5, 0.02), row("grpo@e4m3+r3", 0, 0.5, 0.5, 0.001, replay=True),
            row("grpo@e5m2+r3", 0, 0.5, 0.5, 0.004, replay=True)]
    doses = dose_mismatch(aggregate_runs(rows))
    assert list(doses) == ["e5m2", "e4m3"] and doses["e4m3"].mean == 0.02 and doses["e5m2"].mean == 0.004


def test_x_positions_keep_the_exact_engine_visible():
    from mismatch_ctrl.lab.results.stats import spread

    doses = {EXACT: spread([1e-7]), "e4m3": spread([0.01]), "e5m2": spread([0.03])}
    x, broken = x_positions(doses)
    assert broken and x == {EXACT: pytest.approx(0.001), "e4m3": 0.01, "e5m2": 0.03}
    x, broken = x_positions({EXACT: spread([0.0]), "e4m3": spread([0.01])})
    assert broken and x[EXACT] == pytest.approx(0.001)
    doses = {EXACT: spread([0.001]), "e4m3": spread([0.01])}  # within two decades: true values
    assert x_positions(doses) == ({EXACT: 0.001, "e4m3": 0.01}, False)
    assert x_positions({"e4m3": spread([0.01]), "e5m2": spread([0.03])}) == ({"e4m3": 0.01, "e5m2": 0.03}, False)


def test_controller_row_reads_eps_lambda_penalty_and_flips():
    records = [{"step": 0, "eps": 0.005, "lambda": 0.05, "lambda_next": 0.2, "penalty_share": 0.01,
                "routing_flip_fraction": 0.04},
               {"step": 1, "eps": 0.012, "lambda": 0.2, "lambda_next": 0.1, "penalty_share": 0.03,
                "routing_flip_fraction": 0.06}]
    got = controller_row(records)
    assert got == {"eps_start": 0.005, "eps_end": 0.012, "lambda_start": 0.05, "lambda_peak": 0.2, "lambda_end": 0.1,
                   "penalty_share": pytest.approx(0.02), "routing_flip_fraction": pytest.approx(0.05)}
    assert set(controller_row([{"step": 0, "reward": 0.1}]).values()) == {None}


def test_report_and_summary_carry_the_same_frontier_numbers(tmp_path):
    rows = []
    for s in range(3):
        for label, acc, early in (("grpo@none", 0.9, 1e-7), ("grpo@e5m2", 0.8 - 0.01 * s, 0.02),
                                  ("dcgrpo@e5m2", 0.85, 0.02)):
            r = row(label, s, acc, 0.5, early)
            r["settings"] = {"policy": "moe", "task": "add", "steps": 4, "prompts_per_step": 2, "samples_per_prompt": 2,
                             "optimizer_steps": 1, "lr": 1e-3}
            rows.append(r)
            run = tmp_path / label / f"seed{s}"
            run.mkdir(parents=True)
            lam = [{"lambda": 0.05 * (k + 1), "lambda_next": 0.05 * (k + 2), "eps": 0.01}
                   if label.startswith("dcgrpo") else {} for k in range(2)]
            (run / "metrics.jsonl").write_text("\n".join(json.dumps({"step": k, **lam[k]}) for k in range(2)))
    records = {(r["label"], r["seed"]): [json.loads(line) for line in (tmp_path / r["label"] / f"seed{r['seed']}" /
                                                                    "metrics.jsonl").read_text().splitlines()]
               for r in rows}
    write_outputs(RunTable.of(Run(r, records[r["label"], r["seed"]]) for r in rows), tmp_path,
                  ["mismatch-ctrl lab --test"])
    report = (tmp_path / "report.md").read_text()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (tmp_path / "plots" / "frontier.png").read_bytes()[:4] == b"\x89PNG"
    assert "![frontier](plots/frontier.png)" in report
    point = next(p for p in summary["frontier"]["points"] if p["label"] == "grpo@e5m2")
    gap = point["gaps"]["late_acc_engine"]
    assert gap["mean"] == pytest.approx(-0.11) and gap["n"] == 3 and gap["high"] < 0
    assert f"| `grpo@e5m2` | e5m2 | 0.020 | `grpo@none` | {gap['mean']:.3f} [{gap['low']:.3f}, {gap['high']:.3f}] " \
           "(3) **lower** |" in report
    versus = {(c["run"], c["quantity"]): c for c in summary["versus_grpo"]}
    d = versus[("dcgrpo@e5m2", "late_acc_engine")]["difference"]
    assert d["mean"] == pytest.approx(0.06) and f"{d['mean']:.3f} [{d['low']:.3f}, {d['high']:.3f}] (3) **higher**" \
        in report
    lam = [c for c in summary["controllers"] if c["label"] == "dcgrpo@e5m2"]
    assert len(lam) == 3 and lam[0]["lambda_peak"] == pytest.approx(0.15)
    assert "| `dcgrpo@e5m2` | 0 | 0.010 | 0.050 / 0.150 / 0.150 | - | - |" in report


def test_frontier_plot_of_engines_without_measured_mismatch(tmp_path):
    rows = [row(label, s, 0.5, 0.5, 0.0) for s in range(2) for label in ("grpo@none", "grpo@e4m3")]
    found = frontier(aggregate_runs(rows))
    assert [p["gaps"]["late_reward"].mean for p in found["points"] if p["reference"]] == [0.0]
    assert write_frontier_plot(found, tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"


def test_close_doses_share_one_tick_on_the_top_axis():
    def fits(ticks, rows, left=-4.5, right=-1.0, char=0.01):  # a label's width: char x its length (log axis)
        def span(at, name):
            where = (math.log10(at) - left) / (right - left) if at > 0 else 0.0
            return where - char * len(name) / 2, where + char * len(name) / 2
        return all(a[1] < b[0] for row in range(rows) for a, b in itertools.pairwise(
            [span(*tick) for tick in ticks[row::rows]]))

    x = {EXACT: 1e-4, "e4m3": 0.011, "int4": 0.0111, "temp1.3": 0.0112, "nvfp4": 0.046}
    names = {dose: dose.upper() for dose in x}
    ticks, rows = dose_ticks(x, names, fits)  # within 2% of the range: one point to the eye, one tick
    joined = (0.011 * 0.0111 * 0.0112) ** (1 / 3)
    assert [name for _, name in ticks] == ["NONE", "E4M3 / INT4 / TEMP1.3", "NVFP4"] and rows == 1
    assert [at for at, _ in ticks] == pytest.approx([1e-4, joined, 0.046])
    apart = {"e4m3": 0.01, "e5m2": 0.03, "nvfp4": 0.1}
    assert dose_ticks(apart, {d: d for d in apart}, fits) == ([(0.01, "e4m3"), (0.03, "e5m2"), (0.1, "nvfp4")], 1)
    near = {EXACT: 1e-4, "bf16": 0.01, "e4m3": 0.013, "e5m2": 0.017, "nvfp4": 0.1}  # near, not equal: two rows
    assert dose_ticks(near, {d: d for d in near}, fits) == ([(x, d) for d, x in near.items()], 2)
    crowded = {"a": 0.01, "b": 0.0102, "c": 0.0115, "d": 0.0117, "e": 0.1}  # too many to stagger: closest join
    ticks, rows = dose_ticks(crowded, {d: d * 8 for d in crowded}, fits, span=0.0)
    assert [name for _, name in ticks] == ["a" * 8 + " / " + "b" * 8, "c" * 8 + " / " + "d" * 8, "e" * 8]
    assert rows == 2
    linear = {"a": 0.0, "b": 0.0}  # a degenerate lab: every engine at 0, a linear axis: one tick, both names
    assert dose_ticks(linear, {d: d for d in linear}, fits) == ([(0.0, "a / b")], 1)
