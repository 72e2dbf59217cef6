"""analyze's bad input (issue 37, items 2 and 6): dumps without samples, rewards that are partly not numbers (named
with the dump and the sample), dumps that cannot be one run (truncation at several lengths, responses longer than
--max-response-len, gaps, a rollout repeated under another id), and a FIFO or a device where a file is read."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from analyze.synthetic import make_rollout, write_run
from no_hang import make_fifo, within_deadline

from mismatch_ctrl.analyze import AnalyzeOptions, analyze_dumps
from mismatch_ctrl.analyze.dumps import DumpError, write_rollout_dump, write_train_dump
from mismatch_ctrl.cli import main


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    monkeypatch.setattr("mismatch_ctrl.analyze.report.write_plots", lambda result, out_dir: [])


def rollouts(ids, max_len: int = 24, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [make_rollout(i, g, samples=6, max_len=max_len) for i in ids]


def analyze(directory: Path, capsys, *extra: str) -> tuple[int, str]:
    code = within_deadline(lambda: main(["analyze", str(directory), "--out", str(directory.parent / "out"),
                                         *extra]), [])
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    return code, err


QUIET = AnalyzeOptions(progress=False)


def test_a_clean_run_has_no_finding_and_no_warning(tmp_path, capsys):
    write_run(tmp_path / "run", rollouts(range(5)))
    assert analyze_dumps(tmp_path / "run", QUIET)["consistency"] == []
    # eps: auto, so that the DC-GRPO budget sits above these dumps' floor (the default MoE eps, 0.005, is below it,
    # and analyze rightly warns about that: test_analyze_cli checks that warning)
    code, err = analyze(tmp_path / "run", capsys, "--eps", "auto")
    assert code == 0 and "warning" not in err, err


@pytest.mark.parametrize("kind", ["train", "rollout", "both"])
def test_dumps_without_samples_are_an_error_that_says_so(tmp_path, capsys, kind):
    for rid in range(3):
        if kind in ("train", "both"):
            write_train_dump(tmp_path / "run", rid, [])
        if kind in ("rollout", "both"):
            write_rollout_dump(tmp_path / "run", rid, [])
    with pytest.raises(DumpError, match=r"the dumps of its 3 rollout\(s\) hold no samples"):
        analyze_dumps(tmp_path / "run", QUIET)
    code, err = analyze(tmp_path / "run", capsys)
    assert code == 2 and "hold no samples (every 'samples' list is empty)" in err


def test_one_rollout_with_samples_among_empty_ones_is_analysed(tmp_path):
    write_run(tmp_path / "run", rollouts([0]))
    write_train_dump(tmp_path / "run", 1, [])
    assert analyze_dumps(tmp_path / "run", QUIET)["counts"]["rollouts"] == 2


def _train_with_reward(directory: Path, rollout, sample: int, value) -> None:
    rows = rollout.train_samples()
    rows[sample]["rewards"] = value
    write_train_dump(directory, rollout.rollout_id, rows, {"raw_reward": rollout.raw})


@pytest.mark.parametrize("value", ["abc", None, [1.0, 2.0], {"score": 1}])
def test_partly_non_numeric_train_rewards_are_named_with_dump_and_sample(tmp_path, capsys, value):
    run = tmp_path / "run"
    items = rollouts(range(3))
    write_run(run, items, rollout_dumps=False)
    _train_with_reward(run, items[1], 4, value)
    result = analyze_dumps(run, QUIET)
    row = result["rollouts"][1]
    dump = run / "train_data" / "1.pt"
    named = f"rewards left out of the replay: {dump}: sample 4: rewards is "
    assert any(note.startswith(named) for note in row["notes"])
    assert row["replay"]["has_rewards"] is False and result["rollouts"][0]["replay"]["has_rewards"] is True
    code, err = analyze(run, capsys)
    assert code == 0 and f"warning: 1 rollout(s) (1) with rewards that are not all numbers, left out of the replay; " \
                         f"the first: {dump}: sample 4: rewards is" in err, err


def test_partly_non_numeric_raw_rewards_and_sample_rewards_are_named(tmp_path, capsys):
    run = tmp_path / "run"
    items = rollouts(range(2))
    write_run(run, items, rollout_dumps=False)
    write_train_dump(run, 1, items[1].train_samples(), {"raw_reward": [0.0, 1.0, "x", 0.0, 1.0, 0.0]})
    rows = items[0].rollout_samples()
    rows[2]["reward"] = "yes"
    write_rollout_dump(tmp_path / "only", 0, rows)
    notes = analyze_dumps(run, QUIET)["rollouts"][1]["notes"]
    assert f"rewards left out of the replay: {run}/train_data/1.pt: sample 2: raw_reward is 'x', not a number" in notes
    notes = analyze_dumps(tmp_path / "only", QUIET)["rollouts"][0]["notes"]
    assert f"rewards left out of the replay: {tmp_path}/only/rollout_data/0.pt: sample 2: reward is 'yes', not a " \
           "number" in notes


def test_truncation_at_several_lengths_is_named_as_runs_with_other_settings(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, rollouts(range(3), max_len=24) + rollouts(range(3, 6), max_len=40, seed=1))
    (finding,) = analyze_dumps(run, QUIET)["consistency"]
    assert finding.startswith("truncated responses end at 2 lengths (at 24 tokens in rollouts 0, 1, 2; at 40 tokens "
                              "in rollouts 3, 4, 5)") and "different response-length settings" in finding
    code, err = analyze(run, capsys)
    assert code == 0 and f"warning: {finding}" in err
    assert finding in (tmp_path / "out" / "report.md").read_text()


def test_responses_longer_than_max_response_len_are_named(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, rollouts(range(2), max_len=24))
    findings = analyze_dumps(run, AnalyzeOptions(progress=False, max_response_len=16))["consistency"]
    assert "rollout 0, sample 2: a response of 24 tokens, longer than --max-response-len 16" in findings[0]
    assert analyze_dumps(run, AnalyzeOptions(progress=False, max_response_len=24))["consistency"] == []


def test_a_gap_in_the_rollout_ids_is_named(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, rollouts([0, 1, 4, 5, 9]))
    (finding,) = analyze_dumps(run, QUIET)["consistency"]
    assert finding.startswith("5 rollout(s) between 0 and 9 have no dump (2-3, 6-8): the replay joins the rollouts "
                              "around each gap")
    code, err = analyze(run, capsys)
    assert code == 0 and f"warning: {finding}" in err


def test_a_rollout_repeated_under_another_id_is_named(tmp_path, capsys):
    run = tmp_path / "run"
    items = rollouts(range(3))
    write_run(run, items)
    write_train_dump(run, 3, items[1].train_samples(), {"raw_reward": items[1].raw})
    write_rollout_dump(run, 3, items[1].rollout_samples())
    (finding,) = analyze_dumps(run, QUIET)["consistency"]
    assert finding.startswith("rollouts 1 and 3 hold the same samples (lengths, log-probs, rewards)")
    code, err = analyze(run, capsys)
    assert code == 0 and "warning: rollouts 1 and 3 hold the same samples" in err


# Item 2: files read by analyze.
def test_a_fifo_or_a_device_as_a_dump_is_skipped_by_name(tmp_path, capsys):
    run = tmp_path / "run"
    write_run(run, rollouts(range(3)))
    (run / "train_data" / "1.pt").unlink()
    fifo = make_fifo(run / "train_data" / "1.pt")
    (run / "rollout_data" / "2.pt").unlink()
    (run / "rollout_data" / "2.pt").symlink_to("/dev/zero")
    result = within_deadline(lambda: analyze_dumps(run, QUIET), [fifo])
    reasons = {s["path"]: s["reason"] for s in result["skipped"]}
    assert reasons[str(fifo)] == "not a regular file" and reasons[str(run / "rollout_data" / "2.pt")] == \
        "not a regular file"


def test_load_dump_refuses_what_is_no_regular_file(tmp_path):
    from mismatch_ctrl.analyze.dumps.files import load_dump
    fifo = make_fifo(tmp_path / "0.pt")
    with pytest.raises(DumpError, match=r"0.pt: cannot be read \(a FIFO \(named pipe\), not a regular file\)"):
        within_deadline(lambda: load_dump(fifo), [fifo])
    with pytest.raises(DumpError, match=r"cannot be read \(a character device, not a regular file\)"):
        load_dump("/dev/zero")


@pytest.mark.parametrize("make, what", [(make_fifo, "a FIFO (named pipe)"),
                                        (lambda p: p.symlink_to("/dev/zero"), "a character device")])
def test_hf_config_that_is_no_regular_file_is_named(tmp_path, capsys, make, what):
    run = tmp_path / "run"
    write_run(run, rollouts(range(2)))
    config = tmp_path / "config.json"
    make(config)
    code, err = analyze(run, capsys, "--hf-config", str(config))
    assert code == 2 and f"cannot read the Hugging Face config {config} ({what}, not a regular file)" in err, err
    model = tmp_path / "model"
    model.mkdir()
    make(model / "config.json")
    code, err = analyze(run, capsys, "--hf-config", str(model))
    assert code == 2 and f"{model / 'config.json'} ({what}, not a regular file)" in err


def test_copying_a_run_keeps_its_findings_empty(tmp_path):
    """The repeat rule compares samples, not files: a whole run copied elsewhere is still one run."""
    write_run(tmp_path / "run", rollouts(range(3)))
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    assert analyze_dumps(tmp_path / "copy", QUIET)["consistency"] == []
