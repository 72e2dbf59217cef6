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
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    return ns.run(ns)
