"""``mismatch-ctrl``: exit codes and messages of check-config, and usage errors of every command."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mismatch_ctrl.cli import main

METHODS = Path(__file__).resolve().parents[2] / "mismatch_ctrl" / "configs" / "methods"


def broken_config(tmp_path) -> Path:
    path = tmp_path / "broken.yaml"
    path.write_text("mismatch_ctrl:\n  dcgrpo:\n    enabled: true\n    lamda_0: 0.1\n")
    return path


def test_python_dash_m_exit_codes(tmp_path):
    run = [sys.executable, "-m", "mismatch_ctrl", "check-config"]
    ok = subprocess.run([*run, str(METHODS / "dcgrpo.yaml"), "--arch", "moe"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "OK" in ok.stdout and "architecture moe" in ok.stdout
    bad = subprocess.run([*run, str(broken_config(tmp_path))], capture_output=True, text=True)
    assert bad.returncode == 2
    assert "mismatch_ctrl.dcgrpo.lamda_0: unknown key; did you mean 'lambda_0'?" in bad.stderr


def test_json_prints_every_resolved_setting(capsys):
    assert main(["check-config", str(METHODS / "dcgrpo.yaml"), "--num-experts", "128", "--json"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["architecture"] == "moe" and resolved["name"] == "dcgrpo"
    assert resolved["dcgrpo"]["eps"] == 0.005 and resolved["dcgrpo"]["lambda_0"] == 0.05
    assert resolved["correction"]["is_level"] is None


def test_dcgrpo_keys_are_explained_with_their_resolved_values(capsys):
    assert main(["check-config", str(METHODS / "dcgrpo.yaml"), "--arch", "moe"]) == 0
    out = capsys.readouterr().out
    for key in ("eps: 0.005", "drift_guard:", "drift_window: 10", "penalty_cap:", "zero_advantage:"):
        line = next(x for x in out.splitlines() if x.strip().startswith(key))
        assert "  # " in line, line
    assert main(["check-config", str(METHODS / "dcgrpo_paper.yaml"), "--arch", "moe"]) == 0
    paper = capsys.readouterr().out
    assert 'drift_guard: "off"' in paper and 'penalty_cap: "none"' in paper and 'zero_advantage: "penalise"' in paper


def test_hf_config_option(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"num_experts": 0}))
    assert main(["check-config", str(METHODS / "dcgrpo.yaml"), "--hf-config", str(tmp_path)]) == 0
    assert "architecture dense" in capsys.readouterr().out


def test_without_an_architecture_each_one_is_checked_and_reported(capsys):
    assert main(["check-config", str(METHODS / "dcgrpo.yaml")]) == 0
    out = capsys.readouterr().out
    assert "architecture dense" in out and "architecture moe" in out
    assert "eps: 0.0037" in out and "eps: 0.005 " in out  # the dense and the MoE default
    assert main(["check-config", str(METHODS / "grpo.yaml")]) == 0
    assert capsys.readouterr().out.count(": OK") == 1  # nothing in it depends on the architecture


def test_the_resolved_correction_is_printed(tmp_path, capsys):
    """A preset's settings, or explicit ones with the IS bounds' defaults filled in; nothing without a correction."""
    assert main(["check-config", str(METHODS / "icepop.yaml")]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["correction (preset 'token_mis'):", "  is_level: token",
                                                        "  is_mode: mask, bounds [0.5, 2]"]
    path = tmp_path / "clip.yaml"
    path.write_text("mismatch_ctrl:\n  name: x\n  correction:\n    is_level: token\n    is_mode: clip\n"
                    "    is_high: 4.0\n    veto: 1.0e-4\n")
    assert main(["check-config", str(path)]) == 0
    assert capsys.readouterr().out.splitlines()[1:] == ["correction:", "  is_level: token",
                                                        "  is_mode: clip, bounds [0.25, 4]", "  veto: 0.0001"]
    assert main(["check-config", str(METHODS / "grpo.yaml")]) == 0
    assert "correction" not in capsys.readouterr().out


def test_version_and_help_without_arguments(capsys):
    import mismatch_ctrl

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"mismatch-ctrl {mismatch_ctrl.__version__}"
    assert main([]) == 2
    assert "usage: mismatch-ctrl" in capsys.readouterr().out


def test_missing_file(tmp_path, capsys):
    assert main(["check-config", str(tmp_path / "nope.yaml")]) == 2
    assert "no such config file" in capsys.readouterr().err


def test_help_and_usage_errors(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["check-config", "--help"])
    assert exit_info.value.code == 0 and "--json" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main(["check-config", "x.yaml", "--arch", "moe", "--num-experts", "8"])
    assert exit_info.value.code == 2


@pytest.mark.parametrize("argv, command", [
    (["lab", "compare", "runs/x", "--bogus"], "lab compare"),
    (["lab", "--bogus"], "lab"),
    (["analyze", "dumps", "--bogus"], "analyze"),
    (["check-config", "x.yaml", "--bogus"], "check-config"),
])
def test_an_unknown_option_is_named_with_its_commands_usage(argv, command, capsys):
    """argparse reports a subcommand's unknown option under the top-level usage; the CLI gives the command's own."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"usage: mismatch-ctrl {command} ") and f"mismatch-ctrl {command}: error: unrecognized " \
        "arguments: --bogus" in err


def test_torch_compile_is_reported_and_its_acrl_combination_refused(tmp_path, capsys):
    path = tmp_path / "compiled.yaml"
    path.write_text("mismatch_ctrl:\n  name: geo\n  torch_compile: true\n  correction:\n    preset: geo_mis\n")
    assert main(["check-config", str(path), "--arch", "moe"]) == 0
    assert "torch_compile: true" in capsys.readouterr().out
    assert main(["check-config", str(METHODS / "geo_mis.yaml"), "--arch", "moe"]) == 0
    assert "torch_compile" not in capsys.readouterr().out
    path.write_text("mismatch_ctrl:\n  name: acrl\n  torch_compile: true\n  acrl:\n    enabled: true\n")
    assert main(["check-config", str(path), "--arch", "moe"]) == 2
    assert "mismatch_ctrl.torch_compile: ACRL moves its IS band" in capsys.readouterr().err
