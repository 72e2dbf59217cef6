"""benchmarks/lab_pooled.py: a run's paired differences against GRPO from each lab summary, pooled over
directories, against a direct computation."""

import importlib.util
import json
import math
import statistics
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "lab_pooled.py"
spec = importlib.util.spec_from_file_location("lab_pooled", SCRIPT)
lab_pooled = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lab_pooled)


def write(directory: Path, differences: list[float], collapses: tuple[int, int], first_seed: int = 0) -> Path:
    """A summary.json as the lab writes it: dc@e5m2 - grpo@e5m2 per seed (seeds from ``first_seed`` on), and each
    run's collapse count."""
    directory.mkdir()
    versus = [{"run": "dc@e5m2", "reference": "grpo@e5m2", "quantity": "late_acc_engine",
               "difference": {"values": differences}},
              {"run": "dc@e5m2", "reference": "grpo@e5m2", "quantity": "late_reward",
               "difference": {"values": [9.0] * len(differences)}}]
    aggregate = {"dc@e5m2": {"collapses": collapses[0]}, "grpo@e5m2": {"collapses": collapses[1]}}
    runs = [{"label": f"{method}@e5m2", "method": method, "quant": "e5m2", "replay": False, "seed": seed,
             "settings": {"lr": 1e-3, "seed": seed}, "collapse_step": None}
            for method in ("dc", "grpo") for seed in range(first_seed, first_seed + len(differences))]
    (directory / "summary.json").write_text(json.dumps({"runs": runs, "versus_grpo": versus, "aggregate": aggregate}))
    return directory


def test_pools_the_paired_differences_of_every_directory(tmp_path, capsys):
    a = write(tmp_path / "a", [0.1, -0.3], (1, 1))
    b = write(tmp_path / "b", [0.15], (1, 0), first_seed=2)
    assert lab_pooled.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    pooled = next(line for line in out if " pooled " in line)
    diffs = [0.1, -0.3, 0.15]
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.303 * sd / math.sqrt(3)  # Student's t, 2 degrees of freedom
    assert pooled.split()[0] == "dc@e5m2" and "n=3" in pooled and f"{mean:+.3f}" in pooled
    assert f"[{mean - half:+.3f}, {mean + half:+.3f}]" in pooled and "collapsed 2 (GRPO 1)" in pooled
    assert any(str(b) in line and "(one seed)" in line for line in out)


def test_unpaired_and_unreadable_directories_are_clear_errors(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "summary.json").write_text(json.dumps({"runs": [], "versus_grpo": [], "aggregate": {}}))
    assert lab_pooled.main([str(empty)]) == 2
    assert "no run has a GRPO run" in capsys.readouterr().err
    for content in ("[1, 2]", "{not json", json.dumps({"runs": []}), json.dumps({"versus_grpo": [], "aggregate": {}})):
        (empty / "summary.json").write_text(content)
        with pytest.raises(SystemExit, match="not a lab summary"):
            lab_pooled.main([str(empty)])
    with pytest.raises(SystemExit, match="not a lab summary"):
        lab_pooled.main([str(tmp_path / "missing")])
