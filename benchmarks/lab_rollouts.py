"""Rollouts per second of the lab's engine on the short and the long task, and how decoding time grows with length.

A rollout is ``--prompts`` x ``--samples`` sampled responses (the lab's default 32 x 8) from the engine of a
freshly initialised policy of ``--policy`` kind in ``--quant`` mode. To time answers of a known length the policy is
made never to stop: its final norm emits a constant feature that the LM head turns into a logit of -100 for EOS, so
every response runs to ``max_new_tokens``. Printed: per task (``add``: answers up to 6 tokens, ``reverse-long``: up
to 128), rollouts/s and generated tokens/s at the task's full answer length; then the time of one rollout on the long
task at 16, 32, 64 and 128 new tokens and the time per token, which stays flat when decoding reuses the KV cache
(cost linear in the answer length) and would grow with the length if every step recomputed the prefix.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mismatch_ctrl.lab.model.engine import RolloutEngine
from bench_options import PROMPTS, REPEATS, SAMPLES, THREADS  # benchmarks/ is this script's directory
from mismatch_ctrl.lab.sweeps.options import quant_list
from mismatch_ctrl.lab.model.policy import POLICY_KINDS, PolicyConfig, TinyPolicy
from mismatch_ctrl.lab.model.task import EOS
from mismatch_ctrl.lab.model.tasks import make_task


def never_stopping_policy(task_name: str, kind: str, seed: int = 0) -> TinyPolicy:
    """A random policy whose EOS logit is about -100 at every position (feature 0 of the final norm is 1)."""
    policy = TinyPolicy(PolicyConfig.of_kind(kind, make_task(task_name)), seed=seed)
    with torch.no_grad():
        policy.norm.weight[0] = 0.0
        policy.norm.bias[0] = 1.0
        policy.lm_head.weight[:, 0] = 0.0
        policy.lm_head.weight[EOS, 0] = -100.0
    return policy


def seconds_per_rollout(engine: RolloutEngine, prompts: torch.Tensor, samples: int, max_new: int,
                        repeats: int) -> float:
    """Median wall time of one ``generate`` call."""
    times = []
    for repeat in range(repeats):
        generator = torch.Generator().manual_seed(repeat)
        start = time.perf_counter()
        rollout = engine.generate(prompts, samples, 1.0, max_new, generator)
        times.append(time.perf_counter() - start)
        if int(rollout.response_lengths.min()) != max_new:
            raise RuntimeError("a response stopped early; the never-stopping policy did not hold")
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", choices=sorted(POLICY_KINDS), default="moe", help="policy kind (default: moe)")
    parser.add_argument("--quant", type=quant_list, default="e4m3", help="engine, one mode (default: e4m3)")
    parser.add_argument("--prompts", type=PROMPTS, default=32, help="prompts per rollout (default: 32)")
    parser.add_argument("--samples", type=SAMPLES, default=8, help="samples per prompt (default: 8)")
    parser.add_argument("--repeats", type=REPEATS, default=3, help="timing repeats, median (default: 3)")
    parser.add_argument("--threads", type=THREADS, default=1, help="torch threads (default: 1, the lab's)")
    args = parser.parse_args(argv)
    if "," in args.quant:
        parser.error("--quant: give one engine")
    torch.set_num_threads(args.threads)
    print(f"policy {args.policy}, engine {args.quant}, {args.prompts} prompts x {args.samples} samples, "
          f"{args.threads} thread(s)")
    for task_name in ("add", "reverse-long"):
        task = make_task(task_name)
        engine = RolloutEngine(never_stopping_policy(task_name, args.policy), args.quant)
        prompts = task.make_prompts(args.prompts, torch.Generator().manual_seed(0))
        seconds = seconds_per_rollout(engine, prompts, args.samples, task.max_response_len, args.repeats)
        tokens = args.prompts * args.samples * task.max_response_len
        print(f"{task_name:>13}: {task.max_response_len:4d} tokens per answer: {1 / seconds:7.2f} rollouts/s, "
              f"{tokens / seconds:9.0f} generated tokens/s")
    task = make_task("reverse-long")
    engine = RolloutEngine(never_stopping_policy("reverse-long", args.policy), args.quant)
    prompts = task.make_prompts(args.prompts, torch.Generator().manual_seed(0))
    print("reverse-long, answer length vs time of one rollout:")
    for max_new in (16, 32, 64, 128):
        seconds = seconds_per_rollout(engine, prompts, args.samples, max_new, args.repeats)
        print(f"  {max_new:4d} new tokens: {seconds:6.2f} s per rollout, {1e3 * seconds / max_new:6.1f} ms per "
              "decoding step")


if __name__ == "__main__":
    main()
