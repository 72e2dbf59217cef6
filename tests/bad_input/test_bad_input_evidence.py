"""Evidence that protects itself (issue 37, items 1, 2 and 7 in the lab): a run's integrity record covers its own list
of files, a folder without hashes counts only on request (``--trust-unhashed``) and is then named, every file
``lab compare``, ``--report-only`` and a resumed sweep read is read as a regular file (a FIFO or a device there is
named, never waited on), and the commands a directory records run again when pasted."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest
from no_hang import make_fifo, within_deadline
from sweep_helpers import TINY_WARMUP, copied_sweep, tiny_sweep

from mismatch_ctrl import cli
from mismatch_ctrl.lab.sweeps import run as lab_run
from mismatch_ctrl.lab.sweeps.integrity import DamagedRun, UnhashedRun, check_run
from mismatch_ctrl.lab.sweeps.sweep import FINGERPRINT_FILE, digest
from mismatch_ctrl.lab.training.methods import RunSpec
from mismatch_ctrl.lab.training.settings import LabSettings

TINY = dict(steps=2, prompts_per_step=4, samples_per_prompt=4, eval_every=1)
RUNS = [RunSpec("grpo", "e4m3"), RunSpec("token_tis", "e4m3")]
VICTIM = ("token_tis@e4m3", "seed0")


@pytest.fixture(autouse=True)
def tiny_cli(monkeypatch):
    monkeypatch.setattr(lab_run, "warmup_preset", lambda task, policy: TINY_WARMUP)


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained") / "out"
    tiny_sweep(out, RUNS, LabSettings(**TINY))
    return out


@pytest.fixture
def out(trained, tmp_path) -> Path:
    return copied_sweep(trained, tmp_path)


def resume(out: Path, *extra: str) -> list[str]:
    return ["lab", "--out", str(out), "--cache-dir", str(out.parent / "cache"), "--methods", "grpo@e4m3,token_tis@e4m3",
            "--prompts", "4", "--samples", "4", "--steps", "2", "--eval-every", "1", "--jobs", "1", *extra]


COMMANDS = {"resume": resume, "report-only": lambda out, *extra: ["lab", "--report-only", "--out", str(out), *extra],
            "compare": lambda out, *extra: ["lab", "compare", str(out), *extra]}


def run_cli(args: list[str], capsys, fifos: tuple[Path, ...] = ()) -> tuple[int, str, str]:
    code = within_deadline(lambda: cli.main(args), list(fifos))
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err, captured.err
    return code, captured.out, captured.err


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data, indent=1) + "\n")


def tamper_metrics(folder: Path) -> None:
    """The issue's edit: every rollout's reward and accuracy moved, as if the run had done better."""
    lines = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    for record in lines:
        record.update({k: 1.0 for k in record if k.startswith(("reward", "eval_acc", "final_eval_acc"))})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))


def as_before_the_record_covered_its_list(folder: Path) -> None:
    """The record a lab wrote before this change: ``sha256`` over the inputs only, the list of files beside it."""
    edit_json(folder / FINGERPRINT_FILE, lambda d: d.update(sha256=digest(d["inputs"])))


def as_before_hashes(folder: Path) -> None:
    """A folder from before file hashes were recorded: no ``files``, ``sha256`` over the inputs."""
    as_before_the_record_covered_its_list(folder)
    edit_json(folder / FINGERPRINT_FILE, lambda d: d.pop("files"))


def test_a_new_record_covers_its_list_of_files(out):
    record = json.loads(out.joinpath(*VICTIM, FINGERPRINT_FILE).read_text())
    assert {"run.json", "metrics.jsonl"} <= set(record["files"])
    assert record["sha256"] == digest({"inputs": record["inputs"], "files": record["files"]})
    assert check_run(out.joinpath(*VICTIM)).hashed


REMOVALS = {
    "files deleted, metrics edited": (lambda f: (edit_json(f / FINGERPRINT_FILE, lambda d: d.pop("files")),
                                                 tamper_metrics(f)), "its inputs or its list of files"),
    "files emptied, metrics edited": (lambda f: (edit_json(f / FINGERPRINT_FILE, lambda d: d.update(files={})),
                                                 tamper_metrics(f)), "its inputs or its list of files"),
    "metrics taken off the list, edited": (
        lambda f: (edit_json(f / FINGERPRINT_FILE, lambda d: d["files"].pop("metrics.jsonl")), tamper_metrics(f)),
        "its inputs or its list of files"),
    "files null": (lambda f: edit_json(f / FINGERPRINT_FILE, lambda d: d.update(files=None)),
                   "its inputs or its list of files"),
    "older record, files emptied": (lambda f: (as_before_the_record_covered_its_list(f),
                                               edit_json(f / FINGERPRINT_FILE, lambda d: d.update(files={})),
                                               tamper_metrics(f)), "lacks run.json and metrics.jsonl"),
    "older record, metrics taken off the list": (
        lambda f: (as_before_the_record_covered_its_list(f),
                   edit_json(f / FINGERPRINT_FILE, lambda d: d["files"].pop("metrics.jsonl")), tamper_metrics(f)),
        "lacks metrics.jsonl"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("case", list(REMOVALS))
def test_removing_or_emptying_the_list_of_files_is_detected(out, capsys, case, command):
    damage, needle = REMOVALS[case]
    folder = out.joinpath(*VICTIM)
    damage(folder)
    code, _, err = run_cli(COMMANDS[command](out), capsys)
    assert code == 2 and f"{folder}: a damaged run (" in err and needle in err, err
    code, _, err = run_cli(COMMANDS[command](out, "--trust-unhashed"), capsys)
    assert code == 2 and needle in err, err  # a damaged record is no unhashed one: the option does not count it


def test_an_older_record_with_its_list_intact_still_counts(out, capsys):
    folder = out.joinpath(*VICTIM)
    as_before_the_record_covered_its_list(folder)
    assert check_run(folder).hashed
    code, _, err = run_cli(COMMANDS["report-only"](out), capsys)
    assert code == 0 and "warning" not in err, err
    tamper_metrics(folder)
    with pytest.raises(DamagedRun, match="metrics.jsonl was changed after the run finished"):
        check_run(folder)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_folder_without_hashes_is_named_and_counts_only_on_request(out, capsys, command):
    folder = out.joinpath(*VICTIM)
    as_before_hashes(folder)
    with pytest.raises(UnhashedRun):
        check_run(folder)
    code, _, err = run_cli(COMMANDS[command](out), capsys)
    assert code == 2 and f"{folder}: a damaged run (fingerprint.json records no file hashes" in err, err
    assert "--trust-unhashed" in err
    code, stdout, err = run_cli(COMMANDS[command](out, "--trust-unhashed"), capsys)
    assert code == 0, err
    assert f"warning: {'' if command != 'compare' else f'{out}: '}counted 1 run folder whose fingerprint.json " \
           f"records no file hashes, unchecked (--trust-unhashed): {folder}" in err
    assert not check_run(folder, trust_unhashed=True).hashed


def test_the_option_also_counts_when_given_before_compare(out, capsys):
    as_before_hashes(out.joinpath(*VICTIM))
    code, _, err = run_cli(["lab", "--trust-unhashed", "compare", str(out)], capsys)
    assert code == 0 and "counted 1 run folder" in err, err


def test_a_damaged_unhashed_folder_is_damaged_even_when_trusted(out, capsys):
    folder = out.joinpath(*VICTIM)
    as_before_hashes(folder)
    lines = (folder / "metrics.jsonl").read_text().splitlines()
    (folder / "metrics.jsonl").write_text(lines[0] + "\n")
    code, _, err = run_cli(COMMANDS["report-only"](out, "--trust-unhashed"), capsys)
    assert code == 2 and "holds 1 of the run's 2 rollouts" in err, err


# Item 2 in the lab: every file these commands read, replaced by a FIFO or a device.
PLACES = {"metrics.jsonl": VICTIM, "fingerprint.json": VICTIM, "run.json": VICTIM}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("name", ["metrics.jsonl", "fingerprint.json", "run.json", "state"])
def test_a_fifo_in_a_run_folder_is_named_never_waited_on(out, capsys, command, name):
    folder = out.joinpath(*VICTIM)
    if name == "state":  # a file the record lists beyond the two the checks read
        record = json.loads((folder / FINGERPRINT_FILE).read_text())
        name = next(n for n in record["files"] if n not in ("metrics.jsonl", "run.json"))
    (folder / name).unlink()
    fifo = make_fifo(folder / name)
    code, _, err = run_cli(COMMANDS[command](out), capsys, (fifo,))
    assert code == 2 and f"{folder}: a damaged run ({name} is unreadable or malformed: a FIFO (named pipe), not a " \
                         "regular file)" in err, err


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_device_where_metrics_belong_is_named_never_read(out, capsys, command):
    folder = out.joinpath(*VICTIM)
    (folder / "metrics.jsonl").unlink()
    (folder / "metrics.jsonl").symlink_to("/dev/zero")
    code, _, err = run_cli(COMMANDS[command](out), capsys)
    assert code == 2 and "metrics.jsonl is unreadable or malformed: a character device, not a regular file" in err


@pytest.mark.parametrize("command", ["resume", "report-only"])
def test_a_fifo_as_commands_txt_is_named(out, capsys, command):
    fifo = out / "commands.txt"
    fifo.unlink()
    make_fifo(fifo)
    code, _, err = run_cli(COMMANDS[command](out), capsys, (fifo,))
    assert code == 2 and f"{fifo} cannot be read or written as UTF-8 text (a FIFO (named pipe), not a regular file)" \
        in err, err


@pytest.mark.parametrize("command", ["resume", "report-only"])
@pytest.mark.parametrize("name", ["summary.json", "report.md"])
def test_a_fifo_where_an_output_is_written_is_replaced_never_opened(out, capsys, command, name):
    fifo = out / name
    fifo.unlink()
    make_fifo(fifo)
    code, _, err = run_cli(COMMANDS[command](out), capsys, (fifo,))
    assert code == 0, err
    assert fifo.is_file() and fifo.stat().st_size > 0


def test_a_fifo_as_a_plot_is_replaced_never_opened(out, capsys):
    fifo = out / "plots" / "overview.png"
    fifo.unlink()
    make_fifo(fifo)
    code, _, err = run_cli(COMMANDS["report-only"](out), capsys, (fifo,))
    assert code == 0 and fifo.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", err


# Item 7: the recorded command runs again.
HOSTILE_WORDS = ["has space", "new\nline", "it's", "$HOME", "a;b|c&d", "`x`", "tab\there", "*", "-dash", "é", "",
                 "\\", "'\"'", "\r\x01\x7f", "$'x'", "~", "#hash", "!!"]
HOSTILE_DIR = "a b\nc\td it's $HOME;x|y&z `w` * é"


def _words_as_bash_reads(line: str) -> list[str]:
    """The words bash gives a command when ``line`` is pasted (the first word a function that prints them)."""
    program = line.split(" ", 1)[0]
    done = subprocess.run(["bash", "-c", f"{program}() {{ printf '%s\\0' \"$@\"; }}\n{line}"], capture_output=True,
                          check=True, cwd="/", env={**os.environ, "HOME": "/home/nobody"})
    return done.stdout.decode().split("\0")[:-1]


@pytest.fixture
def bash():
    if shutil.which("bash") is None:
        pytest.skip("no bash")


def test_shell_command_is_one_line_that_bash_reads_back_word_for_word(bash):
    from mismatch_ctrl.formatting import shell_command
    for word in HOSTILE_WORDS:
        line = shell_command(["mismatch-ctrl", "lab", "--out", word])
        assert "\n" not in line and _words_as_bash_reads(line) == ["lab", "--out", word], (word, line)
    line = shell_command(["mismatch-ctrl", *HOSTILE_WORDS])
    assert _words_as_bash_reads(line) == HOSTILE_WORDS
    assert shell_command(["mismatch-ctrl", "lab", "--out", "runs/lab"]) == "mismatch-ctrl lab --out runs/lab"


@pytest.mark.parametrize("command", ["resume", "report-only"])
def test_recorded_commands_read_back_as_the_words_that_ran(out, capsys, command, tmp_path, bash):
    target = tmp_path / HOSTILE_DIR
    shutil.copytree(out, target)
    if command == "report-only":  # it records nothing; its command names a report only where none was recorded
        (target / "commands.txt").unlink()
    args = COMMANDS[command](target)
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    line = json.loads((target / "summary.json").read_text())["commands"][-1]
    if command == "resume":
        recorded = (target / "commands.txt").read_text().splitlines()
        assert len(recorded) == 2 and recorded[-1] == line, recorded  # one line per command, newlines included
    assert _words_as_bash_reads(line) == ["lab", *args[1:]], line
    assert line in (target / "report.md").read_text()


def test_report_fences_a_command_holding_backticks(out, capsys):
    from mismatch_ctrl.formatting import code_span
    line = "mismatch-ctrl lab --out '``x'"
    (out / "commands.txt").write_text(line + "\n")
    code, _, err = run_cli(COMMANDS["report-only"](out), capsys)
    assert code == 0 and code_span(line) in (out / "report.md").read_text() and code_span(line).startswith("```")


def test_sha_of_the_old_record_is_what_an_older_lab_wrote(out):
    """The compatibility rule rests on this: the older record's sha256 is ``digest(inputs)``."""
    record = json.loads(out.joinpath(*VICTIM, FINGERPRINT_FILE).read_text())
    assert digest(record["inputs"]) == hashlib.sha256(json.dumps(record["inputs"], sort_keys=True).encode()).hexdigest()


# Item 9: a stale `.partial` the lab did not write.
@pytest.mark.parametrize("kind", ["file", "link to a folder", "broken link", "fifo"])
def test_a_stale_partial_that_is_no_folder_is_named_and_left_alone(out, capsys, tmp_path, kind):
    partial = out / "grpo@e4m3" / ".seed0.partial"
    kept = tmp_path / "kept"
    if kind == "file":
        partial.write_text("mine")
    elif kind == "fifo":
        make_fifo(partial)
    else:
        if kind == "link to a folder":
            kept.mkdir()
            (kept / "precious").write_text("x")
        partial.symlink_to(kept)
    code, _, err = run_cli(COMMANDS["resume"](out), capsys, (partial,) if kind == "fifo" else ())
    what = {"file": "a file", "fifo": "a FIFO (named pipe)"}.get(kind, f"a symbolic link to {kept}")
    assert code == 2 and f"{partial} is {what}, where the lab keeps the folder of a run it is writing" in err, err
    assert "move it out of the output directory (or delete it)" in err
    assert partial.is_symlink() or partial.exists()
    if kind == "link to a folder":
        assert (kept / "precious").read_text() == "x"


def test_a_stale_partial_folder_is_still_removed(out, capsys):
    partial = out / "grpo@e4m3" / ".seed0.partial"
    partial.mkdir()
    (partial / "metrics.jsonl").write_text("half")
    code, stdout, err = run_cli(COMMANDS["resume"](out), capsys)
    assert code == 0 and not partial.exists() and f"removed the unfinished run folder {partial}" in stdout, err


# Item 10: a preset's learning rate and a policy that cannot take it.
def test_a_preset_lr_made_for_another_policy_yields_to_the_policys_own(capsys):
    from mismatch_ctrl.lab.sweeps.options import LAB_PRESETS, POLICY_DEFAULTS

    parser = cli.build_parser()
    settings = cli.lab_plan(parser.parse_args(["lab", "--preset", "e5m2-edge", "--policy", "moe-large"]))[1]
    assert settings.lr == POLICY_DEFAULTS["moe-large"]["lr"] == 1e-4 != LAB_PRESETS["e5m2-edge"]["lr"]
    err = capsys.readouterr().err
    assert "note: --preset e5m2-edge sets lr 0.0015 for the moe policy; --policy moe-large uses its own lr 0.0001 " \
           "(give --lr to choose)" in err
    chosen = cli.lab_plan(parser.parse_args(["lab", "--preset", "e5m2-edge", "--policy", "moe-large", "--lr", "2e-3"]))
    assert chosen[1].lr == 2e-3 and "note" not in capsys.readouterr().err
    for policy in ("moe", "dense"):  # policies without their own lr keep the preset's, silently
        plan = cli.lab_plan(parser.parse_args(["lab", "--preset", "e5m2-edge", "--policy", policy, "--methods",
                                               "grpo,dcgrpo"]))
        assert plan[1].lr == 1.5e-3 and "note" not in capsys.readouterr().err
