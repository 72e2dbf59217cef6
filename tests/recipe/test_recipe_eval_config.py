"""The slime --eval-config file: six benchmarks, the agreed sampling settings, keys slime accepts, and the paths
data.py writes."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import yaml

from recipes.qwen3_30b_a3b import data, reward

EVAL_YAML = Path(__file__).resolve().parents[2] / "recipes" / "qwen3_30b_a3b" / "eval.yaml"
DATA_ROOT = "${oc.env:DATA_DIR,/root/data}"
SAMPLES = {"aime24": 32, "aime25": 32, "amc23": 32, "math500": 4, "minerva": 4, "olympiadbench": 4}

# EvalDatasetConfig fields and the extra eval.defaults keys of slime/utils/eval_config.py at THUDM/slime 624b824a.
SLIME_DATASET_FIELDS = {
    "name",
    "path",
    "rm_type",
    "custom_rm_path",
    "input_key",
    "label_key",
    "tool_key",
    "metadata_key",
    "multimodal_keys",
    "apply_chat_template",
    "apply_chat_template_kwargs",
    "n_samples_per_eval_prompt",
    "temperature",
    "top_p",
    "top_k",
    "max_response_len",
    "stop",
    "stop_token_ids",
    "min_new_tokens",
    "repetition_penalty",
    "skip_special_tokens",
    "no_stop_trim",
    "custom_generate_function_path",
    "app_service",
    "eval_task_timeout",
    "min_eval_samples",
    "eval_early_stop_remaining",
    "eval_early_stop_idle_timeout",
    "message_processor",
    "reward_model",
    "remote_environment",
    "metadata_overrides",
}


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load(EVAL_YAML.read_text(encoding="utf-8"))["eval"]


def test_six_benchmarks_with_stated_samples_per_prompt(config):
    datasets = {entry["name"]: entry for entry in config["datasets"]}
    assert len(config["datasets"]) == len(datasets) == 6
    assert {name: entry["n_samples_per_eval_prompt"] for name, entry in datasets.items()} == SAMPLES


def test_sampling_settings_and_reward(config):
    defaults = config["defaults"]
    assert defaults["temperature"] == 0.7
    assert defaults["top_p"] == 1.0
    assert defaults["max_response_len"] == 32768
    assert (defaults["input_key"], defaults["label_key"], defaults["apply_chat_template"]) == ("prompt", "label", True)
    module_path, _, attribute = defaults["custom_rm_path"].rpartition(".")  # how slime's load_function resolves it
    assert getattr(importlib.import_module(module_path), attribute) is reward.rm


def test_keys_are_ones_slime_accepts(config):
    assert set(config["defaults"]) <= SLIME_DATASET_FIELDS
    for entry in config["datasets"]:
        assert set(entry) <= SLIME_DATASET_FIELDS


def test_paths_are_the_files_data_py_writes(config):
    for entry in config["datasets"]:
        assert entry["path"] == DATA_ROOT + "/" + data.output_path(Path(), entry["name"]).as_posix()


def test_paths_resolve_from_data_dir_with_omegaconf(monkeypatch):
    omegaconf = pytest.importorskip("omegaconf")
    monkeypatch.delenv("DATA_DIR", raising=False)
    resolved = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(EVAL_YAML), resolve=True)
    assert resolved["eval"]["datasets"][0]["path"] == "/root/data/eval/aime24.jsonl"
    monkeypatch.setenv("DATA_DIR", "/mnt/data")
    resolved = omegaconf.OmegaConf.to_container(omegaconf.OmegaConf.load(EVAL_YAML), resolve=True)
    assert resolved["eval"]["datasets"][-1]["path"] == "/mnt/data/eval/olympiadbench.jsonl"


def test_the_light_protocol_has_the_same_sets_and_keys_at_the_training_length(config):
    light = yaml.safe_load(EVAL_YAML.with_name("eval_light.yaml").read_text(encoding="utf-8"))["eval"]
    assert [d["name"] for d in light["datasets"]] == [d["name"] for d in config["datasets"]]
    assert [d["path"] for d in light["datasets"]] == [d["path"] for d in config["datasets"]]
    assert {k: v for k, v in light["defaults"].items() if k != "max_response_len"} == \
        {k: v for k, v in config["defaults"].items() if k != "max_response_len"}
    assert light["defaults"]["max_response_len"] == 8192  # the training length, --rollout-max-response-len
    assert set(light["defaults"]) <= SLIME_DATASET_FIELDS and all(set(d) <= SLIME_DATASET_FIELDS
                                                                  for d in light["datasets"])
    samples = {d["name"]: d["n_samples_per_eval_prompt"] for d in light["datasets"]}
    assert samples == {"aime24": 8, "aime25": 8, "amc23": 8, "math500": 1, "minerva": 1, "olympiadbench": 1}
