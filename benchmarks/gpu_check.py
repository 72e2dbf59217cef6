"""The GPU check for a short turn on a GPU machine: one command, at most 8 minutes on one H100/H200, one report file.

Steps, each bounded in time, in this order (a step that fails or runs out of time is reported, the next runs):

1. the machine: GPU, memory, torch and CUDA versions, and whether megatron-core imports;
2. the CUDA tests (``pytest -m cuda``): every hook configuration on CUDA against the CPU and its host
   synchronisations counted by the CUDA runtime (tests/slime/test_slime_device.py), the compiled TIS hook
   (``torch_compile: true``) the same way (tests/slime/test_slime_compiled.py), a few lab rollouts of every kind of
   run on CUDA (tests/lab/test_lab_cuda.py);
3. ``benchmarks/bench_gpu.py``: host syncs and ms per hook call against the hooks' targets; then
   ``benchmarks/bench_fused.py``: the least a fused correction costs (eager, compiled, CUDA graph) next to the hook;
4. lab throughput: rollouts per second of the demo's six runs at once (``grpo@none``, ``grpo``, ``grpo+r3``,
   ``dcgrpo``, ``token_tis``, ``geo_rs_e4m3``; one seed) of the small ``moe`` and of the 5.3M-parameter
   ``moe-large`` policy on CUDA and on the CPU, summed over the runs (``--steps`` rollouts each on CUDA; the first
   rollout, with the step-0 evaluation, and the last, with the final one, are not timed), and whether ``--device
   auto`` (``lab.training.settings.auto_device``) follows its rule at that load: CUDA where it is at least
   ``AUTO_CUDA_MARGIN`` times as fast as the CPU;
5. the ``gpu-moe`` preset on two seeds with ``--jobs`` concurrent runs on the one GPU: each run's rollouts per second
   while sharing it, the time the whole preset would take, and the ``moe-large`` warm-ups (steps to the accuracy
   target, seconds).

    python3 benchmarks/gpu_check.py --out runs/gpu-check    # writes runs/gpu-check/gpu_check.md and .json
    make gpu-check                                          # the same

The report is rewritten after every step (and a line printed), so a run cut short keeps what it measured. Each lab
step starts from an empty folder (the warm-up cache, ``OUT/cache``, is kept): a rerun measures again. A step that
runs out of time is stopped with every process it started (the lab's workers hold the GPU). Runs from the source
tree (``PYTHONPATH`` is set for the children), without a virtual environment: the device machine's ``python3`` has
torch, numpy, matplotlib, PyYAML, pytest and hypothesis. To copy the results off a machine, the small files are
``runs/gpu-check/*.md``, ``*.json`` and ``*.log`` (the folder also holds warm-up caches of ~20 MB per ``moe-large``
seed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the source tree, where mismatch_ctrl is not installed (the device machine's python3)
    sys.path.insert(0, str(ROOT))

from bench_options import bounded_int  # noqa: E402 (benchmarks/)
from mismatch_ctrl.lab.sweeps.options import DEFAULT_METHODS, LAB_PRESETS  # noqa: E402
from mismatch_ctrl.lab.training.settings import AUTO_CUDA_MARGIN, auto_device  # noqa: E402

CUDA_TESTS = ["tests/slime/test_slime_device.py", "tests/slime/test_slime_compiled.py", "tests/lab/test_lab_cuda.py"]
BUDGET_S = 480
SHARES = {"CUDA tests": 0.2, "hook benchmark": 0.16, "fused floor": 0.06, "moe on cuda": 0.12, "moe on cpu": 0.1,
          "moe-large on cuda": 0.15, "moe-large on cpu": 0.12}
"""Each step's most of the budget (the ``moe-large`` runs on CUDA include the warm-up, cached for the later steps);
the ``gpu-moe`` sweep gets what is left. On an H200 (2026-11-27, the demo's six runs at once in every lab step) the
steps took 22, 5, 31, 24, 34 and 38 s and the sweep 42 s (``moe-large`` then ran at lr 1e-3 and collapsed; it
runs at 1e-4 now); ``bench_fused.py`` took under 25 s on another H200, its compile included. Each share is at least
1.4x that, and what a step leaves goes to the sweep. Not yet measured on a GPU: the compiled hook's first calls
(``torch_compile: true``), one in the CUDA tests and one in the hook benchmark, each compiling its graph with
Triton (tens of seconds expected); the CUDA tests' and the hook benchmark's shares leave room for them."""
CPU_LARGE_STEPS = 3
"""Rollouts of each ``moe-large`` run on the CPU (one thread each): one is timed."""
LAB_JOBS = len(DEFAULT_METHODS.split(","))
"""Runs at once in the throughput steps: the demo's methods, as ``make demo`` runs them (on the CPU one process per
core, on the GPU all sharing it), so that ``--device auto`` is judged at the lab's own load."""


def run(command: list[str], timeout: float, log: Path) -> dict[str, Any]:
    """``command`` in the repository root with the source tree importable; its output goes to ``log``. Past
    ``timeout`` seconds its whole process group is killed (a lab sweep's worker processes too)."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    text = log.read_text(errors="replace")
    return {"command": " ".join(command), "returncode": code, "seconds": round(time.perf_counter() - start, 1),
            "timed_out": code is None, "tail": text[-3000:]}


def machine() -> dict[str, Any]:
    """The GPU, the versions, and whether megatron-core imports (the multi-process tests need it)."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                            "cuda": torch.cuda.is_available(), "python": sys.version.split()[0]}
    if not info["cuda"]:  # nothing to check: no megatron import, whose warnings would bury the one line that says so
        return info
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    try:
        import megatron.core  # noqa: F401
        info["megatron_core"] = True
    except ImportError:
        info["megatron_core"] = False
    return info


def rollout_rate(records: list[dict[str, Any]]) -> float | None:
    """Rollouts per second of one run from its ``metrics.jsonl`` records, whose ``seconds`` is the time since the run
    started at the end of each rollout: rollouts 1 to n-2, without the first (the step-0 evaluation, first-call
    costs) and the last (the final evaluation); None with fewer than 3 rollouts."""
    times = [record.get("seconds") for record in records]
    if len(times) < 3 or not all(isinstance(t, (int, float)) for t in times) or times[-2] <= times[0]:
        return None
    return (len(times) - 2) / (times[-2] - times[0])


def run_rates(folder: Path) -> list[float]:
    """The :func:`rollout_rate` of every finished run under a lab output folder (runs without one left out)."""
    rates = []
    for path in sorted(folder.glob("*/seed*/metrics.jsonl")):
        try:
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        except (OSError, ValueError):
            continue
        rate = rollout_rate(records) if all(isinstance(r, dict) for r in records) else None
        if rate is not None:
            rates.append(rate)
    return rates


WARMUP_LINE = re.compile(r"^warm-up seed (\d+) \((\S+), (\d+) parameters\): (.*)$")
STEP_LINE = re.compile(r"^warm-up step (\d+):")


def warmups(log: str) -> list[str]:
    """``seed S (policy): N steps, <time and accuracies>`` for each warm-up a lab log reports (its last ``warm-up
    step`` line before it; a cached warm-up has none)."""
    out, steps = [], None
    for line in log.splitlines():
        if match := STEP_LINE.match(line):
            steps = match.group(1)
        elif match := WARMUP_LINE.match(line):
            seed, policy, _, rest = match.groups()
            out.append(f"seed {seed} ({policy}): " + (f"{steps} steps, " if steps else "") + rest)
            steps = None
    return out


def fresh(folder: Path) -> Path:
    """``folder`` emptied (a rerun measures again instead of finding its runs finished)."""
    shutil.rmtree(folder, ignore_errors=True)
    return folder


def throughput(policy: str, device: str, steps: int, out: Path, timeout: float, log: Path) -> dict[str, Any]:
    """The demo's :data:`LAB_JOBS` runs of ``policy`` on ``device`` at once (one seed): the sum of their
    :func:`rollout_rate` values, the lab's rollouts per second at the load ``make demo`` puts on it; none unless
    every run finished."""
    folder = fresh(out / f"{policy}-{device}")
    result = run([sys.executable, "-m", "mismatch_ctrl", "lab", "--out", str(folder), "--policy", policy,
                  "--device", device, "--methods", DEFAULT_METHODS, "--quant", "e4m3", "--steps", str(steps),
                  "--seeds", "40", "--jobs", str(LAB_JOBS), "--eval-every", "1000", "--cache-dir", str(out / "cache")],
                 timeout, log)
    rates = run_rates(folder)
    if len(rates) == LAB_JOBS:
        result["rollouts_per_s"] = round(sum(rates), 2)
    result["warmups"] = warmups(log.read_text(errors="replace"))
    return result


def sweep(steps: int, jobs: int, out: Path, timeout: float, log: Path) -> dict[str, Any]:
    """The ``gpu-moe`` preset on seeds 40 and 41 with ``jobs`` concurrent runs: the median rate of its runs while
    they share the GPU, and what the whole preset would take at that rate."""
    folder = fresh(out / "gpu-moe")
    result = run([sys.executable, "-m", "mismatch_ctrl", "lab", "--preset", "gpu-moe", "--out", str(folder),
                  "--steps", str(steps), "--seeds", "40,41", "--jobs", str(jobs), "--device", "cuda",
                  "--cache-dir", str(out / "cache")], timeout, log)
    result["warmups"] = warmups(log.read_text(errors="replace"))
    rates = run_rates(folder)
    if rates:
        rate = statistics.median(rates)
        preset = LAB_PRESETS["gpu-moe"]
        runs = len(preset["methods"].split(",")) * len(preset["seeds"])
        result["rollouts_per_s"] = round(rate, 2)
        at_once = min(jobs, len(rates))
        result["preset"] = (f"{len(rates)} runs, {at_once} at a time on the GPU: median {rate:.2f} rollouts/s per "
                            f"run; the whole gpu-moe preset ({runs} runs x {preset['steps']} rollouts, --jobs {jobs}) "
                            f"would train for about {runs * preset['steps'] / (jobs * rate):.0f} s after its "
                            f"{len(preset['seeds'])} warm-ups (at that rate; more runs at once share the GPU further)")
    return result


def device_verdict(policy: str, rates: dict[str, float | None], chosen: str) -> str:
    """Whether ``--device auto``'s pick ``chosen`` for ``policy`` follows its rule on the measured ``rates``: CUDA
    where it is at least :data:`AUTO_CUDA_MARGIN` times as fast as the CPU, else the CPU."""
    line = f"{policy}: cpu {rates['cpu']} / cuda {rates['cuda']} rollouts/s"
    if not (rates["cpu"] and rates["cuda"]):
        return f"{line}; auto picks {chosen} (not judged: a rate is missing)"
    ratio = rates["cuda"] / rates["cpu"]
    due = "cuda" if ratio >= AUTO_CUDA_MARGIN else "cpu"
    verdict = "ok" if chosen == due else f"FAIL: the rule asks for {due}"
    return (f"{line} (cuda {ratio:.2f}x); auto picks {chosen}: {verdict} (cuda where at least {AUTO_CUDA_MARGIN:g}x "
            "as fast)")


def report(results: dict[str, Any]) -> str:
    """The report file: the machine, then each step's status, time, command, numbers and output tail."""
    m = results["machine"]
    lines = [f"# GPU check: {m.get('gpu', 'no GPU')}", "",
             f"torch {m['torch']} (CUDA {m['cuda_build']}), Python {m['python']}, {m.get('gpus', 0)} GPU(s), "
             f"{m.get('memory_gib', 0)} GiB; megatron-core {'present' if m['megatron_core'] else 'absent'}; "
             f"{results['seconds']:.0f} s in all" + ("" if results.get("finished") else " (not finished)") + ".", ""]
    for name, step in results["steps"].items():
        status = "timed out" if step.get("timed_out") else ("ok" if step.get("returncode") == 0 else
                                                             f"exit {step.get('returncode')}")
        lines += [f"## {name}: {status} ({step.get('seconds', 0):.0f} s)", "", f"`{step.get('command', '')}`", ""]
        if "rollouts_per_s" in step:
            lines += [f"rollouts/s: {step['rollouts_per_s']}", ""]
        if step.get("preset"):
            lines += [step["preset"], ""]
        lines += [f"- warm-up {line}" for line in step.get("warmups", [])] + ([""] if step.get("warmups") else [])
        lines += ["```", step.get("tail", "").strip()[-2500:], "```", ""]
    if results.get("auto_device"):
        lines += ["## --device auto", ""] + [f"- {line}" for line in results["auto_device"]] + [""]
    return "\n".join(lines)


def main() -> int:
    summary, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=summary, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check", help="report folder")
    parser.add_argument("--budget", type=bounded_int(60, 86400, "seconds: a device lease is minutes, a day at most"),
                        default=BUDGET_S, help=f"seconds in all (default {BUDGET_S})")
    parser.add_argument("--steps", type=bounded_int(3, 1000, "rollouts per run"), default=12,
                        help="rollouts per run on CUDA, at least 3: the first (step-0 evaluation, caches) and the "
                             "last (final evaluation) are not timed (default 12)")
    parser.add_argument("--jobs", type=bounded_int(1, 64, "lab runs sharing one GPU"), default=8,
                        help="concurrent lab runs on the GPU in step 5, as the docs run the gpu-moe preset (default 8)")
    args = parser.parse_args()
    args.out = args.out.resolve()
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out {args.out}: {exc.strerror or exc}")
    start = time.perf_counter()

    def left(share: float) -> float:
        """Seconds for the next step: ``share`` of the budget, never beyond what is left."""
        return min(share * args.budget, args.budget - (time.perf_counter() - start))

    results: dict[str, Any] = {"machine": machine(), "steps": {}, "finished": False}
    steps = results["steps"]

    def save(name: str) -> None:
        """The report as it stands, and one line for the step just done."""
        results["seconds"] = time.perf_counter() - start
        (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1))
        (args.out / "gpu_check.md").write_text(report(results))
        step = steps.get(name, {})
        status = "timed out" if step.get("timed_out") else f"exit {step.get('returncode')}"
        rate = f", {step['rollouts_per_s']} rollouts/s" if "rollouts_per_s" in step else ""
        print(f"gpu_check: {name}: {status} in {step.get('seconds', 0):.0f} s{rate}", flush=True)

    if not results["machine"]["cuda"]:
        print("gpu_check: torch finds no CUDA GPU here; nothing to check (run it on a GPU machine)")
        return 1
    steps["CUDA tests"] = run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                               *CUDA_TESTS], left(SHARES["CUDA tests"]), args.out / "tests.log")
    save("CUDA tests")
    steps["hook benchmark"] = run([sys.executable, "benchmarks/bench_gpu.py", "--json",
                                   str(args.out / "bench_gpu.json")], left(SHARES["hook benchmark"]),
                                  args.out / "bench_gpu.log")
    save("hook benchmark")
    steps["fused floor"] = run([sys.executable, "benchmarks/bench_fused.py", "--json",
                                str(args.out / "bench_fused.json")], left(SHARES["fused floor"]),
                               args.out / "bench_fused.log")
    save("fused floor")
    picks = []
    for policy in ("moe", "moe-large"):
        rates = {}
        for device in ("cuda", "cpu"):  # CUDA first: its warm-up is cached for the CPU run
            name = f"lab {policy} on {device}"
            steps[name] = step = throughput(
                policy, device, CPU_LARGE_STEPS if (policy, device) == ("moe-large", "cpu") else args.steps,
                args.out, left(SHARES[f"{policy} on {device}"]), args.out / f"lab-{policy}-{device}.log")
            rates[device] = step.get("rollouts_per_s")
            save(name)
        picks.append(device_verdict(policy, rates, auto_device(policy, "add")))
        results["auto_device"] = picks
    steps["gpu-moe sweep"] = sweep(args.steps, args.jobs, args.out, left(1.0), args.out / "gpu-moe.log")
    results["finished"] = True
    save("gpu-moe sweep")
    print(f"report: {args.out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
