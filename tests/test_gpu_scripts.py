"""The GPU scripts are ready for a short device lease: ``benchmarks/bench_gpu.py`` measures and reports every case,
``benchmarks/bench_fused.py`` times the hook's own correction fused, and ``benchmarks/gpu_check.py`` writes its
report, here on the CPU with the CUDA calls stood in for (the numbers are the CPU's; only the plumbing is under
test), so no lease is spent on a typo."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from mismatch_ctrl import compiled
from mismatch_ctrl.hostguard import HostGuard
from mismatch_ctrl.lab.sweeps.options import DEFAULT_METHODS
from mismatch_ctrl.lab.sweeps.run import run_lab
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.training.settings import LabSettings

sys.path[:0] = [str(Path(__file__).resolve().parents[1] / "benchmarks"), str(Path(__file__).resolve().parent / "lab")]
import bench_fused  # noqa: E402
import bench_gpu  # noqa: E402
import gpu_check  # noqa: E402
from sweep_helpers import TINY_WARMUP  # noqa: E402


def test_bench_gpu_measures_every_case_and_judges_the_targets(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_gpu, "on_gpu", lambda view: view)
    monkeypatch.setattr(compiled, "BACKEND", "aot_eager")  # the compiled cases trace their graph, fast

    def guarded_sites(call):
        with HostGuard() as guard:
            call()
        return [f"fetch {k}" for k in range(guard.syncs)]

    monkeypatch.setattr(bench_gpu, "sync_sites", guarded_sites)
    monkeypatch.setattr(bench_gpu, "CASES", [(hook, settings, (6, 20, 90), 3)
                                             for hook, settings, _, _ in bench_gpu.CASES])
    rows = bench_gpu.measure(repeats=2, seed=0)
    assert [(r["hook"], r["settings"]) for r in rows] == [(h, s) for h, s, _, _ in bench_gpu.CASES]
    for row in rows:
        assert row["syncs"] == row["syncs_other"] == bench_gpu.TARGETS[row["hook"]]["syncs"] and row["syncs_ok"]
        assert row["ms"] > 0 and row["pass_ms"] > 0 and row["ms_target"] is None  # far from the targets' sizes
        assert row["first_s"] > 0
    lines = bench_gpu.report(rows)
    assert len(lines) == 1 + len(rows) and all("syncs <= " in line and "pass" in line for line in lines[1:])
    rows[0].update(syncs=2, syncs_ok=False, sync_sites=["a.py:1 f", "b.py:2 g"], sync_sites_other=["a.py:1 f"])
    lines = bench_gpu.report(rows)
    assert "syncs <= 1 and constant: FAIL" in lines[1] and lines[1 + len(rows):] == [
        f"  sync, tis Geo-MIS @6: {site}" for site in ("a.py:1 f", "b.py:2 g")] + ["  sync, tis Geo-MIS @3: a.py:1 f"]


def test_the_fused_correction_is_the_hooks_with_rejections_and_vetoes():
    """bench_fused's floor is only a floor if it computes what the hook computes: the same ``pg_loss`` on
    slime-shaped input where each rule decides a sequence on its own: the band from above (0) and below (1), the veto
    alone (2: its -20 offset by other tokens, so its mean stays in the band), truncation at 2 (3: l = +1 and -1), the
    veto ignoring an untrained token (4), and the mean over trained tokens only (5: out of the band, in it if its
    untrained half counted)."""
    view = bench_fused.local_view(bench_fused.make_rollout(12, 120, 200, seed=3), list(range(12)))
    train, rollout = [t.clone() for t in view["log_probs"]], [t.clone() for t in view["rollout_log_probs"]]
    masks = [m.clone().float() for m in view["loss_masks"]]
    trained = [m.nonzero()[:, 0] for m in masks]
    rollout[0] -= 0.01  # geometric ratio exp(+0.01) > 1.001 (log-probs stay below 0)
    train[1] -= 0.01  # exp(-0.01) < 0.999
    train[2][trained[2][0]] -= 20.0  # rho = exp(-20) < 1e-4 ...
    rollout[2][trained[2][1:101]] -= 0.2  # ... and +0.2 on 100 others: the sum of l is unchanged
    rollout[3][trained[3][0]] -= 1.0  # rho = e > 2: truncated
    train[3][trained[3][1]] -= 1.0
    untrained = (masks[4] == 0).nonzero()[:, 0]
    masks[4][untrained[0] if len(untrained) else 0] = 0.0
    train[4][untrained[0] if len(untrained) else 0] -= 20.0  # below the veto, but not trained
    half = len(masks[5]) // 2
    masks[5][half:] = 0.0
    rollout[5][:half] -= 0.0016  # trained mean +0.0016 > log 1.001; over every token ~+0.0008, inside
    view.update(log_probs=train, rollout_log_probs=rollout, loss_masks=masks)
    args = bench_fused.make_args({"name": bench_fused.PRESET, "correction": {"preset": bench_fused.PRESET}})
    expected = bench_fused.tis_call(args, view)()[0].detach()
    pg_loss = torch.cat(view["log_probs"]).neg()
    inputs = bench_fused.flat_inputs(view, pg_loss)
    fused = bench_fused.fused_geo_rs_token_tis(*inputs)
    assert bench_fused.difference(expected, fused) <= bench_fused.TOLERANCE
    means = [float(((t - r) * m).sum() / m.sum()) for t, r, m in zip(train, rollout, masks)]
    assert abs(means[2]) < math.log(1.001) and abs(means[3]) < math.log(1.001)  # the band alone would keep them
    per_seq = [part.abs().sum() for part in fused.split(view["response_lengths"])]
    assert per_seq[0] == per_seq[1] == per_seq[2] == per_seq[5] == 0 and all(per_seq[i] > 0 for i in (3, 4, 6, 7))
    weights = fused.split(view["response_lengths"])[3] / pg_loss.split(view["response_lengths"])[3]
    assert weights[trained[3][0]] == pytest.approx(2.0)  # truncated at is_high


def test_a_fused_correction_that_differs_from_the_hook_is_not_timed(monkeypatch):
    monkeypatch.setattr(bench_fused, "fused_geo_rs_token_tis", lambda pg_loss, *rest: pg_loss.detach())
    with pytest.raises(SystemExit, match="differs from the hook's by"):
        bench_fused.case(6, 20, 90, 0, "cpu")


def test_bench_fused_times_every_variant(monkeypatch, capsys, tmp_path):
    """The plumbing on the CPU: ``torch.compile`` and the CUDA graph stood in for by the eager function."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench_fused, "on_gpu", lambda view: view)
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)
    monkeypatch.setattr(bench_fused, "graph_call", lambda fn, inputs: lambda: fn(*inputs))
    monkeypatch.setattr(bench_fused, "CASES", [(6, 20, 90), (3, 50, 60)])
    rows = bench_fused.measure(repeats=2, seed=0)
    assert [r["responses"] for r in rows] == [6, 3]
    for row in rows:
        assert row["max_difference"] <= bench_fused.TOLERANCE and row["compiled_max_difference"] == 0
        assert all(row[f"{name}_ms"] > 0 for name in ("hook", "eager", "compiled", "graph", "pass"))
    lines = bench_fused.report(rows)
    assert len(lines) == 3 and lines[1].split()[:2] == ["6", f"{rows[0]['tokens']:,d}"]
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H200")
    bench_gpu.on_cuda("bench_fused", lambda: rows, bench_fused.report, tmp_path / "fused.json")
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bench_fused  NVIDIA H200  torch ") and out[1:] == lines
    assert json.loads((tmp_path / "fused.json").read_text()) == {"device": "NVIDIA H200", "torch": torch.__version__,
                                                                 "rows": rows}


@pytest.mark.parametrize("rates, chosen, verdict", [
    ({"cpu": 25.7, "cuda": 31.3}, "cpu", "(cuda 1.22x); auto picks cpu: ok"),  # the H200's small moe at the demo load
    ({"cpu": 0.31, "cuda": 4.9}, "cuda", "(cuda 15.81x); auto picks cuda: ok"),
    ({"cpu": 2.0, "cuda": 3.0}, "cpu", "(cuda 1.50x); auto picks cpu: FAIL: the rule asks for cuda"),
    ({"cpu": 2.0, "cuda": 2.9}, "cuda", "(cuda 1.45x); auto picks cuda: FAIL: the rule asks for cpu"),
    ({"cpu": None, "cuda": 2.9}, "cuda", "auto picks cuda (not judged: a rate is missing)"),
])
def test_the_device_choice_is_judged_by_the_margin_cuda_must_win_by(rates, chosen, verdict):
    line = gpu_check.device_verdict("moe", rates, chosen)
    assert line.startswith(f"moe: cpu {rates['cpu']} / cuda {rates['cuda']} rollouts/s") and verdict in line


def test_gpu_check_report_names_every_step_and_the_device_choice():
    results = {"machine": {"torch": "2.x", "cuda_build": "13.0", "cuda": True, "python": "3.12", "gpu": "NVIDIA H200",
                           "memory_gib": 139.8, "gpus": 1, "megatron_core": False},
               "steps": {"CUDA tests": {"command": "pytest -m cuda", "returncode": 0, "seconds": 40.0,
                                        "timed_out": False, "tail": "22 passed"},
                         "lab moe on cuda": {"command": "lab", "returncode": None, "seconds": 38.0, "timed_out": True,
                                             "tail": "", "rollouts_per_s": 1.5}},
               "auto_device": ["moe: cpu 2.0 / cuda 1.5 rollouts/s (cuda 0.75x); auto picks cpu: ok"], "seconds": 300.0}
    text = gpu_check.report(results)
    assert text.startswith("# GPU check: NVIDIA H200")
    assert "## CUDA tests: ok (40 s)" in text and "## lab moe on cuda: timed out (38 s)" in text
    assert "rollouts/s: 1.5" in text and "auto picks cpu: ok" in text


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_the_gpu_scripts_say_when_there_is_no_gpu(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(tmp_path)])
    assert gpu_check.main() == 1
    monkeypatch.setattr(sys, "argv", ["bench_gpu.py"])
    bench_gpu.main()
    monkeypatch.setattr(sys, "argv", ["bench_fused.py"])
    bench_fused.main()
    out = capsys.readouterr().out
    assert "no CUDA GPU here" in out and out.count("no CUDA GPU") == 3
    assert "the fused correction equals the hook's on the CPU" in out


@pytest.mark.parametrize("script, argv, message", [
    (gpu_check, ["--steps", "2"], "argument --steps: expected an integer from 3 to 1000"),
    (gpu_check, ["--jobs", "0"], "argument --jobs: expected an integer from 1 to 64"),
    (gpu_check, ["--budget", "-5"], "argument --budget: expected an integer from 60 to 86400"),
    (bench_gpu, ["--repeats", "0"], "argument --repeats: expected an integer from 1 to 1000"),
    (bench_gpu, ["--json", "/nonexistent-dir/report.json"], "/nonexistent-dir is not a directory"),
    (bench_fused, ["--repeats", "0"], "argument --repeats: expected an integer from 1 to 1000"),
    (bench_fused, ["--json", "/nonexistent-dir/report.json"], "/nonexistent-dir is not a directory"),
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


@pytest.mark.parametrize("script", ["gpu_check.py", "bench_gpu.py", "bench_fused.py"])
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


@pytest.mark.parametrize("venv, system, chosen", [
    ("nocuda", "cuda", "system"),  # make demo's venv with a CPU build of torch, the machine's python3 with CUDA
    ("cuda", "cuda", "venv"),
    (None, "nocuda", "system"),  # a device machine: no venv
    ("nocuda", "nocuda", "venv"),  # no GPU anywhere: the venv's python says so
])
def test_make_gpu_check_runs_the_python_whose_torch_finds_cuda(tmp_path, venv, system, chosen):
    fakes = {}
    for name, cuda in (("venv", venv), ("system", system)):  # a python whose `-c` check exits 0 where it finds CUDA
        fakes[name] = tmp_path / name
        if cuda is not None:
            fakes[name].write_text(f"#!/bin/sh\nexit {0 if cuda == 'cuda' else 1}\n")
            fakes[name].chmod(0o755)
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(["make", "-n", "-s", "gpu-check", f"PY={fakes['venv']}", f"PYTHON={fakes['system']}"],
                          cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == str(fakes[chosen]) and "benchmarks/gpu_check.py" in done.stdout


def records(seconds: list[float]) -> str:
    """A ``metrics.jsonl`` whose ``seconds`` are the trainer's: time since the run started, at each rollout's end."""
    return "".join(json.dumps({"step": k, "reward": 0.5, "seconds": t}) + "\n" for k, t in enumerate(seconds))


def test_a_runs_rate_leaves_out_its_first_and_last_rollout_of_cumulative_seconds(tmp_path):
    """The trainer's ``seconds`` accumulate: rollout 0 (with the step-0 evaluation) ends at 5 s, rollouts 1-3 take
    0.5 s each, the last (with the final evaluation) 4 s: 3 rollouts in 1.5 s."""
    assert gpu_check.rollout_rate([{"seconds": t} for t in (5.0, 5.5, 6.0, 6.5, 10.5)]) == pytest.approx(2.0)
    assert gpu_check.rollout_rate([{"seconds": t} for t in (5.0, 9.0)]) is None
    assert gpu_check.rollout_rate([{"seconds": 1.0}, {"step": 1}, {"seconds": 3.0}]) is None
    for seed, times in ((40, [2.0, 3.0, 4.0, 9.0]), (41, [1.0, 1.25, 1.5, 2.0])):
        folder = tmp_path / "grpo@nvfp4" / f"seed{seed}"
        folder.mkdir(parents=True)
        (folder / "metrics.jsonl").write_text(records(times))
    (tmp_path / "grpo@none" / "seed40").mkdir(parents=True)
    (tmp_path / "grpo@none" / "seed40" / "metrics.jsonl").write_text("not json\n")
    assert gpu_check.run_rates(tmp_path) == [pytest.approx(1.0), pytest.approx(4.0)]


def test_the_warm_ups_are_read_from_the_labs_own_log(tmp_path, capsys):
    """The lines ``run_lab`` prints for a warm-up it trains and for one it finds cached."""
    settings = LabSettings(steps=2, prompts_per_step=4, samples_per_prompt=2, eval_every=1000, eval_prompts=8)
    for out in ("a", "b"):
        run_lab([RunSpec("grpo", "none")], settings, tmp_path / out, cache_dir=tmp_path / "cache", warmup=TINY_WARMUP,
                seeds=(40,))
    first, cached = gpu_check.warmups(capsys.readouterr().out)
    assert first.startswith(f"seed 40 (moe): {TINY_WARMUP.steps} steps, ") and "sample accuracy" in first
    assert cached.startswith("seed 40 (moe): cached, sample accuracy")


def test_a_step_past_its_time_is_stopped_with_the_processes_it_started(tmp_path):
    child = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(60)']); open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    start = time.perf_counter()
    step = gpu_check.run([sys.executable, "-c", script], 3, tmp_path / "log")
    assert step["timed_out"] and step["returncode"] is None and time.perf_counter() - start < 30
    pid = int(child.read_text())
    for _ in range(50):  # the killed grandchild is reaped by init within moments
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the step's own child process {pid} outlived the step")


def test_the_sweep_step_estimates_the_whole_preset_from_its_runs_rates(tmp_path, monkeypatch):
    """Two seeds of gpu-moe (6 runs, all at once under --jobs 8), each at 2 rollouts/s: the preset's 24 runs x 120
    rollouts with 8 at a time would train for 24 x 120 / (8 x 2) = 180 s."""
    def step(command, timeout, log):
        for run in ("grpo@none", "grpo@nvfp4", "grpo@nvfp4+r3"):
            for seed in (40, 41):
                folder = Path(command[command.index("--out") + 1]) / run / f"seed{seed}"
                folder.mkdir(parents=True)
                (folder / "metrics.jsonl").write_text(records([5.0, 5.5, 6.0, 9.0]))
        log.write_text("")
        return {"command": " ".join(command), "returncode": 0, "seconds": 1.0, "timed_out": False, "tail": ""}

    monkeypatch.setattr(gpu_check, "run", step)
    result = gpu_check.sweep(steps=4, jobs=8, out=tmp_path, timeout=60, log=tmp_path / "log")
    assert result["rollouts_per_s"] == 2.0
    assert result["preset"].startswith("6 runs, 6 at a time on the GPU: median 2.00 rollouts/s per run; the whole "
                                       "gpu-moe preset (24 runs x 120 rollouts, --jobs 8) would train for about 180 s")


def test_the_report_is_written_after_every_step_and_each_lab_step_starts_afresh(tmp_path, monkeypatch, capsys):
    """``main`` with the machine said to have CUDA and each step stood in for: a lab step writes its run as the lab
    does (cumulative seconds); a stale run from an earlier check is not read; the gpu-moe step dies mid-way, and the
    report written before it holds every earlier step and the device choice."""
    out = tmp_path / "check"
    stale = out / "moe-cuda" / "grpo@e4m3" / "seed40"
    stale.mkdir(parents=True)
    (stale / "metrics.jsonl").write_text(records([1.0, 1.1, 1.2, 2.0]))  # 10 rollouts/s, from a rerun's folder
    monkeypatch.setattr(gpu_check, "machine", lambda: {"torch": "2.x", "cuda_build": "13.0", "cuda": True,
                                                      "python": "3.12", "gpu": "NVIDIA H200", "megatron_core": False})
    calls = []

    def step(command, timeout, log):
        calls.append(command)
        log.write_text("warm-up step 120: sample accuracy 0.210\nwarm-up seed 40 (moe-large, 5300000 parameters): 9 s, "
                       "sample accuracy 0.21, greedy accuracy 0.30\n")
        if "--preset" in command:
            raise RuntimeError("the device went away")
        if "lab" in command:  # the demo's runs at once, each at 2 (CUDA) or 1 rollouts/s
            assert command[command.index("--methods") + 1] == DEFAULT_METHODS
            assert command[command.index("--jobs") + 1] == str(gpu_check.LAB_JOBS) == "6"
            cuda = command[command.index("--device") + 1] == "cuda"
            for run in ("grpo@none", "grpo@e4m3", "grpo@e4m3+r3", "dcgrpo@e4m3", "token_tis@e4m3", "geo_rs_e4m3@e4m3"):
                folder = Path(command[command.index("--out") + 1]) / run / "seed40"
                folder.mkdir(parents=True)
                (folder / "metrics.jsonl").write_text(records([5.0, 5.5, 6.0, 9.0] if cuda else [5.0, 6.0, 7.0, 9.0]))
        return {"command": " ".join(command), "returncode": 0, "seconds": 1.0, "timed_out": False,
                "tail": log.read_text()}

    monkeypatch.setattr(gpu_check, "run", step)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(out), "--steps", "4"])
    with pytest.raises(RuntimeError, match="the device went away"):
        gpu_check.main()
    text = (out / "gpu_check.md").read_text()
    assert "(not finished)" in text and "## hook benchmark: ok" in text and "## lab moe-large on cpu: ok" in text
    assert "rollouts/s: 12.0" in text and "rollouts/s: 6.0" in text and "rollouts/s: 10" not in text
    assert "- warm-up seed 40 (moe-large): 120 steps, 9 s, sample accuracy 0.21" in text
    assert "moe: cpu 6.0 / cuda 12.0 rollouts/s (cuda 2.00x); auto picks cpu: FAIL: the rule asks for cuda" in text
    assert [c[c.index("--steps") + 1] for c in calls if "lab" in c and "--preset" not in c] == ["4", "4", "4", "3"]
    printed = capsys.readouterr().out
    assert "gpu_check: lab moe on cuda: exit 0 in 1 s, 12.0 rollouts/s" in printed
