"""Finished runs read once into one table: every analysis and renderer of the lab works on a ``RunTable``.

A ``Run`` is one finished run of one seed: its summary (``training.summary.summarize``: the numbers aggregated over
seeds, the run's label, method, engine, replay, seed and settings), its per-rollout records (``metrics.jsonl``) and the
directory it was read from (``source``: runs of several ``--out`` directories can share a table, e.g. to pool seeds)
and, where it was read from a run folder, the inputs its ``fingerprint.json`` records (``fingerprint``: settings,
warm-up, method configuration), which tell whether runs of several directories may be pooled.
The table keeps the runs in the order given, which is the order of every table and legend the lab writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..training.methods import REPLAY_SUFFIX


@dataclass(frozen=True)
class Run:
    """One finished run of one seed: ``summary`` (numbers and identity), ``records`` (one per rollout), ``source``,
    ``fingerprint`` (its recorded inputs; empty when not read from a run folder)."""

    summary: Mapping[str, Any]
    records: Sequence[Mapping[str, Any]] = ()
    source: str = ""
    fingerprint: Mapping[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.summary["label"]

    @property
    def method(self) -> str:
        return self.summary["method"]

    @property
    def quant(self) -> str:
        """The rollout engine (the dose of the frontier)."""
        return self.summary["quant"]

    @property
    def replay(self) -> bool:
        return self.summary["replay"]

    @property
    def seed(self) -> int:
        return self.summary["seed"]

    @property
    def settings(self) -> Mapping[str, Any]:
        return self.summary["settings"]

    @property
    def line(self) -> str:
        """The method with ``+r3`` when it replays the engine's routing: one line of the frontier."""
        return self.method + (REPLAY_SUFFIX if self.replay else "")

    def value(self, key: str) -> float | None:
        """A number of the summary (None when the run did not measure it)."""
        return self.summary.get(key)


@dataclass(frozen=True)
class RunTable:
    """Runs in report order; each (source, label, seed) once."""

    runs: tuple[Run, ...]

    def __post_init__(self) -> None:
        seen: set[tuple[str, str, int]] = set()
        for run in self.runs:
            key = (run.source, run.label, run.seed)
            if key in seen:
                raise ValueError(f"run {run.label} seed {run.seed} is in the table twice"
                                 + (f" (both from {run.source})" if run.source else ""))
            seen.add(key)

    @classmethod
    def of(cls, runs: Iterable[Run]) -> RunTable:
        return cls(tuple(runs))

    @classmethod
    def from_summaries(cls, summaries: Iterable[Mapping[str, Any]], source: str = "") -> RunTable:
        """A table of summaries without their records (enough for every analysis but the controller table)."""
        return cls(tuple(Run(summary, (), source) for summary in summaries))

    def __len__(self) -> int:
        return len(self.runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

    def labels(self) -> list[str]:
        """Run labels in first-seen order."""
        return list(dict.fromkeys(run.label for run in self.runs))

    def seeds(self) -> list[int]:
        return sorted({run.seed for run in self.runs})

    def sources(self) -> list[str]:
        """Source directories in first-seen order."""
        return list(dict.fromkeys(run.source for run in self.runs))

    def where(self, *sources: str) -> RunTable:
        """The runs read from any of ``sources``."""
        return RunTable(tuple(run for run in self.runs if run.source in sources))

    def groups(self) -> dict[str, list[Run]]:
        """label -> its runs (one per seed), labels in first-seen order."""
        out: dict[str, list[Run]] = {}
        for run in self.runs:
            out.setdefault(run.label, []).append(run)
        return out

    def records(self) -> dict[str, dict[int, list[Mapping[str, Any]]]]:
        """label -> seed -> the run's per-rollout records (what the plots draw)."""
        return {label: {run.seed: list(run.records) for run in runs} for label, runs in self.groups().items()}
