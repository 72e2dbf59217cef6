"""How fast could a TIS hook call be on a GPU? The least a fused correction costs, next to the hook's call.

The TIS hook's target is at most 0.5 ms at 22k tokens. The hook takes 3.6-6.7 ms on an H200, almost all of it
host work: ~300 aten ops and ~1200 Python calls (docs/performance.md). This script measures the floor a fused
rewrite could reach. It takes the hook's correction alone, ``geo_rs_token_tis`` with no metrics: geometric
rejection outside [0.999, 1.001], a veto below 1e-4, token IS truncated at 2. It writes that as one function of
flat tensors, about 20 ops (:func:`fused_geo_rs_token_tis`), and times it three ways:

- **eager**: each op dispatched from Python;
- **compiled**: ``torch.compile(dynamic=True)``, one compile for every token and sequence count;
- **graph**: a CUDA graph replay at one fixed shape, after copying the inputs in. A hook would have to pad each
  micro-batch to a fixed bucket to use it.

Next to these: the hook's call with every metric, and one pass over the log-probs. The inputs are slime-shaped,
with every 4th response pushed out of the geometric band, so that sequences are rejected. Before timing, the fused
function's ``pg_loss`` must equal the hook's to 1e-6 (relative), or the script stops: the floor is the same
computation. It leaves out what a hook also does: the input check and its host sync, flattening slime's lists, the
sequence index, and autograd's record of the multiplication. Without CUDA it checks the equality on the CPU, says
that nothing was timed, and exits 0.

    python benchmarks/bench_fused.py                       # 8 x 1k-4k and 64 x 100-600 tokens
    python benchmarks/bench_fused.py --json fused.json     # also write the numbers as JSON
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any, Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the source tree, where mismatch_ctrl is not installed (the device machine's python3)
    sys.path.insert(0, str(ROOT))

from bench_gpu import median_ms, on_cuda, on_gpu, options  # noqa: E402 (benchmarks/)
from bench_hooks import local_view, make_args, make_rollout, tis_call  # noqa: E402
from mismatch_ctrl.batch import LOG_RATIO_BOUND  # noqa: E402
from mismatch_ctrl.presets import PRESETS  # noqa: E402

PRESET = "geo_rs_token_tis"
CASES = [(8, 1000, 4000), (64, 100, 600)]
"""(responses, min length, max length): the TIS cases of ``bench_gpu.py`` at about 22k tokens."""
TOLERANCE = 1e-6
"""Largest difference from the hook's ``pg_loss`` (:func:`difference`)."""
REJECTED_EVERY = 4
"""Every 4th response of a timed case is pushed out of the geometric band (half above, half below), so the timed
calls reject sequences as the hook's would."""


def difference(expected: torch.Tensor, found: torch.Tensor) -> float:
    """Largest difference, relative where a value exceeds 1 in size (float32 rounding: the hook forms ``rho`` as
    ``expm1(l) m + m``, the fused function as ``exp(l)``)."""
    return ((expected - found).abs() / expected.abs().clamp_min(1.0)).max().item()


def fused_geo_rs_token_tis(pg_loss: torch.Tensor, train: torch.Tensor, rollout: torch.Tensor, mask: torch.Tensor,
                           seq: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """``pg_loss`` corrected as the ``geo_rs_token_tis`` preset corrects it (docs/algorithms.md, rollout correction).

    Inputs are flat token tensors, with ``seq`` the index of each token's sequence. ``l = train - rollout``
    clamped to [-20, 20] at trained tokens (``m = 1``), 0 elsewhere. A
    sequence is rejected when its geometric mean ``sum_t m l / max(sum_t m, 1)`` leaves ``[log 0.999, log 1.001]``,
    or when one of its trained tokens has ``l < log 1e-4`` (the veto). A kept trained token is weighted by
    ``min(exp(l), 2)``; every other token's loss is 0."""
    spec = PRESETS[PRESET]
    lo, hi = math.log(spec.rs_low), math.log(spec.rs_high)
    log_ratio = torch.where(mask > 0, (train - rollout).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND), 0.0)
    per_seq = torch.zeros(3, num_seqs, dtype=log_ratio.dtype, device=log_ratio.device)
    per_seq.index_add_(1, seq, torch.stack([log_ratio, mask, (log_ratio < math.log(spec.veto)).to(mask.dtype)]))
    geometric = per_seq[0] / per_seq[1].clamp_min(1)
    keep_seq = ((geometric - (lo + hi) / 2).abs() <= (hi - lo) / 2) & (per_seq[2] == 0)
    weight = torch.exp(log_ratio).clamp_max(spec.is_high) * mask * keep_seq[seq].to(mask.dtype)
    return (pg_loss * weight.to(pg_loss.dtype)).masked_fill_(weight == 0, 0.0)


def flat_inputs(view: dict[str, Any], pg_loss: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The fused function's inputs from a slime-shaped view (one data-parallel rank, no context parallelism)."""
    lengths = torch.tensor(view["response_lengths"], device=pg_loss.device)
    seq = torch.repeat_interleave(torch.arange(len(lengths), device=pg_loss.device), lengths)
    return (pg_loss, torch.cat(view["log_probs"]), torch.cat(view["rollout_log_probs"]),
            torch.cat(view["loss_masks"]).to(pg_loss.dtype), seq, len(lengths))


def graph_call(fn: Callable[..., torch.Tensor], inputs: tuple[torch.Tensor, ...]) -> Callable[[], torch.Tensor]:
    """``fn`` captured in a CUDA graph on copies of ``inputs``; each call copies the inputs in and replays it."""
    *tensors, num_seqs = inputs
    static = [t.clone() for t in tensors]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up outside the capture, as torch.cuda.graphs asks
        for _ in range(3):
            fn(*static, num_seqs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn(*static, num_seqs)

    def call() -> torch.Tensor:
        for target, source in zip(static, tensors):
            target.copy_(source, non_blocking=True)
        graph.replay()
        return out
    return call


def case(seqs: int, min_len: int, max_len: int, seed: int, device: str) -> tuple[dict[str, Any], Callable, tuple]:
    """One case: its hook call and fused inputs, after checking that both give the same ``pg_loss``."""
    view = local_view(make_rollout(seqs, min_len, max_len, seed), list(range(seqs)))
    rollout = [t.clone() for t in view["rollout_log_probs"]]
    for i in range(0, seqs, REJECTED_EVERY):  # the geometric ratio exp(+-0.01) leaves [0.999, 1.001]
        rollout[i] -= 0.01 if i % (2 * REJECTED_EVERY) else -0.01
        rollout[i].clamp_(max=0.0)
    view["rollout_log_probs"] = rollout
    if device == "cuda":
        view = on_gpu(view)
    args = make_args({"name": PRESET, "correction": {"preset": PRESET}})
    hook = tis_call(args, view)
    pg_loss = torch.cat(view["log_probs"]).neg()
    inputs = flat_inputs(view, pg_loss)
    largest = difference(hook()[0].detach(), fused_geo_rs_token_tis(*inputs))
    if not largest <= TOLERANCE:
        raise SystemExit(f"bench_fused: the fused correction differs from the hook's by {largest:.3g} at {seqs} "
                         f"responses of {min_len}-{max_len} tokens: fix fused_geo_rs_token_tis before timing it")
    kept = fused_geo_rs_token_tis(torch.ones_like(pg_loss), *inputs[1:]) != 0
    rejected = 1.0 - float(kept.sum()) / float((inputs[3] > 0).sum())
    row = {"responses": seqs, "lengths": [min_len, max_len], "tokens": pg_loss.numel(), "max_difference": largest,
           "rejected_token_fraction": rejected}
    return row, hook, inputs


def measure(repeats: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    compiled = torch.compile(fused_geo_rs_token_tis, dynamic=True)
    for seqs, min_len, max_len in CASES:
        row, hook, inputs = case(seqs, min_len, max_len, seed, "cuda")
        a, b = inputs[1], inputs[2]
        calls = {"hook": hook, "eager": lambda: fused_geo_rs_token_tis(*inputs), "compiled": lambda: compiled(*inputs),
                 "graph": graph_call(fused_geo_rs_token_tis, inputs),
                 "pass": lambda: (torch.exp(a) - torch.exp(b)).abs().sum()}
        row["compiled_max_difference"] = difference(fused_geo_rs_token_tis(*inputs), compiled(*inputs))
        for name, call in calls.items():
            for _ in range(3):
                call()
            row[f"{name}_ms"] = median_ms(call, repeats)
        rows.append(row)
    return rows


def report(rows: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'responses':>9s}{'tokens':>9s}{'hook':>9s}{'eager':>9s}{'compiled':>10s}{'graph':>9s}{'1 pass':>9s}"
             "  (ms per call; fused = the correction alone, equal to the hook's pg_loss)"]
    for r in rows:
        lines.append(f"{r['responses']:9d}{r['tokens']:9,d}{r['hook_ms']:9.3f}{r['eager_ms']:9.3f}"
                     f"{r['compiled_ms']:10.3f}{r['graph_ms']:9.3f}{r['pass_ms']:9.3f}")
    return lines


def main() -> None:
    args = options(__doc__, 50, "variant")
    if not torch.cuda.is_available():
        rows = [case(seqs, lo, hi, args.seed, "cpu")[0] for seqs, lo, hi in CASES]
        print("bench_fused: no CUDA GPU here: the fused correction equals the hook's on the CPU (max difference "
              f"{max(r['max_difference'] for r in rows):.2g}); nothing timed (run it on a GPU machine, e.g. "
              "`make gpu-check`)")
        return
    on_cuda("bench_fused", lambda: measure(args.repeats, args.seed), report, args.json)


if __name__ == "__main__":
    main()
