"""``mismatch-ctrl lab``: warm up once per seed, train every requested run for every seed (in parallel processes),
write plots and report.

Seed k seeds the warm-up (the policy's initial weights and its supervised data) and the RL run (prompts, sampling,
data order), so the spread over seeds covers the starting policy too - which is what differs between machines whose
floating-point kernels differ. Run k of method m is written to ``OUT/<m>/seed<k>/``.
"""

from __future__ import annotations

import dataclasses
import io
import json
import multiprocessing
import os
import queue
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .methods import RunSpec
from .report import aggregate_runs, read_metrics, write_plots, write_report
from .trainer import RUN_FILE, LabSettings, Trainer, summarize
from .warmup import WarmupConfig, warmup_policy, warmup_preset

COMMANDS_FILE = "commands.txt"
"""Every lab command that trained runs into an output directory, one a line."""


@dataclass(frozen=True)
class LabResult:
    """Per-run summaries (one per method and seed), their aggregate over seeds per method, report and plots."""

    summaries: list[dict[str, Any]]
    aggregate: dict[str, dict[str, Any]]
    report: Path
    plots: list[Path]


def run_dir(out_dir: Path, spec: RunSpec, seed: int) -> Path:
    """Where one run (a method at a seed) writes ``metrics.jsonl`` and its state."""
    return out_dir / spec.label / f"seed{seed}"


def _train_one(spec: RunSpec, settings: LabSettings, policy_bytes: bytes, out_dir: Path,
               progress: Any) -> dict[str, Any]:
    torch.set_num_threads(1)
    policy_state = torch.load(io.BytesIO(policy_bytes), weights_only=True)
    trainer = Trainer(spec, settings, policy_state, run_dir(out_dir, spec, settings.seed))
    key = (spec.label, settings.seed)
    if progress is not None:
        progress.put((key, 0))  # the run starts now (it may have waited for a free process)
    return trainer.run(lambda n: progress.put((key, n)) if progress is not None else None)


def run_lab(runs: list[RunSpec], settings: LabSettings, out_dir: Path, jobs: int = 1,
            command: str = "mismatch-ctrl lab", cache_dir: str | Path | None = None, show_progress: bool = True,
            warmup: WarmupConfig | None = None, seeds: tuple[int, ...] = (0,)) -> LabResult:
    """Train each run once per seed, each from its seed's warmed-up policy, and write ``out_dir/report.md``,
    ``summary.json``, plots and per-run metrics.

    ``warmup`` defaults to the task's preset for ``settings.policy`` (``warmup_preset``); its seed is replaced by
    each run seed. Warm-ups are cached.
    """
    torch.set_num_threads(1)
    labels = [spec.label for spec in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"--methods: runs must be distinct, got {labels}")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds: give distinct seeds, got {list(seeds)}")
    base = warmup or warmup_preset(settings.task, settings.policy)
    if base.task != settings.task or base.policy != settings.policy:
        raise ValueError(f"the warm-up is for task {base.task!r}, policy {base.policy!r} but the runs are for "
                         f"{settings.task!r}, {settings.policy!r}")
    states = {}
    for seed in seeds:
        warm = warmup_policy(dataclasses.replace(base, seed=seed), cache_dir=cache_dir,
                             log=print if show_progress else None, device=settings.device)
        if show_progress:
            print(f"warm-up seed {seed} ({settings.policy}, {warm.policy.num_parameters()} parameters): "
                  f"{'cached' if warm.from_cache else f'{warm.seconds:.0f} s'}, sample accuracy "
                  f"{warm.sample_accuracy:.2f}, greedy accuracy {warm.greedy_accuracy:.2f}")
        states[seed] = {"policy_config": warm.policy.config.to_dict(), "state_dict": warm.policy.state_dict()}
    out_dir.mkdir(parents=True, exist_ok=True)
    jobs_list = [(spec, dataclasses.replace(settings, seed=seed)) for seed in seeds for spec in runs]
    jobs = max(1, min(jobs, len(jobs_list)))
    if jobs == 1:
        summaries = [_run_serial(spec, run_settings, states[run_settings.seed], out_dir, show_progress)
                     for spec, run_settings in jobs_list]
    else:
        summaries = _run_parallel(jobs_list, states, out_dir, jobs, show_progress)
    summaries.sort(key=lambda row: (labels.index(row["label"]), row["seed"]))
    _commands(out_dir, command)
    return _write_outputs(summaries, out_dir, [command])


def _write_outputs(summaries: list[dict[str, Any]], out_dir: Path, commands: list[str]) -> LabResult:
    records: dict[str, dict[int, list[dict[str, Any]]]] = {}
    for s in summaries:
        spec = RunSpec(s["method"], s["quant"], s["replay"])
        records.setdefault(s["label"], {})[s["seed"]] = read_metrics(run_dir(out_dir, spec, s["seed"]) /
                                                                     "metrics.jsonl")
    aggregate = aggregate_runs(summaries)
    plots = write_plots(records, out_dir / "plots")
    report = write_report(summaries, aggregate, plots, out_dir, commands)
    return LabResult(summaries, aggregate, report, plots)


def _commands(out_dir: Path, command: str | None = None) -> list[str]:
    """The lab commands that trained into ``out_dir`` (``COMMANDS_FILE``), after appending ``command`` if given."""
    path = out_dir / COMMANDS_FILE
    if command is not None:
        with open(path, "a") as f:
            f.write(command + "\n")
    return path.read_text().splitlines() if path.is_file() else []


def rewrite_report(out_dir: Path, command: str = "mismatch-ctrl lab --report-only") -> LabResult:
    """Summaries, report and plots of a lab output directory written again from the runs it holds
    (``<label>/seed<k>/run.json`` and ``metrics.jsonl``): after a change of the report, or after more seeds were
    trained into the same directory. Runs keep the order of the previous ``summary.json`` where it lists them; runs
    that did not finish (no final evaluation) are left out."""
    found = sorted(out_dir.glob(f"*/seed*/{RUN_FILE}"))
    if not found:
        raise ValueError(f"--report-only: no runs (*/seed*/{RUN_FILE}) in {out_dir}; run the lab into it first")
    previous_path = out_dir / "summary.json"
    previous = json.loads(previous_path.read_text()) if previous_path.is_file() else {}
    order = [row["label"] for row in previous.get("runs", [])]
    rows = []
    for path in found:
        info = json.loads(path.read_text())
        metrics = path.parent / "metrics.jsonl"
        records = read_metrics(metrics) if metrics.is_file() else []
        if not records or "final_eval_acc_engine" not in records[-1]:
            continue
        rows.append((RunSpec(info["method"], info["quant"], info["replay"]), LabSettings(**info["settings"]), records))
    if not rows:
        raise ValueError(f"--report-only: no finished run in {out_dir}")
    rows.sort(key=lambda r: (order.index(r[0].label) if r[0].label in order else len(order), r[0].label, r[1].seed))
    summaries = [summarize(spec, settings, records) for spec, settings, records in rows]
    return _write_outputs(summaries, out_dir, _commands(out_dir) or [command])


def _bar(label: str, total: int, position: int, enabled: bool) -> Any:
    """A progress bar (``disable=None``: none when standard error is not a terminal; see :class:`_Progress`)."""
    from tqdm import tqdm

    return tqdm(total=total, desc=f"{label:<30}", position=position, unit="rollout",
                disable=None if enabled else True, leave=True, dynamic_ncols=True)


class _Progress:
    """One bar per parallel run, whose clock starts when the run starts and stops when it ends; without a terminal,
    one line per finished run instead of bars."""

    def __init__(self, jobs_list: list[tuple[RunSpec, LabSettings]], enabled: bool) -> None:
        self.bars = {(spec.label, s.seed): _bar(f"{spec.label} seed {s.seed}", s.steps, i, enabled)
                     for i, (spec, s) in enumerate(jobs_list)}
        self.done = dict.fromkeys(self.bars, 0)
        self.started = dict.fromkeys(self.bars, time.monotonic())
        self.lines = enabled

    def advance(self, key: tuple[str, int], n: int) -> None:
        bar = self.bars[key]
        if n == 0:
            self.started[key] = time.monotonic()
            bar.reset()
            return
        bar.update(n)
        self.done[key] += n
        if self.done[key] == bar.total:
            bar.close()
            if bar.disable and self.lines:
                print(f"{key[0]} seed {key[1]}: {bar.total} rollouts in {time.monotonic() - self.started[key]:.0f} s",
                      flush=True)

    def close(self) -> None:
        for bar in self.bars.values():
            bar.close()


def _run_serial(spec: RunSpec, settings: LabSettings, policy_state: dict[str, Any], out_dir: Path,
                show_progress: bool) -> dict[str, Any]:
    with _bar(f"{spec.label} seed {settings.seed}", settings.steps, 0, show_progress) as bar:
        return Trainer(spec, settings, policy_state, run_dir(out_dir, spec, settings.seed)).run(bar.update)


def _run_parallel(jobs_list: list[tuple[RunSpec, LabSettings]], states: dict[int, dict[str, Any]], out_dir: Path,
                  jobs: int, show_progress: bool) -> list[dict[str, Any]]:
    context = multiprocessing.get_context("spawn")
    state_bytes = {}
    for seed, state in states.items():
        buffer = io.BytesIO()
        torch.save(state, buffer)
        state_bytes[seed] = buffer.getvalue()
    with context.Manager() as manager, ProcessPoolExecutor(jobs, mp_context=context) as pool:
        progress = manager.Queue()
        bars = _Progress(jobs_list, show_progress)
        futures = [pool.submit(_train_one, spec, s, state_bytes[s.seed], out_dir, progress) for spec, s in jobs_list]
        while not all(f.done() for f in futures):
            try:
                bars.advance(*progress.get(timeout=0.5))
            except queue.Empty:
                continue
        while not progress.empty():
            bars.advance(*progress.get())
        bars.close()
        return [f.result() for f in futures]


def default_jobs() -> int:
    """One process per CPU core (each runs one thread)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
