"""docs/verl.md's overrides compose with verl 0.9.1's own Hydra config (a typo or a key verl's schema lacks is an error
there), and the page's correction table is the one ``PRESET_KEYS`` decides."""

from __future__ import annotations

import re
import shlex

import pytest

from mismatch_ctrl.verl.checks import overrides
from mismatch_ctrl.verl.runtime import VerlRuntime, read_config
from mismatch_ctrl.verl_vocabulary import PRESET_KEYS
from verl_harness import REPO, compose_verl, dense_model

PAGE = (REPO / "docs" / "verl.md").read_text()
README_SECTION = (REPO / "README.md").read_text().split("## Use mismatch_ctrl in your verl run")[1].split("\n## ")[0]


def shown_overrides(text=PAGE):
    """Every ``key=value`` word of the text's bash blocks (continuation lines joined, the command itself left out)."""
    words = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        words += [w for w in shlex.split(block.replace("\\\n", " ")) if "=" in w and not w.startswith("-")]
    return words


def test_the_readmes_overrides_are_the_pages():
    """README's verl section shows a subset of the page's overrides (the YAML at the docker image's path), which the
    next test composes and runs."""
    words = [w.replace("/workspace/mismatch-ctrl/", "") for w in shown_overrides(README_SECTION)]
    assert "trainer.v1.trainer_mode=mismatch_ctrl" in words and set(words) <= set(shown_overrides())


def test_every_override_shown_composes_with_verls_config_and_runs(tmp_path, monkeypatch):
    words = shown_overrides()
    assert "trainer.v1.trainer_mode=mismatch_ctrl" in words and "+mismatch_ctrl.config=configs/methods/dcgrpo.yaml" \
        in words
    config = compose_verl(*words, f"actor_rollout_ref.model.path={dense_model(tmp_path)}")
    monkeypatch.chdir(REPO)
    runtime = VerlRuntime(read_config(config))
    assert runtime.config.dcgrpo.enabled and runtime.config.architecture == "dense"


@pytest.mark.parametrize("preset", sorted(PRESET_KEYS))
def test_the_pages_table_row_is_the_decided_mapping(preset):
    row = next(line for line in PAGE.splitlines() if re.match(rf"\| `{preset}`", line)).replace("'", "")
    keys = PRESET_KEYS[preset]
    if keys is None:
        assert "runs from our core" in row
        return
    for key, value in keys.items():
        if value is not None and value is not False and not (key == "rollout_is_threshold" and not keys["rollout_is"]):
            assert f"{key}={overrides({key: value}).split('=', 1)[1].strip(chr(39))}" in row, (key, value)
