"""``mismatch-ctrl lab compare``: runs of several lab output directories read once into one table, each controller
against GRPO per directory and pooled, and interactions of two settings (``--pairs``), against direct computations
per seed; and every way a run could count twice, or a pooled interval mix settings, refused with the reason."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import shutil
import statistics
from pathlib import Path
from typing import Any

import pytest

from mismatch_ctrl import cli
from mismatch_ctrl.lab.model.warmup import WarmupConfig, warmup_preset
from mismatch_ctrl.lab.results.pooling import POOLED, interactions, pooled_versus
from mismatch_ctrl.lab.results.table import Run, RunTable
from mismatch_ctrl.lab.sweeps import sweep
from mismatch_ctrl.lab.sweeps.sweep import FINGERPRINT_FILE, RunTask, commit_run, record_digest
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.training.settings import LabSettings
from mismatch_ctrl.lab.training.trainer import RUN_FILE

STEPS = 4


def make_runs(out: Path, values: dict[str, dict[int, float]], optimizer_steps: int = 2,
              warmup: WarmupConfig | None = None, **settings: Any) -> Path:
    """Committed run folders as a sweep leaves them: ``values[label][seed]`` is the run's late (= final) engine
    accuracy; its reward collapses when the value is below 0.1. The warm-up the fingerprints record: ``warmup``, by
    default the add task's preset for the MoE policy."""
    for label, by_seed in values.items():
        spec = RunSpec.parse(label, "e4m3", num_experts=8)
        for seed, value in by_seed.items():
            run_settings = LabSettings(**{"steps": STEPS, **settings}, seed=seed, optimizer_steps=optimizer_steps)
            rewards = [0.5, 0.0, 0.0, 0.0] if value < 0.1 else [0.5] * STEPS
            records = [{"step": i, "reward": r, "seconds": 1.0 + i} for i, r in enumerate(rewards)]
            records[-1].update(final_eval_acc_engine=value, final_eval_acc_fp32=value, run=f"{label} seed {seed}")
            files = {"metrics.jsonl": "".join(json.dumps(r) + "\n" for r in records).encode(),
                     RUN_FILE: json.dumps({"method": spec.method, "quant": spec.quant, "replay": spec.replay,
                                           "settings": run_settings.__dict__}).encode()}
            commit_run(out, RunTask(spec, run_settings, b""), files, warmup or warmup_preset("add", "moe"))
    return out


def compare(capsys, *args: str | Path) -> tuple[int, str, str]:
    code = cli.main(["lab", "compare", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def interval(values: list[float]) -> str:
    """mean [95% t interval] as the table prints it, computed directly."""
    mean, sd = statistics.mean(values), statistics.stdev(values)
    half = {2: 12.706, 3: 4.303, 4: 3.182}[len(values)] * sd / math.sqrt(len(values))
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def row(out: str, *cells: str) -> str:
    """The table line holding every one of ``cells``."""
    return next(line for line in out.splitlines() if all(c in line for c in cells))


def test_differences_against_grpo_per_directory_and_pooled(tmp_path, capsys):
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5, 1: 0.6}, "dcgrpo@e5m2": {0: 0.6, 1: 0.3}})
    b = make_runs(tmp_path / "b", {"grpo@e5m2": {2: 0.4, 3: 0.05}, "dcgrpo@e5m2": {2: 0.55, 3: 0.02}})
    code, out, _ = compare(capsys, a, b)
    assert code == 0
    diffs = [0.1, -0.3, 0.15, -0.03]
    assert interval(diffs[:2]) in row(out, str(a)) and interval(diffs[2:]) in row(out, str(b))
    pooled = row(out, "**pooled**")
    assert "`dcgrpo@e5m2` | `grpo@e5m2`" in pooled and "| 4 |" in pooled and interval(diffs) in pooled
    assert pooled.endswith("| 1/4, 1/4 |")  # seed 3 collapsed in both runs
    assert "`grpo@e5m2` | `grpo@e5m2`" not in out


def test_pooling_is_a_pure_function_of_the_table():
    def summary(label: str, seed: int, value: float) -> dict:
        spec = RunSpec.parse(label, "e4m3", num_experts=8)
        return {"label": label, "method": spec.method, "quant": spec.quant, "replay": spec.replay, "seed": seed,
                "settings": {}, "collapse_step": None, "late_acc_engine": value}

    table = RunTable.of([Run(summary("grpo@nvfp4", 0, 0.5), (), "x"), Run(summary("grpo@nvfp4+r3", 0, 0.7), (), "x"),
                         Run(summary("grpo@nvfp4", 5, 0.4), (), "y"), Run(summary("grpo@nvfp4+r3", 5, 0.3), (), "y")])
    rows = pooled_versus(table, "late_acc_engine")
    assert [(r.source, r.difference.n) for r in rows] == [("x", 1), ("y", 1), (POOLED, 2)]
    assert rows[-1].difference.values == pytest.approx((0.2, -0.1))
    with pytest.raises(ValueError, match="grpo@nvfp4 seed 0 is in the table twice"):
        RunTable.of([*table.runs, Run(summary("grpo@nvfp4", 0, 0.1), (), "x")])


def test_pairs_give_gains_and_their_difference_paired_by_seed_and_pooled_over_pairs(tmp_path, capsys):
    k1 = make_runs(tmp_path / "k1", {"grpo@e4m3": {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9},
                                     "grpo@e4m3+r3": {0: 0.55, 1: 0.58, 2: 0.8, 4: 0.1}}, optimizer_steps=1)
    k4 = make_runs(tmp_path / "k4", {"grpo@e4m3": {0: 0.4, 1: 0.5, 2: 0.45},
                                     "grpo@e4m3+r3": {0: 0.6, 1: 0.52, 2: 0.7, 3: 0.2}}, optimizer_steps=4)
    code, out, _ = compare(capsys, "--pairs", k1, k4)
    assert code == 0
    gain_a, gain_b = [0.05, -0.02, 0.1], [0.2, 0.02, 0.25]  # seeds 0, 1, 2: the only ones all four runs have
    r3 = row(out, "`grpo@e4m3+r3`")
    assert "| 3 |" in r3 and interval(gain_a) in r3 and interval(gain_b) in r3
    assert interval([b - a for a, b in zip(gain_a, gain_b)]) in r3
    assert interval([-0.1, -0.1, -0.25]) in row(out, "`grpo@e4m3` |")
    k1b = make_runs(tmp_path / "k1b", {"grpo@e4m3": {7: 0.7}, "grpo@e4m3+r3": {7: 0.8}}, optimizer_steps=1)
    k4b = make_runs(tmp_path / "k4b", {"grpo@e4m3": {7: 0.3}, "grpo@e4m3+r3": {7: 0.35}}, optimizer_steps=4)
    code, out, _ = compare(capsys, "--pairs", k1, k4, k1b, k4b)
    r3 = row(out, "`grpo@e4m3+r3`")
    assert "| 4 |" in r3 and interval([*gain_a, 0.1]) in r3 and interval([*gain_b, 0.05]) in r3
    table = RunTable.of(Run(s.summary, (), s.source) for s in [])  # an empty table compares nothing
    assert interactions(table, [("a", "b")], "late_acc_engine") == []


def test_pairs_name_the_setting_that_changed_and_refuse_none_or_several(tmp_path, capsys):
    def values(base: float) -> dict[str, dict[int, float]]:  # other numbers: the same file twice would be a copy
        return {"grpo@e5m2": {0: base}, "dcgrpo@e5m2": {0: base + 0.1}}

    a = make_runs(tmp_path / "a", values(0.5), optimizer_steps=1)
    b = make_runs(tmp_path / "b", values(0.4), optimizer_steps=4)
    code, out, _ = compare(capsys, "--pairs", a, b)
    assert code == 0 and out.rstrip().endswith("B - A: optimizer_steps: 1 -> 4")
    same = make_runs(tmp_path / "same", {"grpo@e5m2": {1: 0.5}, "dcgrpo@e5m2": {1: 0.6}}, optimizer_steps=1)
    code, _, err = compare(capsys, "--pairs", a, same)
    assert code == 2 and f"{a} and {same} were trained under the same settings; pool them without --pairs" in err
    two = make_runs(tmp_path / "two", values(0.3), optimizer_steps=4, lr=2e-3)
    code, _, err = compare(capsys, "--pairs", a, two)
    assert code == 2 and f"{a} and {two} differ in 2 settings (lr: 0.001 -> 0.002; optimizer_steps: 1 -> 4)" in err
    code, out, _ = compare(capsys, "--pairs", "--across-settings", a, two)
    assert code == 0 and "B - A: lr: 0.001 -> 0.002; optimizer_steps: 1 -> 4" in out
    code, _, err = compare(capsys, "--pairs", "--across-settings", a, two, same, make_runs(
        tmp_path / "same2", {"grpo@e5m2": {2: 0.4}, "dcgrpo@e5m2": {2: 0.5}}, optimizer_steps=1))
    assert code == 2 and "were trained under the same settings" in err  # every pair is checked, not the first
    dense = make_runs(tmp_path / "dense", values(0.2), optimizer_steps=1, policy="dense",
                      warmup=warmup_preset("add", "dense"))
    code, out, _ = compare(capsys, "--pairs", a, dense)  # the policy's warm-up changes with it: one setting
    assert code == 0 and "B - A: policy: 'moe' -> 'dense'; warmup.policy: 'moe' -> 'dense'" in out


def test_a_directory_given_twice_however_spelled_is_refused(tmp_path, capsys, monkeypatch):
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5}, "dcgrpo@e5m2": {0: 0.6}})
    (tmp_path / "link").symlink_to(a)
    monkeypatch.chdir(tmp_path)
    for again in ("./a", tmp_path / "link", tmp_path / "b" / ".." / "a"):
        code, _, err = compare(capsys, a, again)
        assert code == 2 and f"is given twice (also as {a}); its seeds would count twice" in err
    code, _, err = compare(capsys, a, f"{a}/")
    assert code == 2 and f"{a} is given twice; its seeds would count twice" in err


def test_a_copied_directory_or_the_same_run_twice_is_refused(tmp_path, capsys):
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5, 1: 0.4}, "dcgrpo@e5m2": {0: 0.6, 1: 0.5}})
    shutil.copytree(a, tmp_path / "copy")
    code, _, err = compare(capsys, a, tmp_path / "copy")
    assert code == 2 and "one run copied, which would count twice" in err
    again = make_runs(tmp_path / "again", {"grpo@e5m2": {1: 0.45}})  # the same run, trained again elsewhere
    code, _, err = compare(capsys, a, again)
    assert code == 2 and f"{a} and {again} both hold grpo@e5m2 seed 1 trained with the same settings" in err


def test_pooling_directories_of_different_settings_is_refused_but_pairs_compare_them(tmp_path, capsys):
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5}, "dcgrpo@e5m2": {0: 0.6}}, optimizer_steps=1)
    b = make_runs(tmp_path / "b", {"grpo@e5m2": {0: 0.45}, "dcgrpo@e5m2": {0: 0.7}}, optimizer_steps=4)
    code, _, err = compare(capsys, a, b)
    assert code == 2 and f"different settings would be pooled ({a} and {b}: optimizer_steps: 1 -> 4)" in err
    assert "--pairs" in err and "--across-settings" in err
    assert compare(capsys, "--pairs", a, b)[0] == 0
    code, out, _ = compare(capsys, "--across-settings", a, b)
    assert code == 0 and out.rstrip().endswith(f"Pooled across settings: {a} and {b}: optimizer_steps: 1 -> 4")
    pooled = row(out, "**pooled**")  # seed 0 in both: one value, the mean of +0.1 and +0.25, not two
    assert "(1 of its seeds measured in several directories: each seed's mean) | 1 | +0.175 (one seed) |" in pooled
    c = make_runs(tmp_path / "c", {"grpo@e5m2": {1: 0.5}, "dcgrpo@e5m2": {1: 0.7}}, optimizer_steps=2)
    d = make_runs(tmp_path / "d", {"grpo@e5m2": {1: 0.55}, "dcgrpo@e5m2": {1: 0.75}}, optimizer_steps=4)
    code, _, err = compare(capsys, "--pairs", a, b, c, d)  # the A of the second pair is another setting
    assert code == 2 and "different settings" in err
    code, _, err = compare(capsys, "--pairs", a, b, c)
    assert code == 2 and "in pairs A B, got 3" in err


def test_directories_of_another_warm_up_or_method_configuration_are_other_settings(tmp_path, capsys, monkeypatch):
    """Settings alike, but the fingerprints record another warm-up, or another configuration of a method both
    directories ran (a lab of another version): pooling them is refused, naming the difference, and the same label
    and seed in both is not one run twice."""
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5}, "dcgrpo@e5m2": {0: 0.6}})
    slower = dataclasses.replace(warmup_preset("add", "moe"), lr=5e-4)
    b = make_runs(tmp_path / "b", {"grpo@e5m2": {0: 0.45}, "dcgrpo@e5m2": {0: 0.7}}, warmup=slower)
    code, _, err = compare(capsys, a, b)
    assert code == 2 and f"different settings would be pooled ({a} and {b}: warmup.lr: 0.003 -> 0.0005)" in err
    assert compare(capsys, "--across-settings", a, b)[0] == 0
    real = sweep.method_section
    monkeypatch.setattr(sweep, "method_section", lambda name: {**real(name), "dcgrpo": {"enabled": True, "eps": 0.5}}
                        if name == "dcgrpo" else real(name))
    c = make_runs(tmp_path / "c", {"grpo@e5m2": {1: 0.5}, "dcgrpo@e5m2": {1: 0.7}, "token_tis@e5m2": {1: 0.6}})
    monkeypatch.setattr(sweep, "method_section", real)
    code, _, err = compare(capsys, a, c)
    assert code == 2 and f"({a} and {c}: method dcgrpo.dcgrpo.eps: '<absent>' -> 0.5)" in err
    d = make_runs(tmp_path / "d", {"grpo@e5m2": {2: 0.5}, "token_tis@e5m2": {2: 0.6}})
    assert compare(capsys, a, d)[0] == 0  # token_tis only in d: nothing of it to compare


def test_missing_empty_damaged_and_incomparable_directories_are_named(tmp_path, capsys):
    code, _, err = compare(capsys, tmp_path / "missing")
    assert code == 2 and f"{tmp_path / 'missing'}: not a directory" in err
    (tmp_path / "empty").mkdir()
    code, _, err = compare(capsys, tmp_path / "empty")
    assert code == 2 and "no runs (*/seed*/)" in err
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5}, "dcgrpo@e5m2": {0: 0.6}})
    metrics = a / "dcgrpo@e5m2" / "seed0" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().replace("0.6", "0.9"))
    code, _, err = compare(capsys, a)
    assert code == 2 and "a damaged run" in err and "was changed after the run finished" in err
    assert f"compare cannot count it. Leave {a} out, or move the folder out of it" in err and "--report-only" not in err
    alone = make_runs(tmp_path / "alone", {"dcgrpo@e5m2": {0: 0.6}})
    code, _, err = compare(capsys, alone)
    assert code == 2 and "nothing to compare: no run has a GRPO run on its engine" in err


@pytest.mark.parametrize("key, value", [("seed", "0"), ("steps", 4.0), ("optimizer_steps", True)])
def test_a_run_json_with_a_setting_of_the_wrong_type_is_a_damaged_run_not_a_traceback(tmp_path, capsys, key, value):
    """run.json and fingerprint.json edited together (the fingerprint's sha256 recomputed): a seed "0" still names
    the folder seed0, and used to reach the sort by seed (TypeError)."""
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5, 1: 0.4}, "dcgrpo@e5m2": {0: 0.6, 1: 0.3}})
    folder = a / "grpo@e5m2" / "seed0"
    info = json.loads((folder / RUN_FILE).read_text())
    info["settings"][key] = value
    (folder / RUN_FILE).write_text(json.dumps(info))
    fingerprint = json.loads((folder / FINGERPRINT_FILE).read_text())
    fingerprint["inputs"]["settings"] = info["settings"]
    fingerprint["files"][RUN_FILE] = hashlib.sha256((folder / RUN_FILE).read_bytes()).hexdigest()
    fingerprint["sha256"] = record_digest(fingerprint["inputs"], fingerprint["files"])
    (folder / FINGERPRINT_FILE).write_text(json.dumps(fingerprint))
    code, _, err = compare(capsys, a)
    assert code == 2 and f"{folder}: a damaged run" in err and f"{key} must be an integer, got {value!r}" in err


def test_a_seed_in_several_directories_counts_once_as_the_mean_of_its_differences(tmp_path, capsys):
    moe = make_runs(tmp_path / "moe", {"grpo@e5m2": {0: 0.5, 1: 0.6, 2: 0.4}, "dcgrpo@e5m2": {0: 0.4, 1: 0.5, 2: 0.5}})
    k4 = make_runs(tmp_path / "k4", {"grpo@e5m2": {1: 0.3, 2: 0.45, 3: 0.2}, "dcgrpo@e5m2": {1: 0.4, 2: 0.3, 3: 0.3}},
                   optimizer_steps=4)
    code, out, _ = compare(capsys, "--across-settings", moe, k4)
    per_seed = [-0.1, (-0.1 + 0.1) / 2, (0.1 - 0.15) / 2, 0.1]  # seeds 0-3; 1 and 2 in both directories
    pooled = row(out, "**pooled**")
    assert code == 0 and "(2 of its seeds" in pooled and "| 4 |" in pooled and interval(per_seed) in pooled


def test_against_the_exact_engine_gives_the_engines_cost(tmp_path, capsys):
    a = make_runs(tmp_path / "a", {"grpo@none": {0: 0.7, 1: 0.8}, "grpo@nvfp4": {0: 0.5, 1: 0.55},
                                   "grpo@nvfp4+r3": {0: 0.6, 1: 0.7}})
    b = make_runs(tmp_path / "b", {"grpo@none": {2: 0.6}, "grpo@nvfp4": {2: 0.45}})
    code, out, _ = compare(capsys, "--against", "exact", a, b)
    assert code == 0 and "run - the exact engine" in out
    assert interval([-0.2, -0.25, -0.15]) in row(out, "`grpo@nvfp4` | `grpo@none` | **pooled**")
    assert "+r3` | `grpo@none` | **pooled**" not in out  # measured in one directory: nothing pooled
    assert "| 2 | -0.100 [-0.100, -0.100] | 0/2, 0/2 |" in row(out, "`grpo@nvfp4+r3` | `grpo@none` |")
    code, out, _ = compare(capsys, a, b)  # against GRPO: only R3 has a reference, in one directory
    assert code == 0 and "**pooled**" not in out and "`grpo@nvfp4+r3` | `grpo@nvfp4`" in out


def test_against_a_named_run_pairs_every_run_with_it(tmp_path, capsys):
    a = make_runs(tmp_path / "a", {"grpo@none": {0: 0.7, 1: 0.8}, "grpo@fp16+train-fp16": {0: 0.65, 1: 0.8},
                                   "grpo@nvfp4+train-bf16+r3": {0: 0.5, 1: 0.7}}, optimizer_steps=4)
    b = make_runs(tmp_path / "b", {"grpo@fp16+train-fp16": {2: 0.6}, "grpo@nvfp4+train-bf16+r3": {2: 0.4}},
                  optimizer_steps=4)
    code, out, _ = compare(capsys, "--against", "grpo@fp16+train-fp16", a, b)
    assert code == 0 and "run - `grpo@fp16+train-fp16`" in out
    pooled = row(out, "`grpo@nvfp4+train-bf16+r3` | `grpo@fp16+train-fp16` | **pooled**")
    assert interval([-0.15, -0.1, -0.2]) in pooled and "| 3 |" in pooled
    assert "| 2 | +0.025 [" in row(out, "`grpo@none` | `grpo@fp16+train-fp16` |")  # one directory: not pooled
    code, _, err = compare(capsys, "--against", "grpo@e4m3+train-bf16", a)
    assert code == 2 and "nothing to compare: no directory holds grpo@e4m3+train-bf16" in err
    with pytest.raises(SystemExit):
        cli.main(["lab", "compare", "--against", "fp16", str(a)])
    assert "expected grpo, exact or a run label METHOD@ENGINE[+r3]" in capsys.readouterr().err


def test_options_of_the_lab_before_compare_are_refused(tmp_path, capsys):
    a = make_runs(tmp_path / "a", {"grpo@e5m2": {0: 0.5}, "dcgrpo@e5m2": {0: 0.6}})
    code = cli.main(["lab", "--out", str(tmp_path / "x"), "--steps", "5", "compare", str(a)])
    err = capsys.readouterr().err
    assert code == 2 and "--steps, --out: options of `mismatch-ctrl lab`" in err
