"""Every command README.md and docs/*.md show runs as written: a fresh clone, followed as the pages say, runs every
command they show, unchanged; and every figure comes with its command.

What runs and what is only resolved:

- ``mismatch-ctrl check-config ...``: **run** (exit 0). ``mismatch-ctrl ... --help``: **run** (exit 0).
- ``mismatch-ctrl lab ...``: **resolved only**, because the shortest real run takes longer than ~20 s on 2 cores (the
  engine ladder: 42 s; ``--steps 40 --dump-details``: ~20 s with a cached warm-up, ~30 s without): each parses and
  resolves to the runs it would train (presets, methods, engines, seeds); each that trains names an explicit
  ``--out`` other than the default ``runs/lab`` (except ``make demo``'s own
  ``mismatch-ctrl lab --preset demo --out runs/lab``), so it never lands among the demo's runs and is refused
  there; commands sharing an ``--out`` share its settings (``lab`` refuses an ``--out`` holding runs made with other
  settings).
- ``mismatch-ctrl lab compare ...``: **resolved only**: it parses, every directory it compares is the ``--out`` of a
  lab command the documents show, and directories it pools share their settings unless it says ``--across-settings``.
- ``mismatch-ctrl analyze ...``: **resolved only** (its input is a lab run's dump): it parses, and each analyze of a
  lab dump reads a folder that a ``lab --dump-details`` command of the same documents writes.
- ``python benchmarks/...``: written with the virtual environment's interpreter (``.venv/bin/python``, or plain
  ``python`` after ``. .venv/bin/activate`` in the same code block); every flag shown exists in the script's
  ``--help``, and the command with ``--help`` appended exits 0 (its option values parse). Not run: the shortest
  takes 17 s, the others minutes.
- ``make TARGET``: the target exists in the Makefile. ``bash launch/SCRIPT --FLAG``: the script exists and the flag
  is one of its modes (their dry runs are tested in tests/launch/).
- Figures: every image a page shows exists; every figure of docs/ is shown on a docs page, and wherever it is shown
  (README included) next to the words naming the run folder it was copied from (``runs/<dir>/plots/<name>.png``)
  and, in the same section, the command that wrote ``runs/<dir>``.

Commands with placeholders (``DIR``, ``P``, ``FILE``, ``...``) are templates, not commands, and are left out."""

import dataclasses
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from mismatch_ctrl.cli import build_parser, lab_plan, main

ROOT = Path(__file__).resolve().parents[1]
SOURCE_TREE_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
"""A script's environment: mismatch_ctrl from this source tree, as the suite imports it (the venv installs it; a
device machine's python3, which runs the suite from the source tree, does not)."""
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDERS = {"DIR", "DIR...", "P", "Q", "LR", "N", "...", "my.yaml", "[--json]", "METHOD", "FILE", "D"}
DEMO = ["lab", "--preset", "demo", "--out", "runs/lab"]
"""``make demo``'s own command (the Makefile's ``mismatch-ctrl lab --preset demo --out $(OUT)``), the one allowed on
runs/lab; the Makefile's demo target is this command (tested below)."""


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def code_blocks(text: str) -> list[str]:
    """Fenced code blocks, continuation lines joined."""
    return [re.sub(r"\\\n\s*", " ", block) for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)]


def shown_lines(text: str) -> list[tuple[str, str]]:
    """(command, the code block it is in, or '' for an inline span) for every inline code span and every code-block
    line, comments dropped."""
    found = [(" ".join(m.group(1).split()), "") for m in re.finditer(r"`([^`]+)`", re.sub(r"```.*?```", "", text,
                                                                                               flags=re.S))]
    for block in code_blocks(text):
        found += [(line.split(" #")[0].strip(), block) for line in block.splitlines()]
    return found


def mismatch_ctrl_commands(text: str) -> list[list[str]]:
    """The ``mismatch-ctrl ...`` commands of a document's text as argument lists without the program name; bare
    mentions (no arguments) and templates left out."""
    commands = [shlex.split(line)[1:] for line, _ in shown_lines(text) if line.startswith("mismatch-ctrl ")]
    return [c for c in commands if len(c) > 1 and not PLACEHOLDERS & set(c)]


COMMANDS = [(path, argv) for path in DOCUMENTS for argv in mismatch_ctrl_commands(path.read_text())]
LAB = [(p, a) for p, a in COMMANDS if a[0] == "lab" and "--help" not in a and a[1] != "compare"]
COMPARE = [(p, a) for p, a in COMMANDS if a[:2] == ["lab", "compare"] and len(a) > 2 and "--help" not in a]


def _ids(items):
    return [f"{_rel(p)}: {' '.join(a)}" for p, a in items]


def test_the_documents_show_commands_of_every_subcommand():
    readme = [a for p, a in COMMANDS if p.name == "README.md" and p.parent == ROOT]
    assert {a[0] for a in readme} >= {"lab", "analyze", "check-config"}
    assert {a[0] for _, a in COMMANDS} >= {"lab", "analyze", "check-config"} and len(COMMANDS) >= 30


@pytest.mark.parametrize("path, argv", LAB, ids=_ids(LAB))
def test_each_lab_command_resolves_to_the_runs_it_would_train(path, argv):
    ns = build_parser().parse_args(argv)
    if ns.report_only:
        return
    runs, settings, seeds = lab_plan(ns)
    assert runs and seeds and settings.steps >= 1


@pytest.mark.parametrize("path, argv", LAB, ids=_ids(LAB))
def test_each_lab_command_that_trains_names_its_own_out(path, argv):
    if build_parser().parse_args(argv).report_only or argv == DEMO:
        return
    assert "--out" in argv, f"{_rel(path)}: `mismatch-ctrl {' '.join(argv)}` has no --out: it would train into " \
                            "runs/lab, where make demo's runs are, and be refused"
    assert build_parser().parse_args(argv).out.rstrip("/") != "runs/lab", f"{_rel(path)}: --out runs/lab is make demo's"


def test_lab_commands_sharing_an_out_share_its_settings():
    settings_of: dict[str, tuple] = {}
    for path, argv in LAB:
        ns = build_parser().parse_args(argv)
        if ns.report_only:
            continue
        _, settings, _ = lab_plan(ns)
        key = dataclasses.replace(settings, seed=0)
        first = settings_of.setdefault(ns.out.rstrip("/"), (key, path, argv))
        assert first[0] == key, (f"--out {ns.out}: `mismatch-ctrl {' '.join(argv)}` ({_rel(path)}) and "
                                 f"`mismatch-ctrl {' '.join(first[2])}` ({_rel(first[1])}) differ in their settings: "
                                 "the second would be refused")


def _trained_settings() -> dict[str, object]:
    """Each ``--out`` a shown lab command trains into -> its settings (seed aside)."""
    out = {}
    for _, argv in LAB:
        ns = build_parser().parse_args(argv)
        if not ns.report_only:
            out[ns.out.rstrip("/")] = dataclasses.replace(lab_plan(ns)[1], seed=0)
    return out


@pytest.mark.parametrize("path, argv", COMPARE, ids=_ids(COMPARE))
def test_each_compare_reads_directories_shown_commands_train_and_pools_only_what_it_may(path, argv):
    ns = build_parser().parse_args(argv)
    trained = _trained_settings()
    dirs = [str(d).rstrip("/") for d in ns.directories]
    missing = [d for d in dirs if d not in trained]
    assert not missing, f"{_rel(path)}: `mismatch-ctrl {' '.join(argv)}` compares {missing}, which no lab command " \
                        "of the documents trains"
    halves = [dirs[::2], dirs[1::2]] if ns.pairs else [dirs]
    mixed = [d for half in halves for d in half if trained[d] != trained[half[0]]]
    assert ns.across_settings or not mixed, f"{_rel(path)}: `mismatch-ctrl {' '.join(argv)}` pools {mixed}, " \
        "trained with other settings: it is refused without --across-settings"


HELP = [(p, a) for p, a in COMMANDS if "--help" in a]


@pytest.mark.parametrize("path, argv", HELP, ids=_ids(HELP))
def test_each_help_command_succeeds(path, argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code in (0, None)


CHECKS = [(p, a) for p, a in COMMANDS if a[0] == "check-config"]


@pytest.mark.parametrize("path, argv", CHECKS, ids=_ids(CHECKS))
def test_each_check_config_command_succeeds(path, argv, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 0, capsys.readouterr().err


def test_each_analyze_of_a_lab_dump_reads_a_folder_a_shown_lab_command_writes():
    written = set()
    for _, argv in LAB:
        ns = build_parser().parse_args(argv)
        if ns.dump_details:
            runs, _, seeds = lab_plan(ns)
            written |= {(Path(ns.out) / run.label / f"seed{seed}" / "dump").as_posix()
                        for run in runs for seed in seeds}
    analyzed = [(p, build_parser().parse_args(a)) for p, a in COMMANDS if a[0] == "analyze"]
    lab_dumps = [(p, ns) for p, ns in analyzed if "/dump" in ns.directory]
    assert lab_dumps, "the documents show analyze on a lab run's dump"
    for path, ns in lab_dumps:
        assert Path(ns.directory).as_posix() in written, f"{_rel(path)}: {ns.directory}: no lab command writes it"


def benchmark_commands() -> list[tuple[Path, str, list[str]]]:
    """(document, interpreter, [script, args...]) of every ``python benchmarks/...`` command shown."""
    out = []
    for path in DOCUMENTS:
        for line, block in shown_lines(path.read_text()):
            m = re.match(r"(\S*python3?)\s+(benchmarks/\S+\.py)(.*)$", line)
            if m:
                interpreter = m.group(1)
                if interpreter in ("python", "python3") and re.search(r"^\s*(\.|source) \.venv/bin/activate", block,
                                                                      flags=re.M):
                    interpreter = ".venv/bin/python"
                out.append((path, interpreter, [m.group(2), *shlex.split(m.group(3))]))
    return out


BENCHMARKS = benchmark_commands()


def test_the_documents_show_benchmark_commands():
    assert {args[0] for _, _, args in BENCHMARKS} >= {"benchmarks/lab_mismatch.py", "benchmarks/lab_rollouts.py"}


@pytest.mark.parametrize("path, interpreter, args", BENCHMARKS,
                         ids=[f"{_rel(p)}: {' '.join(a)}" for p, _, a in BENCHMARKS])
def test_each_benchmark_command_uses_the_venv_and_its_flags_parse(path, interpreter, args):
    device_machine = args[0] == "benchmarks/gpu_check.py" and interpreter == "python3"  # no venv there, by design
    assert interpreter == ".venv/bin/python" or device_machine, \
        f"{_rel(path)}: `{interpreter} {' '.join(args)}`: write .venv/bin/python (the dependencies are in the venv)"
    script = ROOT / args[0]
    assert script.is_file(), f"{_rel(path)}: {args[0]} does not exist"
    help_run = subprocess.run([sys.executable, str(script), "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env=SOURCE_TREE_ENV)
    assert help_run.returncode == 0, help_run.stderr
    for flag in (a.split("=")[0] for a in args[1:] if a.startswith("--")):
        assert re.search(rf"(^|[\s,\[]){re.escape(flag)}([\s,=\]]|$)", help_run.stdout, flags=re.M), \
            f"{_rel(path)}: {args[0]} has no option {flag}"
    parsed = subprocess.run([sys.executable, str(script), *args[1:], "--help"], cwd=ROOT, capture_output=True,
                            text=True, timeout=120, env=SOURCE_TREE_ENV)
    assert parsed.returncode == 0, f"{_rel(path)}: {' '.join(args)}: {parsed.stderr[-500:]}"


def test_the_makefiles_demo_is_the_demo_command_the_documents_exempt():
    recipe = re.search(r"^demo:.*\n\t(.+)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    assert shlex.split(recipe)[3:] == DEMO[:-1] + ["$(OUT)"], recipe
    assert re.search(r"^OUT \?= runs/lab$", (ROOT / "Makefile").read_text(), flags=re.M)


def test_each_make_target_and_launcher_shown_exists():
    targets = set(re.findall(r"^([a-z][a-z-]*):", (ROOT / "Makefile").read_text(), flags=re.M))
    for path in DOCUMENTS:
        for line, _ in shown_lines(path.read_text()):
            for target in re.findall(r"(?:^|\s)make ([a-z][a-z-]*)", line):
                assert target in targets, f"{_rel(path)}: `make {target}`: no such target"
            m = re.match(r"bash (launch/\S+\.sh)(.*)$", line)
            if m:
                assert (ROOT / m.group(1)).is_file(), f"{_rel(path)}: {m.group(1)} does not exist"
                flags = [a for a in shlex.split(m.group(2)) if a.startswith("-")]
                assert set(flags) <= {"--help", "--prepare", "--dry-run", "--"}, f"{_rel(path)}: {line}"


def figures(path: Path) -> list[tuple[str, int]]:
    """(image path as written, line number) of every image a document shows."""
    return [(m.group(1), path.read_text()[:m.start()].count("\n")) for m in
            re.finditer(r"!\[[^\]]*\]\(([^)\s]+\.png)\)", path.read_text())]


def test_every_figure_shown_exists():
    for path in DOCUMENTS:
        for image, _ in figures(path):
            assert (path.parent / image).is_file(), f"{_rel(path)}: {image} does not exist"


def _section(lines: list[str], at: int) -> str:
    start = max((i for i in range(at + 1) if lines[i].startswith("## ")), default=0)
    end = min((i for i in range(at + 1, len(lines)) if lines[i].startswith("## ")), default=len(lines))
    return "\n".join(lines[start:end])


@pytest.mark.parametrize("png", sorted(p.name for p in (ROOT / "docs").glob("*.png")))
def test_each_docs_figure_is_shown_next_to_the_command_that_made_it(png):
    shown = [(path, line) for path in DOCUMENTS for image, line in figures(path) if Path(image).name == png]
    assert any(path.parent.name == "docs" for path, _ in shown), f"docs/{png} is not shown on any docs page"
    for path, at in shown:
        lines = path.read_text().splitlines()
        near = "\n".join(lines[max(at - 3, 0):at + 8])
        origin = re.search(rf"`(?:docs/)?{re.escape(png)}` is `(runs/[^/`]+)/plots/[^`]+\.png`", near)
        assert origin, f"{_rel(path)}:{at + 1}: say next to {png} which run folder's plot it is " \
                       f"(`{png}` is `runs/<dir>/plots/<name>.png`)"
        section = _section(lines, at)
        outs = {build_parser().parse_args(argv).out.rstrip("/") for argv in mismatch_ctrl_commands(section)
                if argv[0] == "lab"}
        assert origin.group(1) in outs, f"{_rel(path)}: {png} comes from {origin.group(1)}, but no lab command " \
                                        "in its section writes that folder"



def slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_page_or_section_of_this_repository_resolves():
    """The README links each finding and each section of the evidence into docs/ (one click): each relative link
    names a file that exists, and its ``#anchor`` a heading of that file."""
    for path in DOCUMENTS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file, _, anchor = target.partition("#")
            linked = (path.parent / file) if file else path
            assert linked.exists(), f"{_rel(path)}: link {target}: {file} does not exist"
            if anchor:
                headings = re.findall(r"^#+ (.+)$", linked.read_text(), flags=re.M)
                assert anchor in {slug(h) for h in headings}, f"{_rel(path)}: link {target}: no such heading"
