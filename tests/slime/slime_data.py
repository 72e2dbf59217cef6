"""slime-shaped test data for the adapter tests: random rollouts, DP partitions, and our own zigzag CP slicing.

Everything is deterministic in its seed, so the pytest process (the single-process reference) and every rank of a
spawned world build exactly the same global batch and cut out their own share of it.

Context-parallel layout (slime ``cp_utils.get_logits_and_tokens_offset_with_cp`` / ``slice_log_prob_with_cp``,
``qkv_format=thd``), written here from the contract, independently of ``mismatch_ctrl.slime.cp``: a sequence of
``total`` tokens is cut into ``2C`` chunks of ``ceil(total / 2C)``; rank ``r`` holds chunks ``r`` and ``2C-1-r``; the
response token at position ``j`` is predicted by logit position ``prompt - 1 + j``, so for each of its chunks
``[c0, c1)`` (chunk ``r`` first) rank ``r`` holds response positions ``[max(c0, P-1), min(c1, T-1)) - (P-1)``.
"""

from __future__ import annotations

import copy
import math
from argparse import Namespace
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

METHODS_DIR = Path(__file__).resolve().parents[2] / "configs" / "methods"
GROUP = 4
"""Samples per prompt."""

ADVANTAGE_HOOK = "mismatch_ctrl.slime.hooks.advantages"
TIS_HOOK = "mismatch_ctrl.slime.hooks.rollout_correction"
LR_HOOK = "mismatch_ctrl.slime.hooks.before_train_step"
PREFIX = "mismatch_ctrl/"


@dataclass(frozen=True)
class View:
    """Which share of the global batch a rank sees: its DP rank (without CP) and its CP rank; only ranks of the last
    pipeline stage see rollout data at all. Tensor-parallel peers (same DP and CP rank) see identical data."""

    dp_rank: int = 0
    dp_size: int = 1
    cp_rank: int = 0
    cp_size: int = 1
    last_stage: bool = True
    tp_rank: int = 0
    tp_size: int = 1


FULL = View()
"""A single process that sees every sample at full length (the reference)."""

COLLECTIVE_CALLS: Counter[str] = Counter()
"""Calls of ``torch.distributed`` collectives in this process, by name (``slime_worker`` counts them)."""


# --- methods ---------------------------------------------------------------------------------------------------------

def method(file: str, /, **overrides: Any) -> dict[str, Any]:
    """The ``mismatch_ctrl`` section of ``configs/methods/<file>.yaml``, its keys updated by ``overrides`` (one level
    deep for sections)."""
    section = yaml.safe_load((METHODS_DIR / f"{file}.yaml").read_text())["mismatch_ctrl"]
    for key, value in overrides.items():
        if isinstance(value, dict):
            section[key] = {**section.get(key, {}), **value}
        else:
            section[key] = value
    return section


def make_args(section: dict[str, Any] | None, **overrides: Any) -> Namespace:
    """The ``args`` slime passes to the hooks: the YAML's top-level key plus the slime flags the adapters read."""
    values: dict[str, Any] = {
        "num_experts": 128, "save": None, "load": None, "finetune": False, "start_rollout_id": None,
        "lr": 2.0e-3, "min_lr": 2.0e-4, "custom_advantage_function_path": ADVANTAGE_HOOK,
        "custom_tis_function_path": TIS_HOOK, "custom_megatron_before_train_step_hook_path": LR_HOOK,
        "get_mismatch_metrics": True, "advantage_estimator": "grpo", "rollout_max_response_len": 400,
        "save_interval": None, "num_rollout": 100,
    }
    if section is not None:
        values["mismatch_ctrl"] = copy.deepcopy(section)
    values.update(overrides)
    return Namespace(**values)


# --- context parallelism ---------------------------------------------------------------------------------------------

def cp_positions(total: int, response: int, cp_rank: int, cp_size: int) -> list[int]:
    """Response positions rank ``cp_rank`` of ``cp_size`` holds, in slime's order (see the module docstring)."""
    if cp_size == 1:
        return list(range(response))
    chunk = math.ceil(total / (2 * cp_size))
    first_logit = total - response - 1
    out: list[int] = []
    for c in (cp_rank, 2 * cp_size - 1 - cp_rank):
        low, high = max(c * chunk, first_logit), min((c + 1) * chunk, total - 1)
        out.extend(range(low - first_logit, high - first_logit))
    return out


def cp_slice(full: torch.Tensor, total: int, response: int, view: View) -> torch.Tensor:
    """The CP-local slice of a full-response tensor (slime's ``slice_log_prob_with_cp``)."""
    assert full.numel() == response
    return full[torch.tensor(cp_positions(total, response, view.cp_rank, view.cp_size), dtype=torch.long)]


# --- rollouts --------------------------------------------------------------------------------------------------------

@dataclass
class GlobalBatch:
    """One rollout of the whole global batch, full length, in global sample order."""

    rewards: list[float]
    total_lengths: list[int]
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]
    train: list[torch.Tensor]
    rollout: list[torch.Tensor]
    nonfinite: list[list[int]]
    """Per sample, the trained positions whose log-probs were made non-finite."""

    @property
    def size(self) -> int:
        return len(self.rewards)


def group_normalize(raw: torch.Tensor) -> list[float]:
    """slime's GRPO reward post-processing: per prompt group ``(r - mean) / (std + 1e-6)``."""
    grouped = raw.double().reshape(-1, GROUP)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    return (centered / (grouped.std(dim=1, keepdim=True) + 1e-6)).reshape(-1).tolist()


def make_batch(seed: int, groups: int = 4, mean_length: float = 24.0, noise: float = 1.0,
               nonfinite: bool = False) -> GlobalBatch:
    """A random rollout: response lengths around ``mean_length`` (always including lengths 0 and 1), loss masks with
    interior zeros (one sample fully masked), per-sequence mismatch scales from none to large (times ``noise``) with a
    few outlier tokens, and optionally non-finite log-probs at some trained tokens (at most one per sample, never the
    only trained token)."""
    g = torch.Generator().manual_seed(seed)
    n = groups * GROUP

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=g)

    lengths = (mean_length * (0.4 + 1.2 * uniform(n))).round().long().tolist()
    lengths[1], lengths[6] = 0, 1
    prompts = (1 + 20 * uniform(n)).long().tolist()
    scales = [0.0, 1e-4, 3e-3, 0.03, 0.3]
    raw = (uniform(n) < 0.5).double()
    batch = GlobalBatch(group_normalize(raw), [], [], [], [], [], [])
    for i, (length, prompt) in enumerate(zip(lengths, prompts)):
        mask = (uniform(length) > 0.2).int()
        if i == 9:
            mask.zero_()
        rollout = -torch.empty(length).exponential_(1.0, generator=g) * (0.05 + 2 * uniform(1))
        scale = scales[i % len(scales)] * noise
        train = rollout + scale * torch.randn(length, generator=g)
        if scale > 0 and length > 3:
            train[int(uniform(1) * length)] += 1.5
            if i % 3 == 0:
                train[int(uniform(1) * length)] -= 12.0
        train = train.clamp(max=0.0)
        bad: list[int] = []
        trained = mask.nonzero().flatten().tolist()
        if nonfinite and len(trained) >= 2 and i % 4 == 3:
            pos = trained[int(uniform(1) * len(trained))]
            if i % 8 == 3:
                train[pos] = float("nan")
            else:
                rollout[pos] = -float("inf")
            bad.append(pos)
            untrained = (mask == 0).nonzero().flatten().tolist()
            if untrained:
                train[untrained[0]] = float("nan")
        batch.total_lengths.append(prompt + length)
        batch.response_lengths.append(length)
        batch.loss_masks.append(mask)
        batch.train.append(train.float())
        batch.rollout.append(rollout.float())
        batch.nonfinite.append(bad)
    return batch


def partition(n: int, dp_size: int) -> list[list[int]]:
    """Global sample indices of each DP rank, in its local order: shuffled and uneven, so prompt groups straddle
    ranks (slime's ``dp_schedule`` does not align groups to ranks)."""
    if dp_size == 1:
        return [list(range(n))]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(1234)).tolist()
    sizes = [n // dp_size] * dp_size
    sizes[0] -= 1
    sizes[-1] += n - sum(sizes)
    starts = [sum(sizes[:k]) for k in range(dp_size)]
    return [order[s:s + size] for s, size in zip(starts, sizes)]


def local_samples(batch: GlobalBatch, view: View) -> list[int]:
    return partition(batch.size, view.dp_size)[view.dp_rank]


def rollout_data(batch: GlobalBatch, view: View, log_probs: bool = True) -> dict[str, Any]:
    """``rollout_data`` as slime hands it to the advantage hook on this rank: DP-local samples, full-length loss masks,
    CP-local log-probs and ``kl`` (zeros)."""
    idx = local_samples(batch, view)
    tl, rl = batch.total_lengths, batch.response_lengths

    def local(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [cp_slice(tensors[i], tl[i], rl[i], view) for i in idx]

    data: dict[str, Any] = {
        "rewards": [batch.rewards[i] for i in idx],
        "response_lengths": [rl[i] for i in idx],
        "total_lengths": [tl[i] for i in idx],
        "loss_masks": [batch.loss_masks[i].clone() for i in idx],
        "rollout_log_probs": local(batch.rollout),
        "kl": [torch.zeros(len(cp_positions(tl[i], rl[i], view.cp_rank, view.cp_size))) for i in idx],
        "partition": idx,
        "rollout_ids": list(idx),  # slime numbers samples without a rollout id apart (ray/rollout.py:647-655)
    }
    if log_probs:
        data["log_probs"] = local(batch.train)
    return data


def micro_batches(samples: Sequence[int]) -> list[list[int]]:
    """Local sample positions of this rank's two micro-batches (the first one a bit smaller)."""
    cut = len(samples) // 2 - 1 if len(samples) > 3 else len(samples) // 2
    return [list(range(cut)), list(range(cut, len(samples)))]
