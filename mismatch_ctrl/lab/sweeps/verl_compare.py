"""``python -m mismatch_ctrl.lab.sweeps.verl_compare``: one lab run through the slime hooks and the same run through
the verl adapter (:class:`~mismatch_ctrl.lab.training.verl_trainer.VerlTrainer`: verl 0.9.1's own trainer code and
batch structures), then every logged number of every rollout side by side. Needs verl (``make verl-venv``; run it
with ``.venv-verl/bin/python``).

    .venv-verl/bin/python -m mismatch_ctrl.lab.sweeps.verl_compare --method dcgrpo --steps 20 --out runs/verl-compare

Methods: those whose computation the adapter owns (GRPO, DC-GRPO, length decay, their variants), and the correction
presets verl computes natively (``token_tis``, ``icepop``): both runs train with our correction (the slime hook), and
the verl run also computes verl's own correction on each rollout's batch and logs how far it lies from ours
(:mod:`~mismatch_ctrl.lab.training.verl_correction`); that gap is printed, never judged. A preset verl cannot express
is refused by name (exit 2). Exit 0 when every number both runs logged agrees to ``--rtol``, 1 otherwise, naming the
first that does not.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Sequence

from ..model.policy import POLICY_KINDS
from ..model.warmup import warmup_policy, warmup_preset
from ..training.methods import RunSpec, method_section
from ..training.settings import LabSettings
from ..training.trainer import Trainer


def differences(slime: list[dict], verl: list[dict]) -> dict[str, float]:
    """The largest relative difference of each metric both runs logged, over the rollouts (NaN only against NaN)."""
    out: dict[str, float] = {}
    for a, b in zip(slime, verl):
        for key in sorted(set(a) & set(b) - {"seconds", "step"}):
            x, y = float(a[key]), float(b[key])
            diff = 0.0 if (math.isnan(x) and math.isnan(y)) or x == y else \
                abs(x - y) / max(abs(x), abs(y), 1e-12) if math.isfinite(x) and math.isfinite(y) else math.inf
            out[key] = max(out.get(key, 0.0), diff)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mismatch_ctrl.lab.sweeps.verl_compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--method", default="dcgrpo", help="a lab method (configs/methods/ or a lab variant)")
    parser.add_argument("--quant", default="e4m3", help="the rollout engine (the lab's quantisation modes)")
    parser.add_argument("--policy", default="dense", choices=("dense", "moe"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=260)
    parser.add_argument("--rtol", type=float, default=1e-5,
                        help="largest relative difference allowed between the numbers both runs log (default 1e-5); "
                             "verl's correction against ours is reported, not held to it")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    from ..training.verl_correction import GAP, gap_report, native_correction  # imports verl
    from ..training.verl_trainer import VerlTrainer

    try:
        native_correction(method_section(args.method), POLICY_KINDS[args.policy].get("n_experts", 0))
    except ValueError as exc:
        parser.error(f"--method {args.method}: {exc}")

    settings = LabSettings(steps=args.steps, seed=args.seed, policy=args.policy)
    warm = warmup_policy(warmup_preset(settings.task, settings.policy, args.seed))
    state = {"policy_config": warm.policy.config.to_dict(), "state_dict": warm.policy.state_dict()}
    runs = {}
    for name, cls in (("slime", Trainer), ("verl", VerlTrainer)):
        out = args.out / name
        cls(RunSpec.parse(args.method, args.quant), settings, state, out).run()
        runs[name] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    worst = differences(runs["slime"], runs["verl"])
    for key, diff in sorted(worst.items(), key=lambda kv: -kv[1]):
        print(f"{key:<40} max relative difference {diff:.2e}")
    bad = [key for key, diff in worst.items() if not diff <= args.rtol]
    print(f"{len(worst)} metrics over {args.steps} rollouts: " +
          ("the adapters agree" if not bad else f"{len(bad)} differ beyond {args.rtol:g}, first {bad[0]}"))
    if any(key.startswith(GAP) for key in runs["verl"][0]):
        print(gap_report(runs["verl"], args.method))
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
