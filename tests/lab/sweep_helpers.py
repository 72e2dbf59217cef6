"""Tiny lab sweeps for the sweep tests: a warm-up of a few steps, rollouts of 4 prompts x 4 samples, and the real
``mismatch-ctrl lab`` command line with that warm-up (in this process or in a subprocess)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from mismatch_ctrl.lab.model.warmup import WarmupConfig

TINY_WARMUP = WarmupConfig(d_model=32, n_layers=1, d_ff=16, steps=3, max_steps=3, batch_size=16,
                           min_sample_accuracy=0.0, eval_prompts=8, eval_samples=1)
TINY_FLAGS = ["--prompts", "4", "--samples", "4", "--eval-every", "1000"]
ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import signal
import sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C as in a terminal, even if this test runs where
# SIGINT is ignored and inherited (a test suite started in the background by a non-interactive shell)
from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import run
sys.path.insert(0, {tests!r})
from sweep_helpers import TINY_WARMUP
run.warmup_preset = lambda task, policy: TINY_WARMUP
sys.exit(cli.main(sys.argv[1:]))
"""


def lab_command(out: Path, cache: Path, *args: str) -> list[str]:
    """The arguments of ``mismatch-ctrl lab`` (without the program) for a tiny sweep into ``out``."""
    return ["lab", "--out", str(out), "--cache-dir", str(cache), *TINY_FLAGS, *args]


def start_lab(out: Path, cache: Path, *args: str) -> subprocess.Popen:
    """``mismatch-ctrl lab`` with the tiny warm-up in a subprocess (its own process, for signals and the lock)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", SCRIPT.format(tests=str(Path(__file__).parent)),
                             *lab_command(out, cache, *args)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def killed_by_the_system(task, sink):
    """A ``LocalExecutor`` target whose worker process dies as an out-of-memory kill leaves it: SIGKILL, no result
    (the second task of a sweep; the first trains nothing and returns an empty run)."""
    import signal

    sink.put(("start", task.key, os.getpid()))
    if task.settings.seed == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return {"label": task.key[0]}, {}


def sleeps(task, sink):
    """A ``LocalExecutor`` target that reports its worker's pid and then trains for ten minutes (sleeps)."""
    import time

    sink.put(("start", task.key, os.getpid()))
    time.sleep(600)
    return {"label": task.key[0]}, {}


EXECUTOR_SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from mismatch_ctrl.lab.sweeps.executors import LocalExecutor
from mismatch_ctrl.lab.sweeps.sweep import RunTask
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.training.settings import LabSettings
from sweep_helpers import sleeps
def event(item):
    if item[0] == "start":
        print(item[2], flush=True)
tasks = [RunTask(RunSpec("grpo", "e4m3"), LabSettings(seed=seed), b"") for seed in (0, 1)]
try:
    LocalExecutor(2, target=sleeps).run(tasks, event, lambda task, out: None)
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def start_sleeping_sweep() -> subprocess.Popen:
    """A parallel sweep of two sleeping runs in a subprocess; it prints each worker's pid as the worker starts."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-c", EXECUTOR_SCRIPT.format(tests=str(Path(__file__).parent))],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def read_lines(stream, count: int, timeout: float) -> list[str]:
    """``count`` lines of ``stream``, or fewer if it ends or a line takes more than ``timeout`` seconds (a daemon
    thread reads, so a silent stream cannot hang the test)."""
    import queue
    import threading

    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(stream.readline()) for _ in range(count)], daemon=True).start()
    out = []
    for _ in range(count):
        try:
            line = lines.get(timeout=timeout)
        except queue.Empty:
            break
        if not line:
            break
        out.append(line)
    return out


def gone(pid: int, within: float) -> bool:
    """Whether process ``pid`` ends (or is a zombie: ended, not yet reaped) within ``within`` seconds."""
    import time

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except FileNotFoundError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.1)
    return False


def tiny_sweep(out: Path, runs: list, settings, seeds: tuple[int, ...] = (0,)):
    """A finished sweep into ``out`` with the tiny warm-up (cached in ``out.parent / "cache"``), also where the lab
    asks for its preset warm-up; its ``LabResult``."""
    from mismatch_ctrl.lab.sweeps import run as lab_run

    original = lab_run.warmup_preset
    lab_run.warmup_preset = lambda task, policy: TINY_WARMUP
    try:
        return lab_run.run_lab(runs, settings, out, cache_dir=out.parent / "cache", show_progress=False,
                               warmup=TINY_WARMUP, seeds=seeds)
    finally:
        lab_run.warmup_preset = original


def copied_sweep(trained: Path, tmp_path: Path) -> Path:
    """A copy of the sweep ``trained`` and its warm-up cache under ``tmp_path`` (``tmp_path / "out"``), to damage."""
    import shutil

    shutil.copytree(trained, tmp_path / "out")
    shutil.copytree(trained.parent / "cache", tmp_path / "cache")
    return tmp_path / "out"
