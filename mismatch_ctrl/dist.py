"""How statistics combine across ranks: two all-gathers of small tensors per hook call, never a gather of tokens.

Every statistic in mismatch_ctrl is built from per-sequence sums and maxima (ARCHITECTURE.md, "Statistics are
additive"), reduced in two steps:

- ``seq``: the context-parallel shards of the *same* sequences. Each shard holds some tokens of every sequence; the
  per-sequence table ``[N, K]`` (sums and maxima side by side) is gathered over the CP group and combined locally
  (sum or max per column), so every CP rank then holds the complete, identical table.
- ``batch``: *disjoint* sets of sequences on the data-parallel ranks. The small vector of batch numbers (sums,
  maxima, minima, histogram counts) is gathered over the DP group (without CP: after the first step every CP rank
  holds the same numbers) and combined locally.

A gather, unlike an all-reduce, combines sums, maxima and minima in one collective, and every rank combines the same
rows in the same order, so the results are bit-identical everywhere. Tensor-parallel peers hold identical data and are
in neither group, so nothing is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

import torch


class Gather(Protocol):
    """All participants' copies of ``tensor``, stacked in rank order: ``[P, *tensor.shape]`` on the input's device,
    identical everywhere. Never modifies the input."""

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor: ...


def local_gather(tensor: torch.Tensor) -> torch.Tensor:
    """The gather of a single participant."""
    return tensor.unsqueeze(0)


class GroupGather:
    """An all-gather over the ``torch.distributed`` group returned by ``group_fn()`` at call time, on the group's
    device (CUDA for NCCL, else the CPU); the result comes back on the input's device.

    The group is looked up on every call because slime destroys and recreates process groups around offload;
    :meth:`bound` gives the same gather for a compiled region. ``name`` says which group it is (``context_parallel``,
    ``data_parallel``): the compiled gather reaches the group under that fixed name."""

    def __init__(self, group_fn: Callable[[], object], name: str) -> None:
        self.group_fn = group_fn
        self.name = name

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        group = self.group_fn()
        size, device = _where(group)
        flat = tensor.detach().reshape(-1).to(device)
        out = flat.new_empty(size * flat.numel())
        dist.all_gather_into_tensor(out, flat, group=group)
        return out.view(size, *tensor.shape).to(tensor.device)

    def bound(self) -> Gather:
        """The same gather as a functional collective, which ``torch.compile`` records in its graph (a
        ``torch.distributed`` call would end the graph), over the current group bound to the fixed name
        ``mismatch_ctrl.<name>``. The graph holds that name, not the group: slime's re-created groups (a new group,
        and name, every offload) reuse the graph. The name stays bound until a later call binds the next group (c10d
        holds it weakly), so nested or repeated calls need no bookkeeping."""
        from torch._C import _distributed_c10d as c10d

        group = _registered(self.group_fn())
        size, device = _where(group)
        alias = f"mismatch_ctrl.{self.name}"
        try:
            current = c10d._resolve_process_group(alias)
        except RuntimeError:  # not bound yet, or its group is gone
            current = None
        if current is not group:
            c10d._unregister_process_group(alias)
            c10d._register_process_group(alias, group)

        def gather(tensor: torch.Tensor) -> torch.Tensor:
            flat = tensor.detach().reshape(-1).to(device)
            out = torch.ops._c10d_functional.all_gather_into_tensor(flat, size, alias)
            return torch.ops._c10d_functional.wait_tensor(out).view(size, *tensor.shape).to(tensor.device)

        return gather


def _registered(group: object) -> object:
    """The process group c10d itself knows: slime wraps Megatron's groups in a Python ``ProcessGroup`` subclass that
    keeps the real one in ``.group`` and only forwards calls to it (``ReloadableProcessGroup``,
    ``slime/utils/reloadable_process_group.py:285`` at 624b824a); functional collectives need the real one."""
    import torch.distributed as dist

    inner = getattr(group, "group", None)
    return inner if isinstance(inner, dist.ProcessGroup) else group


def _where(group: object) -> tuple[int, torch.device]:
    """The group's size and the device its backend gathers on."""
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else \
        torch.device("cpu")
    return dist.get_world_size(group), device


@dataclass(frozen=True)
class Reducers:
    """The two gathers of one hook call: ``seq`` over the CP shards of the same sequences, ``batch`` over the DP ranks
    (see the module docstring). Both default to a single participant (the CPU lab, ``mismatch-ctrl analyze``)."""

    seq: Gather = local_gather
    batch: Gather = local_gather

    @property
    def sharded(self) -> bool:
        """Whether sequences are split over context-parallel ranks (else the per-sequence table is already complete)."""
        return self.seq is not local_gather

    def bound(self) -> Reducers:
        """These reducers as gathers a compiled region records, over the current groups (see
        :meth:`GroupGather.bound`)."""
        return Reducers(*(g.bound() if isinstance(g, GroupGather) else g for g in (self.seq, self.batch)))


LOCAL = Reducers()
"""A single process: every gather is the identity."""

