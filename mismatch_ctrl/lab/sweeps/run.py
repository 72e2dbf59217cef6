"""``mismatch-ctrl lab``: warm up once per seed, train every requested run for every seed (through an executor:
this process, a local process pool, or Ray), write plots, report and a summary table.

Seed k seeds the warm-up (the policy's initial weights and its supervised data) and the RL run (prompts, sampling,
data order), so the spread over seeds covers the starting policy too - which is what differs between machines whose
floating-point kernels differ. Run k of method m is written to ``OUT/<m>/seed<k>/`` once it finished (``sweep.py``):
a rerun into the same ``OUT`` trains only the runs that are missing.
"""

from __future__ import annotations

import dataclasses
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ... import regular_files
from ...formatting import clip
from ..model.warmup import WarmupConfig, cache_path, default_cache_dir, warmup_policy, warmup_preset
from ..results.outputs import write_outputs
from ..results.table import Run, RunTable
from ..training.methods import RunSpec
from ..training.settings import LabSettings
from .budget import check_warmups, training_estimate
from .executors import Executor, LocalExecutor
from .integrity import CheckedRun, check_run, check_runs, run_folders, unhashed_note
from .lock import OutLock
from .progress import SweepProgress
from .sweep import (
    BYTES_PER_STEP,
    RunTask,
    SweepError,
    check_names,
    check_writable,
    clean_partial,
    commit_run,
    differences,
    plan,
    run_dir,
    shared_inputs,
)

COMMANDS_FILE = "commands.txt"
"""Every lab command that trained runs into an output directory, one a line."""


class SweepInterrupted(SweepError):
    """Ctrl-C during a sweep: the finished runs are kept, a rerun continues."""


@dataclass(frozen=True)
class LabResult:
    """The runs (``table``; ``summaries``: one per method and seed), their aggregate over seeds per label, report,
    plots, and the comparisons the report could not make because a reference run is missing."""

    table: RunTable
    aggregate: dict[str, dict[str, Any]]
    report: Path
    plots: list[Path]
    missing: list[str]

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return [dict(run.summary) for run in self.table]


def run_lab(runs: list[RunSpec], settings: LabSettings, out_dir: Path, jobs: int = 1,
            command: str = "mismatch-ctrl lab", cache_dir: str | Path | None = None, show_progress: bool = True,
            warmup: WarmupConfig | None = None, seeds: tuple[int, ...] = (0,), executor: Executor | None = None,
            progress_interval: float = 30.0, trust_unhashed: bool = False) -> LabResult:
    """Train each run once per seed, each from its seed's warmed-up policy, and write ``out_dir/report.md``,
    ``summary.json``, plots and per-run folders. Runs already finished in ``out_dir`` with the same fingerprint are
    not trained again; before any warm-up, runs made there with other settings are refused (SweepError), a damaged,
    copied or renamed run folder too (``integrity.DamagedRun``), and seeds whose warm-ups would not fit in memory
    (``budget.check_warmups``, which also announces warm-ups expected to take long).

    ``warmup`` defaults to the task's preset for ``settings.policy`` (``warmup_preset``); its seed is replaced by
    each run seed. Warm-ups are cached. ``executor`` defaults to ``LocalExecutor(jobs)``. ``trust_unhashed``: count
    finished runs whose fingerprint records no file hashes (``integrity.UnhashedRun``), named on standard error.
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
    executor = executor or LocalExecutor(jobs)
    grid = [(spec, dataclasses.replace(settings, seed=seed)) for seed in seeds for spec in runs]
    log = print if show_progress else _quiet
    check_names(_existing(out_dir), runs)
    check_writable(out_dir, "--out", len(grid) * settings.steps * BYTES_PER_STEP)
    if not all(cache_path(dataclasses.replace(base, seed=seed), cache_dir).is_file() for seed in seeds):
        check_writable(Path(cache_dir) if cache_dir is not None else default_cache_dir(), "--cache-dir")
    with OutLock(out_dir, log):
        for path in clean_partial(out_dir):
            log(f"removed the unfinished run folder {path} (a sweep was stopped while writing it)")
        checked = {run.folder: run for run in _checked(run_folders(out_dir), trust_unhashed)}
        finished = plan(out_dir, grid, base, {folder: run.inputs for folder, run in checked.items()})
        _commands(out_dir)
        todo = [(spec, s) for (spec, s), done in zip(grid, finished) if not done]
        if len(todo) < len(grid):
            log(f"{len(grid) - len(todo)} of {len(grid)} runs already finished in {out_dir}: kept, not trained again")
        training = sorted({s.seed for _, s in todo})
        check_warmups(base, [seed for seed in training if not cache_path(dataclasses.replace(base, seed=seed),
                                                                          cache_dir).is_file()], training, log)
        estimate = training_estimate(settings.task, settings.policy, sum(s.steps for _, s in todo), len(todo),
                                     getattr(executor, "jobs", 1))
        if estimate is not None:
            log(estimate)
        if todo:
            executor.connect()
            _train(todo, base, out_dir, executor, cache_dir, show_progress, progress_interval, len(grid) - len(todo))
        runs = [checked.get(folder) or check_run(folder) for folder in (run_dir(out_dir, spec, s.seed)
                                                                          for spec, s in grid)]
        runs.sort(key=lambda run: (labels.index(run.spec.label), run.settings.seed))
        return _write_outputs(runs, out_dir, list(dict.fromkeys(_commands(out_dir, command))))


def _quiet(text: str) -> None:
    """A log that prints nothing."""


def _checked(folders: list[Path], trust_unhashed: bool) -> list[CheckedRun]:
    """``integrity.check_runs``; the runs counted without file hashes named on standard error."""
    runs = check_runs(folders, trust_unhashed)
    note = unhashed_note(runs)
    if note is not None:
        print(f"mismatch-ctrl lab: warning: {note}", file=sys.stderr, flush=True)
    return runs


def _existing(path: Path) -> Path:
    return next(p for p in (path, *path.parents) if p.exists())


def _train(todo: list[tuple[RunSpec, LabSettings]], base: WarmupConfig, out_dir: Path, executor: Executor,
           cache_dir: str | Path | None, show_progress: bool, interval: float, skipped: int) -> None:
    """Warm up the seeds that have runs to train, hand the runs to ``executor`` and write each as it finishes."""
    states = {}
    for seed in sorted({s.seed for _, s in todo}):
        warm = warmup_policy(dataclasses.replace(base, seed=seed), cache_dir=cache_dir,
                             log=print if show_progress else None, device=todo[0][1].device)
        if show_progress:
            print(f"warm-up seed {seed} ({base.policy}, {warm.policy.num_parameters()} parameters): "
                  f"{'cached' if warm.from_cache else f'{warm.seconds:.0f} s'}, sample accuracy "
                  f"{warm.sample_accuracy:.2f}, greedy accuracy {warm.greedy_accuracy:.2f}", flush=True)
        buffer = io.BytesIO()
        torch.save({"policy_config": warm.policy.config.to_dict(), "state_dict": warm.policy.state_dict()}, buffer)
        states[seed] = buffer.getvalue()
    tasks = [RunTask(spec, s, states[s.seed]) for spec, s in todo]
    progress = SweepProgress(tasks, skipped, enabled=show_progress, interval=interval)

    def on_result(task: RunTask, output: tuple[dict[str, Any], dict[str, bytes]]) -> None:
        commit_run(out_dir, task, output[1], base)
        progress.finish(task.key, output[0])

    try:
        executor.run(tasks, progress.event, on_result)
    except KeyboardInterrupt:
        progress.close()
        raise SweepInterrupted(f"interrupted: {progress.finished} of {progress.total_runs} runs are finished and kept "
                               f"in {out_dir}; rerun the same command to train the rest") from None
    finally:
        progress.close()


def _write_outputs(runs: list[CheckedRun], out_dir: Path, commands: list[str]) -> LabResult:
    """The checked runs as one table (read once, in report order) and the directory's report, summary and plots."""
    table = RunTable.of(Run(run.summary, run.records, str(out_dir)) for run in runs)
    written = write_outputs(table, out_dir, commands)
    comparison = written.comparison
    return LabResult(table, comparison.aggregated, written.report, written.plots, comparison.missing)


def _commands(out_dir: Path, command: str | None = None) -> list[str]:
    """The lab commands that trained into ``out_dir`` (``COMMANDS_FILE``), after appending ``command`` (one line: see
    ``quoting.shell_command``) if given; SweepError naming the file when it cannot be read or written as UTF-8 text
    (a FIFO or a device there is refused by name, never opened)."""
    path = out_dir / COMMANDS_FILE
    try:
        try:
            text = regular_files.read_text(path)
        except FileNotFoundError:
            text = ""
        if command is not None:
            text += ("" if not text or text.endswith("\n") else "\n") + command + "\n"
            regular_files.write_atomic(path, text.encode("utf-8", "backslashreplace"))
        return text.splitlines()
    except (OSError, UnicodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else clip(str(exc), 120)
        raise SweepError(f"--out {out_dir}: {path} cannot be read or written as UTF-8 text ({reason}); it lists the "
                         "commands that trained into this --out, one a line: repair it, or move it away (the report "
                         "then names only the commands from now on)") from None


def rewrite_report(out_dir: Path, command: str = "mismatch-ctrl lab --report-only",
                   trust_unhashed: bool = False) -> LabResult:
    """Summaries, report and plots of a lab output directory written again from the runs it holds
    (``<label>/seed<k>/``): after a change of the report, or after more seeds were trained into the same directory.
    Runs keep the order of the previous ``summary.json`` where it lists them. Every run folder is checked first
    (``integrity.check_runs``: a damaged, copied or renamed one is a ``DamagedRun`` naming it); ValueError for a
    directory without runs, and for runs trained with different settings (one report is for one set of settings)."""
    folders = run_folders(out_dir)
    if not folders:
        raise ValueError(f"--report-only: no runs (*/seed*/) in {out_dir}; run the lab into it first")
    order = _previous_order(out_dir / "summary.json")
    runs = _checked(folders, trust_unhashed)
    reference = shared_inputs(runs[0].inputs)
    for run in runs[1:]:
        other = shared_inputs(run.inputs)
        if other != reference:
            raise ValueError(f"--report-only: {out_dir} holds runs trained with different settings ({runs[0].folder} "
                             f"vs {run.folder}: {differences(reference, other)}); one report is for one set of "
                             "settings - move the runs of each setting into their own --out")
    runs.sort(key=lambda r: (order.index(r.spec.label) if r.spec.label in order else len(order), r.spec.label,
                             r.settings.seed))
    with OutLock(out_dir):
        return _write_outputs(runs, out_dir, _commands(out_dir) or [command])


def _previous_order(path: Path) -> list[str]:
    """Run labels in the order of a previous ``summary.json`` (empty when absent or unreadable: it is rewritten; a
    FIFO or a device there is never opened)."""
    try:
        return [str(row["label"]) for row in regular_files.read_json(path)["runs"]]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return []


def default_jobs() -> int:
    """One process per CPU core (each runs one thread)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
