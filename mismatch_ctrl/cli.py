"""``mismatch-ctrl``: the command line (also ``python -m mismatch_ctrl``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from .errors import ConfigError


def _check_config(ns: argparse.Namespace) -> int:
    from .config import load_config

    try:
        config = load_config(ns.path, architecture=ns.arch, num_experts=ns.num_experts, hf_config=ns.hf_config)
    except ConfigError as exc:
        print(f"mismatch-ctrl check-config: {exc}", file=sys.stderr)
        return 2
    if ns.json:
        print(json.dumps(config.as_dict(), indent=1))
    else:
        print(f"{ns.path}: OK (method {config.name!r}, architecture {config.architecture or 'unresolved'})")
    return 0


def _lab(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from .lab.methods import RunSpec
    from .lab.run import run_lab
    from .lab.trainer import LabSettings

    try:
        runs = [RunSpec.parse(m, ns.quant) for m in ns.methods.split(",") if m.strip()]
        if not runs:
            raise ValueError("--methods: give at least one METHOD[@QUANT]")
        settings = LabSettings(task=ns.task, steps=ns.steps, lr=ns.lr, seed=ns.seed, eval_every=ns.eval_every,
                               prompts_per_step=ns.prompts, samples_per_prompt=ns.samples,
                               dump_details=ns.dump_details)
    except (ValueError, ConfigError) as exc:
        print(f"mismatch-ctrl lab: {exc}", file=sys.stderr)
        return 2
    result = run_lab(runs, settings, Path(ns.out), jobs=ns.jobs, command="mismatch-ctrl lab " + " ".join(sys.argv[2:]),
                     cache_dir=ns.cache_dir)
    print(f"\nreport: {result.report}\nplots:  {result.plots[0].parent}/")
    return 0


def _analyze(ns: argparse.Namespace) -> int:
    from pathlib import Path

    from .analyze import AnalyzeOptions, DumpError, analyze_dumps, write_report

    options = AnalyzeOptions(config=ns.config, architecture=ns.arch, num_experts=ns.num_experts,
                             hf_config=ns.hf_config, eps=ns.eps, lambda_0=ns.lambda_0, eta=ns.eta,
                             max_response_len=ns.max_response_len)
    try:
        result = analyze_dumps(ns.directory, options)
    except (ConfigError, DumpError) as exc:
        print(f"mismatch-ctrl analyze: {exc}", file=sys.stderr)
        return 2
    report = write_report(result, Path(ns.out) if ns.out else Path(ns.directory) / "analysis",
                          command="mismatch-ctrl analyze " + " ".join(sys.argv[2:]))
    if ns.json == "-":
        print(json.dumps(result, indent=1))
    elif ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=1) + "\n")
    print(f"report: {report}", file=sys.stderr if ns.json == "-" else sys.stdout)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mismatch-ctrl",
        description="Control the training-inference mismatch of RL with FP8 rollouts (DC-GRPO, rollout correction, "
                    "length-triggered LR decay).")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check = sub.add_parser("check-config", help="validate a method YAML (the file given to --custom-config-path)",
                           description="Validate a YAML with a top-level 'mismatch_ctrl:' key and print the resolved "
                                       "settings. Exit 0 if valid, 2 with a message naming the key otherwise.")
    check.add_argument("path", help="YAML file, e.g. configs/methods/dcgrpo.yaml")
    arch = check.add_mutually_exclusive_group()
    arch.add_argument("--arch", choices=("dense", "moe"), help="architecture for the DC-GRPO defaults")
    arch.add_argument("--num-experts", type=int, help="Megatron --num-experts of the model (> 0 means MoE)")
    arch.add_argument("--hf-config", help="Hugging Face config.json (or model directory) to read the architecture from")
    check.add_argument("--json", action="store_true", help="print every resolved setting as JSON")
    check.set_defaults(run=_check_config)

    from .lab.run import DEFAULT_METHODS, default_jobs

    lab = sub.add_parser(
        "lab", help="CPU lab: FP8-engine RL on a tiny policy, every method through the slime hooks",
        description="Warm up a tiny transformer on a verifiable task (cached), then train it with GRPO from rollouts "
                    "of an FP8-quantised copy, once per method, calling mismatch_ctrl's slime hooks as slime does. "
                    "Writes OUT/report.md, OUT/plots/*.png and OUT/<run>/metrics.jsonl.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    lab.add_argument("--methods", default=DEFAULT_METHODS,
                     help="comma list of runs METHOD[@QUANT]; METHOD is a configs/methods file or a lab variant "
                          "(dcgrpo_tight_noguard, dcgrpo_tight_guard)")
    lab.add_argument("--quant", default="e4m3",
                     help="rollout engine quantisation for runs without @QUANT: e4m3 (weights, activations and LM "
                          "head), e4m3-w (weights only), e5m2, bf16, none")
    lab.add_argument("--task", default="add", help="add (reversed addition, ~5-token answers) or reverse (long "
                                                   "answers, 32-64 tokens: the stress task)")
    lab.add_argument("--steps", type=int, default=200, help="rollouts (training iterations) per run")
    lab.add_argument("--lr", type=float, default=1.5e-3,
                     help="Adam learning rate (1.5e-3: the edge of stability of the add task, see the README)")
    lab.add_argument("--seed", type=int, default=0, help="seed of prompts, sampling and data order")
    lab.add_argument("--prompts", type=int, default=32, help="prompts per rollout")
    lab.add_argument("--samples", type=int, default=8, help="samples per prompt")
    lab.add_argument("--eval-every", type=int, default=20, help="rollouts between held-out evaluations")
    lab.add_argument("--jobs", type=int, default=default_jobs(), help="runs trained in parallel (one thread each)")
    lab.add_argument("--out", default="runs/lab", help="output directory")
    lab.add_argument("--dump-details", action="store_true",
                     help="also write each rollout's batch in slime's --dump-details format to OUT/<run>/dump/ "
                          "(input of mismatch-ctrl analyze)")
    lab.add_argument("--cache-dir", default=None, help="warm-up cache (default $MISMATCH_CTRL_CACHE/lab or "
                                                       "~/.cache/mismatch_ctrl/lab)")
    lab.set_defaults(run=_lab)

    from .analyze.analysis import eps_option

    analyze = sub.add_parser(
        "analyze", help="calibrate eps and preview every controller on a slime run's --dump-details dumps",
        description="Read the dumps of a slime run (--dump-details DIR: DIR/train_data/{rollout_id}.pt and "
                    "DIR/rollout_data/{rollout_id}.pt) one rollout at a time; measure the training-inference "
                    "discrepancy per rollout, recommend eps, replay the DC-GRPO controller and the surge detector, "
                    "and give each IS/RS preset's rejections. Writes OUT/report.md and OUT/plots/*.png.")
    analyze.add_argument("directory", help="the --dump-details directory (or a directory of train dumps)")
    analyze.add_argument("--out", help="output directory (default DIRECTORY/analysis)")
    analyze_arch = analyze.add_mutually_exclusive_group()
    analyze_arch.add_argument("--arch", choices=("dense", "moe"), help="architecture for the DC-GRPO defaults "
                                                                       "(default moe, the recipe's model)")
    analyze_arch.add_argument("--num-experts", type=int, help="Megatron --num-experts of the model (> 0 means MoE)")
    analyze_arch.add_argument("--hf-config", help="Hugging Face config.json (or model directory) of the model")
    analyze.add_argument("--config", help="method YAML (or the name of one in configs/methods/) whose dcgrpo and "
                                          "lr_decay settings drive the replay (default dcgrpo_length_decay)")
    analyze.add_argument("--eps", type=eps_option, help="DC-GRPO budget for the replay: a number or 'auto'")
    analyze.add_argument("--lambda-0", type=float, help="initial DC-GRPO multiplier for the replay")
    analyze.add_argument("--eta", type=float, help="dual step size for the replay")
    analyze.add_argument("--max-response-len", type=int,
                         help="slime's --rollout-max-response-len: truncation rate (when the dump does not record "
                              "truncation) and the surge detector's cap (default: the longest truncated response)")
    analyze.add_argument("--json", metavar="PATH", help="also write every number of the report as JSON to PATH "
                                                        "('-': standard output)")
    analyze.set_defaults(run=_analyze)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return ns.run(ns)
