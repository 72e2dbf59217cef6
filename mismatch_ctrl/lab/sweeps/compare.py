"""``mismatch-ctrl lab compare DIR...``: the runs of several lab output directories read once into one table (every
run folder checked as ``--report-only`` checks it), then pooled or paired (``results.pooling``).

A run may count once: a directory given twice, one run folder's ``metrics.jsonl`` found in two directories (a copy),
or the same run (label, settings, seed) in two directories is refused. Pooling mixes only directories trained with
the same settings (the seed, device and dump option aside) unless asked to pool across settings
(``--across-settings``, which names the differences); two settings are compared in pairs (``--pairs``).
"""

from __future__ import annotations

from pathlib import Path

from ..results.table import Run, RunTable
from .integrity import check_runs, run_folders
from .sweep import SweepError, differences

IGNORED_SETTINGS = ("seed", "device", "dump_details")
"""Settings that do not make runs different experiments: pooled across directories, and a run's identity without
them is what may appear only once."""


def experiment(settings: dict) -> dict:
    """A run's settings without ``IGNORED_SETTINGS``."""
    return {k: v for k, v in settings.items() if k not in IGNORED_SETTINGS}


def read_directories(directories: list[Path]) -> RunTable:
    """The runs of each directory (checked by ``integrity.check_runs``; ``source`` = the directory as given), in
    directory order and, within one, by label and seed. SweepError naming the directory or run that cannot count."""
    given: dict[Path, Path] = {}
    for directory in directories:
        if directory.resolve() in given:
            first = given[directory.resolve()]
            also = "" if str(first) == str(directory) else f" (also as {first})"
            raise SweepError(f"{directory} is given twice{also}; its seeds would count twice")
        given[directory.resolve()] = directory
    runs: list[Run] = []
    owner: dict[str, Path] = {}
    identity: dict[tuple[str, str, int], Path] = {}
    for directory in directories:
        if not directory.is_dir():
            raise SweepError(f"{directory}: not a directory; give lab output directories (the --out of "
                             "`mismatch-ctrl lab`)")
        checked = check_runs(run_folders(directory))
        if not checked:
            raise SweepError(f"{directory}: no runs (*/seed*/); give the --out of a `mismatch-ctrl lab` sweep")
        for run in sorted(checked, key=lambda r: (r.spec.label, r.settings.seed)):
            other = owner.setdefault(run.metrics_sha256, run.folder)
            if other != run.folder:
                raise SweepError(f"{run.folder} holds the metrics.jsonl of {other}: one run copied, which would count "
                                 "twice; compare the original only")
            key = (run.spec.label, repr(sorted(experiment(run.summary["settings"]).items())), run.settings.seed)
            if identity.setdefault(key, directory) != directory:
                raise SweepError(f"{identity[key]} and {directory} both hold {run.spec.label} seed "
                                 f"{run.settings.seed} trained with the same settings: it would count twice; give "
                                 "directories of other seeds")
            runs.append(Run(run.summary, run.records, str(directory)))
    return RunTable.of(runs)


def setting_differences(table: RunTable) -> list[str]:
    """``A and B: field: a -> b; ...`` for each source whose runs were trained with other settings than the first
    source's (the seed, device and dump option aside); empty when every run shares the first run's settings."""
    first = table.runs[0]
    out = {}
    for run in table:
        if run.source not in out and experiment(run.settings) != experiment(first.settings):
            out[run.source] = (f"{first.source} and {run.source}: "
                               f"{differences(experiment(first.settings), experiment(run.settings))}")
    return list(out.values())
