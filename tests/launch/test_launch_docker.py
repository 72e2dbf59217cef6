"""docker/Dockerfile, checked statically (docker cannot run here)."""

from __future__ import annotations

import re

from launch_harness import REPO

DOCKERFILE = (REPO / "docker" / "Dockerfile").read_text()


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE)
    pairs = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            pairs.append((keyword.upper(), rest.strip()))
    return pairs


def test_base_image_is_a_pinned_slime_tag() -> None:
    bases = [rest for keyword, rest in instructions() if keyword == "FROM"]
    assert len(bases) == 1
    image, _, tag = bases[0].partition(":")
    assert image == "slimerl/slime"
    assert tag and "latest" not in tag and "$" not in tag
    assert re.fullmatch(r"nightly-dev-\d{8}[a-z]?-cu\d+", tag), tag


def test_slime_is_moved_to_the_pinned_commit() -> None:
    args = dict(rest.split("=", 1) for keyword, rest in instructions() if keyword == "ARG")
    assert re.fullmatch(r"[0-9a-f]{40}", args["SLIME_COMMIT"])
    runs = " ".join(rest for keyword, rest in instructions() if keyword == "RUN")
    assert 'git checkout --quiet "${SLIME_COMMIT}"' in runs
    assert not re.search(r"git (fetch|clone|pull)|curl |wget |hf download", runs)  # the package index only


def test_the_repository_is_copied_and_installed_without_touching_torch_or_numpy() -> None:
    pairs = instructions()
    copied = {source for keyword, rest in pairs if keyword == "COPY" for source in rest.split()[:-1]}
    assert {"pyproject.toml", "README.md", "mismatch_ctrl", "recipes", "configs", "launch"} <= copied
    assert ".venv" not in copied and "." not in copied  # never the laptop's virtualenv
    runs = [rest for keyword, rest in pairs if keyword == "RUN"]
    install = next(run for run in runs if "-e '.[recipe]'" in run)
    assert "-c /tmp/image-constraints.txt" in install  # every package of the image pinned to its version
    assert "pip list --format=json | python3 docker/image_constraints.py --exclude mismatch-ctrl" in install
    assert "numpy.__version__.startswith('1.')" in install  # Megatron asserts numpy 1.x
    assert "cmp /tmp/versions-before.txt /tmp/versions-after.txt" in install  # torch/numpy unchanged
    assert "--upgrade" not in install and "-U " not in install
    assert "bash launch/qwen3_30b_dcgrpo.sh --dry-run" in install  # the launcher core works with the image's python
    workdir = [rest for keyword, rest in pairs if keyword == "WORKDIR"]
    assert workdir == ["/workspace/mismatch-ctrl"]


def test_environment_defaults_match_the_launchers() -> None:
    env = " ".join(rest for keyword, rest in instructions() if keyword == "ENV")
    for setting in ("SLIME_DIR=/root/slime", "MEGATRON_DIR=/root/Megatron-LM", "CUDA_DEVICE_MAX_CONNECTIONS=1",
                    "PYTHONPATH=/root/Megatron-LM:/workspace/mismatch-ctrl"):
        assert setting in env, setting


def test_downloads_use_the_hf_client() -> None:
    """The image's huggingface_hub (required by its Transformers) ships `hf`; `huggingface-cli` is gone."""
    shown = [REPO / "docker" / "README.md", REPO / "launch" / "README.md", REPO / "README.md",
             *sorted((REPO / "mismatch_ctrl" / "launch").glob("*.py"))]
    for path in shown:
        assert "huggingface-cli" not in path.read_text(), path
    assert "hf download Qwen/Qwen3-30B-A3B --local-dir" in (REPO / "docker" / "README.md").read_text()


def test_image_constraints_skip_what_pip_cannot_parse() -> None:
    import json
    import subprocess
    import sys

    script = REPO / "docker" / "image_constraints.py"
    installed = [{"name": "torch", "version": "2.9.0a0+git1234abc"}, {"name": "numpy", "version": "1.26.4"},
                 {"name": "sglang", "version": "0.5.15.post1"}, {"name": "deep_ep", "version": "1.0 beta"},
                 {"name": "flashinfer-python", "version": "0.2.5+cu129torch2.9"}, {"name": "weird", "version": "dev"},
                 {"name": "slime", "version": "0.1.0", "editable_project_location": "/root/slime"},
                 {"name": "mismatch_ctrl", "version": "0.1.0"}, {"name": "apex", "version": "0.1"}]
    done = subprocess.run([sys.executable, str(script), "--exclude", "mismatch-ctrl"], input=json.dumps(installed),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["torch==2.9.0a0+git1234abc", "numpy==1.26.4", "sglang==0.5.15.post1",
                                   "flashinfer-python==0.2.5+cu129torch2.9", "apex==0.1"]
    for skipped in ("'deep_ep' '1.0 beta'", "'weird' 'dev'", "slime 0.1.0: an editable install"):
        assert skipped in done.stderr
    bad = subprocess.run([sys.executable, str(script)], input="not json", capture_output=True, text=True)
    assert bad.returncode == 2 and "not pip list --format=json output" in bad.stderr
