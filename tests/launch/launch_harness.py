"""A sandbox for driving the launchers with subprocess: a PATH holding only basic tools plus fakes of the cluster's
executables (nvidia-smi, ray, torchrun, a python whose check-config is instant), and a fake cluster file tree.

Every fake appends its argv (JSON) to ``logs/<name>.jsonl`` so tests can assert what was (not) called.
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from mismatch_ctrl.launch.known_flags import PASSED_FLAGS

REPO = Path(__file__).resolve().parents[2]
LAUNCH = REPO / "launch"
REAL_PYTHON = sys.executable


@functools.cache
def _launcher_imports_math_verify() -> bool:
    with tempfile.TemporaryDirectory() as home:  # the launcher's sandbox has a HOME of its own
        found = subprocess.run([sys.executable, "-c", "import math_verify"], capture_output=True, cwd=home,
                               env={"PATH": os.environ.get("PATH", ""), "HOME": home})
    return found.returncode == 0


def needs_the_recipe_imports() -> None:
    """A launch that reaches the import checks imports the recipe's reward, which needs math-verify (``make`` and the
    image install it; a bare python with torch may not have it). Asked of the launcher's python in the launcher's
    environment, which inherits no PYTHONPATH: a package this process finds only through one (wheels unpacked for a
    device machine), or only in a user site of this HOME, is not there for the launch."""
    if not _launcher_imports_math_verify():
        pytest.skip("the preflight imports the recipe's reward, and the launcher's python cannot import math_verify "
                    "without PYTHONPATH: pip install -e '.[recipe]'")


# The launchers and what they select: script -> (METHOD, MODEL, run name = the SAVE_DIR and wandb group name).
LAUNCHERS = {
    "qwen3_30b_dcgrpo.sh": ("dcgrpo", "qwen3_30b_a3b", "qwen3_30b_a3b_dcgrpo"),
    "qwen3_30b_grpo.sh": ("grpo", "qwen3_30b_a3b", "qwen3_30b_a3b_grpo"),
    "qwen3_30b_geo_mis.sh": ("geo_mis", "qwen3_30b_a3b", "qwen3_30b_a3b_geo_mis"),
    "qwen3_30b_token_tis.sh": ("token_tis", "qwen3_30b_a3b", "qwen3_30b_a3b_token_tis"),
    "qwen3_30b_length_decay.sh": ("length_decay", "qwen3_30b_a3b", "qwen3_30b_a3b_length_decay"),
    "qwen3_30b_dcgrpo_length_decay.sh": ("dcgrpo_length_decay", "qwen3_30b_a3b", "qwen3_30b_a3b_dcgrpo_length_decay"),
    "qwen3_30b_fp8_aligned.sh": ("token_tis", "qwen3_30b_a3b", "qwen3_30b_a3b_token_tis_fp8train"),
    "qwen3_30b_fp16_aligned.sh": ("grpo", "qwen3_30b_a3b", "qwen3_30b_a3b_grpo_fp16"),
    "qwen3_8b_dcgrpo.sh": ("dcgrpo", "qwen3_8b", "qwen3_8b_dcgrpo"),
    "qwen3_5_35b_dcgrpo.sh": ("dcgrpo", "qwen3_5_35b_a3b", "qwen3_5_35b_a3b_dcgrpo"),
}

# The Hugging Face checkpoints' config.json (Qwen/Qwen3-30B-A3B and Qwen/Qwen3-8B), independent of the launcher.
HF_CONFIGS = {
    "qwen3_30b_a3b": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
        "intermediate_size": 6144, "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936, "tie_word_embeddings": False,
        "max_position_embeddings": 40960, "rope_scaling": None,
    },
    "qwen3_8b": {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096, "intermediate_size": 12288,
        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "tie_word_embeddings": False, "max_position_embeddings": 40960, "rope_scaling": None,
    },
    # Qwen/Qwen3.5-35B-A3B, a multimodal checkpoint: the language model's numbers sit in text_config (the model card:
    # 40 layers in 10 x (3 Gated DeltaNet + 1 gated attention), 16 Q / 2 KV heads of 256, 256 experts of 512, top-8,
    # one shared expert of 512, vocabulary 248320, 262,144 tokens of context).
    "qwen3_5_35b_a3b": {
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
        "tie_word_embeddings": False, "vision_config": {"depth": 27, "hidden_size": 1152},
        "text_config": {
            "model_type": "qwen3_5_moe_text", "hidden_size": 2048, "num_hidden_layers": 40,
            "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4,
            "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
            "linear_value_head_dim": 128, "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512, "vocab_size": 248320, "max_position_embeddings": 262144,
            "tie_word_embeddings": False,
            "rope_parameters": {"rope_theta": 10000000, "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]},
        },
    },
}
MODELS = {
    "qwen3_30b_a3b": {"hf_name": "Qwen3-30B-A3B", "num_hidden_layers": 48, "num_experts": 128},
    "qwen3_8b": {"hf_name": "Qwen3-8B", "num_hidden_layers": 36, "num_experts": 0},
    "qwen3_5_35b_a3b": {"hf_name": "Qwen3.5-35B-A3B", "num_hidden_layers": 40, "num_experts": 256},
}
FP8_QUANTIZATION = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                    "weight_block_size": [128, 128]}

HOOKS = {
    "--custom-advantage-function-path": "mismatch_ctrl.slime.hooks.advantages",
    "--custom-tis-function-path": "mismatch_ctrl.slime.hooks.rollout_correction",
    "--custom-megatron-before-train-step-hook-path": "mismatch_ctrl.slime.hooks.before_train_step",
    "--custom-megatron-init-path": "mismatch_ctrl.slime.hooks.on_megatron_init",
}

# The flags the launchers may pass, checked by hand against slime, Megatron-LM and SGLang: the launcher's own list.
KNOWN_TRAIN_FLAGS = PASSED_FLAGS

# What the launchers need besides python: bash (also reads model.sh), dirname (lib.sh), env, rm, mv, touch (--prepare).
SYSTEM_TOOLS = ("bash", "env", "dirname", "rm", "mv", "touch")


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str

    def command(self) -> list[str]:
        """The printed command (lines joined at backslash-newline) as an argv."""
        return shlex.split(self.stdout.replace("\\\n", " "))


def split_submit(argv: list[str]) -> tuple[list[str], list[str]]:
    """(ray part before --, train.py arguments after `-- python3 <slime>/train.py`)."""
    separator = argv.index("--")
    assert argv[separator + 1] == "python3" and argv[separator + 2].endswith("/train.py"), argv[separator:separator + 3]
    return argv[:separator], argv[separator + 3:]


def ray_option(ray_part: list[str], name: str) -> str:
    return ray_part[ray_part.index(name) + 1]


def options(train_args: list[str]) -> dict[str, list[list[str]]]:
    """flag -> the value lists of each of its occurrences (values are the words up to the next --flag)."""
    found: dict[str, list[list[str]]] = {}
    current: list[str] | None = None
    for word in train_args:
        if word.startswith("--"):
            current = []
            found.setdefault(word, []).append(current)
        else:
            assert current is not None, f"value {word!r} before any flag"
            current.append(word)
    return found


def model_args(model: str) -> list[str]:
    """MODEL_ARGS of recipes/<model>/model.sh, read by bash itself."""
    out = subprocess.run(["bash", "-c", 'source "$1"; printf "%s\\0" "${MODEL_ARGS[@]}"', "_",
                          str(REPO / "recipes" / model / "model.sh")], capture_output=True, check=True)
    return out.stdout.decode().split("\0")[:-1]


def contains_run(haystack: list[str], needle: list[str]) -> bool:
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _python_fake(body: str) -> str:
    """Source of a fake executable in python that logs its argv, then runs ``body``."""
    return (f"#!{REAL_PYTHON}\nimport json, os, sys\n"
            "with open(os.path.join(os.environ['FAKE_LOGS'], os.path.basename(sys.argv[0]) + '.jsonl'), 'a') as log:\n"
            "    log.write(json.dumps(sys.argv[1:]) + '\\n')\n" + body)


class Sandbox:
    """A temp dir with bin/ (basic tools + chosen fakes), logs/, home/ and a fake cluster tree under cluster/."""

    def __init__(self, root: Path):
        self.root = root
        self.bin = root / "bin"
        self.logs = root / "logs"
        self.home = root / "home"
        self.cluster = root / "cluster"
        for directory in (self.bin, self.logs, self.home, self.cluster):
            directory.mkdir(parents=True, exist_ok=True)
        for tool in SYSTEM_TOOLS:
            found = shutil.which(tool)
            assert found, f"{tool} is needed by the launcher tests"
            (self.bin / tool).symlink_to(found)
        self.fast_python = root / "python-fast-check"
        _write_executable(self.fast_python, f"""#!/bin/bash
# python whose `-m mismatch_ctrl check-config` only records its arguments; everything else runs the real python
if [ "$1" = -m ] && [ "$2" = mismatch_ctrl ] && [ "$3" = check-config ]; then
  printf '%s\\n' "$*" >> "$FAKE_LOGS/check-config.log"
  echo "$4: OK (fake check-config)"
  exit 0
fi
exec {REAL_PYTHON} "$@"
""")

    # -- fakes on PATH ---------------------------------------------------------------------------------------------
    def add_nvidia_smi(self, gpus: int = 8, nvlink: bool = True) -> None:
        link = "NV18" if nvlink else "SYS"
        _write_executable(self.bin / "nvidia-smi", f"""#!/bin/bash
case "$*" in
  *--query-gpu*) for ((i = 0; i < {gpus}; i++)); do echo "$i"; done ;;
  "topo -m") echo "GPU0 X {link}"; echo "GPU1 {link} X" ;;
  *) echo "NVIDIA-SMI fake" ;;
esac
""")

    def add_ray(self, reachable: bool = True, cluster_gpus: int = 8, version: str = "2.60.0") -> None:
        """Fake ray: ``--version`` (as Ray prints it), ``job list`` (reachable or not), ``status``, ``job submit``."""
        _write_executable(self.bin / "ray", _python_fake(f"""
if sys.argv[1:] == ["--version"]:
    print("ray, version {version}")
    sys.exit(0)
if sys.argv[1:3] == ["job", "list"]:
    sys.exit(0 if {reachable} else "ConnectionError: Failed to connect to Ray")
if sys.argv[1:2] == ["status"]:
    print("Resources\\n---------\\nUsage:\\n 0.0/128.0 CPU\\n 0.0/{cluster_gpus}.0 GPU\\n")
    sys.exit(0)
if sys.argv[1:3] == ["job", "submit"]:
    print("Job submitted (fake)")
    sys.exit(0)
sys.exit("fake ray: unexpected arguments")
"""))

    def add_torchrun(self, fail: bool = False) -> None:
        """Fake torchrun: writes a Megatron tracker file into --save (or fails)."""
        _write_executable(self.bin / "torchrun", _python_fake(f"""
if {fail}:
    sys.exit("fake torchrun: conversion failed")
save = sys.argv[sys.argv.index("--save") + 1]
os.makedirs(os.path.join(save, "iter_0000000"), exist_ok=True)
with open(os.path.join(save, "latest_checkpointed_iteration.txt"), "w") as f:
    f.write("0")
"""))

    def calls(self, name: str) -> list[list[str]]:
        path = self.logs / f"{name}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def check_config_calls(self) -> list[list[str]]:
        path = self.logs / "check-config.log"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    # -- fake cluster tree -----------------------------------------------------------------------------------------
    def make_cluster(self, model: str = "qwen3_30b_a3b", *, fp8_quantized: bool = True, prepared: bool = True,
                     slime_package: bool = True) -> dict[str, str]:
        """slime and Megatron-LM checkouts (importable stubs), a BF16 model dir, and, if prepared, the FP8 and
        torch_dist checkpoints and the data. Returns the launcher environment pointing at them."""
        facts = MODELS[model]
        root = self.cluster
        slime = root / "slime"
        (slime / "tools").mkdir(parents=True, exist_ok=True)
        (slime / "train.py").write_text("raise SystemExit('fake train.py')\n")
        (slime / "tools" / "convert_hf_to_torch_dist.py").write_text("raise SystemExit('run by the fake torchrun')\n")
        (slime / "tools" / "convert_hf_to_fp8.py").write_text(FAKE_FP8_CONVERTER)
        if slime_package:
            (slime / "slime").mkdir(exist_ok=True)
            (slime / "slime" / "__init__.py").write_text("")
        megatron = root / "Megatron-LM" / "megatron"
        (megatron / "training").mkdir(parents=True, exist_ok=True)
        # Extend the package path so that the venv's megatron.core stays importable next to the stub.
        (megatron / "__init__.py").write_text("__path__ = __import__('pkgutil').extend_path(__path__, __name__)\n")
        (megatron / "training" / "__init__.py").write_text("")

        config = dict(HF_CONFIGS[model])
        bf16 = root / facts["hf_name"]
        bf16.mkdir(exist_ok=True)
        (bf16 / "config.json").write_text(json.dumps(config))
        fp8 = root / f"{facts['hf_name']}-FP8"
        torch_dist = root / f"{facts['hf_name']}_torch_dist"
        data = root / "data"
        if prepared:
            fp8.mkdir(exist_ok=True)
            quantized = dict(config)
            if fp8_quantized:
                quantized["quantization_config"] = dict(FP8_QUANTIZATION)
            (fp8 / "config.json").write_text(json.dumps(quantized))
            torch_dist.mkdir(exist_ok=True)
            (torch_dist / "latest_checkpointed_iteration.txt").write_text("release")
            self.write_data(data)
        return {
            "SLIME_DIR": str(slime), "MEGATRON_DIR": str(root / "Megatron-LM"), "MODEL_DIR": str(bf16),
            "FP8_HF_DIR": str(fp8), "TORCH_DIST_DIR": str(torch_dist), "DATA_DIR": str(data),
            "SAVE_DIR": str(root / "runs" / "run"),
        }

    @staticmethod
    def write_data(data: Path) -> None:
        (data / "eval").mkdir(parents=True, exist_ok=True)
        row = json.dumps({"prompt": [{"role": "user", "content": "1+1?"}], "label": "2"}) + "\n"
        (data / "dapo-math-17k.jsonl").write_text(row)
        for name in ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"):
            (data / "eval" / f"{name}.jsonl").write_text(row)

    # -- running ---------------------------------------------------------------------------------------------------
    def environment(self, env: dict[str, str] | None = None, *, real_check: bool = False) -> dict[str, str]:
        base = {"PATH": str(self.bin), "HOME": str(self.home), "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
                "FAKE_LOGS": str(self.logs), "PYTHON": REAL_PYTHON if real_check else str(self.fast_python)}
        base.update(env or {})
        return base

    def run(self, script: str, *args: str, env: dict[str, str] | None = None, real_check: bool = False) -> Result:
        """bash launch/<script> ARGS with only the sandbox's environment (nothing inherited)."""
        process = subprocess.run(["bash", str(LAUNCH / script), *args], cwd=self.root, text=True,
                                 capture_output=True, timeout=300, env=self.environment(env, real_check=real_check))
        return Result(process.returncode, process.stdout, process.stderr)


FAKE_FP8_CONVERTER = """\
# Fake tools/convert_hf_to_fp8.py: copies config.json and adds the block quantization_config the real tool writes,
# unless FAKE_FP8_NO_QUANT is set.
import argparse, json, os, sys
with open(os.path.join(os.environ["FAKE_LOGS"], "convert_hf_to_fp8.jsonl"), "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
parser = argparse.ArgumentParser()
parser.add_argument("--model-dir", required=True)
parser.add_argument("--save-dir", required=True)
parser.add_argument("--strategy", required=True)
parser.add_argument("--block-size", type=int, nargs="*", required=True)
parser.add_argument("--max-workers", type=int)
args = parser.parse_args()
os.makedirs(args.save_dir, exist_ok=True)
with open(os.path.join(args.model_dir, "config.json")) as f:
    config = json.load(f)
if not os.environ.get("FAKE_FP8_NO_QUANT"):
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": args.block_size}
with open(os.path.join(args.save_dir, "config.json"), "w") as f:
    json.dump(config, f)
"""
