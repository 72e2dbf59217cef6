"""The hooks resolve DC-GRPO's per-architecture defaults the way slime runs a model: Megatron's ``--num-experts``
for a MoE model, and for a dense one (Megatron leaves ``num_experts`` at None) the ``config.json`` of
``--hf-checkpoint``."""

from __future__ import annotations

import json

import pytest
from slime_data import make_args, method

from mismatch_ctrl.config import arch_defaults
from mismatch_ctrl.errors import ConfigError
from mismatch_ctrl.slime.runtime import get_runtime

DCGRPO = method("dcgrpo")


def hf_dir(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, **config}))
    return str(tmp_path)


@pytest.mark.parametrize("num_experts, hf_config, arch", [
    (128, None, "moe"),
    (None, {"num_experts": 128, "moe_intermediate_size": 768}, "moe"),
    (None, {"intermediate_size": 12288}, "dense"),
    (0, {"num_experts": 128}, "dense"),  # Megatron's own count wins over the checkpoint
])
def test_dcgrpo_defaults_follow_the_model(tmp_path, num_experts, hf_config, arch):
    hf = hf_dir(tmp_path, **hf_config) if hf_config is not None else None
    config = get_runtime(make_args(DCGRPO, num_experts=num_experts, hf_checkpoint=hf)).config
    assert config.architecture == arch
    assert config.dcgrpo.eps == arch_defaults(arch)["dcgrpo"]["eps"]


def test_dense_model_without_a_readable_checkpoint_config_is_named(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the Hugging Face config .*missing"):
        get_runtime(make_args(DCGRPO, num_experts=None, hf_checkpoint=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="architecture"):
        get_runtime(make_args(DCGRPO, num_experts=None))
