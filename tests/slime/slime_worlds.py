"""Spawn the multi-process test worlds once per session and hand their per-rank results to the tests.

Importing megatron costs seconds of CPU per process, so one launcher (``slime_worker.py``) imports it once and forks
four processes that serve all worlds in turn (:data:`PHASES`): world 4 as DP 2 x CP 2, then as PP 2 x CP 2 (the LR
scenarios only), as TP 2 x DP 2 and as TP 2 x CP 2 (the flagship's tensor parallelism: the advantage and correction
scenarios), world 2 as CP 2, world 1 as TP = PP = CP = 1, and the lab phase (megatron imported, no process group).
Each world meets through its own file store (``init_method="file://..."``) in the session's result directory, not a
TCP port: test sessions running side by side (``pytest -n``) cannot take each other's port. The launcher stops
everything when a process fails or at its deadline; the pytest process waits a little longer, then ends the
launcher's session (process group) itself.

The launcher runs with this checkout first on ``PYTHONPATH``, so it imports the code under test even where another
copy of ``mismatch_ctrl`` is installed; :meth:`Worlds.results` checks the file each rank imported, so every test that
reads a world's results asserts it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from slime_scenarios import SCENARIOS

WORKER = Path(__file__).resolve().parent / "slime_worker.py"
CHECKOUT = Path(__file__).resolve().parents[2]
"""The repository under test (its ``mismatch_ctrl`` package is what every process must import)."""
PIPELINE_SCENARIOS = ["lr/auto", "lr/manual"]
TENSOR_PARALLEL_SCENARIOS = [s for s in SCENARIOS if s.startswith(("advantages/", "correction/"))]


@dataclass(frozen=True)
class Phase:
    """One world (``size`` 0: no process group), the scenarios it runs and the processes (0..size-1) it uses."""

    name: str
    size: int
    cp: int = 1
    pp: int = 1
    tp: int = 1
    scenarios: tuple[str, ...] = tuple(SCENARIOS)


PHASES = [
    Phase("w4", 4, cp=2),
    Phase("w4pp", 4, cp=2, pp=2, scenarios=tuple(PIPELINE_SCENARIOS)),
    Phase("w4tp", 4, tp=2, scenarios=tuple(TENSOR_PARALLEL_SCENARIOS)),
    Phase("w4tpcp", 4, tp=2, cp=2, scenarios=tuple(TENSOR_PARALLEL_SCENARIOS)),
    Phase("w2", 2, cp=2),
    Phase("w1", 1),
    Phase("lab", 0),
]
"""In order; the lab phase runs on process 1, in parallel with world 1 on process 0."""
DEADLINE_SECONDS = 300.0
GRACE_SECONDS = 5.0


def phase_of(world: int | str) -> Phase:
    """``world`` as the tests name it: the world size (0: the lab phase) or a phase name."""
    name = world if isinstance(world, str) else (f"w{world}" if world else "lab")
    return next(p for p in PHASES if p.name == name)


class WorkerFailure(AssertionError):
    """A spawned rank failed, timed out or never produced the result a test asked for."""


def plan(out: Path) -> list[list[dict[str, Any]]]:
    """The phases of each process, each world meeting through its own file store under ``out`` (see the module
    docstring)."""
    processes: list[list[dict[str, Any]]] = [[] for _ in range(max(p.size for p in PHASES))]
    for phase in PHASES:
        path = out / f"{phase.name}.store"
        path.unlink(missing_ok=True)  # a store left by an earlier launch into ``out`` would not rendezvous afresh
        store = f"file://{path}" if phase.size else ""
        common = {"name": phase.name, "world": phase.size, "tp": phase.tp, "cp": phase.cp, "pp": phase.pp,
                  "store": store, "scenarios": [s for s in phase.scenarios if s != "bad_input_cp" or phase.cp > 1]}
        if phase.size == 0:
            processes[1].append(dict(common, rank=0))
        for rank in range(phase.size):
            processes[rank].append(dict(common, rank=rank))
    return processes


class Worlds:
    """The running (then finished) launcher and the result directory."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.log = out / "worlds.log"
        self.problem: str | None = None
        path = os.pathsep.join(p for p in (str(CHECKOUT), os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", PYTHONPATH=path)
        with open(self.log, "wb") as f:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), "--out", str(out), "--plan", json.dumps(plan(out)),
                 "--deadline", str(DEADLINE_SECONDS)],
                stdout=f, stderr=subprocess.STDOUT, env=env, cwd=WORKER.parent, start_new_session=True)

    def wait(self) -> None:
        """Wait for the launcher (its own deadline plus a margin); record what went wrong, if anything."""
        try:
            status = self.proc.wait(timeout=DEADLINE_SECONDS + 30.0)
        except subprocess.TimeoutExpired:
            self.problem = f"the launcher did not finish within {DEADLINE_SECONDS + 30.0:.0f} s"
            self.stop()
            return
        if status != 0:
            self.problem = f"the launcher exited with status {status}"

    def stop(self) -> None:
        """End the launcher and the processes it forked (its session's process group)."""
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def diagnosis(self) -> str:
        errors = sorted(self.out.rglob("*.err"), key=lambda e: e.stat().st_mtime)
        if errors:
            return "first failure (others may follow from it):\n" + "\n".join(e.read_text() for e in errors[:2])
        return "--- launcher log (tail) ---\n" + self.log.read_text(errors="replace")[-4000:]

    def results(self, world: int | str, scenario: str) -> list[dict[str, Any]]:
        """``{"view", "result"}`` of every rank of ``world`` (see :func:`phase_of`) for ``scenario``, in rank order."""
        phase = phase_of(world)
        paths = [self.out / phase.name / scenario / f"r{rank}.pt" for rank in range(phase.size or 1)]
        missing = [p for p in paths if not p.exists()]
        if missing:
            raise WorkerFailure(f"no result for {phase.name}/{scenario} ({missing[0].name} missing); "
                                f"{self.problem or 'the launcher finished'}\n{self.diagnosis()}")
        results = [torch.load(p, weights_only=False) for p in paths]
        for path, result in zip(paths, results):
            module = Path(result["module"]).resolve()
            assert module.is_relative_to(CHECKOUT), \
                f"{path}: the spawned process imported mismatch_ctrl from {module}, not from the checkout {CHECKOUT}"
        return results
