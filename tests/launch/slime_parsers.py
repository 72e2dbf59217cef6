"""Stand-ins for the three functions slime 624b824a parses ``train.py``'s arguments with, written to its documented
contract (``mismatch_ctrl.launch.flags``): each builds an argparse parser and calls ``parse_known_args`` on
``sys.argv``; the pre-parser and Megatron's parser with ``allow_abbrev=False``, the SGLang parser (and its helper for
the tensor-parallel default, which divides by ``--sglang-pp-size``) with argparse's default abbreviations.
Megatron's ``parse_args`` fails after it has parsed, as its validation can on a machine without GPUs. Few flags:
enough to test the rules."""

from __future__ import annotations

from pathlib import Path

SLIME_ARGUMENTS = '''
import argparse


def _pre_parse_mode():
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--debug-rollout-only", action="store_true")
    parser.add_argument("--debug-train-only", action="store_true")
    parser.add_argument("--load-debug-rollout-data", default=None)
    return parser.parse_known_args()[0]


def get_slime_extra_args_provider(add_custom_arguments=None):
    def add_slime_arguments(parser):
        parser.add_argument("--rollout-max-response-len", type=int)
        parser.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
        parser.add_argument("--rollout-num-gpus", type=int)
        parser.add_argument("--hf-checkpoint")
        return parser
    return add_slime_arguments
'''

SGLANG_ARGUMENTS = '''
import argparse


def sglang_parse_args():
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--sglang-context-length", type=int)
    parser.add_argument("--sglang-mem-fraction-static", type=float)
    parser.add_argument("--sglang-max-running-requests", type=int)
    parser.add_argument("--sglang-json-model-override-args", default="{}")
    temp_parser = argparse.ArgumentParser(add_help=False)
    temp_parser.add_argument("--rollout-num-gpus-per-engine", type=int, default=1)
    temp_parser.add_argument("--sglang-pp-size", type=int, default=1)
    temp_args, _ = temp_parser.parse_known_args()
    parser.set_defaults(sglang_tensor_parallel_size=temp_args.rollout_num_gpus_per_engine // temp_args.sglang_pp_size)
    return parser.parse_known_args()[0]
'''

MEGATRON_ARGUMENTS = '''
import argparse


def parse_args(extra_args_provider=None, ignore_unknown_args=False):
    parser = argparse.ArgumentParser(description="Megatron-LM Arguments", allow_abbrev=False)
    parser.add_argument("--micro-batch-size", type=int)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--initial-loss-scale", type=float, default=2**32)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    if ignore_unknown_args:
        args, _ = parser.parse_known_args()
    else:
        args = parser.parse_args()
    raise RuntimeError("validation needs torch.distributed")
'''


def write_parsers(slime_dir: Path, megatron_dir: Path) -> None:
    """The stand-ins into a slime checkout (``slime_dir/slime/...``) and a Megatron-LM one
    (``megatron_dir/megatron/...``)."""
    files = {slime_dir / "slime" / "utils" / "arguments.py": SLIME_ARGUMENTS,
             slime_dir / "slime" / "backends" / "sglang_utils" / "arguments.py": SGLANG_ARGUMENTS,
             megatron_dir / "megatron" / "training" / "arguments.py": MEGATRON_ARGUMENTS}
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        for package in (path.parent, *path.parent.parents):
            if package in (slime_dir, megatron_dir):
                break
            if not (package / "__init__.py").exists():
                (package / "__init__.py").write_text("")
        path.write_text(text)
