"""``mismatch-ctrl analyze``: calibrate eps and preview every controller on a real run's slime dumps.

Read ``--dump-details`` dumps one rollout at a time (:mod:`.dumps`, which also writes that format for the CPU lab),
measure the discrepancy (:mod:`.stats`), replay the controllers (:mod:`.replay`; :mod:`.eps_changes` says which
rule changed eps on each rollout), and write the report (:mod:`.report`). :func:`analyze_dumps` returns every number
as a JSON-able dict.
"""

from .analysis import AnalyzeOptions, analyze_dumps
from .dumps import (DumpError, RolloutDump, Skipped, find_rollouts, iter_rollouts, read_rollout,
                    samples_from_rollout_data, write_rollout_dump, write_train_dump)
from .report import write_report

__all__ = ["AnalyzeOptions", "DumpError", "RolloutDump", "Skipped", "analyze_dumps", "find_rollouts", "iter_rollouts",
           "read_rollout", "samples_from_rollout_data", "write_report", "write_rollout_dump", "write_train_dump"]
