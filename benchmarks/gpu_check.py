"""The GPU check for a short device lease: one command, at most 8 minutes on one H100/H200, one report file.

Steps, each bounded in time, in this order (a step that fails or runs out of time is reported, the next runs):

1. the machine: GPU, memory, torch and CUDA versions, and whether megatron-core imports;
2. the CUDA tests (``pytest -m cuda``): every hook configuration on CUDA against the CPU and its host
   synchronisations counted by the CUDA runtime (tests/slime/test_slime_device.py), a few lab rollouts of every kind
   of run on CUDA (tests/lab/test_lab_cuda.py);
3. ``benchmarks/bench_gpu.py``: host syncs and ms per hook call against issue 22's targets;
4. lab throughput: rollouts per second of the small ``moe`` and the 5.3M-parameter ``moe-large`` policy on the CPU
   and on CUDA (``--steps`` rollouts of ``grpo@e4m3`` each, warm-up excluded), and whether ``--device auto``
   (``lab.training.settings.auto_device``) picks the faster device for each;
5. the ``moe-large`` warm-up (the ``gpu-moe`` preset's policy): steps to its accuracy target, and a short sweep of
   concurrent runs on the one GPU (``--jobs``) with its rollouts per second.

    python benchmarks/gpu_check.py --out runs/gpu-check     # writes runs/gpu-check/gpu_check.md and .json
    make gpu-check                                          # the same

Runs from the source tree (``PYTHONPATH`` is set for the children), without a virtual environment: the device
machine's ``python3`` has torch, numpy, matplotlib, PyYAML, pytest and hypothesis.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the source tree, where mismatch_ctrl is not installed (the device machine's python3)
    sys.path.insert(0, str(ROOT))

from mismatch_ctrl.lab.sweeps.options import positive_int  # noqa: E402
from mismatch_ctrl.lab.training.settings import auto_device  # noqa: E402
CUDA_TESTS = ["tests/slime/test_slime_device.py", "tests/lab/test_lab_cuda.py"]
BUDGET_S = 480


def run(command: list[str], timeout: float, log: Path) -> dict[str, Any]:
    """``command`` in the repository root with the source tree importable; its output goes to ``log``."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHONUNBUFFERED": "1"}
    start = time.perf_counter()
    with log.open("w") as out:
        try:
            code = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                  timeout=max(timeout, 1)).returncode
        except subprocess.TimeoutExpired:
            code = None
    text = log.read_text(errors="replace")
    return {"command": " ".join(command), "returncode": code, "seconds": round(time.perf_counter() - start, 1),
            "timed_out": code is None, "tail": text[-3000:]}


def machine() -> dict[str, Any]:
    """The GPU, the versions, and whether megatron-core imports (the multi-process tests need it)."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
                            "cuda": torch.cuda.is_available(), "python": sys.version.split()[0]}
    if info["cuda"]:
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, memory_gib=round(props.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    try:
        import megatron.core  # noqa: F401
        info["megatron_core"] = True
    except ImportError:
        info["megatron_core"] = False
    return info


def throughput(policy: str, device: str, steps: int, out: Path, timeout: float, log: Path) -> dict[str, Any]:
    """Seconds per rollout of one ``grpo@e4m3`` lab run (warm-up excluded: the metrics' own per-rollout times)."""
    folder = out / f"{policy}-{device}"
    result = run([sys.executable, "-m", "mismatch_ctrl", "lab", "--out", str(folder), "--policy", policy,
                  "--device", device, "--methods", "grpo", "--quant", "e4m3", "--steps", str(steps),
                  "--seeds", "40", "--eval-every", "1000", "--cache-dir", str(out / "cache")], timeout, log)
    metrics = folder / "grpo@e4m3" / "seed40" / "metrics.jsonl"
    if metrics.exists():
        rows = [json.loads(line) for line in metrics.read_text().splitlines()]
        seconds = [row["seconds"] for row in rows[1:] if isinstance(row.get("seconds"), (int, float))]
        if seconds:
            result["rollouts_per_s"] = round(len(seconds) / sum(seconds), 2)
    return result


def report(results: dict[str, Any]) -> str:
    """The report file: the machine, then each step's status, time, command and output tail."""
    m = results["machine"]
    lines = [f"# GPU check: {m.get('gpu', 'no GPU')}", "",
             f"torch {m['torch']} (CUDA {m['cuda_build']}), Python {m['python']}, {m.get('gpus', 0)} GPU(s), "
             f"{m.get('memory_gib', 0)} GiB; megatron-core {'present' if m['megatron_core'] else 'absent'}; "
             f"{results['seconds']:.0f} s in all.", ""]
    for name, step in results["steps"].items():
        status = "timed out" if step.get("timed_out") else ("ok" if step.get("returncode") == 0 else
                                                             f"exit {step.get('returncode')}")
        lines += [f"## {name}: {status} ({step.get('seconds', 0):.0f} s)", "", f"`{step.get('command', '')}`", ""]
        if "rollouts_per_s" in step:
            lines += [f"rollouts/s: {step['rollouts_per_s']}", ""]
        lines += ["```", step.get("tail", "").strip()[-2500:], "```", ""]
    if results.get("auto_device"):
        lines += ["## --device auto", ""] + [f"- {line}" for line in results["auto_device"]] + [""]
    return "\n".join(lines)


def main() -> int:
    summary, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=summary, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "gpu-check", help="report folder")
    parser.add_argument("--budget", type=positive_int, default=BUDGET_S, help=f"seconds in all (default {BUDGET_S})")
    parser.add_argument("--steps", type=positive_int, default=12,
                        help="rollouts per throughput run, at least 2: the first (compile, caches) is not timed "
                             "(default 12)")
    parser.add_argument("--jobs", type=positive_int, default=4,
                        help="concurrent lab runs on the GPU in step 5 (default 4)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps: at least 2 (the first rollout is not timed)")
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        parser.error(f"--out {args.out}: {exc.strerror or exc}")
    start = time.perf_counter()

    def left(share: float) -> float:
        """Seconds for the next step: ``share`` of the budget, never beyond what is left."""
        return min(share * args.budget, args.budget - (time.perf_counter() - start))

    results: dict[str, Any] = {"machine": machine(), "steps": {}}
    steps = results["steps"]
    if not results["machine"]["cuda"]:
        print("gpu_check: torch finds no CUDA GPU here; nothing to check (run it on a GPU machine)")
        return 1
    steps["CUDA tests"] = run([sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
                               *CUDA_TESTS], left(0.35), args.out / "tests.log")
    steps["hook benchmark"] = run([sys.executable, "benchmarks/bench_gpu.py", "--json",
                                   str(args.out / "bench_gpu.json")], left(0.15), args.out / "bench_gpu.log")
    picks = []
    for policy in ("moe", "moe-large"):
        rates = {}
        for device in ("cuda", "cpu"):  # CUDA first: its warm-up is cached for the CPU run
            steps[f"lab {policy} on {device}"] = step = throughput(
                policy, device, args.steps if policy == "moe" or device == "cuda" else 3, args.out,
                left(0.08), args.out / f"lab-{policy}-{device}.log")
            rates[device] = step.get("rollouts_per_s")
        chosen = auto_device(policy, "add")
        faster = max(rates, key=lambda d: rates[d] or 0.0) if all(rates.values()) else None
        verdict = "" if faster is None else " (the faster)" if chosen == faster else f" (FAIL: {faster} is faster)"
        picks.append(f"{policy}: cpu {rates['cpu']} / cuda {rates['cuda']} rollouts/s; auto picks {chosen}{verdict}")
    results["auto_device"] = picks
    steps["gpu-moe sweep"] = run([sys.executable, "-m", "mismatch_ctrl", "lab", "--preset", "gpu-moe", "--out",
                                  str(args.out / "gpu-moe"), "--steps", str(args.steps), "--seeds", "40,41",
                                  "--jobs", str(args.jobs), "--cache-dir", str(args.out / "cache")],
                                 left(1.0), args.out / "gpu-moe.log")
    results["seconds"] = time.perf_counter() - start
    (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1))
    (args.out / "gpu_check.md").write_text(report(results))
    print(f"report: {args.out / 'gpu_check.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
