"""benchmarks/lab_interaction.py: a controller's paired gain over GRPO in two lab directories and the difference in
differences, against a direct computation per seed."""

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the script imports lab_pooled from its own directory
spec = importlib.util.spec_from_file_location("lab_interaction", BENCHMARKS / "lab_interaction.py")
lab_interaction = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab_interaction)


def write(directory: Path, values: dict[str, dict[int, float]]) -> Path:
    """A summary.json with the lab's per-run rows: ``values[label][seed]`` is the run's late engine accuracy; the
    directory's name stands for its settings (A and B of a pair differ in one)."""
    directory.mkdir()
    runs = [{"label": label, "method": label.split("@")[0], "quant": label.split("@")[1].split("+")[0],
             "replay": label.endswith("+r3"), "seed": seed, "collapse_step": None, "late_acc_engine": value,
             "settings": {"setting": directory.name.rstrip("b"), "seed": seed}}
            for label, by_seed in values.items() for seed, value in by_seed.items()]
    (directory / "summary.json").write_text(json.dumps({"runs": runs, "versus_grpo": [], "aggregate": {}}))
    return directory


def interval(values: list[float]) -> str:
    mean, half = statistics.mean(values), 4.303 * statistics.stdev(values) / math.sqrt(len(values))  # t, 2 d.o.f.
    return f"{mean:+.3f} [{mean - half:+.3f}, {mean + half:+.3f}]"


def test_gains_and_their_difference_are_paired_by_seed(tmp_path, capsys):
    k1 = write(tmp_path / "k1", {"grpo@e4m3": {0: 0.5, 1: 0.6, 2: 0.7, 3: 0.9},
                                 "grpo@e4m3+r3": {0: 0.55, 1: 0.58, 2: 0.8, 4: 0.1}})
    k4 = write(tmp_path / "k4", {"grpo@e4m3": {0: 0.4, 1: 0.5, 2: 0.45},
                                 "grpo@e4m3+r3": {0: 0.6, 1: 0.52, 2: 0.7, 3: 0.2}})
    assert lab_interaction.main([str(k1), str(k4)]) == 0
    lines = capsys.readouterr().out.splitlines()
    r3 = next(line for line in lines if line.startswith("grpo@e4m3+r3"))
    gain_a, gain_b = [0.05, -0.02, 0.1], [0.2, 0.02, 0.25]  # seeds 0, 1, 2: the only ones all four runs have
    assert r3.split()[1] == "3"
    assert interval(gain_a) in r3 and interval(gain_b) in r3
    assert interval([b - a for a, b in zip(gain_a, gain_b)]) in r3
    grpo = next(line for line in lines if line.startswith("grpo@e4m3 "))
    assert interval([-0.1, -0.1, -0.25]) in grpo


def test_directories_without_common_runs_or_rows_are_clear_errors(tmp_path, capsys):
    a = write(tmp_path / "a", {"grpo@e4m3+r3": {0: 0.5}})
    b = write(tmp_path / "b", {"grpo@nvfp4+r3": {0: 0.5}})
    assert lab_interaction.main([str(a), str(b)]) == 2
    assert "share no run" in capsys.readouterr().err
    (b / "summary.json").write_text(json.dumps({"versus_grpo": [], "aggregate": {}}))
    with pytest.raises(SystemExit, match="not a lab summary"):
        lab_interaction.main([str(a), str(b)])


def test_pairs_of_directories_with_other_seeds_are_pooled(tmp_path, capsys):
    k1 = write(tmp_path / "k1", {"grpo@nvfp4": {0: 0.5, 1: 0.6}, "grpo@nvfp4+r3": {0: 0.55, 1: 0.58}})
    k4 = write(tmp_path / "k4", {"grpo@nvfp4": {0: 0.4, 1: 0.5}, "grpo@nvfp4+r3": {0: 0.6, 1: 0.52}})
    k1b = write(tmp_path / "k1b", {"grpo@nvfp4": {7: 0.7}, "grpo@nvfp4+r3": {7: 0.8}})
    k4b = write(tmp_path / "k4b", {"grpo@nvfp4": {7: 0.3}, "grpo@nvfp4+r3": {7: 0.35}})
    assert lab_interaction.main([str(k1), str(k4), str(k1b), str(k4b)]) == 0
    r3 = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("grpo@nvfp4+r3"))
    gain_a, gain_b = [0.05, -0.02, 0.1], [0.2, 0.02, 0.05]
    assert r3.split()[1] == "3" and interval(gain_a) in r3 and interval(gain_b) in r3
    assert interval([b - a for a, b in zip(gain_a, gain_b)]) in r3
    with pytest.raises(SystemExit):
        lab_interaction.main([str(k1), str(k4), str(k1b)])
