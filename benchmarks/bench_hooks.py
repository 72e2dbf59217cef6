"""What one call of each slime hook costs: dispatched aten ops, host synchronisations, collectives, time per token.

- **ops**: aten operations dispatched by one call (counted with a ``TorchDispatchMode``), and of them the kernel
  launches on a GPU (not views, metadata or allocations); counted for 8, 64 and 256 sequences: a vectorised hook
  dispatches the same number for all three. Then by token count (20k, 300k, 2M tokens): on a CPU the columns go in
  4 MB chunks, each with its own ops; as on a GPU (one chunk) the count stays the same.
- **host syncs**: host synchronisations one call makes as on a GPU, counted on the CPU by
  :class:`~mismatch_ctrl.hostguard.HostGuard` (target: at most 1 for the TIS hook, 2 for the advantage hook; the
  per-sequence and batch arithmetic stays on the device, which costs kernel launches instead: ``bench_gpu.py``
  times both on a GPU).
- **collectives**: ``torch.distributed`` calls made by one call on every rank of a real gloo world of 4 processes,
  data-parallel 2 x context-parallel 2 (megatron-core's ``parallel_state``), counted by wrapping the collectives.
- **time**: CPU time of one call on ~2M tokens (256 responses of 1k-16k tokens, one thread: a whole rollout for
  the advantage hook, a hundred micro-batches at once for the TIS hook), in units of one ``torch.exp`` over the same
  tokens ("elementwise passes", informational: the unit depends on the machine's ``exp``), with glibc's malloc and
  with malloc keeping freed memory (as a caching allocator); and the TIS hook's statistics in one chunk and in 4 MB
  chunks, at 200k and 2M tokens; and the host work of one call on 512 tokens, where the arithmetic is negligible
  (each op's dispatch and the hook's Python: the least a GPU call costs, on a host of that speed), of both hooks and
  of the TIS hook compiled (``torch_compile: true``; its first call compiles it, tens of seconds on a CPU).

Hooks: the advantage hook with DC-GRPO (plus the surge detector and every mismatch metric) and the TIS hook with the
``geo_rs_token_tis`` preset (geometric rejection, veto, token TIS) and every metric. ``make bench`` prints the
targets (host syncs and collectives per call, docs/performance.md) next to the numbers.

    python benchmarks/bench_hooks.py                  # everything
    python benchmarks/bench_hooks.py --skip-world     # no spawned processes
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
import traceback
from argparse import Namespace
from collections import Counter
from pathlib import Path
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch.utils._python_dispatch import TorchDispatchMode

import mismatch_ctrl
from bench_core import fp8_like_tokens  # benchmarks/ is this script's directory
from bench_options import REPEATS, RESPONSES, SEED, bounded_int, check_most
from glibc_malloc import keep_freed_memory
from mismatch_ctrl import seqstats
from mismatch_ctrl.batch import Segments, TokenBatch
from mismatch_ctrl.correction import correction_columns
from mismatch_ctrl.hostguard import HostGuard
from mismatch_ctrl.metrics import METRIC_COLUMNS, TOKEN_COLUMNS
from mismatch_ctrl.presets import PRESETS
from mismatch_ctrl.seqstats import SeqStats
from mismatch_ctrl.slime import hooks
from mismatch_ctrl.slime.cp import local_index

TARGETS = {"tis_syncs": 1, "advantage_syncs": 2, "tis_collectives": 2, "advantage_collectives": 3}
"""The targets: host synchronisations and collectives per call (docs/performance.md)."""
VIEWS = frozenset({"view", "_unsafe_view", "slice", "select", "unbind", "expand", "t", "transpose", "permute",
                   "narrow", "unsqueeze", "squeeze", "unsqueeze_", "squeeze_", "detach", "alias", "as_strided",
                   "split", "split_with_sizes", "scalar_tensor", "lift_fresh", "empty", "new_empty", "empty_like"})
"""aten ops that launch no kernel on a GPU: views, metadata, allocations and host scalars."""
METHODS = {
    "advantages": {"name": "dcgrpo", "dcgrpo": {"enabled": True}},
    "tis": {"name": "geo_rs_token_tis", "correction": {"preset": "geo_rs_token_tis"}},
}
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object",
               "broadcast", "broadcast_object_list", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_to_all",
               "all_to_all_single", "gather", "scatter", "barrier")


# --- inputs ----------------------------------------------------------------------------------------------------------

TOKENS = bounded_int(1, 1 << 24, "tokens of one micro-batch; slime's --max-tokens-per-gpu is ~20k")
TABLE_TOKENS = bounded_int(64, 1 << 25, "tokens of a batch of 64 responses")
TIMED_RESPONSES = bounded_int(1, 2048, "responses of 1000-16000 tokens: up to 33M tokens")


def make_rollout(seqs: int, min_len: int, max_len: int, seed: int, tokens: int | None = None) -> dict[str, Any]:
    """One global batch in slime's per-sample layout: FP8-like log-prob mismatch ~1e-3 with rare outliers, loss masks
    with ~2% untrained tokens, group-normalised-looking rewards, prompts of 20-200 tokens. Response lengths are
    uniform in ``[min_len, max_len]``, or with ``tokens`` random shares of that many tokens (a packed micro-batch)."""
    g = torch.Generator().manual_seed(seed)
    if tokens is None:
        lengths = torch.randint(min_len, max_len + 1, (seqs,), generator=g).tolist()
    else:
        share = torch.rand(seqs, generator=g) + 0.5
        lengths = (share / share.sum() * tokens).floor().long().clamp_min(1).tolist()
    train, rollout, mask = fp8_like_tokens(sum(lengths), g)
    prompts = torch.randint(20, 201, (seqs,), generator=g).tolist()
    return {"response_lengths": lengths, "total_lengths": [p + r for p, r in zip(prompts, lengths)],
            "train": list(train.split(lengths)), "rollout": list(rollout.split(lengths)),
            "loss_masks": list(mask.split(lengths)), "rewards": torch.randn(seqs, generator=g).tolist()}


def local_view(batch: dict[str, Any], samples: list[int], cp_rank: int = 0, cp_size: int = 1) -> dict[str, Any]:
    """The samples of one data-parallel rank, with CP-local log-probs (slime's zigzag layout) and full masks."""
    total = [batch["total_lengths"][i] for i in samples]
    response = [batch["response_lengths"][i] for i in samples]
    if cp_size == 1:
        def local(key: str) -> list[torch.Tensor]:
            return [batch[key][i] for i in samples]
    else:
        sizes, index = local_index(total, response, cp_rank, cp_size)

        def local(key: str) -> list[torch.Tensor]:
            flat = torch.cat([batch[key][i] for i in samples])
            return list(flat[index].split(sizes))
    return {"rewards": [batch["rewards"][i] for i in samples], "response_lengths": response, "total_lengths": total,
            "loss_masks": [batch["loss_masks"][i].clone() for i in samples], "rollout_log_probs": local("rollout"),
            "log_probs": local("train")}


def make_args(section: dict[str, Any]) -> Namespace:
    """The ``args`` slime passes to the hooks (the flags the adapters read)."""
    prefix = "mismatch_ctrl.slime.hooks."
    return Namespace(
        mismatch_ctrl=dict(section), num_experts=128, save=None, load=None, finetune=False, start_rollout_id=None,
        lr=1e-6, min_lr=0.0, custom_advantage_function_path=prefix + "advantages",
        custom_tis_function_path=prefix + "rollout_correction",
        custom_megatron_before_train_step_hook_path=prefix + "before_train_step", get_mismatch_metrics=True,
        advantage_estimator="grpo", rollout_max_response_len=16384, save_interval=None, num_rollout=100)


def advantage_call(args: Namespace, view: dict[str, Any]) -> Callable[[], object]:
    kl = [torch.zeros_like(t) for t in view["rollout_log_probs"]]

    def call() -> object:
        data = dict(view, kl=kl)
        hooks.advantages(args, data)
        return data["advantages"]
    return call


def tis_call(args: Namespace, view: dict[str, Any]) -> Callable[[], object]:
    pg_loss = torch.cat(view["log_probs"]).neg()

    def call() -> object:
        return hooks.rollout_correction(
            args, pg_loss=pg_loss.detach().requires_grad_(True), train_log_probs=view["log_probs"],
            rollout_log_probs=view["rollout_log_probs"], loss_masks=view["loss_masks"],
            total_lengths=view["total_lengths"], response_lengths=view["response_lengths"])
    return call


def hook_calls(batch: dict[str, Any], samples: list[int], cp_rank: int = 0,
               cp_size: int = 1) -> dict[str, Callable[[], object]]:
    view = local_view(batch, samples, cp_rank, cp_size)
    calls = {"advantages": advantage_call(make_args(METHODS["advantages"]), view),
             "tis": tis_call(make_args(METHODS["tis"]), view)}
    for call in calls.values():
        call()  # creates the runtime (config, controllers) outside the measurements
    return calls


# --- ops -------------------------------------------------------------------------------------------------------------

class OpCounter(TorchDispatchMode):
    """Counts every aten op dispatched inside the ``with`` block, with the innermost ``mismatch_ctrl`` source line
    that dispatched it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        where = next((f"{Path(frame.filename).name}:{frame.lineno}" for frame in reversed(traceback.extract_stack())
                      if f"{os.sep}mismatch_ctrl{os.sep}" in frame.filename), "?")
        self.ops.append(f"{where} {func.overloadpacket.__name__}")
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> OpCounter:
    with OpCounter() as counter:
        fn()
    return counter


def launches(ops: Counter) -> int:
    """The ops of an :class:`OpCounter` (``site op`` strings) that launch a kernel on a GPU."""
    return sum(n for op, n in ops.items() if op.split()[-1] not in VIEWS)


def count_syncs(fn: Callable[[], object]) -> int:
    """Host synchronisations of one call as on a GPU: transfers through ``mismatch_ctrl.host`` under ``HostGuard``
    (which refuses any other)."""
    with HostGuard() as guard:
        fn()
    return guard.syncs


# --- collectives on a real gloo world --------------------------------------------------------------------------------

def world_rank(rank: int, size: int, cp: int, out: str, seqs: int, seed: int) -> None:
    """One rank of the DP x CP world: count the collectives of each hook call (after a warm-up call)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    torch.set_num_threads(1)
    logging.getLogger("mismatch_ctrl").setLevel(logging.ERROR)
    dist.init_process_group("gloo", init_method=f"file://{Path(out) / 'store'}", rank=rank, world_size=size)
    ps.initialize_model_parallel(context_parallel_size=cp)
    counts: dict[str, int] = {}
    originals = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}

    def counting(name: str, fn: Callable) -> Callable:
        def wrapper(*a: Any, **k: Any) -> Any:
            counts[name] = counts.get(name, 0) + 1
            return fn(*a, **k)
        return wrapper

    dp_rank, dp_size = ps.get_data_parallel_rank(), ps.get_data_parallel_world_size()
    batch = make_rollout(seqs, 50, 400, seed)
    samples = list(range(dp_rank, seqs, dp_size))
    calls = hook_calls(batch, samples, ps.get_context_parallel_rank(), cp)
    result = {}
    for name in originals:
        setattr(dist, name, counting(name, originals[name]))
    for hook, call in calls.items():
        counts.clear()
        call()
        result[hook] = dict(counts)
    for name, fn in originals.items():
        setattr(dist, name, fn)
    torch.save(result, Path(out) / f"r{rank}.pt")
    dist.barrier()
    ps.destroy_model_parallel()
    dist.destroy_process_group()


def count_collectives(dp: int, cp: int, seqs: int, seed: int) -> list[dict[str, dict[str, int]]]:
    with tempfile.TemporaryDirectory() as out:
        mp.start_processes(world_rank, args=(dp * cp, cp, out, seqs, seed), nprocs=dp * cp, start_method="spawn")
        return [torch.load(Path(out) / f"r{r}.pt") for r in range(dp * cp)]


# --- time ------------------------------------------------------------------------------------------------------------

def median_ms(fn: Callable[[], object], repeats: int, clock: Callable[[], float] = time.process_time,
              warmup: int = 1) -> float:
    """Median time of ``fn`` over ``repeats`` calls after ``warmup`` calls: by default process CPU time (steadier
    than wall-clock on a shared machine; one thread)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = clock()
        fn()
        samples.append(clock() - start)
    return 1e3 * statistics.median(samples)


def time_chunks(seed: int, repeats: int) -> None:
    """CPU time of the TIS hook's statistics in one chunk and in 4 MB chunks (``seqstats.CHUNK_BYTES``, a CPU's
    default), below and above glibc's 32 MiB mmap threshold."""
    columns = METRIC_COLUMNS | TOKEN_COLUMNS | correction_columns(PRESETS["geo_rs_token_tis"])
    rows = len({"trained", *columns.sums, *columns.maxima, *columns.tokens})
    print(f"\nCPU time of the TIS hook's statistics ({rows} columns, SeqStats.build), one chunk vs 4 MB chunks, glibc "
          "malloc (medians)")
    for tokens in (200_000, 2_000_000):
        g = torch.Generator().manual_seed(seed)
        sizes = (torch.rand(64, generator=g) * 2 * tokens / 64).long().clamp_min(1).tolist()
        batch = TokenBatch.build(Segments(sizes), *fp8_like_tokens(sum(sizes), g))
        cpu = seqstats.default_chunk_tokens(torch.device("cpu"), sum(sizes), rows, 4)
        one, chunked = (median_ms(lambda c=c: SeqStats.build(batch, columns, chunk_tokens=c), repeats)
                        for c in (sum(sizes), cpu))
        print(f"  {sum(sizes):>9,} tokens ({sum(sizes) * rows * 4 / 2**20:5.0f} MiB): one chunk {one:7.2f} ms, "
              f"4 MB chunks {chunked:7.2f} ms, ratio {one / chunked:4.2f}")


def time_host_work(seed: int, repeats: int) -> None:
    """Wall time of one call on a micro-batch of 512 tokens in 8 responses, where the arithmetic is negligible: each
    op's dispatch and the hook's own Python. A GPU call costs at least this much host time (on a host CPU of this
    speed; the kernels run while the host queues the next ones), so it bounds the hooks' GPU time targets from
    below. In units of one tiny op (``x * 2.0`` on 64 numbers), which depend less on the machine."""
    calls = hook_calls(make_rollout(8, 0, 0, seed, tokens=512), list(range(8)))
    tiny = torch.randn(64, dtype=torch.float64)
    rounds = max(20 * repeats, 100)

    def wall_ms(fn: Callable[[], object]) -> float:
        return median_ms(fn, rounds, time.perf_counter, warmup=10)

    op_ms = wall_ms(lambda: tiny * 2.0)
    print(f"\nhost work per call: 512 tokens in 8 responses, wall time (median of {rounds}), in tiny ops "
          f"(x * 2.0 on 64 numbers: {1e3 * op_ms:.1f} us here); a GPU call costs at least its host work")
    for hook, target in (("advantages", 1.5), ("tis", 0.5)):
        ms, ops = wall_ms(calls[hook]), len(count_ops(calls[hook]).ops)
        print(f"  {hook:12s} {ms:6.2f} ms = {ms / op_ms:5.0f} tiny ops ({ops} aten ops dispatched); the GPU "
              f"target {target} ms: {'below' if ms <= target else f'{ms / target:.1f}x above'} on this host")
    view = local_view(make_rollout(8, 0, 0, seed, tokens=512), list(range(8)))
    compiled_tis = tis_call(make_args({**METHODS["tis"], "torch_compile": True}), view)
    start = time.perf_counter()
    compiled_tis()  # compiles the graph (inductor: C++ kernels on a CPU)
    first = time.perf_counter() - start
    ms = wall_ms(compiled_tis)
    print(f"  {'tis compiled':12s} {ms:6.2f} ms = {ms / op_ms:5.0f} tiny ops (torch_compile: true; its first call, "
          f"which compiled it: {first:.0f} s); the eager pre-stage (input check, layout) and one graph of fused "
          "kernels")


def verdict(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def main() -> None:
    summary, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=summary, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=RESPONSES, nargs="+", default=[8, 64, 256],
                        help="sequence counts for the op counts, each at most --tokens (default 8 64 256)")
    parser.add_argument("--tokens", type=TOKENS, default=20480, help="tokens of the micro-batch whose ops are counted "
                        "(default 20480)")
    parser.add_argument("--token-counts", type=TABLE_TOKENS, nargs="+", default=[20_000, 300_000, 2_000_000],
                        help="token counts of the ops-by-tokens table, 64 responses each (default 20000 300000 "
                             "2000000)")
    parser.add_argument("--time-seqs", type=TIMED_RESPONSES, default=256,
                        help="responses of the timed batch, 1000-16000 tokens each (default 256)")
    parser.add_argument("--repeats", type=REPEATS, default=5, help="timed repeats (default 5)")
    parser.add_argument("--skip-world", action="store_true", help="do not spawn the DP x CP gloo world")
    parser.add_argument("--skip-time", action="store_true", help="do not time the hooks on 2M tokens")
    parser.add_argument("--seed", type=SEED, default=0)
    args = parser.parse_args()
    check_most(parser, "--seqs", max(args.seqs), args.tokens, "every response of the micro-batch of --tokens tokens "
               "has at least one token")
    torch.set_num_threads(1)
    logging.getLogger("mismatch_ctrl").setLevel(logging.ERROR)
    print(f"bench_hooks  mismatch_ctrl from {Path(mismatch_ctrl.__file__).parent}  torch {torch.__version__}")

    print(f"\nper call: one micro-batch of {args.tokens} tokens (slime's --max-tokens-per-gpu) packed from N "
          "responses; aten ops dispatched (kernel launches: ops that are not views or allocations) and host "
          "synchronisations as on a GPU (HostGuard)")
    print(f"{'N':>6s}{'advantage hook':>24s}{'TIS hook':>24s}")
    ops: dict[str, list[Counter]] = {"advantages": [], "tis": []}
    syncs: dict[str, set[int]] = {"advantages": set(), "tis": set()}
    for seqs in args.seqs:
        batch = make_rollout(seqs, 0, 0, args.seed, tokens=args.tokens)
        calls = hook_calls(batch, list(range(seqs)))
        for hook, call in calls.items():
            ops[hook].append(Counter(count_ops(call).ops))
            syncs[hook].add(count_syncs(call))
        print(f"{seqs:6d}" + "".join(f"{c[-1].total():>8d} ops {launches(c[-1]):>4d} launches"
                                     for c in (ops["advantages"], ops["tis"])))
    for hook, label, target in (("advantages", "advantage hook (DC-GRPO + surge + metrics)", "advantage_syncs"),
                                ("tis", "TIS hook (geo_rs_token_tis + metrics)", "tis_syncs")):
        totals = [c.total() for c in ops[hook]]
        constant = len(set(totals)) == 1
        ok = constant and len(syncs[hook]) == 1 and max(syncs[hook]) <= TARGETS[target]
        print(f"  {label}: ops constant in N: {'yes' if constant else 'no'}; host syncs {sorted(syncs[hook])} "
              f"(target <= {TARGETS[target]}, constant)  {verdict(ok)}")
        first, last = (Counter(op.split()[0] for op in counts.elements()) for counts in (ops[hook][0], ops[hook][-1]))
        growing = {site: (first[site], last[site]) for site in first | last if first[site] != last[site]}
        for site, (low, high) in sorted(growing.items()):
            print(f"    changes with N: {site} ({low} -> {high} ops)")

    print("\naten ops dispatched per call by token count, 64 responses: on a CPU (4 MB chunks) and as on a GPU (one "
          "chunk: any device type outside seqstats.CHUNKED_DEVICES)")
    print(f"{'tokens':>8s}{'':>4s}{'advantage hook':>16s}{'TIS hook':>10s}")
    on_gpu: set[tuple[int, int]] = set()
    for where, devices in (("CPU", seqstats.CHUNKED_DEVICES), ("GPU", frozenset())):
        chunked, seqstats.CHUNKED_DEVICES = seqstats.CHUNKED_DEVICES, devices
        try:
            for tokens in args.token_counts:
                calls = hook_calls(make_rollout(64, 0, 0, args.seed, tokens=tokens), list(range(64)))
                counts = {hook: len(count_ops(call).ops) for hook, call in calls.items()}
                if where == "GPU":
                    on_gpu.add((counts["advantages"], counts["tis"]))
                print(f"{tokens:8d}{where:>4s}{counts['advantages']:16d}{counts['tis']:10d}")
        finally:
            seqstats.CHUNKED_DEVICES = chunked
    print(f"  both hooks on a GPU: constant in the tokens: {'yes' if len(on_gpu) == 1 else 'no'}  "
          f"{verdict(len(on_gpu) == 1)}")

    if not args.skip_world:
        ranks = count_collectives(2, 2, 24, args.seed)
        print("\ncollectives per call on every rank of a gloo world DP 2 x CP 2 (megatron-core parallel_state)")
        for hook, target in (("advantages", "advantage_collectives"), ("tis", "tis_collectives")):
            per_rank = [sum(r[hook].values()) for r in ranks]
            kinds = sorted({k for r in ranks for k in r[hook]})
            print(f"  {hook:12s} {per_rank} ({', '.join(kinds)}); target <= {TARGETS[target]}  "
                  f"{verdict(max(per_rank) <= TARGETS[target])}")

    if not args.skip_time:
        time_host_work(args.seed, args.repeats)
        time_chunks(args.seed, args.repeats)  # first: the malloc setting below stays for the process
        batch = make_rollout(args.time_seqs, 1000, 16000, args.seed)
        tokens = sum(batch["response_lengths"])
        flat = torch.cat(batch["train"])
        calls = hook_calls(batch, list(range(args.time_seqs)))
        print(f"\nCPU time per call on {tokens:,} tokens in {args.time_seqs} responses, one thread, in elementwise "
              "passes (one torch.exp over the tokens; medians)")
        for setting in ("glibc malloc", "malloc keeping freed memory"):
            if setting != "glibc malloc" and not keep_freed_memory():
                break
            exp_ms = median_ms(lambda: torch.exp(flat), args.repeats)
            times = {hook: median_ms(call, args.repeats) for hook, call in calls.items()}
            print(f"  {setting:30s}" + "".join(f"{hook} {ms:7.2f} ms = {ms / exp_ms:5.1f} passes   "
                                              for hook, ms in times.items()))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
