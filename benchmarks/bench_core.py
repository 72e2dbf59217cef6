"""Time the vectorised core on a realistic rollout batch against naive loops and one elementwise pass.

Two workloads on ~2M tokens (256 responses, lengths uniform in [1k, 16k]; CPU, fp32):

(a) DC-GRPO: ``TokenBatch.build`` from flat tensors, the sequence statistics of the signal, ``shape_advantages``, the
    batch reduction, ``LagrangeController.update``;
(b) Geo-MIS: ``apply_correction`` with the ``geo_rs_token_tis`` preset (geometric rejection + veto + token TIS, with
    every per-sequence metric and the weight diagnostics) and the batch summary.

Each is compared with the same math written as naive loops over the sequences: ``python`` (each sequence's tokens
as Python floats, the way tests/reference.py computes) and ``torch`` (torch ops on each sequence's slice), and with a
single ``torch.exp`` over the token tensor. Prints medians over repeats and the ratios loop/vectorised (target: at
least 10x the Python loop) and vectorised/exp (informational: it depends on the machine's ``exp``), first
with glibc's default malloc, then with malloc keeping freed memory (no page faults for fresh temporaries, as with the
CUDA caching allocator where the hooks run).
``--profile`` lists the operations that dominate the vectorised paths.

    python benchmarks/bench_core.py                 # defaults: 256 sequences, 9 repeats
    python benchmarks/bench_core.py --seqs 64 --repeats 3 --profile
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import statistics
import time
from typing import Callable

import torch

from bench_options import LENGTH, REPEATS, RESPONSES, SEED, THREADS, check_most, check_order  # benchmarks/
from glibc_malloc import keep_freed_memory
from mismatch_ctrl.batch import LOG_RATIO_BOUND, Segments, TokenBatch
from mismatch_ctrl.correction import apply_correction
from mismatch_ctrl.dcgrpo import DCGRPOSettings, LagrangeController, shape_advantages, shaping_columns
from mismatch_ctrl.dist import local_gather
from mismatch_ctrl.presets import PRESETS
from mismatch_ctrl.seqstats import SeqStats, reduce_batch

DC = DCGRPOSettings(enabled=True, lambda_0=0.05, eta=1.0, eps=0.005, lambda_max=1.0)
GEO = PRESETS["geo_rs_token_tis"]
LOOP_TARGET = 10.0
"""The vectorised core is at least this many times faster than the per-token Python loop."""


MAX_TOKENS = 1 << 25
"""The most tokens a benchmark batch may hold: 33M fp32 tokens are 128 MB a tensor, and the naive Python loop
over them takes about an hour on one core."""


def make_inputs(seqs: int, min_len: int, max_len: int, seed: int) -> dict[str, object]:
    """Flat fp32 log-probs of both engines (FP8-like mismatch ~1e-3, rare outliers), the loss mask (int, as slime's
    loss masks are), and one GRPO advantage per sequence."""
    g = torch.Generator().manual_seed(seed)
    sizes = torch.randint(min_len, max_len + 1, (seqs,), generator=g).tolist()
    train, rollout, mask = fp8_like_tokens(sum(sizes), g)
    advantages = torch.randn(seqs, generator=g)
    return dict(sizes=sizes, train=train, rollout=rollout, mask=mask, advantages=advantages)


def fp8_like_tokens(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``n`` tokens' training and rollout log-probs (a mix of confident and uncertain tokens, mismatch ~1e-3 as FP8
    rollouts give, a rare -10 outlier) and an int loss mask with ~2% untrained tokens."""
    confident = -torch.empty(n).exponential_(20.0, generator=g)
    uncertain = -torch.empty(n).exponential_(0.7, generator=g)
    rollout = torch.where(torch.rand(n, generator=g) < 0.7, confident, uncertain)
    train = (rollout + 1e-3 * torch.randn(n, generator=g)).clamp(max=0.0)
    train = torch.where(torch.rand(n, generator=g) < 1e-5, train - 10.0, train)
    return train, rollout, (torch.rand(n, generator=g) < 0.98).int()


# --- vectorised core -------------------------------------------------------------------------------------------------

def core_dcgrpo(x: dict) -> tuple[torch.Tensor, float]:
    batch = TokenBatch.build(Segments(x["sizes"]), x["train"], x["rollout"], x["mask"])
    ctrl = LagrangeController(DC)
    stats = SeqStats.build(batch, shaping_columns(DC, ctrl.eps))
    shaped = shape_advantages(stats, x["advantages"], DC, ctrl.shaping_lambda, ctrl.eps)
    reduce_batch(local_gather, shaped)
    ctrl.update(shaped.discrepancy)
    return shaped.advantages, ctrl.lam


def core_geo(x: dict, batch: TokenBatch) -> tuple[torch.Tensor, dict[str, float]]:
    result = apply_correction(GEO, batch)
    return result.weights, result.metrics.summary


# --- naive loops: Python floats per token ----------------------------------------------------------------------------

def python_dcgrpo(x: dict) -> tuple[list[float], float]:
    lam, eps = DC.lambda_0, DC.eps
    shaped: list[float] = []
    seq_means, tokens, sum_pen, sum_adv = [], 0.0, 0.0, 0.0
    for lt, lr, m, adv in zip(*(t.split(x["sizes"]) for t in (x["train"], x["rollout"], x["mask"])),
                              x["advantages"].tolist()):
        count = sum_c = 0.0
        for p, q, w in zip(lt.tolist(), lr.tolist(), m.tolist()):
            if not math.isfinite(p - q):
                p = q = w = 0.0
            c = abs(math.exp(p) - math.exp(q))
            shaped.append(adv - lam * c if w > 0 else adv)
            if w > 0:
                count += w
                sum_c += w * c
                sum_pen += w * abs(lam * c)
                sum_adv += w * abs(adv)
        if count > 0:
            seq_means.append(sum_c / count)
        tokens += count
    c_bar = sum(seq_means) / len(seq_means)
    _ = sum_pen / tokens / max(sum_adv / tokens, 1e-8)
    return shaped, min(max(lam + DC.eta * (c_bar - eps), 0.0), DC.lambda_max)


def python_geo(x: dict, batch: TokenBatch) -> tuple[list[float], dict[str, float]]:
    low, high, veto, cap = GEO.rs_low, GEO.rs_high, GEO.veto, GEO.is_high
    weights: list[float] = []
    rows = []
    for lt, lr, m in zip(*(t.split(x["sizes"]) for t in (x["train"], x["rollout"], x["mask"]))):
        ls, ms = [], []
        for p, q, w in zip(lt.tolist(), lr.tolist(), m.tolist()):
            d = p - q
            if not math.isfinite(d):
                d = w = 0.0
            ls.append(min(max(d, -LOG_RATIO_BOUND), LOG_RATIO_BOUND))
            ms.append(w)
        count = sum(ms)
        denom = max(count, 1.0)
        rhos = [math.exp(l) for l in ls]
        catastrophic = sum(1 for w, r in zip(ms, rhos) if w > 0 and r < veto)
        geo = math.exp(sum(w * l for w, l in zip(ms, ls)) / denom)
        rejected = catastrophic > 0 or not low <= geo <= high
        keep = [0.0 if rejected or w <= 0 else 1.0 for w in ms]
        w_seq = [min(r, cap) * k for r, k in zip(rhos, keep)]
        weights.extend(w_seq)
        rows.append((count, {
            "veto_seq_fraction": float(catastrophic > 0), "catastrophic_token_fraction": catastrophic / denom,
            "geometric_band_rejected_seq_fraction": float(not low <= geo <= high),
            "is_ratio_mean": sum(w * r for w, r in zip(ms, rhos)) / denom,
            "is_clip_high_fraction": sum(w for w, r in zip(ms, rhos) if r > cap) / denom,
            "is_weight_mean": sum(w_seq) / denom, "rejected_token_fraction": 1.0 - sum(keep) / denom,
            "rejected_seq_fraction": float(rejected and count > 0)}))
    valid = [row for count, row in rows if count > 0]
    summary = {k: sum(row[k] for row in valid) / len(valid) for k in valid[0]}
    summary["rejected_tokens"] = sum(row["rejected_token_fraction"] * max(count, 1.0) for count, row in rows)
    return weights, summary


# --- naive loops: torch ops per sequence -----------------------------------------------------------------------------

def torch_loop_dcgrpo(x: dict) -> tuple[torch.Tensor, float]:
    lam, eps = DC.lambda_0, DC.eps
    shaped = torch.empty_like(x["train"])
    seq_means, tokens, sum_pen, sum_adv = [], 0.0, 0.0, 0.0
    start = 0
    for n, a in zip(x["sizes"], x["advantages"].tolist()):
        lt, lr, m = (x[k][start:start + n] for k in ("train", "rollout", "mask"))
        finite = torch.isfinite(lt - lr)
        lt, lr, m = torch.where(finite, lt, 0.0), torch.where(finite, lr, 0.0), torch.where(finite, m, 0.0)
        c = (lt.exp() - lr.exp()).abs()
        shaped[start:start + n] = a - lam * c * m
        count = float(m.sum())
        if count > 0:
            seq_means.append(float((c * m).sum()) / count)
        tokens += count
        sum_pen += float((lam * c * m).abs().sum())
        sum_adv += abs(a) * count
        start += n
    c_bar = sum(seq_means) / len(seq_means)
    _ = sum_pen / tokens / max(sum_adv / tokens, 1e-8)
    return shaped, min(max(lam + DC.eta * (c_bar - eps), 0.0), DC.lambda_max)


def torch_loop_geo(x: dict, batch: TokenBatch) -> tuple[torch.Tensor, dict[str, float]]:
    low, high, veto, cap = GEO.rs_low, GEO.rs_high, GEO.veto, GEO.is_high
    weights = torch.empty_like(batch.mask)
    rows = []
    start = 0
    for n in x["sizes"]:
        l, m = batch.log_ratio[start:start + n], batch.mask[start:start + n]
        count = float(m.sum())
        denom = max(count, 1.0)
        rho = l.exp()
        catastrophic = float(((rho < veto).float() * m).sum())
        geo = math.exp(float((l * m).sum()) / denom)
        rejected = catastrophic > 0 or not low <= geo <= high
        keep = m * (0.0 if rejected else 1.0)
        w = rho.clamp(max=cap) * keep
        weights[start:start + n] = w
        rows.append((count, [float(catastrophic > 0), catastrophic / denom, float(not low <= geo <= high),
                             float((rho * m).sum()) / denom, float(((rho > cap).float() * m).sum()) / denom,
                             float(w.sum()) / denom, 1.0 - float(keep.sum()) / denom, float(rejected)]))
        start += n
    valid = [row for count, row in rows if count > 0]
    return weights, {"means": [sum(col) / len(valid) for col in zip(*valid)]}


# --- timing ----------------------------------------------------------------------------------------------------------

def measure(fns: dict[str, Callable[[], object]], repeats: int) -> dict[str, tuple[float, float]]:
    """Median wall-clock and process-CPU milliseconds of each function; the functions take turns in every repeat, so a
    change of machine load affects them alike."""
    for fn in fns.values():
        fn()  # warm-up
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            samples[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return {name: (1e3 * statistics.median(w for w, _ in v), 1e3 * statistics.median(c for _, c in v))
            for name, v in samples.items()}


def check_same_math(x: dict, batch: TokenBatch) -> None:
    """The loops compute what the core computes (so the timings compare like with like)."""
    shaped, lam = core_dcgrpo(x)
    py_shaped, py_lam = python_dcgrpo(x)
    t_shaped, t_lam = torch_loop_dcgrpo(x)
    torch.testing.assert_close(torch.tensor(py_shaped), shaped, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t_shaped, shaped)
    assert math.isclose(py_lam, lam, rel_tol=1e-4) and math.isclose(t_lam, lam, rel_tol=1e-4)
    weights, summary = core_geo(x, batch)
    py_weights, py_summary = python_geo(x, batch)
    t_weights, _ = torch_loop_geo(x, batch)
    torch.testing.assert_close(torch.tensor(py_weights), weights, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(t_weights, weights)
    for name in ("is_weight_mean", "rejected_seq_fraction", "is_ratio_mean"):
        assert math.isclose(py_summary[name], summary[name], rel_tol=1e-4, abs_tol=1e-6), name


def profile(x: dict, batch: TokenBatch, rows: int = 12) -> None:
    from torch.profiler import ProfilerActivity, profile as torch_profile

    for name, fn in (("(a) DC-GRPO", lambda: core_dcgrpo(x)), ("(b) Geo-MIS", lambda: core_geo(x, batch))):
        fn()
        with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(3):
                fn()
        print(f"\nprofile {name} (3 calls; self CPU time per op)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


def main() -> None:
    summary, details = __doc__.split("\n\n", 1)
    parser = argparse.ArgumentParser(description=summary, epilog=details,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seqs", type=RESPONSES, default=256, help="number of responses (default 256)")
    parser.add_argument("--min-len", type=LENGTH, default=1000, help="shortest response in tokens (default 1000)")
    parser.add_argument("--max-len", type=LENGTH, default=16000, help="longest response in tokens (default 16000)")
    parser.add_argument("--repeats", type=REPEATS, default=9, help="timed repeats of the vectorised paths (default 9)")
    parser.add_argument("--loop-repeats", type=REPEATS, default=3, help="timed repeats of the loops (default 3)")
    parser.add_argument("--threads", type=THREADS, default=1,
                        help="torch threads (default 1: the targets are per thread, as make bench runs it)")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--no-check", action="store_true", help="skip checking that the loops match the core")
    parser.add_argument("--profile", action="store_true", help="print the ops that dominate the vectorised paths")
    args = parser.parse_args()
    check_order(parser, ("--min-len", args.min_len), ("--max-len", args.max_len))
    check_most(parser, "--seqs x --max-len", args.seqs * args.max_len, MAX_TOKENS,
               "the tokens of the batch at their longest (the Python loop visits each)")
    torch.set_num_threads(args.threads)

    x = make_inputs(args.seqs, args.min_len, args.max_len, args.seed)
    batch = TokenBatch.build(Segments(x["sizes"]), x["train"], x["rollout"], x["mask"])
    if not args.no_check:
        check_same_math(x, batch)
    exp = measure({"exp": lambda: torch.exp(x["train"])}, args.repeats)["exp"]
    vectorised = {"a": lambda: core_dcgrpo(x), "b": lambda: core_geo(x, batch)}
    fast = measure(vectorised, args.repeats)
    kept = measure(vectorised, args.repeats) if keep_freed_memory() else None
    loops = measure({"a python": lambda: python_dcgrpo(x), "a torch": lambda: torch_loop_dcgrpo(x),
                     "b python": lambda: python_geo(x, batch), "b torch": lambda: torch_loop_geo(x, batch)},
                    args.loop_repeats)

    print(f"bench_core  {datetime.datetime.now().isoformat(timespec='seconds')}  torch {torch.__version__}  "
          f"threads {torch.get_num_threads()}  load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"{sum(x['sizes']):,} tokens in {args.seqs} responses (lengths {args.min_len}..{args.max_len}), fp32 CPU; "
          f"medians of {args.repeats} repeats (loops: {args.loop_repeats})")
    print(f"\n{'':50s}{'wall ms':>10s}{'cpu ms':>10s}{'loop/vec':>10s}{'vec/exp':>9s}")
    print(f"{'one torch.exp over the tokens':50s}{exp[0]:10.2f}{exp[1]:10.2f}")
    for key, label in (("a", "(a) signals + DC-GRPO shaping + dual update"),
                       ("b", "(b) Geo-MIS: geo_rs_token_tis + metrics")):
        vec_ms = fast[key][0]
        print(f"{label:50s}{vec_ms:10.2f}{fast[key][1]:10.2f}{'':10s}{vec_ms / exp[0]:8.1f}x")
        if kept is not None:
            print(f"{'    same, malloc keeping freed memory':50s}{kept[key][0]:10.2f}{kept[key][1]:10.2f}{'':10s}"
                  f"{kept[key][0] / exp[0]:8.1f}x")
        for kind, text in (("python", "Python floats per token"), ("torch", "torch ops per sequence")):
            wall, cpu = loops[f"{key} {kind}"]
            ratio = wall / vec_ms
            print(f"{'    naive loop, ' + text:50s}{wall:10.1f}{cpu:10.1f}{ratio:9.1f}x"
                  f"{('  ' + ('pass' if ratio >= LOOP_TARGET else 'FAIL')) if kind == 'python' else ''}")
    print(f"\nloop/vec: naive loop / vectorised (target for the Python loop >= {LOOP_TARGET:g}x); vec/exp: "
          "vectorised / one torch.exp, informational only: it depends on the speed of the machine's exp (6-8 on the "
          "machine of the first measurement, 50-70 on another), the hooks' GPU targets are in bench_gpu.py.")
    print("'malloc keeping freed memory': the same code without page faults for fresh temporaries (as with a caching "
          "allocator).")
    if args.profile:
        profile(x, batch)


if __name__ == "__main__":
    main()
