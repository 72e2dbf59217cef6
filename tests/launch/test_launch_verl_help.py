"""The verl launchers' ``--help`` needs no verl (it runs with any python that has this package's dependencies)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script, words", [("verl_qwen3_8b_dcgrpo.sh", "Qwen3-8B with mismatch_ctrl on verl 0.9.1"),
                                           ("verl_qwen3_30b_dcgrpo.sh", "ROUTING_REPLAY")])
def test_help_without_verl(script, words):
    done = subprocess.run(["bash", str(REPO / "launch" / script), "--help"], capture_output=True, text=True,
                          env={**os.environ, "VERL_PYTHON": sys.executable}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert words in done.stdout and "--dry-run" in done.stdout
