"""The 16-core scripts (benchmarks/*_16core.sh) answer --help with their usage and refuse an option where their OUT
folder belongs before any work (a folder named ``--help`` would otherwise be made and a sweep started)."""

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "benchmarks").glob("*_16core.sh"))


def run(script: str, arg: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ROOT / script), arg], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_prints_the_usage(script, tmp_path):
    done = run(script, "--help", tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"bash {script} OUT" in done.stdout and "#" not in done.stdout.splitlines()[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", SCRIPTS)
def test_an_option_for_out_is_refused_before_any_work(script, tmp_path):
    done = run(script, "-x", tmp_path)
    assert done.returncode == 2 and "OUT must be a folder, not the option -x" in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_both_scripts_are_found():
    assert SCRIPTS == ["benchmarks/docs_figures_16core.sh", "benchmarks/lab_precision_16core.sh"]
