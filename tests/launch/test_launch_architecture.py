"""mismatch_ctrl.architecture: the one dense/MoE rule of the config loader and the launcher, torch-free."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launch_harness import REPO
from mismatch_ctrl import config
from mismatch_ctrl.architecture import EXPERT_COUNT_KEYS, expert_count, read_hf_config, resolve_architecture
from mismatch_ctrl.errors import ConfigError


def test_config_uses_the_same_rule() -> None:
    assert config.resolve_architecture is resolve_architecture


@pytest.mark.parametrize("key", EXPERT_COUNT_KEYS)
def test_expert_count_keys(key: str) -> None:
    assert expert_count({key: 64}) == 64
    assert resolve_architecture(num_experts=expert_count({key: 64})) == "moe"


def test_dense_and_odd_values() -> None:
    assert expert_count({"hidden_size": 4096}) == 0
    assert expert_count({"num_experts": None, "num_local_experts": 8}) == 8  # null is unset: the next key counts
    # multimodal MoE models keep the count in text_config (Qwen3-VL-MoE num_experts, Llama 4 num_local_experts)
    assert expert_count({"text_config": {"num_experts": 128}}) == 128
    assert expert_count({"text_config": {"num_local_experts": 16}, "vision_config": {"num_experts": 4}}) == 16
    assert expert_count({"num_experts": 0, "text_config": {"num_experts": 8}}) == 0  # the top level decides
    for bad in (True, "8", 8.0, -1):  # not a count: an error, never a silent "dense"
        with pytest.raises(ConfigError, match="num_experts: expected the number of experts"):
            expert_count({"num_experts": bad, "n_routed_experts": 8})
    assert resolve_architecture(num_experts=0) == "dense"
    assert resolve_architecture() is None
    assert resolve_architecture(architecture="dense", num_experts=128) == "dense"  # an explicit name wins
    with pytest.raises(ConfigError, match="architecture: expected one of 'dense', 'moe', got 'sparse'"):
        resolve_architecture(architecture="sparse")


@pytest.mark.parametrize("content, fragment", [("[1, 2]", "is a JSON list, not an object"),
                                               ('"text"', "is a JSON str, not an object"),
                                               ("{not json", "cannot read the Hugging Face config")])
def test_a_config_json_that_is_not_an_object_is_a_config_error_naming_the_file(tmp_path, content, fragment) -> None:
    (tmp_path / "config.json").write_text(content)
    for target in (tmp_path, tmp_path / "config.json"):
        with pytest.raises(ConfigError, match=fragment) as error:
            resolve_architecture(hf_config=target)
        assert str(tmp_path / "config.json") in str(error.value)


def test_read_hf_config_accepts_a_directory_or_the_file(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 128}))
    assert read_hf_config(tmp_path) == read_hf_config(tmp_path / "config.json") == (tmp_path / "config.json",
                                                                                     {"num_experts": 128})


def test_the_launcher_core_imports_without_torch() -> None:
    """--dry-run on a laptop: a python with PyYAML but no torch must import the launcher core."""
    code = ("import sys; sys.modules['torch'] = None\n"  # any 'import torch' now raises ImportError
            "import mismatch_ctrl.launch.main, mismatch_ctrl.architecture\n"
            "assert 'mismatch_ctrl.config' not in sys.modules, 'the launcher pulled in the torch-based config'\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
