"""Options of ``mismatch-ctrl lab``: defaults, named presets, and value parsers whose errors argparse reports with
the flag's name (exit status 2, before any warm-up)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from ...formatting import brief, clip
from ..model.policy import POLICY_KINDS
from ..model.quant import QUANT_MODES, as_quant_config

DEFAULT_METHODS = "grpo@none,grpo,grpo+r3,dcgrpo,token_tis,geo_rs_e4m3"

LAB_DEFAULTS: dict[str, Any] = {
    "methods": DEFAULT_METHODS, "quant": "e4m3", "policy": "moe", "task": "add", "steps": 200, "lr": 1e-3,
    "seeds": (0,), "prompts": 32, "samples": 8, "eval_every": 20, "num_steps_per_rollout": 2,
}
"""The lab's defaults: the MoE comparison on the add task, one seed, at lr 1e-3, the rate of the research grid
(docs/lab-search.md), where GRPO learns fast and sits near the edge where training turns unstable (from 1.25e-3 the
exact engine itself collapses). ``make demo`` runs them at half that rate (the ``demo`` preset)."""

POLICY_DEFAULTS: dict[str, dict[str, Any]] = {"moe-large": {"lr": 1e-4}}
"""Per policy kind, the defaults that differ from ``LAB_DEFAULTS`` (a flag or a preset still decides). ``moe-large``
learns at lr 1e-4; at the lab's 1e-3 its first updates wreck the warmed-up policy even on the exact engine (below,
``gpu-moe``; on an H200, 2026-11-27, every one of the demo's six runs on ``moe-large`` at 1e-3 ended at accuracy 0)."""

LAB_PRESETS: dict[str, dict[str, Any]] = {
    "demo": {"lr": 5e-4},
    "demo-seeds": {"seeds": (0, 1, 2, 3, 4)},
    "e5m2-edge": {"quant": "e5m2", "lr": 1.5e-3, "seeds": (0, 1, 2, 3, 4),
                  "methods": "grpo@none,grpo,grpo+r3,dcgrpo,token_tis,geo_rs_e5m2,length_decay"},
    "reverse-e5m2": {"task": "reverse", "quant": "e5m2", "steps": 100, "seeds": (0, 1, 2, 3, 4),
                     "methods": "grpo@none,grpo,grpo+r3,dcgrpo"},
    "frontier": {"methods": "grpo@none,grpo,token_tis,icepop,geo_rs_e4m3,grpo+r3,dcgrpo,length_decay",
                 "quant": "temp1.003,e4m3,e5m2,int4,nvfp4,temp1.3", "steps": 120, "seeds": (0, 1, 2, 3, 4)},
    "offpolicy": {"methods": "grpo@none,grpo,grpo+r3,token_tis", "quant": "e4m3,nvfp4", "steps": 120,
                  "num_steps_per_rollout": 4, "seeds": tuple(range(10))},
    "gpu-moe": {"policy": "moe-large", "quant": "nvfp4", "methods": "grpo@none,grpo,grpo+r3", "steps": 120,
                "num_steps_per_rollout": 4, "lr": 1e-4, "seeds": tuple(range(40, 48))},
    "precision": {"methods": "grpo@none,grpo@bf16+train-bf16,grpo@fp16+train-fp16,grpo@e4m3+train-bf16,"
                             "grpo@e4m3+train-bf16+r3,grpo@nvfp4+train-bf16,grpo@nvfp4+train-bf16+r3",
                  "steps": 120, "num_steps_per_rollout": 4, "seeds": tuple(range(150, 156))},
    "surge": {"task": "digitsum", "lr": 5e-4, "steps": 120, "quant": "e4m3", "seeds": tuple(range(70, 75)),
              "methods": "grpo@none,grpo,length_decay,grpo@nvfp4"},
    "surge-compare": {"task": "digitsum", "lr": 5e-4, "steps": 120, "quant": "none,nvfp4",
                      "seeds": tuple(range(75, 85)),
                      "methods": "grpo,length_decay,grpo_lr_half,dcgrpo@nvfp4,token_tis@nvfp4,geo_rs_nvfp4@nvfp4,"
                                 "grpo@nvfp4+r3,grpo@mxfp4"},
}
"""Named settings (``--preset``); explicit flags override them. ``demo``: ``make demo``, the defaults at lr 5e-4,
2.5x below the unstable edge, so that which runs collapse is not decided by a machine's rounding (at 1e-3 one seed
collapsed 3 of the 6 runs on one machine and none on another; the replays that chose 5e-4: docs/lab.md#the-demo).
``demo-seeds``: the defaults (lr 1e-3, the demo's rate until 2026-11-28) over seeds 0-4 (docs/lab.md's five-seed
comparison). ``e5m2-edge``: the setting of the
research grid closest to an FP8 harm on the add task - the coarser e5m2 engine at the learning rate where training
turns unstable - with every controller, 5 seeds. ``reverse-e5m2``: the long-answer task (32-64 tokens) on the e5m2
engine, 5 seeds.

``frontier``: the dose-response frontier on the add task: the exact engine (``grpo@none``) and 7 methods (GRPO, token
TIS, IcePop, Geo-RS, GRPO + R3, DC-GRPO, length decay) on 6 engines ordered by measured mismatch (``temp1.003``,
``e4m3``, ``e5m2``, ``int4``, ``nvfp4``, ``temp1.3``; on the warmed-up MoE, 4 rollouts: ``C_bar`` from ~6e-4 to
~0.05, ``k3_kl`` over ~4 decades), 5 seeds: 43 runs per seed, 215 runs of 120 rollouts (the FP4 engines' rollouts
cost ~1.4x an e4m3 rollout, ``benchmarks/lab_rollouts.py``). The presets' times: docs/times.md.

``offpolicy``: off-policy updates, K = 4 optimizer steps per rollout (steps 2-4 train on a rollout the policy has
moved away from), GRPO with and without R3 and token TIS on the e4m3 and NVFP4 engines and the exact engine, 10
seeds (70 runs); rerun with ``--num-steps-per-rollout 1`` into another ``--out`` for the
on-policy baseline and compare the two with ``mismatch-ctrl lab compare --pairs``.

``gpu-moe``: the CPU lab's off-policy finding at 50x the parameters, for one GPU (``--device auto`` runs the
5.3M-parameter ``moe-large`` on CUDA): the exact engine, GRPO and GRPO + R3 on the NVFP4 engine at K = 4 optimizer
steps per rollout, 120 rollouts, seeds 40-47 (24 runs; ``--jobs`` concurrent runs share the GPU, one process each).
Its warm-up trains at lr 5e-4 (``lab.warmup.POLICY_WARMUP``), its RL at lr 1e-4: at the lab's 1e-3 (and at 3e-4)
the first updates wreck the warmed-up policy even on the exact engine (seed 40 on the CPU: reward 0.26 before the
first rollout, 0.000 from the second on at 1e-3, about 0.1 at 3e-4; at 1e-4 0.63-0.70 by rollouts 12-15). On one
H200 with ``--device cuda --jobs 8`` the whole preset took 5.5 minutes, warm-ups included
(docs/lab-offpolicy.md).

``precision``: FP16 precision alignment (Qi et al. 2025) at the lab's harm regime, K = 4, 120 rollouts: the exact
engine, BF16 everywhere and FP16 everywhere (engine and trainer in one format, ``model.precision``), and FP8 e4m3 /
NVFP4 rollouts against a BF16 trainer without and with R3, seeds 150-155 (42 runs; its unseen seeds are 156-161:
docs/lab-precision.md; ``benchmarks/lab_precision_16core.sh`` runs both sets on 16 cores).

``surge`` and ``surge-compare``: the response-length surge (docs/lab-surge.md) on the ``digitsum`` task, whose
scratchpad RL discovers, at lr 5e-4 (at the lab's 1e-3 the scratchpad took over within 10-20 rollouts, before the
surge detector's 30-rollout baseline exists), 120 rollouts (so that a surge as late as rollout 60 still gets its
first LR cut). ``surge``: GRPO on the exact, the e4m3 and the NVFP4 engine and ``length_decay`` on e4m3, seeds 70-74
(20 runs). ``surge-compare``: GRPO, ``length_decay`` and GRPO at half the learning rate (``grpo_lr_half``) on the
exact and the NVFP4 engine, DC-GRPO, token TIS, Geo-RS (band calibrated to NVFP4 on this task) and GRPO + R3 on
NVFP4, and GRPO on the coarsest engine of the frontier (MXFP4): is GRPO hurt anywhere on this task? Seeds 75-84 (110
runs; sized for one 9-minute command on 16 cores). On the exact engine the four corrections are GRPO up to rounding
(token weights exp(~1e-8), nothing rejected, a penalty of ~1e-10, the replayed experts are the trainer's own), so
they are not run there; add them with ``--methods`` if wanted."""


class UnbrokenNamesHelpFormatter(argparse.HelpFormatter):
    """argparse's help formatter, wrapping only at spaces (the options' help, the description and the epilog): names
    such as ``e4m3-w`` or ``dcgrpo_tight_noguard`` never break across lines."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        import textwrap

        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False, break_long_words=False)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=False)


MAX_COUNT = 2**53
"""The largest count an option takes (steps, rollouts, a response length): beyond it a count is not exact as a float,
and one of hundreds of digits overflowed the float arithmetic that uses it."""


def positive_int(text: str) -> int:
    """An option type (``lab``, ``analyze``, the lab benchmark): an integer from 1 to :data:`MAX_COUNT`."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {brief(text)}")
    if value > MAX_COUNT:
        raise argparse.ArgumentTypeError(f"must be an integer from 1 to 2^53, got {brief(text)}")
    return value


MAX_PROMPTS, MAX_SAMPLES = 4096, 256
"""Bounds of ``--prompts`` and ``--samples``: far beyond what a tiny policy needs, short of allocations that cannot
succeed (a rollout's KV cache is ``prompts x samples x length x width``)."""


def prompt_count(text: str) -> int:
    """An integer from 1 to :data:`MAX_PROMPTS`."""
    value = positive_int(text)
    if value > MAX_PROMPTS:
        raise argparse.ArgumentTypeError(f"at most {MAX_PROMPTS} prompts per rollout, got {value}")
    return value


def group_size(text: str) -> int:
    """An integer >= 2 (GRPO normalises rewards within a prompt's samples)."""
    value = positive_int(text)
    if not 2 <= value <= MAX_SAMPLES:
        raise argparse.ArgumentTypeError(f"expected 2 to {MAX_SAMPLES} samples per prompt (GRPO normalises rewards "
                                         f"within a prompt's samples), got {value}")
    return value


MAX_LR = 10.0
"""The largest ``--lr``: far past any rate that trains (a larger one only blows the policy up, which the lab reports
as a collapse), well inside float32 where the optimizer keeps it."""


def learning_rate(text: str) -> float:
    """A finite float in (0, :data:`MAX_LR`]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and 0 < value <= MAX_LR):
        raise argparse.ArgumentTypeError(f"expected a finite number > 0 and at most {MAX_LR:g}, got {clip(text, 40)!r}")
    return value


MAX_SEED = 2**32
"""Seeds are below 2**32 (the lab derives per-run generator seeds from them)."""


def seed_list(text: str) -> tuple[int, ...]:
    """Distinct non-negative integers separated by commas, e.g. ``0,1,2``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 such as 0,1,2, got {text!r}")
    try:
        seeds = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers >= 0 such as 0,1,2, got {text!r}") \
            from None
    if any(not 0 <= s < MAX_SEED for s in seeds) or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"expected distinct integers from 0 to {MAX_SEED - 1}, got {clip(text, 80)!r}")
    return seeds


def quant_list(text: str) -> str:
    """Comma-separated rollout engines (doses), each a mode of ``QuantConfig.from_mode`` (``QUANT_MODES``, ``tempX``,
    ``+router``, ``+tempX``), returned as their canonical names joined by commas."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated engines such as none,e4m3,nvfp4; accepted: "
                                         f"{', '.join(QUANT_MODES)}, tempX")
    try:
        modes = [as_quant_config(p).mode for p in parts]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if len(set(modes)) != len(modes):
        raise argparse.ArgumentTypeError(f"each engine once, got {clip(text, 80)!r}")
    return ",".join(modes)


def reference_run(text: str) -> str:
    """``lab compare --against``: ``grpo``, ``exact`` or a run label ``METHOD@ENGINE[+r3]`` (its engine by its
    canonical name, as run folders are named)."""
    if text in ("grpo", "exact"):
        return text
    method, at, engine = text.strip().removesuffix("+r3").partition("@")
    if not (method and at and engine):
        raise argparse.ArgumentTypeError(f"expected grpo, exact or a run label METHOD@ENGINE[+r3] such as "
                                         f"grpo@fp16+train-fp16, got {clip(text, 80)!r}")
    try:
        mode = as_quant_config(engine).mode
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{method}@{mode}" + ("+r3" if text.strip().endswith("+r3") else "")


def device_name(text: str) -> str:
    """``auto`` (resolved per policy by :func:`~mismatch_ctrl.lab.training.settings.auto_device`), ``cpu`` or ``cuda``
    (refused without a CUDA GPU)."""
    from ..training.settings import check_device

    if text == "auto":
        return text
    try:
        check_device(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("device: ")) from None
    return text


def policy_kind(text: str) -> str:
    """A name of ``POLICY_KINDS``."""
    if text not in POLICY_KINDS:
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}; choose one of {sorted(POLICY_KINDS)}")
    return text


def directory(text: str) -> str:
    """A path that is a directory or does not exist yet."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a directory path, got an empty string")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory; name a directory")
    return text


def ray_address(text: str) -> str:
    """``--ray-address``: a non-empty address (an empty one is an unset shell variable, not a request to train
    locally: leave the flag out for that)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("empty (an unset variable?); give HOST:PORT, ray://HOST:PORT or auto, or "
                                         "leave --ray-address out to train on this machine")
    return text.strip()


def resolve(ns: argparse.Namespace) -> dict[str, Any]:
    """The value of every ``LAB_DEFAULTS`` option: given on the command line, else from ``--preset``, else the
    policy's own default (:data:`POLICY_DEFAULTS`), else the lab's.

    A preset's values are tuned for its own policy (``policy`` in the preset, else the lab's ``moe``): with another
    ``--policy`` that has its own default for one of them (``moe-large``'s lr 1e-4, which the lab's 1e-3 and
    ``e5m2-edge``'s 1.5e-3 wreck), the policy's default is used instead, and a note on standard error says so (an
    explicit flag still decides)."""
    preset = dict(LAB_PRESETS[ns.preset]) if ns.preset else {}
    policy = ns.policy or preset.get("policy") or LAB_DEFAULTS["policy"]
    own = POLICY_DEFAULTS.get(policy, {})
    if policy != preset.get("policy", LAB_DEFAULTS["policy"]):
        for name in [name for name in own if name in preset and getattr(ns, name) is None]:
            print(f"mismatch-ctrl lab: note: --preset {ns.preset} sets {name} {preset.pop(name):g} for the "
                  f"{preset.get('policy', LAB_DEFAULTS['policy'])} policy; --policy {policy} uses its own {name} "
                  f"{own[name]:g} (give --{name.replace('_', '-')} to choose)", file=sys.stderr)
    given = {name: getattr(ns, name) if getattr(ns, name) is not None else preset.get(name)
             for name in LAB_DEFAULTS}
    return {name: value if value is not None else own.get(name, LAB_DEFAULTS[name]) for name, value in given.items()}
