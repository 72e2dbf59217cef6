"""What the warm-ups of a seed list will cost, known before the first one starts.

Each seed has its own warm-up (cached on disk once trained), and the warmed-up policy of every seed with runs to train
is held in memory until the runs are handed out. Time per warm-up step grows with the policy's parameters, the batch
and the sequence length (prompt + longest answer); ``SECONDS_PER_UNIT`` is that product's cost on one thread of this
project's faster reference CPU (the ``add`` preset on the MoE policy: ~10 s for ~200 steps), a rough figure that the
``reverse`` preset meets within ~20% (~1.5 min); the slower CPU measured takes ``CPU_SPREAD`` times as long. A
warm-up trains between ``steps`` and ``max_steps`` steps.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ..model.policy import TinyPolicy
from ..model.warmup import WarmupConfig
from .sweep import SweepError

SECONDS_PER_UNIT = 2.2e-10
"""Seconds of one warm-up step per parameter x example x token on the faster CPU (see the module docstring)."""
CPU_SPREAD = 2.25
"""How much longer the lab's work takes on the slower of the two 2-core CPUs measured (2026-11-28) than on the faster
(2026-11-26): an ``add`` rollout 0.45 against 0.2 core-s (:data:`ROLLOUT_SECONDS`, docs/times.md)."""
SHOW_ABOVE_SECONDS = 600.0
"""Warm-ups expected to take longer than this in all are announced with their estimate before they start."""
MEMORY_SHARE = 0.5
"""At most this share of the memory available may hold the warmed-up policies of a sweep."""
BYTES_PER_PARAMETER = 8
"""A warmed-up policy in memory: its float32 weights, serialised once more to hand them to the runs."""


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{seconds / 60:.0f} min" if seconds >= 90 else \
        f"{seconds:.0f} s"


def available_memory() -> int | None:
    """This machine's available memory in bytes (``MemAvailable`` of ``/proc/meminfo``), None where unknown."""
    try:
        found = re.search(r"^MemAvailable:\s+([0-9]+) kB", Path("/proc/meminfo").read_text(), re.M)
    except OSError:
        return None
    return int(found.group(1)) * 1024 if found else None


def check_warmups(base: WarmupConfig, uncached: list[int], training: list[int],
                  log: Callable[[str], None] = print) -> None:
    """Refuse (SweepError) a seed list whose warmed-up policies (``training``: the seeds with runs to train) would
    take more than ``MEMORY_SHARE`` of the available memory; announce through ``log`` the estimated time of the
    ``uncached`` seeds' warm-ups when it exceeds ``SHOW_ABOVE_SECONDS``."""
    task = base.make_task()
    parameters = TinyPolicy(base.policy_config(task)).num_parameters()
    needed, available = len(training) * parameters * BYTES_PER_PARAMETER, available_memory()
    if available is not None and needed > MEMORY_SHARE * available:
        share = max(1, int(MEMORY_SHARE * available // (parameters * BYTES_PER_PARAMETER)))
        raise SweepError(f"--seeds: {len(training)} seeds to train hold {len(training)} warmed-up {base.policy} "
                         f"policies in memory at once, ~{needed / 1e9:.1f} GB; this machine has "
                         f"{available / 1e9:.1f} GB available. Train at most ~{share} seeds per command into the same "
                         "--out (the sweep keeps the finished runs and trains only the missing ones)")
    per_step = SECONDS_PER_UNIT * parameters * base.batch_size * (task.prompt_len + task.max_response_len)
    low, high = len(uncached) * base.steps * per_step, len(uncached) * base.max_steps * per_step * CPU_SPREAD
    if high > SHOW_ABOVE_SECONDS:
        log(f"warm-up: {len(uncached)} of the seeds are not cached yet; their warm-ups alone take ~{_duration(low)} "
            f"to ~{_duration(high)} on one thread (a rough estimate; {base.steps} to {base.max_steps} steps each, "
            "CPUs differ), before the first run starts. Ctrl-C now to choose fewer seeds; each finished warm-up is "
            "cached")


ROLLOUT_SECONDS: dict[str, tuple[float, float]] = {
    "add": (0.2, 0.45), "reverse": (2.0, 2.0 * CPU_SPREAD), "digitsum": (0.6 / CPU_SPREAD, 0.6)}
"""Core-seconds of one rollout of the small policies (``moe``, ``dense``) with its evaluations, per task: (the faster,
the slower) of the two 2-core machines this project has measured idle. The faster (2026-11-26): ``add`` from
docs/lab.md, ``reverse`` from the ``reverse-e5m2`` preset, ``digitsum`` the slower's / ``CPU_SPREAD`` (est.). The slower
(2026-11-28, a 2.45 GHz AMD EPYC): ``add`` 0.43-0.45 s for one run alone and 0.35-0.45 s with two at once in
``make demo``; ``digitsum`` 40 rollouts of one run alone in 24 s (seed 75, e4m3); ``reverse`` ``CPU_SPREAD`` x the
faster's (not measured there). The uncached ``add`` warm-up of seed 0: 8-11 s on the faster, 17 s on the slower.
Commits of both days ran the same 40 rollouts in 17 s and 18 s on the slower machine: the spread is the CPU's."""


def training_estimate(task: str, policy: str, rollouts: int, runs: int, jobs: int) -> str | None:
    """A line estimating the training time of ``runs`` runs of ``rollouts`` rollouts in all, ``jobs`` at a time, from
    :data:`ROLLOUT_SECONDS` (a range: the faster and the slower machine measured); None for a task or policy without a
    measured cost."""
    if task not in ROLLOUT_SECONDS or policy not in ("moe", "dense") or not runs:
        return None
    workers = max(1, min(jobs, runs))
    low, high = (rollouts * seconds / workers for seconds in ROLLOUT_SECONDS[task])
    return (f"estimate: {runs} runs, {rollouts} rollouts in all at ~{ROLLOUT_SECONDS[task][0]:g}-"
            f"{ROLLOUT_SECONDS[task][1]:g} core-s each (CPUs differ): about {_span(low, high)} with {workers} "
            f"{'job' if workers == 1 else 'jobs'} on idle cores, warm-ups aside; the progress lines give this "
            "machine's ETA")


def _span(low: float, high: float) -> str:
    """``low`` to ``high`` seconds as one phrase: "4-9 min", "1.2-2.7 h", "40 s-2 min"."""
    first, second = _duration(low), _duration(high)
    number, unit = first.split()
    return f"{number}-{second}" if second.endswith(f" {unit}") else f"{first}-{second}"
