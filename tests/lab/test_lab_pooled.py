"""benchmarks/lab_pooled.py: paired differences against the reference of the same seed and engine, pooled over
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


def write(directory: Path, runs: list[tuple[str, str, int, float, bool]]) -> Path:
    directory.mkdir()
    rows = [{"label": f"{m}@{q}", "method": m, "quant": q, "replay": False, "seed": seed, "late_acc_engine": acc,
             "collapse_step": 5 if collapsed else None} for m, q, seed, acc, collapsed in runs]
    (directory / "summary.json").write_text(json.dumps({"runs": rows}))
    return directory


def test_pairs_by_seed_and_engine_and_pools(tmp_path, capsys):
    a = write(tmp_path / "a", [("grpo", "e5m2", 0, 0.5, False), ("grpo", "e5m2", 1, 0.4, True),
                               ("dc", "e5m2", 0, 0.6, False), ("dc", "e5m2", 1, 0.1, True),
                               ("dc", "e5m2", 7, 0.9, False),  # no GRPO run of seed 7: not paired
                               ("grpo", "none", 0, 0.9, False)])  # another engine: not GRPO at e5m2's reference
    b = write(tmp_path / "b", [("grpo", "e5m2", 3, 0.2, False), ("dc", "e5m2", 3, 0.35, True)])
    assert lab_pooled.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out.splitlines()
    pooled = next(line for line in out if " pooled " in line)
    diffs = [0.6 - 0.5, 0.1 - 0.4, 0.35 - 0.2]
    mean, sd = statistics.mean(diffs), statistics.stdev(diffs)
    half = 4.303 * sd / math.sqrt(3)  # Student's t, 2 degrees of freedom
    assert pooled.split()[0] == "dc@e5m2" and "n=3" in pooled and f"{mean:+.3f}" in pooled
    assert f"[{mean - half:+.3f}, {mean + half:+.3f}]" in pooled and "collapsed 2/3 (reference 1/3)" in pooled


def test_unpaired_and_unreadable_directories_are_clear_errors(tmp_path, capsys):
    only = write(tmp_path / "only", [("dc", "e5m2", 0, 0.6, False)])
    assert lab_pooled.main([str(only)]) == 2
    assert "no run is paired" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="not a lab summary"):
        lab_pooled.main([str(tmp_path / "missing")])
