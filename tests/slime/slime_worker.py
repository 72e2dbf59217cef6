"""The spawned side of the test worlds (started by ``slime_worlds.py``; not a test module).

This launcher imports torch and megatron once, then forks one process per rank of the largest world; each process
runs its phases in order. A phase with ``world > 0`` joins a gloo process group of that size, initialises real
``megatron.core.parallel_state`` (the given TP, PP and CP) and runs its scenarios of ``slime_scenarios``; the phase
with ``world == 0`` runs them with megatron imported but not initialised (the CPU lab's path). Each scenario's result
is saved as ``OUT/<phase>/<scenario>/r<rank>.pt`` with the rank's view and the file of the ``mismatch_ctrl`` package
it imported (the tests check that it is the checkout under test); an exception is saved as ``...r<rank>.err`` and ends
that process with status 1. When a process fails, at the deadline, or on SIGTERM, the launcher kills the other
processes (they may be blocked in a collective) and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state as ps

import mismatch_ctrl
from slime_data import COLLECTIVE_CALLS, View  # this script's directory is on sys.path
from slime_scenarios import run_scenario

COLLECTIVE_TIMEOUT = timedelta(seconds=120)


def run_phase(phase: dict[str, Any], out: Path) -> None:
    """One phase: ``{"name", "world", "tp", "cp", "pp", "rank", "store", "scenarios"}`` (world 0: no process group;
    ``store``: the world's ``file://`` rendezvous)."""
    world, rank = phase["world"], phase["rank"]
    view, barrier = View(), (lambda: None)
    if world:
        dist.init_process_group("gloo", init_method=phase["store"], rank=rank, world_size=world,
                                timeout=COLLECTIVE_TIMEOUT)
        ps.initialize_model_parallel(tensor_model_parallel_size=phase["tp"], pipeline_model_parallel_size=phase["pp"],
                                     context_parallel_size=phase["cp"])
        view = View(ps.get_data_parallel_rank(), ps.get_data_parallel_world_size(), ps.get_context_parallel_rank(),
                    ps.get_context_parallel_world_size(), ps.is_pipeline_last_stage(),
                    ps.get_tensor_model_parallel_rank(), ps.get_tensor_model_parallel_world_size())
        barrier = dist.barrier
    directory = out / phase["name"]
    for name in phase["scenarios"]:
        target = directory / name / f"r{rank}"
        target.parent.mkdir(parents=True, exist_ok=True)
        print(f"{directory.name} rank {rank}: {name}", flush=True)
        try:
            result = run_scenario(name, view, directory, rank, barrier)
        except BaseException:
            target.with_suffix(".err").write_text(f"rank {rank} of {directory.name}, scenario {name}:\n"
                                                  + traceback.format_exc())
            raise
        torch.save({"view": view, "result": result, "module": mismatch_ctrl.__file__}, target.with_suffix(".pt"))
    if world:
        dist.barrier()
        ps.destroy_model_parallel()
        dist.destroy_process_group()


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "broadcast", "broadcast_object_list", "reduce", "reduce_scatter_tensor", "all_to_all_single", "gather",
               "scatter")


def count_collectives() -> None:
    """Wrap the collectives of ``torch.distributed`` so that every call is counted in ``COLLECTIVE_CALLS``."""
    def counting(name: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            COLLECTIVE_CALLS[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    for name in COLLECTIVES:
        if hasattr(dist, name):
            setattr(dist, name, counting(name, getattr(dist, name)))


def run_process(phases: list[dict[str, Any]], out: Path) -> None:
    torch.set_num_threads(1)
    count_collectives()
    logging.getLogger("mismatch_ctrl").setLevel(logging.ERROR)
    for phase in phases:
        run_phase(phase, out)


def main() -> int:
    parser = argparse.ArgumentParser(description="Launch the slime adapter test worlds (see slime_worlds.py).")
    parser.add_argument("--out", required=True, help="directory for results and errors")
    parser.add_argument("--plan", required=True, help="JSON: per process, the list of its phases (see run_phase)")
    parser.add_argument("--deadline", type=float, required=True, help="seconds before every process is killed")
    ns = parser.parse_args()
    import multiprocessing

    context = multiprocessing.get_context("fork")
    procs = [context.Process(target=run_process, args=(phases, Path(ns.out))) for phases in json.loads(ns.plan)]

    def stop(*_: object) -> None:
        for p in procs:
            if p.pid is not None and p.exitcode is None:
                p.kill()
        sys.exit(3)

    signal.signal(signal.SIGTERM, stop)
    for p in procs:
        p.start()
    end = time.monotonic() + ns.deadline
    while any(p.exitcode is None for p in procs):
        failed = [k for k, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if failed or time.monotonic() > end:
            print(f"process {failed[0]} failed" if failed else f"deadline of {ns.deadline:.0f} s passed",
                  file=sys.stderr, flush=True)
            time.sleep(1.0 if failed else 0.0)
            stop()
        time.sleep(0.05)
    return max(p.exitcode for p in procs)


if __name__ == "__main__":
    sys.exit(main())
