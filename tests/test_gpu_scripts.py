"""The GPU scripts are ready for a short device lease: ``benchmarks/bench_gpu.py`` measures and reports every case
and ``benchmarks/gpu_check.py`` writes its report, here on the CPU with the CUDA calls stood in for (the numbers
are the CPU's; only the plumbing is under test), so no lease is spent on a typo."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mismatch_ctrl.hostguard import HostGuard

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_gpu  # noqa: E402
import gpu_check  # noqa: E402


def test_bench_gpu_measures_every_case_and_judges_the_targets(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_gpu, "on_gpu", lambda view: view)

    def guarded_syncs(call):
        with HostGuard() as guard:
            call()
        return guard.syncs

    monkeypatch.setattr(bench_gpu, "syncs", guarded_syncs)
    monkeypatch.setattr(bench_gpu, "CASES", [(hook, settings, (6, 20, 90), 3)
                                             for hook, settings, _, _ in bench_gpu.CASES])
    rows = bench_gpu.measure(repeats=2, seed=0)
    assert [(r["hook"], r["settings"]) for r in rows] == [(h, s) for h, s, _, _ in bench_gpu.CASES]
    for row in rows:
        assert row["syncs"] == row["syncs_other"] == bench_gpu.TARGETS[row["hook"]]["syncs"] and row["syncs_ok"]
        assert row["ms"] > 0 and row["pass_ms"] > 0 and row["ms_target"] is None  # far from the targets' sizes
    lines = bench_gpu.report(rows)
    assert len(lines) == 1 + len(rows) and all("syncs <= " in line and "pass" in line for line in lines[1:])


def test_gpu_check_report_names_every_step_and_the_device_choice():
    results = {"machine": {"torch": "2.x", "cuda_build": "13.0", "cuda": True, "python": "3.12", "gpu": "NVIDIA H200",
                           "memory_gib": 139.8, "gpus": 1, "megatron_core": False},
               "steps": {"CUDA tests": {"command": "pytest -m cuda", "returncode": 0, "seconds": 40.0,
                                        "timed_out": False, "tail": "22 passed"},
                         "lab moe on cuda": {"command": "lab", "returncode": None, "seconds": 38.0, "timed_out": True,
                                             "tail": "", "rollouts_per_s": 1.5}},
               "auto_device": ["moe: cpu 2.0 / cuda 1.5 rollouts/s; auto picks cpu (the faster)"], "seconds": 300.0}
    text = gpu_check.report(results)
    assert text.startswith("# GPU check: NVIDIA H200")
    assert "## CUDA tests: ok (40 s)" in text and "## lab moe on cuda: timed out (38 s)" in text
    assert "rollouts/s: 1.5" in text and "auto picks cpu (the faster)" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_the_gpu_scripts_say_when_there_is_no_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path)])
    assert gpu_check.main() == 1
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py"])
    bench_gpu.main()
    out = capsys.readouterr().out
    assert "no CUDA GPU here" in out and out.count("no CUDA GPU") == 2


@pytest.mark.parametrize("script, argv, message", [
    (gpu_check, ["--steps", "1"], "--steps: at least 2"),
    (gpu_check, ["--jobs", "0"], "argument --jobs: must be an integer >= 1"),
    (gpu_check, ["--budget", "-5"], "argument --budget: must be an integer >= 1"),
    (bench_gpu, ["--repeats", "0"], "argument --repeats: must be an integer >= 1"),
    (bench_gpu, ["--json", "/nonexistent-dir/report.json"], "/nonexistent-dir is not a directory"),
])
def test_bad_options_are_refused_before_any_work(script, argv, message, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", [f"{script.__name__}.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        script.main()
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


DEVICE_MACHINE = '''"""Python started as on the device machine: mismatch_ctrl not installed, no megatron-core."""
import os
import sys

ROOT = os.environ["EMULATED_SOURCE_TREE"]
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != ROOT]


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        package = name.split(".")[0]
        if package == "megatron":
            raise ImportError("no megatron-core on the device machine")
        if package == "mismatch_ctrl" and ROOT not in (os.path.realpath(p or ".") for p in sys.path):
            raise ImportError("mismatch_ctrl is not installed on the device machine")
        return None


sys.meta_path.insert(0, NotInstalled())
'''


@pytest.mark.parametrize("script", ["gpu_check.py", "bench_gpu.py"])
def test_the_gpu_scripts_run_from_the_source_tree_without_an_install(script, tmp_path):
    """``make gpu-check`` on the device machine runs ``python3 benchmarks/gpu_check.py`` from the repository root
    with a python that has torch but not this package (nor megatron-core): the scripts find the source tree
    themselves. Checked with ``--help`` under a ``sitecustomize`` that hides every installed copy of the package."""
    root = Path(__file__).resolve().parents[1]
    (tmp_path / "sitecustomize.py").write_text(DEVICE_MACHINE)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tmp_path), EMULATED_SOURCE_TREE=str(root.resolve()))
    hidden = subprocess.run([sys.executable, "-c", "import mismatch_ctrl"], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert hidden.returncode != 0 and "not installed" in hidden.stderr  # the emulation hides the package
    done = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage:" in done.stdout
