"""The lab's closing "what the mismatch and the controllers did" table (``console.mechanism_table``) against a
straightforward per-run computation, and where ``mismatch-ctrl lab`` prints it."""

from __future__ import annotations

import json
import random

import pytest
from sweep_helpers import TINY_WARMUP, lab_command

from mismatch_ctrl.cli import main
from mismatch_ctrl.lab.results.console import mechanism_table
from mismatch_ctrl.lab.results.table import Run, RunTable
from mismatch_ctrl.lab.sweeps import run as lab_run

CLIP, REJECT = "train/mismatch_ctrl/is_clip_high_fraction", "train/mismatch_ctrl/rejected_seq_fraction"


def _run(label: str, seed: int, rng: random.Random, *, flips: bool, dcgrpo: bool = False, key: str | None = None,
         rollouts: int = 5) -> Run:
    records = []
    for step in range(rollouts):
        record: dict[str, float] = {"step": step, "routing_flip_fraction": rng.uniform(0.01, 0.08) if flips else 0.0}
        if dcgrpo:
            record.update(eps=0.005 if step < 2 else rng.uniform(0.01, 0.02), penalty_share=rng.uniform(0, 1e-3),
                          **{"lambda": rng.uniform(0, 0.2)})
        if key is not None:
            record[key] = rng.uniform(0, 0.05)
        records.append(record)
    summary = {"label": label, "seed": seed,
               "routing_flip_fraction": sum(r["routing_flip_fraction"] for r in records) / rollouts}
    if flips:
        summary.update(discrepancy_flipped=rng.uniform(0.05, 0.08), discrepancy_unflipped=rng.uniform(0.008, 0.012))
    return Run(summary, records)


def _expected(runs: list[Run]) -> dict[str, float | None]:
    """The same numbers, one run at a time: means over a run's rollouts, then over the seeds."""
    def over_seeds(values: list[float | None]) -> float | None:
        values = [v for v in values if v is not None]
        return sum(values) / len(values) if values else None

    def per_run(run: Run, key: str) -> float | None:
        values = [r[key] for r in run.records if key in r]
        return sum(values) / len(values) if values else None

    ratios = []
    for run in runs:
        if "discrepancy_flipped" in run.summary:
            ratios.append(run.summary["discrepancy_flipped"] / run.summary["discrepancy_unflipped"])
    eps = [[r["eps"] for r in run.records if "eps" in r] for run in runs]
    lams = [[r["lambda"] for r in run.records if "lambda" in r] for run in runs]
    return {"flips": over_seeds([run.summary["routing_flip_fraction"] for run in runs]),
            "ratio": over_seeds(ratios),
            "eps_first": over_seeds([e[0] if e else None for e in eps]),
            "eps_last": over_seeds([e[-1] if e else None for e in eps]),
            "lambda_peak": over_seeds([max(lam) if lam else None for lam in lams]),
            "share": over_seeds([per_run(run, "penalty_share") for run in runs]),
            "clipped": over_seeds([per_run(run, CLIP) for run in runs]),
            "rejected": over_seeds([per_run(run, REJECT) for run in runs])}


def _matches(cell: str, want: float) -> bool:
    """The printed cell is ``want`` to the precision it was printed with (half a unit of its last digit)."""
    mantissa = cell.rstrip("x").split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(cell.split("e")[1]) if "e" in cell else 0
    return abs(float(cell.rstrip("x")) - want) <= 0.5 * 10.0 ** (exponent - decimals) * (1 + 1e-9)


@pytest.mark.parametrize("trial", range(5))
def test_each_cell_is_the_mean_over_seeds_of_each_runs_own_figure(trial):
    rng = random.Random(trial)
    seeds = (70, 71, 72)[: rng.randint(1, 3)]
    kinds = {"grpo@none": {"flips": False}, "grpo@e4m3": {"flips": True},
             "dcgrpo@e4m3": {"flips": True, "dcgrpo": True}, "token_tis@e4m3": {"flips": True, "key": CLIP},
             "geo_rs@e4m3": {"flips": True, "key": REJECT}}
    runs = [_run(label, seed, rng, **kind) for label, kind in kinds.items() for seed in seeds]
    lines = mechanism_table(RunTable.of(runs)).splitlines()
    assert lines[0].split() == ["run", "routing", "flips", "flipped", "/", "unflipped", "eps", "first", "->", "last",
                                "lambda", "peak", "penalty", "share", "clipped", "rejected"]
    assert [line.split()[0] for line in lines[1:]] == list(kinds)
    for line, label in zip(lines[1:], kinds):
        cells = line.split()
        want = _expected([run for run in runs if run.label == label])
        assert _matches(cells[1], want["flips"])
        assert (cells[2] == "-") == (want["ratio"] is None)
        if want["ratio"] is not None:
            assert _matches(cells[2], want["ratio"])
        if want["eps_first"] is None:
            assert cells[3] == "-"
            rest = cells[4:]
        else:
            assert cells[4] == "->"
            assert _matches(cells[3], want["eps_first"]) and _matches(cells[5], want["eps_last"])
            rest = cells[6:]
        for cell, key in zip(rest, ("lambda_peak", "share", "clipped", "rejected")):
            if want[key] is None:
                assert cell == "-", (label, key)
            else:
                assert _matches(cell, want[key]), (label, key, cell, want[key])


def test_nothing_to_show_gives_no_table():
    """Exact-engine runs flip nothing and have no controller: the table would be all dashes and zeros."""
    rng = random.Random(0)
    assert mechanism_table(RunTable.of([_run("grpo@none", 0, rng, flips=False)])) == ""
    assert mechanism_table(RunTable.of([_run("grpo@e4m3", 0, rng, flips=True)])) != ""


def test_the_lab_prints_it_after_the_summary(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)
    out = tmp_path / "out"
    code = main(lab_command(out, tmp_path / "cache", "--methods", "grpo@none,grpo,dcgrpo", "--steps", "2", "--seeds",
                            "0", "--jobs", "1"))
    printed = capsys.readouterr().out
    assert code == 0
    summaries = json.loads((out / "summary.json").read_text())["runs"]
    runs = [Run(s, [json.loads(line) for line in (out / s["label"] / f"seed{s['seed']}" / "metrics.jsonl")
                    .read_text().splitlines()]) for s in summaries]
    table = mechanism_table(RunTable.of(runs))
    assert table and table in printed
    assert printed.index("late acc") < printed.index("what the mismatch and the controllers did") < printed.index(
        "report:")
    dcgrpo = next(line for line in table.splitlines() if line.startswith("dcgrpo@e4m3")).split()
    assert dcgrpo[4] == "->"  # the multiplier's budget is shown for the DC-GRPO run
