"""The lab's evidence cannot be corrupted silently (issue 23, items 1 and 2): a damaged, copied or renamed run folder
is refused by a resumed sweep and by ``--report-only``, naming the folder and the choice, and moving the folder away
as the message says lets the next sweep train the run again; a comparison whose reference run is missing says so."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable

import pytest
from sweep_helpers import TINY_WARMUP

from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import run as lab_run
from mismatch_ctrl.lab.sweeps.integrity import DamagedRun
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.sweeps.run import run_lab
from mismatch_ctrl.lab.sweeps.sweep import FINGERPRINT_FILE, digest
from mismatch_ctrl.lab.training.settings import LabSettings

TINY = dict(steps=2, prompts_per_step=4, samples_per_prompt=4, eval_every=1, eval_prompts=8)
RUNS = [RunSpec("grpo", "none"), RunSpec("grpo", "e4m3"), RunSpec("token_tis", "e4m3")]
VICTIM = ("grpo@e4m3", "seed0")


@pytest.fixture(autouse=True)
def tiny_cli(monkeypatch):
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)


def lab(out: Path, runs: list[RunSpec] = RUNS, seeds: tuple[int, ...] = (0,)) -> lab_run.LabResult:
    return run_lab(runs, LabSettings(**TINY), out, cache_dir=out.parent / "cache", show_progress=False,
                   warmup=TINY_WARMUP, seeds=seeds)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One finished sweep (three runs, seed 0), copied by each test that damages it."""
    out = tmp_path_factory.mktemp("trained") / "out"
    original = lab_run.warmup_preset
    lab_run.warmup_preset = lambda task, policy: TINY_WARMUP
    try:
        lab(out)
    finally:
        lab_run.warmup_preset = original
    return out


@pytest.fixture
def out(trained, tmp_path) -> Path:
    copy = tmp_path / "out"
    shutil.copytree(trained, copy)
    shutil.copytree(trained.parent / "cache", tmp_path / "cache")
    return copy


def _edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _lines(path: Path, change: Callable[[list[str]], list[str]]) -> None:
    path.write_text("".join(line + "\n" for line in change(path.read_text().splitlines())))


def _nan_reward(lines: list[str]) -> list[str]:
    first = json.loads(lines[0])
    first["reward"] = float("nan")
    return [json.dumps(first)] + lines[1:]


def _remove_half(folder: Path) -> None:
    """Every other entry of a run folder (metrics.jsonl and state/), its fingerprint kept."""
    for path in [p for p in sorted(folder.iterdir()) if p.name != FINGERPRINT_FILE][::2]:
        shutil.rmtree(path) if path.is_dir() else path.unlink()


DAMAGE = {
    "metrics deleted": (lambda f: (f / "metrics.jsonl").unlink(), "metrics.jsonl is missing"),
    "metrics emptied": (lambda f: (f / "metrics.jsonl").write_text(""), "metrics.jsonl was changed"),
    "metrics truncated": (lambda f: _lines(f / "metrics.jsonl", lambda x: x[:-1]), "metrics.jsonl was changed"),
    "metrics cut mid-line": (lambda f: (f / "metrics.jsonl").write_bytes((f / "metrics.jsonl").read_bytes()[:-40]),
                             "metrics.jsonl was changed"),
    "metrics holding NaN": (lambda f: _lines(f / "metrics.jsonl", _nan_reward), "metrics.jsonl was changed"),
    "run.json deleted": (lambda f: (f / "run.json").unlink(), "run.json is missing"),
    "run.json lr edited": (lambda f: _edit_json(f / "run.json", lambda d: d["settings"].update(lr=0.5)),
                           "run.json was changed"),
    "run.json method edited": (lambda f: _edit_json(f / "run.json", lambda d: d.update(method="dcgrpo")),
                               "run.json was changed"),
    "half the folder gone": (lambda f: _remove_half(f), "metrics.jsonl is missing"),
    "fingerprint edited": (lambda f: _edit_json(f / FINGERPRINT_FILE, lambda d: d["inputs"]["settings"].update(lr=1)),
                           "fingerprint.json was edited"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_resumed_sweep_and_report_only_refuse_a_damaged_run_naming_it_and_the_choice(out, tmp_path, capsys, case):
    damage, needle = DAMAGE[case]
    folder = out.joinpath(*VICTIM)
    damage(folder)
    code = cli.main(["lab", "--out", str(out), "--cache-dir", str(tmp_path / "cache"), "--methods",
                     "grpo@none,grpo", "--prompts", "4", "--samples", "4", "--steps", "2", "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert f"{folder}: a damaged run (" in err and needle in err
    assert "Move the folder out of" in err and "trains the run again" in err
    code = cli.main(["lab", "--report-only", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{folder}: a damaged run (" in err and needle in err and "Traceback" not in err


@pytest.mark.parametrize("case", ["metrics holding NaN", "run.json deleted", "half the folder gone"])
def test_a_damaged_run_moved_away_as_the_message_says_is_trained_again(out, tmp_path, case):
    folder = out.joinpath(*VICTIM)
    DAMAGE[case][0](folder)
    with pytest.raises(DamagedRun):
        lab(out)
    folder.rename(tmp_path / "kept")
    result = lab(out)
    assert json.loads((folder / FINGERPRINT_FILE).read_text())["files"]["metrics.jsonl"]
    assert [s["label"] for s in result.summaries] == [r.label for r in RUNS]


def _forge(folder: Path, seed: int) -> None:
    """A careful copy to another seed: run.json, the fingerprint's inputs, its sha256 and file hashes all agree."""
    _edit_json(folder / "run.json", lambda d: d["settings"].update(seed=seed))

    def refingerprint(data: dict) -> None:
        data["inputs"]["settings"]["seed"] = seed
        data["inputs"]["warmup"]["seed"] = seed
        data["sha256"] = digest(data["inputs"])
        data["files"]["run.json"] = hashlib.sha256((folder / "run.json").read_bytes()).hexdigest()

    _edit_json(folder / FINGERPRINT_FILE, refingerprint)


COPIES = {
    "under another seed": (("grpo@e4m3", "seed1"), None, "belongs in grpo@e4m3/seed0"),
    "under another method": (("dcgrpo@e4m3", "seed0"), None, "belongs in grpo@e4m3/seed0"),
    "as a backup next to it": (("grpo@e4m3", "seed0.bak"), None, "belongs in grpo@e4m3/seed0"),
    "relabelled with care": (("grpo@e4m3", "seed1"), 1, "the same run copied"),
}


@pytest.mark.parametrize("case", list(COPIES))
def test_a_run_folder_copied_under_another_name_is_refused_never_counted_twice(out, tmp_path, capsys, case):
    where, forged_seed, needle = COPIES[case]
    copy = out.joinpath(*where)
    shutil.copytree(out.joinpath(*VICTIM), copy)
    if forged_seed is not None:
        _forge(copy, forged_seed)
    code = cli.main(["lab", "--report-only", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and f"{out}/" in err and needle in err, err
    with pytest.raises(DamagedRun, match=needle):
        lab(out, seeds=(0, 1))


def test_report_only_names_a_run_it_cannot_read_instead_of_dropping_it(out, capsys):
    folder = out.joinpath(*VICTIM)
    (folder / "run.json").unlink()
    code = cli.main(["lab", "--report-only", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{folder}: a damaged run (run.json is missing)" in err
    (folder / "metrics.jsonl").unlink()
    (folder / FINGERPRINT_FILE).unlink()
    code = cli.main(["lab", "--report-only", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"{folder}: a damaged run (no {FINGERPRINT_FILE}" in err


def test_a_comparison_whose_reference_run_is_missing_says_so(out, tmp_path, capsys):
    out.joinpath("grpo@e4m3").rename(tmp_path / "grpo-elsewhere")
    code = cli.main(["lab", "--report-only", "--out", str(out)])
    captured = capsys.readouterr()
    assert code == 0 and "token_tis@e4m3" in captured.out
    assert "note: token_tis@e4m3 is not compared with GRPO: grpo@e4m3 is missing (train the reference run" \
        in captured.err
    report = (out / "report.md").read_text()
    assert "Not compared (a reference run is missing from this directory): `token_tis@e4m3` is not compared with " \
           "GRPO: `grpo@e4m3` is missing." in report
    assert json.loads((out / "summary.json").read_text())["missing_comparisons"] == [
        "`token_tis@e4m3` is not compared with GRPO: `grpo@e4m3` is missing"]
    out.joinpath("grpo@none").rename(tmp_path / "exact-elsewhere")
    (tmp_path / "grpo-elsewhere").rename(out / "grpo@e4m3")
    code = cli.main(["lab", "--report-only", "--out", str(out)])
    assert code == 0 and "is not compared" not in capsys.readouterr().err  # one engine: no frontier, every pair there
