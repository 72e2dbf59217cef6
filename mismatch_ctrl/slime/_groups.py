"""Megatron process groups for the hooks (SLIME.md section 1), looked up at call time, never WORLD.

The two gathers of :class:`~mismatch_ctrl.dist.Reducers`:

- ``seq``, pieces of the same sequences (CP shards): the context-parallel group;
- ``batch``, per-sequence values (after ``seq`` identical on every CP rank of a DP rank): the data-parallel group
  without CP.

Neither group contains tensor-parallel peers (which hold identical data), so nothing is counted twice. Without an
initialised megatron (a single process such as the CPU lab) both are the identity.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import host
from ..dist import LOCAL, GroupGather, Reducers


def _parallel_state():
    """megatron's ``parallel_state`` if torch.distributed and megatron's groups are initialised, else None (megatron
    is not even imported in a single process)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    try:
        from megatron.core import parallel_state
    except ImportError:
        return None
    return parallel_state if parallel_state.model_parallel_is_initialized() else None


@dataclass(frozen=True)
class Topology:
    """This rank's place in the parallel layout and the reducers the core needs."""

    cp_size: int = 1
    cp_rank: int = 0
    pp_size: int = 1
    is_last_stage: bool = True
    is_main_rank: bool = True
    reducers: Reducers = LOCAL


def topology() -> Topology:
    """The current topology (identity reducers when megatron is not initialised)."""
    ps = _parallel_state()
    if ps is None:
        return Topology()
    cp_size = ps.get_context_parallel_world_size()
    dp_size = ps.get_data_parallel_world_size(with_context_parallel=False)
    pp_size = ps.get_pipeline_model_parallel_world_size()
    is_last = ps.is_pipeline_last_stage()
    return Topology(
        cp_size=cp_size,
        cp_rank=ps.get_context_parallel_rank(),
        pp_size=pp_size,
        is_last_stage=is_last,
        is_main_rank=(ps.get_data_parallel_rank(with_context_parallel=True) == 0
                      and ps.get_tensor_model_parallel_rank() == 0 and is_last),
        reducers=Reducers(
            seq=GroupGather(ps.get_context_parallel_group, "context_parallel") if cp_size > 1 else LOCAL.seq,
            batch=(GroupGather(lambda: ps.get_data_parallel_group(with_context_parallel=False), "data_parallel")
                   if dp_size > 1 else LOCAL.batch)),
    )


def broadcast_from_last_stage(value: float) -> float:
    """``value`` of the last pipeline stage, on every stage (identity without pipeline parallelism)."""
    ps = _parallel_state()
    if ps is None or ps.get_pipeline_model_parallel_world_size() == 1:
        return value
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) \
        if dist.get_backend(ps.get_pipeline_model_parallel_group()) == "nccl" else torch.device("cpu")
    t = host.to_device([value], device, torch.float64)
    dist.broadcast(t, src=ps.get_pipeline_model_parallel_last_rank(), group=ps.get_pipeline_model_parallel_group())
    return host.fetch(t)[0]
