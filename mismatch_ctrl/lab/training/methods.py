"""Which ``mismatch_ctrl`` configuration each lab run uses.

A lab method is a file of ``configs/methods/`` (the very YAML users pass to slime) plus the lab's adjustments below,
or one of the lab's own variants (the infeasible-budget demonstration). A run is ``method``, ``method@quant``
(e.g. ``grpo@none``: plain GRPO with an exact fp32 rollout engine, the control), and either with ``+r3``: rollout
routing replay (slime's ``--use-rollout-routing-replay``), the trainer's forwards use the engine's expert sets.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ...config import ROOT_KEY, build_config, merge_sections
from ...formatting import clip
from ..model.quant import as_quant_config

LAB_ADJUSTMENTS: dict[str, Any] = {
    "lr_decay": {"surge": {"min_increase_tokens": 1.0}},
}
"""The surge detector's absolute minimum rise (300 tokens, for LLM responses) scaled to the lab's short answers."""

_TIGHT = {"eps": 1.0e-4, "lambda_max": 50.0, "eta": 10.0}
_SAFETIES = ("drift_guard", "penalty_cap", "zero_advantage")


def _dcgrpo(*safeties: Any, **more: Any) -> tuple[str, dict[str, Any]]:
    return "dcgrpo", {"dcgrpo": {**dict(zip(_SAFETIES, safeties)), **more}}


VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dcgrpo_floor_guard": _dcgrpo("off", "none", "penalise"),
    "dcgrpo_drift": _dcgrpo("saturated", "none", "penalise"),
    "dcgrpo_drift_skip": _dcgrpo("saturated", "none", "skip"),
    "dcgrpo_cap1": _dcgrpo("saturated", 1.0, "skip"),
    "dcgrpo_cap025": _dcgrpo("saturated", 0.25, "skip"),
    "dcgrpo_cap005": _dcgrpo("saturated", 0.05, "skip"),
    "dcgrpo_persistent": _dcgrpo("persistent", 1.0, "skip"),
    "dcgrpo_centered_persistent": _dcgrpo("persistent", 1.0, "skip", penalty_form="centered"),
    "dcgrpo_tight_noguard": ("dcgrpo", {"dcgrpo": {**_TIGHT, "eps_guard": "off"}}),
    "dcgrpo_tight_guard": ("dcgrpo", {"dcgrpo": {**_TIGHT, "eps_guard": "clamp"}}),
    "dcgrpo_centered": ("dcgrpo", {"dcgrpo": {"penalty_form": "centered"}}),
    "geo_rs_e4m3": ("geo_mis", {"correction": {"rs_low": 0.87, "rs_high": 1.15}}),
    "geo_rs_e5m2": ("geo_mis", {"correction": {"rs_low": 0.76, "rs_high": 1.31}}),
    "geo_rs_nvfp4": ("geo_mis", {"correction": {"rs_low": 0.82, "rs_high": 1.22}}),
    "grpo_lr_half": ("length_decay", {"lr_decay": {"period": 1, "factor": 0.5, "min_scale": 0.5}}),
}
"""``dcgrpo_floor_guard`` .. ``dcgrpo_centered_persistent``: DC-GRPO with the safeties of docs/lab-dcgrpo.md added one
at a time (``drift_guard``, ``penalty_cap``, ``zero_advantage``; ALGORITHMS.md section 2): ``dcgrpo_floor_guard`` is the
default before them (the paper's method plus the infeasible-budget guard), ``dcgrpo_persistent`` the default after
(= ``dcgrpo``). ``dcgrpo_tight_*``: DC-GRPO with eps far below the FP8 engine's discrepancy floor and a large
lambda_max, without and with the infeasible-budget guard (ALGORITHMS.md section 2); eta = 10 lets lambda climb
within a lab run's 200 rollouts. ``dcgrpo_centered``: DC-GRPO with the penalty ``lambda (c - eps)`` (ALGORITHMS.md
section 2), zero on average at the budget instead of always pushing the sampled tokens down. ``geo_rs_e4m3`` /
``geo_rs_e5m2``: Geo-RS with its band calibrated to the lab's MoE engine in that format: 99% of the warmed-up
policies' sequences have |geometric-mean log-ratio| <= 0.14 with e4m3 and <= 0.27 with e5m2
(``benchmarks/lab_mismatch.py``, 3 seeds: 0.127-0.170 and 0.245-0.289), so the bands [exp(-0.14), exp(0.14)] =
[0.87, 1.15] and [0.76, 1.31] reject about 1% of the sequences at the start and more as the mismatch grows.
``geo_rs_nvfp4``: the same for the NVFP4 engine on the ``digitsum`` task (the ``surge-compare`` preset): <= 0.20 on
its warmed-up policies (``benchmarks/lab_mismatch.py --task digitsum --modes nvfp4 --seeds 70,71,72,73,74``: 0.10-0.38,
mean 0.204), so [exp(-0.20), exp(0.20)] = [0.82, 1.22].
``grpo_lr_half``: GRPO at half the learning rate, applied by the same LR hook as ``length_decay`` (a fixed schedule
that halves once, at rollout 1, and stays: rollout 0 trains at the full rate): is it the surge trigger that helps,
or only a lower rate?"""


def method_names() -> list[str]:
    """Every method the lab can run: the files of ``configs/methods/`` and the lab variants."""
    files = resources.files("mismatch_ctrl").joinpath("configs", "methods")
    return sorted([p.name[:-5] for p in files.iterdir() if p.name.endswith(".yaml")] + list(VARIANTS))


def method_section(name: str) -> dict[str, Any]:
    """The ``mismatch_ctrl`` section a lab run of ``name`` puts into its slime-shaped ``args``."""
    base, extra = VARIANTS.get(name, (name, {}))
    path = resources.files("mismatch_ctrl").joinpath("configs", "methods", f"{base}.yaml")
    try:
        known = path.is_file()
    except OSError:  # e.g. a name too long for a file name
        known = False
    if not known:
        stem = Path(name).name.removesuffix(".yaml").removesuffix(".yml")
        hint = f" (a method is named without folder and .yaml: {stem})" if stem != name and stem in method_names() \
            else ""
        raise ValueError(f"unknown lab method {clip(name, 60)!r}{hint}; choose from {', '.join(method_names())}")
    section = yaml.safe_load(path.read_text())[ROOT_KEY]
    section = merge_sections(merge_sections(section, LAB_ADJUSTMENTS), extra)
    section["name"] = name
    return section


REPLAY_SUFFIX = "+r3"


@dataclass(frozen=True)
class RunSpec:
    """One lab run: a method, the rollout engine's quantisation mode, and whether routing replay (R3) is on."""

    method: str
    quant: str
    replay: bool = False

    @property
    def label(self) -> str:
        return f"{self.method}@{self.quant}{REPLAY_SUFFIX if self.replay else ''}"

    @classmethod
    def parse(cls, text: str, default_quant: str, num_experts: int = 0) -> RunSpec:
        """``"dcgrpo"``, ``"grpo@none"``, ``"grpo+r3"``, ``"grpo@e5m2+r3"`` or ``"grpo@nvfp4+router+r3"``. The
        method's config is built the way the hooks build it (``num_experts`` > 0 resolves the MoE defaults); the
        quantisation mode is validated and stored by its canonical name, and ``+r3`` needs experts."""
        text = text.strip()
        replay = text.endswith(REPLAY_SUFFIX)
        method, at, quant = text.removesuffix(REPLAY_SUFFIX).partition("@")
        if at and not quant.strip():
            raise ValueError(f"run {text!r}: nothing after '@'; name the engine (e.g. {method}@e4m3) or drop the '@'")
        build_config(method_section(method), num_experts=num_experts)
        mode = as_quant_config(quant or default_quant).mode
        if replay and not num_experts:
            raise ValueError(f"run {text!r}: routing replay ({REPLAY_SUFFIX}) needs a mixture-of-experts policy "
                             "(--policy moe)")
        return cls(method, mode, replay)

    @classmethod
    def expand(cls, methods: list[str], doses: list[str], num_experts: int = 0) -> list[RunSpec]:
        """The runs of methods x doses: a method without ``@QUANT`` once per dose (engine), a method with one once;
        method-major order. Refuses an empty list and a run named twice."""
        doses = [d.strip() for d in doses if d.strip()]
        if not doses:
            raise ValueError("--quant: give at least one engine")
        runs = []
        for text in (m.strip() for m in methods if m.strip()):
            pinned = "@" in text
            runs += [cls.parse(text, dose, num_experts) for dose in (doses[:1] if pinned else doses)]
        labels = [run.label for run in runs]
        if not runs:
            raise ValueError("give at least one METHOD[@QUANT][+r3]")
        if len(set(labels)) != len(labels):
            twice = sorted({label for label in labels if labels.count(label) > 1})
            raise ValueError(f"each run once, got {', '.join(twice)} more than once (a METHOD@QUANT also made by "
                             "METHOD with that --quant engine?)")
        return runs
