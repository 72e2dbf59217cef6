"""``mismatch-ctrl lab``: warm up once, train every requested run (in parallel processes), write plots and report."""

from __future__ import annotations

import io
import multiprocessing
import os
import queue
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .methods import RunSpec
from .report import read_metrics, write_plots, write_report
from .trainer import LabSettings, Trainer
from .warmup import WARMUP_PRESETS, WarmupConfig, warmup_policy

DEFAULT_METHODS = "grpo@none,grpo,dcgrpo,geo_mis,token_tis,length_decay,dcgrpo_length_decay"


@dataclass(frozen=True)
class LabResult:
    summaries: list[dict[str, Any]]
    report: Path
    plots: list[Path]


def _train_one(spec: RunSpec, settings: LabSettings, policy_bytes: bytes, out_dir: Path,
               progress: Any) -> dict[str, Any]:
    torch.set_num_threads(1)
    policy_state = torch.load(io.BytesIO(policy_bytes), weights_only=True)
    trainer = Trainer(spec, settings, policy_state, out_dir / spec.label)
    return trainer.run(lambda n: progress.put((spec.label, n)) if progress is not None else None)


def run_lab(runs: list[RunSpec], settings: LabSettings, out_dir: Path, jobs: int = 1,
            command: str = "mismatch-ctrl lab", cache_dir: str | Path | None = None, show_progress: bool = True,
            warmup: WarmupConfig | None = None) -> LabResult:
    """Train each run from the same warmed-up policy and write ``out_dir/report.md``, plots and per-run metrics.

    ``warmup`` defaults to the task's preset (``WARMUP_PRESETS``); it is trained once and cached.
    """
    torch.set_num_threads(1)
    labels = [spec.label for spec in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"runs must be distinct, got {labels}")
    if warmup is None and settings.task not in WARMUP_PRESETS:
        raise ValueError(f"task: unknown {settings.task!r}; choose one of {sorted(WARMUP_PRESETS)}")
    warmup = warmup or WARMUP_PRESETS[settings.task]
    if warmup.task != settings.task:
        raise ValueError(f"the warm-up is for task {warmup.task!r} but the runs are for {settings.task!r}")
    warm = warmup_policy(warmup, cache_dir=cache_dir, log=print if show_progress else None)
    if show_progress:
        print(f"warm-up: {'cached' if warm.from_cache else f'{warm.seconds:.0f} s'}, sample accuracy "
              f"{warm.sample_accuracy:.2f}, greedy accuracy {warm.greedy_accuracy:.2f}")
    policy_state = {"policy_config": warm.policy.config.to_dict(), "state_dict": warm.policy.state_dict()}
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs = max(1, min(jobs, len(runs)))
    if jobs == 1:
        summaries = [_run_serial(spec, settings, policy_state, out_dir, show_progress) for spec in runs]
    else:
        summaries = _run_parallel(runs, settings, policy_state, out_dir, jobs, show_progress)
    records = {spec.label: read_metrics(out_dir / spec.label / "metrics.jsonl") for spec in runs}
    plots = write_plots(records, out_dir / "plots")
    report = write_report(summaries, plots, out_dir, command)
    return LabResult(summaries, report, plots)


def _bar(label: str, total: int, position: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{label:<28}", position=position, unit="rollout", disable=not enabled,
                leave=True, dynamic_ncols=True)


def _run_serial(spec: RunSpec, settings: LabSettings, policy_state: dict[str, Any], out_dir: Path,
                show_progress: bool) -> dict[str, Any]:
    with _bar(spec.label, settings.steps, 0, show_progress) as bar:
        return Trainer(spec, settings, policy_state, out_dir / spec.label).run(bar.update)


def _run_parallel(runs: list[RunSpec], settings: LabSettings, policy_state: dict[str, Any], out_dir: Path, jobs: int,
                  show_progress: bool) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    buffer = io.BytesIO()
    torch.save(policy_state, buffer)
    with context.Manager() as manager, ProcessPoolExecutor(jobs, mp_context=context) as pool:
        progress = manager.Queue()
        bars = {spec.label: _bar(spec.label, settings.steps, i, show_progress) for i, spec in enumerate(runs)}
        futures = [pool.submit(_train_one, spec, settings, buffer.getvalue(), out_dir, progress) for spec in runs]
        while not all(f.done() for f in futures):
            try:
                label, n = progress.get(timeout=0.5)
                bars[label].update(n)
            except queue.Empty:
                continue
        while not progress.empty():
            label, n = progress.get()
            bars[label].update(n)
        for bar in bars.values():
            bar.close()
        return [f.result() for f in futures]


def default_jobs() -> int:
    """One process per CPU core (each runs one thread)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
