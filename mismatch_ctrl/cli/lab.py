"""``mismatch-ctrl lab`` (train and report, or ``--report-only``) and ``mismatch-ctrl lab compare`` (pool finished
runs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..formatting import shell_command

if TYPE_CHECKING:
    from ..lab.sweeps.run import LabResult
    from ..lab.training.methods import RunSpec
    from ..lab.training.settings import LabSettings


def _unwritable(exc: OSError, out: str, fix: str) -> int:
    """The lab's message for a file it could not write (the file, the reason, the fix); exit status 2."""
    print(f"mismatch-ctrl lab: {exc.filename or out}: {exc.strerror or exc}; {fix}", file=sys.stderr)
    return 2


def lab_plan(ns: argparse.Namespace) -> tuple[list[RunSpec], LabSettings, tuple[int, ...]]:
    """What ``lab`` would train, from its parsed options (preset and defaults resolved): the ``RunSpec`` of every
    run, the ``LabSettings`` (of the first seed) and the seeds. ValueError or ConfigError naming the option."""
    from ..lab.training.methods import RunSpec
    from ..lab.sweeps.options import resolve
    from ..lab.model.policy import POLICY_KINDS
    from ..lab.training.settings import LabSettings, auto_device

    o = resolve(ns)
    experts = POLICY_KINDS[o["policy"]].get("n_experts", 0)
    try:
        runs = RunSpec.expand(o["methods"].split(","), o["quant"].split(","), experts)
    except (ValueError, ConfigError) as exc:
        raise ValueError(f"--methods: {exc}") from None
    settings = LabSettings(task=o["task"], policy=o["policy"], steps=o["steps"], lr=o["lr"], seed=o["seeds"][0],
                           eval_every=o["eval_every"], prompts_per_step=o["prompts"], samples_per_prompt=o["samples"],
                           optimizer_steps=o["num_steps_per_rollout"], dump_details=ns.dump_details,
                           device=auto_device(o["policy"], o["task"]) if ns.device == "auto" else ns.device)
    return runs, settings, o["seeds"]


def _training_options(ns: argparse.Namespace) -> list[str]:
    """The options of ``lab`` given on its command line that only training reads (``--preset``, the settings,
    ``--dump-details``, ``--ray-address``), as flags."""
    from ..lab.sweeps.options import LAB_DEFAULTS

    given = [f"--{name.replace('_', '-')}" for name in ("preset", *LAB_DEFAULTS) if getattr(ns, name, None) is not None]
    return given + ["--dump-details"] * ns.dump_details + ["--ray-address"] * (ns.ray_address is not None)


def _print_tables(result: LabResult) -> None:
    """The closing tables of a lab run (``run_lab`` / ``rewrite_report``'s result): the summary, what the mismatch
    and the controllers did, where the report and plots are, and which runs had nothing to compare against."""
    from ..lab.results.console import mechanism_table, summary_table

    mechanisms = mechanism_table(result.table)
    print(summary_table(result.table))
    if mechanisms:
        print("\nwhat the mismatch and the controllers did (means over the rollouts and seeds; report.md explains "
              f"each column):\n{mechanisms}")
    print(f"\nreport: {result.report}\nplots:  {result.plots[0].parent}/")
    _not_compared(result.missing)


def lab_command(ns: argparse.Namespace) -> int:
    from ..lab.sweeps.executors import LocalExecutor, RayExecutor
    from ..lab.sweeps.run import SweepInterrupted, rewrite_report, run_lab
    from ..lab.sweeps.sweep import SweepError

    if ns.report_only:
        training = _training_options(ns)
        if training:
            print(f"mismatch-ctrl lab: --report-only trains nothing, so {', '.join(training)} would be ignored; drop "
                  "them (the report is rewritten from OUT's runs as they were trained)", file=sys.stderr)
            return 2
        try:
            result = rewrite_report(Path(ns.out), shell_command(["mismatch-ctrl", *ns.argv]), ns.trust_unhashed)
        except (ValueError, SweepError) as exc:
            print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            return _unwritable(exc, ns.out, "free space or make --out writable")
        _print_tables(result)
        return 0
    try:
        runs, settings, seeds = lab_plan(ns)
    except (ValueError, ConfigError) as exc:
        print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
        return 2
    executor = RayExecutor(ns.ray_address) if ns.ray_address is not None else LocalExecutor(ns.jobs)
    try:
        result = run_lab(runs, settings, Path(ns.out), command=shell_command(["mismatch-ctrl", *ns.argv]),
                         cache_dir=ns.cache_dir, seeds=seeds, executor=executor, trust_unhashed=ns.trust_unhashed)
    except SweepError as exc:
        print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
        return 130 if isinstance(exc, SweepInterrupted) else 2
    except KeyboardInterrupt:
        print(f"mismatch-ctrl lab: interrupted; the finished runs in {ns.out} are kept, rerun the same command to "
              "continue", file=sys.stderr)
        return 130
    except OSError as exc:
        return _unwritable(exc, ns.out, "free space or choose a writable --out / --cache-dir")
    print()
    _print_tables(result)
    return 0


def compare_command(ns: argparse.Namespace) -> int:
    """``mismatch-ctrl lab compare``: pooled differences against GRPO, or interactions with ``--pairs``."""
    from ..lab.results.console import interaction_table, pooled_table
    from ..lab.results.pooling import interactions, pooled_versus
    from ..lab.sweeps.compare import pair_change, read_directories, setting_differences
    from ..lab.sweeps.sweep import SweepError

    given = _training_options(ns) + (["--cache-dir"] if ns.cache_dir is not None else []) + [
        flag for flag, default in (("--out", "runs/lab"), ("--device", "auto"), ("--jobs", ns.lab_jobs_default),
                                   ("--report-only", False)) if getattr(ns, flag[2:].replace("-", "_")) != default]
    if given:
        what = "options" if len(given) > 1 else "an option"
        print(f"mismatch-ctrl lab compare: {', '.join(given)}: {what} of `mismatch-ctrl lab` (training), which compare "
              "would ignore; give compare only its own options (`mismatch-ctrl lab compare --help`)", file=sys.stderr)
        return 2
    dirs = ns.directories
    if ns.pairs and len(dirs) % 2:
        print(f"mismatch-ctrl lab compare: --pairs takes directories in pairs A B, got {len(dirs)}", file=sys.stderr)
        return 2
    try:
        table = read_directories(dirs, ns.trust_unhashed or ns.compare_trust_unhashed)
    except SweepError as exc:
        print(f"mismatch-ctrl lab compare: {exc}", file=sys.stderr)
        return 2
    halves = [dirs[::2], dirs[1::2]] if ns.pairs else [dirs]
    mixed = [d for half in halves for d in setting_differences(table.where(*map(str, half)))]
    if mixed and not ns.across_settings:
        print(f"mismatch-ctrl lab compare: runs trained with different settings would be pooled ({'; '.join(mixed)}); "
              "pool one setting at a time, compare two with --pairs A B, or pool across them on purpose with "
              "--across-settings", file=sys.stderr)
        return 2
    changes: list[str] = []
    if ns.pairs:
        pairs = [(str(a), str(b)) for a, b in zip(dirs[::2], dirs[1::2])]
        for a, b in pairs:
            count, change = pair_change(table, a, b)
            if count != 1 and not (count and ns.across_settings):
                what = f"differ in {count} settings ({change})" if count else "were trained under the same settings"
                print(f"mismatch-ctrl lab compare: --pairs compares two settings, but {a} and {b} {what}; " +
                      ("pair directories that differ in one setting, or compare them anyway with --across-settings"
                       if count else "pool them without --pairs"), file=sys.stderr)
                return 2
            changes += [change] if change not in changes else []
        rows = interactions(table, pairs, ns.metric)
        text = interaction_table(rows, ns.metric, pairs) if rows else None
        why = "no run is in both directories of a pair with seeds in both (and, but for GRPO, its grpo@<engine>)"
    else:
        rows = pooled_versus(table, ns.metric, ns.against)
        text = pooled_table(rows, ns.metric, ns.against) if rows else None
        why = ("no run has a GRPO run on its engine (grpo@<engine>) with a seed in common" if ns.against == "grpo" else
               "no run has an exact-engine run (grpo@none or its own @none) with a seed in common"
               if ns.against == "exact" else f"no directory holds {ns.against} and another run with a seed in common")
    if text is None:
        print(f"mismatch-ctrl lab compare: nothing to compare: {why}", file=sys.stderr)
        return 2
    print(text + "".join(f"\n\nB - A: {change}" for change in changes) +
          "".join(f"\n\nPooled across settings: {line}" for line in mixed))
    return 0


def _not_compared(missing: list[str]) -> None:
    """Name on stderr each comparison the report could not make (its reference run is missing): a note, the runs are
    done."""
    for line in missing:
        print(f"mismatch-ctrl lab: note: {line.replace('`', '')} (train the reference run into the same --out to "
              "compare)", file=sys.stderr)
