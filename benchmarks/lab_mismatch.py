"""Measure the CPU lab's training-inference mismatch per quantisation mode, and the speed of rollout and recompute.

After the (cached) warm-up, for each mode: sample ``--prompts`` x ``--samples`` responses with the engine, recompute
their log-probs with the fp32 policy, and print token means over response tokens of |p_train - p_rollout|,
|log ratio| and K3 (rho - 1 - log rho, rho = p_train / p_rollout), the engine's sample accuracy, and the median
seconds per rollout, per fp32 recompute and per weight sync.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from mismatch_ctrl.lab.engine import RolloutEngine
from mismatch_ctrl.lab.quant import QUANT_MODES
from mismatch_ctrl.lab.warmup import WARMUP_PRESETS, warmup_policy


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", choices=sorted(WARMUP_PRESETS), default="add", help="lab task (default: add)")
    parser.add_argument("--modes", nargs="+", choices=list(QUANT_MODES), default=list(QUANT_MODES),
                        help="quantisation modes to measure (default: all)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per rollout (default: 32)")
    parser.add_argument("--samples", type=int, default=8, help="samples per prompt (default: 8)")
    parser.add_argument("--batches", type=int, default=4, help="rollouts averaged for the mismatch (default: 4)")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats, median reported (default: 5)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, the lab's setting)")
    parser.add_argument("--cache-dir", default=None, help="warm-up cache directory (default: $MISMATCH_CTRL_CACHE/lab "
                        "or ~/.cache/mismatch_ctrl/lab)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    warm = warmup_policy(WARMUP_PRESETS[args.task], cache_dir=args.cache_dir, log=print)
    policy, task = warm.policy, warm.task
    print(
        f"task {task.name}: policy {policy.num_parameters()} parameters, warm-up {warm.steps} steps "
        f"({'cached' if warm.from_cache else f'{warm.seconds:.1f} s'}), fp32 sample accuracy "
        f"{warm.sample_accuracy:.3f}, greedy {warm.greedy_accuracy:.3f}"
    )
    print(f"{'mode':8} {'|dp|':>9} {'|log r|':>9} {'k3':>9} {'max|log r|':>10} {'acc':>6} "
          f"{'rollout s':>9} {'recomp s':>9} {'sync s':>8}")
    for mode in args.modes:
        engine = RolloutEngine(policy, quant=mode)
        generator = torch.Generator().manual_seed(args.seed)
        sums = torch.zeros(3)
        tokens, correct, samples, worst = 0, 0.0, 0, 0.0
        for _ in range(args.batches):
            prompts = task.make_prompts(args.prompts, generator)
            rollout = engine.generate(prompts, args.samples, 1.0, task.max_response_len, generator)
            mask = rollout.response_mask
            with torch.inference_mode():
                lp_train = policy.token_log_probs(rollout.tokens, rollout.prompt_len, mask)
            log_ratio = (lp_train - rollout.rollout_log_probs).clamp(-20, 20)[mask]
            prob_diff = (lp_train.exp() - rollout.rollout_log_probs.exp()).abs()[mask]
            k3 = log_ratio.exp() - 1 - log_ratio
            sums += torch.stack([prob_diff.sum(), log_ratio.abs().sum(), k3.sum()])
            worst = max(worst, log_ratio.abs().max().item())
            tokens += int(mask.sum())
            correct += task.reward(rollout.prompts, rollout.responses).sum().item()
            samples += rollout.prompts.shape[0]
        prompts = task.make_prompts(args.prompts, generator)
        rollout_s = median_seconds(
            lambda: engine.generate(prompts, args.samples, 1.0, task.max_response_len, generator), args.repeats
        )
        rollout = engine.generate(prompts, args.samples, 1.0, task.max_response_len, generator)

        def recompute() -> None:
            with torch.inference_mode():
                policy.token_log_probs(rollout.tokens, rollout.prompt_len, rollout.response_mask)

        recompute_s = median_seconds(recompute, args.repeats)
        sync_s = median_seconds(lambda: engine.sync(policy), args.repeats)
        dp, dl, k3 = (sums / tokens).tolist()
        print(f"{mode:8} {dp:9.2e} {dl:9.2e} {k3:9.2e} {worst:10.2e} {correct / samples:6.3f} "
              f"{rollout_s:9.4f} {recompute_s:9.4f} {sync_s:8.4f}")


if __name__ == "__main__":
    main()
