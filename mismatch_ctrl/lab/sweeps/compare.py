"""``mismatch-ctrl lab compare DIR...``: the runs of several lab output directories read once into one table (every
run folder checked as ``--report-only`` checks it), then pooled or paired (``results.pooling``).

A run may count once: a directory given twice, one run folder's ``metrics.jsonl`` found in two directories (a copy),
or the same run (label, conditions, seed) in two directories is refused. A run's conditions are what its
``fingerprint.json`` records it was trained under, the seed, device and dump option aside: its settings, its warm-up
and its method's configuration. Pooling mixes only directories trained under the same conditions (a method's
configuration compared where both directories ran the method) unless asked to pool across settings
(``--across-settings``, which names the differences); two settings are compared in pairs (``--pairs``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ..results.table import Run, RunTable
from .integrity import DamagedRun, check_runs, run_folders, unhashed_note
from .sweep import SweepError, changed_fields, differences, digest

IGNORED_SETTINGS = ("seed", "device", "dump_details")
"""Settings that do not make runs different experiments: pooled across directories, and a run's identity without
them is what may appear only once."""


def conditions(run: Run) -> dict[str, Any]:
    """What ``run`` was trained under, ``IGNORED_SETTINGS`` and the seed aside: its settings, its warm-up
    (``warmup``) and its method's configuration (``method <name>``), as its fingerprint records them."""
    return {**{k: v for k, v in run.settings.items() if k not in IGNORED_SETTINGS},
            "warmup": {k: v for k, v in run.fingerprint.get("warmup", {}).items() if k != "seed"},
            f"method {run.method}": run.fingerprint.get("method_config", {})}


def read_directories(directories: list[Path], trust_unhashed: bool = False) -> RunTable:
    """The runs of each directory (checked by ``integrity.check_runs``; ``source`` = the directory as given), in
    directory order and, within one, by label and seed. SweepError naming the directory or run that cannot count;
    ``trust_unhashed``: count runs whose fingerprint records no file hashes, named on standard error."""
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
        try:
            checked = check_runs(run_folders(directory), trust_unhashed)
        except DamagedRun as exc:
            raise SweepError(f"{exc.folder}: a damaged run ({exc.problem}); compare cannot count it. Leave {directory} "
                             f"out, or move the {'folder' if exc.folder.is_dir() else 'file'} out of it (the next "
                             f"`mismatch-ctrl lab --out {directory}` trains the run again)") from None
        if not checked:
            raise SweepError(f"{directory}: no runs (*/seed*/); give the --out of a `mismatch-ctrl lab` sweep")
        note = unhashed_note(checked)
        if note is not None:
            print(f"mismatch-ctrl lab compare: warning: {directory}: {note}", file=sys.stderr, flush=True)
        for run in sorted(checked, key=lambda r: (r.spec.label, r.settings.seed)):
            other = owner.setdefault(run.metrics_sha256, run.folder)
            if other != run.folder:
                raise SweepError(f"{run.folder} holds the metrics.jsonl of {other}: one run copied, which would count "
                                 "twice; compare the original only")
            row = Run(run.summary, run.records, str(directory), run.inputs)
            key = (run.spec.label, digest(conditions(row)), run.settings.seed)
            if identity.setdefault(key, directory) != directory:
                raise SweepError(f"{identity[key]} and {directory} both hold {run.spec.label} seed "
                                 f"{run.settings.seed} trained with the same settings: it would count twice; give "
                                 "directories of other seeds")
            runs.append(row)
    return RunTable.of(runs)


def pair_change(table: RunTable, a: str, b: str) -> tuple[int, str]:
    """How many settings directory ``b``'s runs were trained under differently from ``a``'s, and ``field: a -> b;
    ...``. A setting is a lab setting, a method's configuration (of each method both ran), or the warm-up, which counts
    only when no lab setting changed (the policy or the task change the warm-up with them)."""
    first = {source: next(run for run in table.runs if run.source == source) for source in (a, b)}
    both = {run.method for run in table.where(a).runs} & {run.method for run in table.where(b).runs}
    methods = {source: {f"method {run.method}": conditions(run)[f"method {run.method}"]
                        for run in table.where(source).runs if run.method in both} for source in (a, b)}
    old, new = ({k: v for k, v in conditions(first[source]).items() if not k.startswith("method ")} | methods[source]
                for source in (a, b))
    changed = {field.split(".")[0] if field.startswith(("warmup.", "method ")) else field
               for field in changed_fields(old, new)}
    count = len(changed - {"warmup"}) or len(changed)
    return count, differences(old, new)


def setting_differences(table: RunTable) -> list[str]:
    """``A and B: field: a -> b; ...`` for each source whose runs were trained under other :func:`conditions` than
    the first source's (a method's configuration compared where the first source ran the method too); empty when
    every run shares them."""
    first = table.runs[0].source
    reference = {run.method: conditions(run) for run in reversed(table.runs) if run.source == first}
    shared = {k: v for k, v in next(iter(reference.values())).items() if not k.startswith("method ")}
    out = {}
    for run in table:
        mine = conditions(run)
        theirs = reference.get(run.method, {**shared, f"method {run.method}": mine[f"method {run.method}"]})
        if run.source not in out and mine != theirs:
            out[run.source] = f"{first} and {run.source}: {differences(theirs, mine)}"
    return list(out.values())
