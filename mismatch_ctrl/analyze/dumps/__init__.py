"""slime's debug dumps: read them one rollout at a time, and write them (the CPU lab's output) in the same format.

Layout (slime 624b824, ``slime/observability/{train,rollout}_data_utils.py``), with ``--dump-details DIR``:

- ``DIR/train_data/{rollout_id}.pt`` (``--save-debug-train-data``): ``{"format_version": 2, "rollout_id", "rank",
  "samples", "dp_shards", "raw_reward"?}``. ``samples`` holds one dict per trained sample, sorted by
  ``rollout_position`` (the sample's index in the rollout dump), with the per-sample columns of the training batch
  (``response_lengths``, ``total_lengths``, ``loss_masks`` int32, ``rewards`` (group-normalised), ``truncated``
  0/1, ``log_probs`` (training-engine recompute), ``rollout_log_probs`` (SGLang), ``advantages``, ``returns``,
  ``kl``, ... float32), context-parallel shards already gathered to full response length, and the ids
  ``rollout_position``, ``sample_index``, ``data_parallel_rank``. ``dp_shards`` keeps the DP / micro-batch layout
  only; ``raw_reward`` is the whole batch's raw rewards in rollout order.
- ``DIR/rollout_data/{rollout_id}.pt`` (``--save-debug-rollout-data``): ``{"rollout_id", "samples"}`` with slime
  ``Sample.to_dict()`` dicts (``response_length``, ``rollout_log_probs`` list, ``loss_mask`` list or None,
  ``status`` string, ``reward``, ...); ``eval_{rollout_id}.pt`` files hold evaluations and are ignored here.

The package, one concern a module:

- :mod:`.schema`: the format as data (directories, format version, field groups and dtypes, ``Sample`` defaults) and
  :class:`DumpError`;
- :mod:`.files`: which files hold which rollout (the id rules) and loading one safely (``weights_only``);
- :mod:`.fields`: validating a loaded dump's fields (token columns, lengths, ids, flags, rewards);
- :mod:`.rollout`: building a rollout's :class:`RolloutDump` from its train and/or rollout dump;
- :mod:`.writer`: writing both kinds of dump (the CPU lab's output) in slime's format.
"""

from .files import (MAX_ID_DIGITS, RolloutFiles, Skipped, checked_id, dump_kind, find_rollouts, load_dump, name_ids,
                    safe_globals)
from .rollout import RolloutDump, iter_rollouts, read_rollout
from .schema import (CONTEXT_PARALLEL_FIELDS, FORMAT_VERSION, LAYOUT_FIELDS, MAX_TOKENS, ROLLOUT_DIR,
                     SAMPLE_DEFAULTS, SAMPLE_STATUSES, TENSOR_DTYPES, TRAIN_DIR, WHOLE_BATCH_FIELDS, DumpError)
from .writer import samples_from_rollout_data, write_rollout_dump, write_train_dump

__all__ = ["CONTEXT_PARALLEL_FIELDS", "FORMAT_VERSION", "LAYOUT_FIELDS", "MAX_ID_DIGITS", "MAX_TOKENS",
           "ROLLOUT_DIR", "SAMPLE_DEFAULTS", "SAMPLE_STATUSES", "TENSOR_DTYPES", "TRAIN_DIR", "WHOLE_BATCH_FIELDS",
           "DumpError", "RolloutDump", "RolloutFiles", "Skipped", "checked_id", "dump_kind", "find_rollouts",
           "iter_rollouts", "load_dump", "name_ids", "read_rollout", "safe_globals", "samples_from_rollout_data",
           "write_rollout_dump", "write_train_dump"]
