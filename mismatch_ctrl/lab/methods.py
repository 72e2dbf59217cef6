"""Which ``mismatch_ctrl`` configuration each lab run uses.

A lab method is a file of ``configs/methods/`` (the very YAML users pass to slime) plus the lab's adjustments below,
or one of the lab's own variants (the infeasible-budget demonstration). A run is ``method`` or ``method@quant``
(e.g. ``grpo@none``: plain GRPO with an exact fp32 rollout engine, the control).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from typing import Any

import yaml

from ..config import ROOT_KEY, build_config, merge_sections
from .quant import as_quant_config

LAB_ADJUSTMENTS: dict[str, Any] = {
    "lr_decay": {"surge": {"min_increase_tokens": 1.0}},
}
"""The surge detector's absolute minimum rise (300 tokens, for LLM responses) scaled to the lab's short answers."""

_TIGHT = {"eps": 1.0e-4, "lambda_max": 50.0, "eta": 10.0}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "dcgrpo_tight_noguard": ("dcgrpo", {"dcgrpo": {**_TIGHT, "eps_guard": "off"}}),
    "dcgrpo_tight_guard": ("dcgrpo", {"dcgrpo": {**_TIGHT, "eps_guard": "clamp"}}),
}
"""DC-GRPO with eps far below the FP8 engine's discrepancy floor and a large lambda_max, without and with the
infeasible-budget guard (ALGORITHMS.md section 2); eta = 10 lets lambda climb within a lab run's 200 rollouts."""


def method_names() -> list[str]:
    """Every method the lab can run: the files of ``configs/methods/`` and the lab variants."""
    files = resources.files("mismatch_ctrl").joinpath("configs", "methods")
    return sorted([p.name[:-5] for p in files.iterdir() if p.name.endswith(".yaml")] + list(VARIANTS))


def method_section(name: str) -> dict[str, Any]:
    """The ``mismatch_ctrl`` section a lab run of ``name`` puts into its slime-shaped ``args``."""
    base, extra = VARIANTS.get(name, (name, {}))
    path = resources.files("mismatch_ctrl").joinpath("configs", "methods", f"{base}.yaml")
    if not path.is_file():
        raise ValueError(f"unknown lab method {name!r}; choose from {', '.join(method_names())}")
    section = yaml.safe_load(path.read_text())[ROOT_KEY]
    section = merge_sections(merge_sections(section, LAB_ADJUSTMENTS), extra)
    section["name"] = name
    return section


@dataclass(frozen=True)
class RunSpec:
    """One lab run: a method and the rollout engine's quantisation mode."""

    method: str
    quant: str

    @property
    def label(self) -> str:
        return f"{self.method}@{self.quant}"

    @classmethod
    def parse(cls, text: str, default_quant: str) -> RunSpec:
        """``"dcgrpo"`` or ``"grpo@none"``; the method (with the lab's dense architecture) and the quantisation mode
        are validated."""
        method, _, quant = text.strip().partition("@")
        build_config(method_section(method), architecture="dense")
        as_quant_config(quant or default_quant)
        return cls(method, quant or default_quant)
