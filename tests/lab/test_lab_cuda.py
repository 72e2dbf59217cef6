"""The lab on a CUDA GPU (``-m cuda``, skipped without one; ``make gpu-check`` runs it): a few rollouts of each kind
of run - the exact engine, an FP8 and an FP4 engine, routing replay, DC-GRPO and a rollout correction - through the
same hooks as on the CPU, on the MoE policy, with every logged number finite and in range."""

from __future__ import annotations

import json
import math

import pytest
import torch
from sweep_helpers import TINY_WARMUP

from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.sweeps.run import run_lab
from mismatch_ctrl.lab.training.settings import LabSettings

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
RUNS = [RunSpec("grpo", "none"), RunSpec("grpo", "e4m3"), RunSpec("grpo", "nvfp4", replay=True),
        RunSpec("dcgrpo", "e4m3"), RunSpec("token_tis", "nvfp4")]


def test_a_few_rollouts_of_every_kind_of_run_on_cuda(tmp_path):
    settings = LabSettings(steps=3, prompts_per_step=8, samples_per_prompt=4, eval_every=1, eval_prompts=16,
                           device="cuda")
    result = run_lab(RUNS, settings, tmp_path / "out", cache_dir=tmp_path / "cache", show_progress=False,
                     warmup=TINY_WARMUP, seeds=(40,))
    assert sorted(s["label"] for s in result.summaries) == sorted(spec.label for spec in RUNS)
    for spec in RUNS:
        rows = [json.loads(line) for line in
                (tmp_path / "out" / spec.label / "seed40" / "metrics.jsonl").read_text().splitlines()]
        assert len(rows) == settings.steps, spec.label
        for row in rows:
            for key, value in row.items():
                if isinstance(value, float):
                    assert math.isfinite(value), f"{spec.label}: {key} = {value}"
            assert 0.0 <= row["eval_acc_engine"] <= 1.0
            discrepancy = row["prob_diff_mean"]
            assert discrepancy < 1e-4 if spec.quant == "none" else 0.0 < discrepancy < 0.5, spec.label
            if spec.replay:
                assert row["routing_flip_fraction"] == 0.0
        if spec.method == "dcgrpo":
            assert all("lambda" in row and "eps" in row for row in rows)
