"""Every ``mismatch-ctrl`` command the README shows is accepted as written (issue 18: "a fresh clone, followed as the
README says, runs every command the README shows, unchanged"), without training: each ``lab`` command parses and
resolves to the runs it would train (presets, methods, engines, seeds); each ``check-config`` exits 0; each
``analyze`` of a lab run's dump names a run and seed that a ``lab --dump-details`` command of the README writes.
Commands with placeholders (``DIR``, ``P``, ``...``) are templates, not commands, and are left out."""

import re
import shlex
from pathlib import Path

import pytest

from mismatch_ctrl.cli import build_parser, lab_plan, main

ROOT = Path(__file__).resolve().parents[1]
PLACEHOLDERS = {"DIR", "P", "Q", "LR", "N", "...", "my.yaml", "[--json]", "METHOD"}


def readme_commands(path: Path = ROOT / "README.md") -> list[list[str]]:
    """The ``mismatch-ctrl ...`` commands of inline code spans and of code blocks (continuation lines joined,
    comments dropped), as argument lists without the program name; bare mentions (no arguments) left out."""
    text = path.read_text()
    found = [m.group(1) for m in re.finditer(r"`(mismatch-ctrl [^`]+)`", text)]
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [line.split(" #")[0] for line in joined.splitlines() if line.startswith("mismatch-ctrl ")]
    commands = [shlex.split(command)[1:] for command in found]
    return [c for c in commands if len(c) > 1 and not PLACEHOLDERS & set(c)]


COMMANDS = readme_commands()


def test_the_readme_shows_commands_of_every_subcommand():
    assert {c[0] for c in COMMANDS} >= {"lab", "analyze"} and len(COMMANDS) >= 10


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] == "lab"], ids=" ".join)
def test_each_lab_command_resolves_to_the_runs_it_would_train(argv):
    ns = build_parser().parse_args(argv)
    if ns.report_only:
        return
    runs, settings, seeds = lab_plan(ns)
    assert runs and seeds and settings.steps >= 1


@pytest.mark.parametrize("argv", [c for c in COMMANDS if c[0] == "check-config"], ids=" ".join)
def test_each_check_config_command_succeeds(argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 0, capsys.readouterr().err


def test_each_analyze_of_a_lab_dump_reads_a_folder_a_readme_lab_command_writes():
    written = set()
    for argv in (c for c in COMMANDS if c[0] == "lab"):
        ns = build_parser().parse_args(argv)
        if ns.dump_details:
            runs, _, seeds = lab_plan(ns)
            written |= {(Path(ns.out) / run.label / f"seed{seed}" / "dump").as_posix()
                        for run in runs for seed in seeds}
    analyzed = [build_parser().parse_args(c) for c in COMMANDS if c[0] == "analyze"]
    lab_dumps = [ns for ns in analyzed if "/dump" in ns.directory]
    assert lab_dumps, "the README shows analyze on a lab run's dump"
    for ns in lab_dumps:
        assert Path(ns.directory).as_posix() in written, f"{ns.directory}: no README lab command writes it"
