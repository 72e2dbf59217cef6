"""What slime's debug dumps hold, as data: the directory layout, the train dump's format version and field groups,
the dtypes of its tensor columns, and every field of a ``Sample`` dict with its default; and :class:`DumpError`.

The reader (:mod:`.files`, :mod:`.fields`, :mod:`.rollout`) and the writer (:mod:`.writer`) share these, so what is
written is what is read.
"""

from __future__ import annotations

from typing import Any

import torch

TRAIN_DIR, ROLLOUT_DIR = "train_data", "rollout_data"
FORMAT_VERSION = 2
MAX_TOKENS = 2**53
"""The most tokens a response (or a batch) can have: anything above is not a length (and not exact in a float)."""
CONTEXT_PARALLEL_FIELDS = ("rollout_log_probs", "teacher_log_probs", "log_probs", "ref_log_probs", "values",
                           "advantages", "returns", "kl", "entropy", "opd_reverse_kl")
"""Response-token columns slime gathers over context parallelism before writing (full response length each)."""
LAYOUT_FIELDS = ("micro_batch_indices", "num_microbatches", "global_batch_sizes")
WHOLE_BATCH_FIELDS = ("raw_reward",)
TENSOR_DTYPES: dict[str, torch.dtype] = {"tokens": torch.long, "loss_masks": torch.int32,
                                         "rollout_mask_sums": torch.float32,
                                         **dict.fromkeys(CONTEXT_PARALLEL_FIELDS, torch.float32)}
"""dtypes of the tensor columns of a train dump (as slime's training batch holds them)."""
SAMPLE_DEFAULTS: dict[str, Any] = {
    "group_index": None, "index": None, "rollout_id": None, "prompt": "", "tokens": [], "multimodal_inputs": None,
    "multimodal_train_inputs": None, "multimodal_train_input_id": None, "apply_chat_template_kwargs": {},
    "response": "", "response_length": 0, "label": None, "reward": None, "loss_mask": None, "weight_versions": [],
    "rollout_log_probs": None, "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None,
    "rollout_routed_experts": None, "remove_sample": False, "teacher_log_probs": None, "status": "pending",
    "metadata": {}, "generate_function_path": None, "custom_rm_path": None, "train_metadata": None,
    "session_id": None, "non_generation_time": 0.0,
    "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                  "completion_token_num": 0},
    "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": 0},
}
"""Every field of slime's ``Sample.to_dict()`` with its default (slime/utils/types.py at 624b824)."""
SAMPLE_STATUSES = ("pending", "completed", "truncated", "aborted", "failed")


class DumpError(ValueError):
    """A dump file cannot be used; the message names the file and the reason."""
