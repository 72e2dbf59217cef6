"""The CPU lab's training-inference mismatch floor per policy kind and quantisation mode, with and without routing
replay, over seeds; and the speed of rollout, recompute and weight sync.

For each policy kind (dense, MoE) and seed: the (cached) warm-up of that seed; then for each mode, ``--rollouts``
rollouts of ``--prompts`` x ``--samples`` from the engine, each recomputed by the trainer (the fp32 policy, or the
precision a ``+train-bf16`` / ``+train-fp16`` mode names) with its own routing and
with the engine's expert sets (R3, MoE only; paired on the same tokens). Printed per policy and mode as mean
[min, max] over seeds: the floor (median ``C_bar`` over the rollouts, what DC-GRPO's eps guard and ``eps: auto``
measure), the floor with R3, the paired reduction by R3, the tails of ``|log ratio|`` (99th percentile, maximum) with
and without R3, the routing flip fraction of response and prompt positions, and the mean ``|p_train - p_rollout|``
of tokens whose routing flipped and of the others. ``--json PATH`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch

from mismatch_ctrl.lab.results.stats import spread
from mismatch_ctrl.lab.model.engine import RolloutEngine
from mismatch_ctrl.lab.model.floor import measure_floor
from bench_options import (  # benchmarks/ is this script's directory
    PROMPTS, REPEATS, SAMPLES, THREADS, bounded_int, check_output_file)
from mismatch_ctrl.lab.sweeps.options import seed_list
from mismatch_ctrl.lab.model.policy import POLICY_KINDS
from mismatch_ctrl.lab.model.quant import QUANT_MODES, QuantConfig
from mismatch_ctrl.lab.model.warmup import WARMUP_PRESETS, warmup_policy, warmup_preset

COLUMNS = [
    ("floor", "floor"), ("floor_r3", "floor R3"), ("replay_reduction", "R3 cut"),
    ("log_ratio_abs_p99", "p99 abs(lr)"), ("log_ratio_abs_p99_r3", "p99 R3"), ("log_ratio_abs_max", "max abs(lr)"),
    ("log_ratio_abs_max_r3", "max R3"), ("routing_flip_fraction", "flips"), ("routing_flip_fraction_prompt", "prompt"),
    ("discrepancy_flipped", "abs(dp) flip"), ("discrepancy_unflipped", "abs(dp) other"),
    ("geo_log_ratio_abs_p99", "geo p99"),
]


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    s = spread(values)
    return f"{s.mean:.3g} [{s.min:.3g}, {s.max:.3g}]" if s.n > 1 else f"{s.mean:.3g}"


def quant_mode(text: str) -> str:
    """An engine mode (``QuantConfig.from_mode``), by its canonical name."""
    try:
        return QuantConfig.from_mode(text).mode
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(WARMUP_PRESETS), default="add", help="lab task (default: add)")
    parser.add_argument("--policies", nargs="+", choices=sorted(POLICY_KINDS), default=["dense", "moe"],
                        help="policy kinds (default: dense moe)")
    parser.add_argument("--modes", nargs="+", type=quant_mode, default=["none", "bf16", "e4m3", "e5m2"],
                        help=f"engines: modes of {', '.join(QUANT_MODES)}, with suffixes as mismatch-ctrl lab --quant "
                             "takes them (+router, +tempX, +train-bf16 / +train-fp16: the trainer's precision) "
                             "(default: none bf16 e4m3 e5m2)")
    parser.add_argument("--seeds", type=seed_list, default=(0, 1, 2), help="warm-up and sampling seeds (default: "
                        "0,1,2)")
    parser.add_argument("--rollouts", type=bounded_int(1, 10000, "rollouts measured per policy, mode and seed"),
                        default=10,
                        help="rollouts per policy, mode and seed (default: 10)")
    parser.add_argument("--prompts", type=PROMPTS, default=32, help="prompts per rollout (default: 32)")
    parser.add_argument("--samples", type=SAMPLES, default=8, help="samples per prompt (default: 8)")
    parser.add_argument("--repeats", type=REPEATS, default=5, help="timing repeats, median reported (default: 5)")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (default: 1, the lab's setting)")
    parser.add_argument("--cache-dir", default=None, help="warm-up cache directory (default: $MISMATCH_CTRL_CACHE/lab "
                        "or ~/.cache/mismatch_ctrl/lab)")
    parser.add_argument("--json", help="write every number to this file")
    args = parser.parse_args(argv)
    check_output_file(parser, "--json", args.json)
    torch.set_num_threads(args.threads)

    results: dict[str, dict[str, list[dict]]] = {}
    for kind in args.policies:
        warm_rows = []
        for seed in args.seeds:
            warm = warmup_policy(warmup_preset(args.task, kind, seed), cache_dir=args.cache_dir)
            policy, task = warm.policy, warm.task
            warm_rows.append((warm.greedy_accuracy, warm.sample_accuracy))
            for mode in args.modes:
                floor = measure_floor(policy, task, mode, args.rollouts, args.prompts, args.samples, seed)
                results.setdefault(f"{kind}@{mode}", {}).setdefault("seeds", []).append(floor)
        print(f"{kind}: {policy.num_parameters()} parameters; warm-up greedy accuracy "
              f"{cell([g for g, _ in warm_rows])}, sample accuracy {cell([s for _, s in warm_rows])}")
        engine = RolloutEngine(policy, "e4m3")
        generator = torch.Generator().manual_seed(0)
        prompts = task.make_prompts(args.prompts, generator)
        rollout = engine.generate(prompts, args.samples, 1.0, task.generation_len, generator)

        def recompute() -> None:
            with torch.inference_mode():
                policy.score(rollout.tokens, rollout.prompt_len, rollout.response_mask)

        rollout_s = median_seconds(lambda: engine.generate(prompts, args.samples, 1.0, task.generation_len,
                                                           generator), args.repeats)
        print(f"  e4m3 engine: rollout {rollout_s:.4f} s, fp32 recompute {median_seconds(recompute, args.repeats):.4f}"
              f" s, weight sync {median_seconds(lambda: engine.sync(policy), args.repeats):.4f} s")

    print(f"\nmean [min, max] over seeds {','.join(map(str, args.seeds))}; {args.rollouts} rollouts of "
          f"{args.prompts} x {args.samples} per seed; floor = median C_bar over the rollouts")
    print("| run | " + " | ".join(title for _, title in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for name, entry in results.items():
        values = []
        for key, _ in COLUMNS:
            per_seed = [s.get(key, s["medians"].get(key)) for s in entry["seeds"]]
            values.append(cell([v for v in per_seed if v is not None]))
        print(f"| {name} | " + " | ".join(values) + " |")
    for mode in args.modes:
        dense, moe = results.get(f"dense@{mode}"), results.get(f"moe@{mode}")
        if dense and moe and mode != "none":
            d = statistics.fmean(s["floor"] for s in dense["seeds"])
            m = statistics.fmean(s["floor"] for s in moe["seeds"])
            print(f"{mode}: MoE floor / dense floor = {m / d:.2f} (means {m:.4g} / {d:.4g})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "json"}, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
