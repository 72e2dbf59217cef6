"""Reducers: how statistics combine across ranks.

Every statistic in mismatch_ctrl is built from sums (and a few maxima), so pieces computed on different ranks combine
by an all-reduce of a few numbers per sequence, never by gathering token tensors [ours, ARCHITECTURE.md].

Core functions take two reducers:

- ``seq_reduce`` combines *pieces of the same sequences* (context-parallel shards): per-sequence sums ``[N, K]``.
- ``batch_reduce`` combines *disjoint sets of sequences* (data-parallel ranks): batch totals ``[K]``.

Both default to :func:`local_reduce` (a single process, e.g. the CPU lab).
"""

from __future__ import annotations

from typing import Callable, Literal, Protocol

import torch

ReduceOp = Literal["sum", "max"]


class Reducer(Protocol):
    """Return the element-wise sum (or max) of ``tensor`` over all participants; never modify the input."""

    def __call__(self, tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor: ...


def local_reduce(tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
    """The reducer of a single participant: the identity."""
    return tensor


def group_reducer(group_fn: Callable[[], object]) -> Reducer:
    """An all-reduce over the ``torch.distributed`` group returned by ``group_fn()`` at call time.

    The group is looked up on every call because slime destroys and recreates process groups around offload.
    """
    import torch.distributed as dist

    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}

    def reduce(tensor: torch.Tensor, op: ReduceOp = "sum") -> torch.Tensor:
        out = tensor.detach().clone()
        dist.all_reduce(out, op=ops[op], group=group_fn())
        return out

    return reduce
