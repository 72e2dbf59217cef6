"""The documentation agrees with itself and stays inside the clone.

Three rules, each a function of a repository root, so the tests below run them on this checkout and on planted
violations in a temporary tree:

- **Inside the clone**: every relative link of a page (README.md, docs/, launch/, docker/, recipes/) and every
  literal ``../`` path in its text resolves, from the page's own directory, to a file of the clone; no page, and no
  line of the code, tests, scripts or configs (comments included), names the developers' design folder
  (``../shared``, ``shared/design/``) or a path of the machine it was written on (``/work/``).
- **No tracker numbers**: "issue 22" means nothing in a clone. No page says "issue N"; no string of the package, the
  benchmarks, the recipes or docker/ (docstrings included: ``--help`` prints several), no launcher script, config,
  Dockerfile or Makefile, and no test name or test string a failing run prints (test docstrings aside) does either.
- **Times stated once** (the convention of docs/times.md): the time of a ``make`` target of :data:`TIMED_TARGETS`
  and of a lab preset run as itself (``mismatch-ctrl lab --preset NAME --out DIR``, no other option) is stated on
  docs/times.md only, which has a row for each; any other command (a code-block line or a ``mismatch-ctrl`` /
  ``make`` / ``bash`` / ``python`` code span) has its time on one page at most. A time is stated where a number
  with a unit (``s``, ``min``, ``h``) stands in the command's code-block comment, or in the same sentence or table
  row as the command.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections import defaultdict
from pathlib import Path

import pytest

from mismatch_ctrl.lab.sweeps.options import LAB_PRESETS

ROOT = Path(__file__).resolve().parents[1]
TIMES_PAGE = "docs/times.md"
TIMED_TARGETS = ("venv", "verl-venv", "demo", "test", "test-verl", "bench", "gpu-check")
"""The ``make`` targets whose time only docs/times.md states."""

ISSUE = re.compile(r"\bissues?[\s#-]*\d+", re.I)
TIME = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s*(?:-|to)\s*\d+(?:\.\d+)?)?\s*"
                  r"(?:s|secs?|seconds?|min|mins|minutes?|h|hrs?|hours?)\b(?!-)")
LINK = re.compile(r"\]\(([^)\s]+)[^)]*\)")
UP_PATH = re.compile(r"(?<![\w/.~$-])(?:\.\./)+[\w./-]*")
OUTSIDE_WORDS = re.compile(r"\.\./shared\b|\bshared/design/|/work/")
COMMAND_STARTS = ("mismatch-ctrl ", "make ", "bash ", "python", ".venv/bin/python")


def pages(root: Path) -> list[Path]:
    """The documentation a user of a clone reads."""
    found = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "launch").glob("*.md")),
             *sorted((root / "docker").glob("*.md")), *sorted((root / "recipes").glob("*/README.md"))]
    return [p for p in found if p.is_file()]


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


# --- inside the clone ------------------------------------------------------------------------------------------------

def outside_references(root: Path) -> list[str]:
    """``page: reference (why)`` for each link or ``../`` path that leaves the clone or names no file in it."""
    problems = []
    for page in pages(root):
        text = page.read_text()
        targets = [t for t in LINK.findall(text) if not re.match(r"[a-zA-Z][\w+.-]*:|#", t)]
        for target in targets + UP_PATH.findall(text):
            resolved = (page.parent / target.split("#")[0]).resolve()
            if not resolved.is_relative_to(root.resolve()):
                problems.append(f"{_rel(page, root)}: {target} (outside the clone)")
            elif not resolved.exists():
                problems.append(f"{_rel(page, root)}: {target} (no such file in the clone)")
        problems += [f"{_rel(page, root)}: {m.group()} (outside the clone)" for m in OUTSIDE_WORDS.finditer(text)]
    for path in source_files(root):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            problems += [f"{_rel(path, root)}:{number}: {m.group()} (outside the clone)"
                         for m in OUTSIDE_WORDS.finditer(line)]
    return problems


def source_files(root: Path) -> list[Path]:
    """The code, tests, scripts and configs of the clone (this file aside: it plants violations in its strings)."""
    found = [p for folder in ("mismatch_ctrl", "tests", "benchmarks", "recipes", "docker", "launch", "configs", ".ci")
             for p in sorted((root / folder).rglob("*")) if p.is_file() and p.suffix in ("", ".py", ".sh", ".yaml")]
    found += [root / "Makefile"] if (root / "Makefile").is_file() else []
    return [p for p in found if p.resolve() != Path(__file__).resolve() and "__pycache__" not in p.parts]


# --- no tracker numbers ----------------------------------------------------------------------------------------------

def _python_strings(path: Path, docstrings: bool) -> list[tuple[int, str]]:
    """(line, text) of every string constant of a Python file (f-strings' literal parts included); without
    ``docstrings``, those of modules, classes and functions left out."""
    tree = ast.parse(path.read_text())
    skip = set()
    if not docstrings:
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
                first = node.body[0]
                if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                    skip.add(id(first.value))
    found = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip]
    return found + [(n.lineno, n.name) for n in ast.walk(tree)
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def issue_mentions(root: Path) -> list[str]:
    """``file:line: issue N`` in the pages, in user-facing strings of the code, and in test names and messages."""
    problems = []

    def scan(path: Path, items: list[tuple[int, str]]) -> None:
        for line, text in items:
            problems.extend(f"{_rel(path, root)}:{line}: {m.group()}" for m in ISSUE.finditer(text.replace("_", " ")))

    for page in pages(root):
        scan(page, list(enumerate(page.read_text().splitlines(), 1)))
    for folder in ("mismatch_ctrl", "benchmarks", "recipes", "docker"):
        for path in sorted((root / folder).rglob("*.py")):
            scan(path, _python_strings(path, docstrings=True))
    for path in sorted((root / "tests").rglob("*.py")):
        if path.resolve() != Path(__file__).resolve():  # this file plants violations in its own strings
            scan(path, _python_strings(path, docstrings=False))
    scripts = [*(root / "launch").glob("*.sh"), *(root / "benchmarks").glob("*.sh"), *(root / "recipes").rglob("*.sh"),
               *(root / "configs").rglob("*.yaml"), *(root / "recipes").rglob("*.yaml"), root / "docker" / "Dockerfile",
               root / "Makefile"]
    for path in sorted(p for p in scripts if p.is_file()):
        scan(path, list(enumerate(path.read_text().splitlines(), 1)))
    return problems


# --- times stated once -----------------------------------------------------------------------------------------------

def command_key(command: str) -> str:
    """The name a time is filed under: ``make TARGET`` for a timed target, ``--preset NAME`` for a preset run as
    itself, else the command with its whitespace collapsed."""
    words = command.split()
    if len(words) == 2 and words[0] == "make" and words[1] in TIMED_TARGETS:
        return command
    try:
        argv = shlex.split(command)
    except ValueError:
        return " ".join(words)
    if argv[:2] == ["mismatch-ctrl", "lab"]:
        argv = argv[2:]
    options = dict(zip(argv[::2], argv[1::2])) if len(argv) % 2 == 0 else {}
    if set(options) in ({"--preset"}, {"--preset", "--out"}) and options["--preset"] in LAB_PRESETS:
        return f"--preset {options['--preset']}"
    return " ".join(words)


def is_keyed(key: str) -> bool:
    """Whether only docs/times.md may state this command's time."""
    return key in {f"make {t}" for t in TIMED_TARGETS} | {f"--preset {p}" for p in LAB_PRESETS}


def _units(text: str) -> list[str]:
    """Prose split into sentences (and table rows), code blocks removed."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    units = []
    for block in re.split(r"\n\s*\n", prose):
        rows = [line for line in block.splitlines() if line.lstrip().startswith("|")]
        units += rows
        rest = " ".join(line for line in block.splitlines() if not line.lstrip().startswith("|"))
        units += re.split(r"(?<=[.;!?])\s+(?=[A-Z`(\[*])", rest)
    return units


def time_statements(text: str) -> list[tuple[str, str]]:
    """(command key, the words stating its time) for each command of a page that has a time next to it."""
    found = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            command, hash_, comment = line.partition(" #")
            if hash_ and command.strip() and TIME.search(comment):
                found.append((command_key(command.strip()), line.strip()))
    for unit in _units(text):
        if not TIME.search(unit):
            continue
        spans = [" ".join(s.split()) for s in re.findall(r"`([^`]+)`", unit)]
        keys = {command_key(s) for s in spans if s.startswith(COMMAND_STARTS) or s.startswith("--preset ")}
        keys |= {f"make {t}" for t in TIMED_TARGETS if re.search(rf"\bmake {re.escape(t)}(?![\w-])", unit)}
        found += [(key, " ".join(unit.split())) for key in sorted(keys)]
    return found


def times_rows(root: Path) -> dict[str, tuple[str, set[str]]]:
    """Per keyed command with a row on docs/times.md (the first code span of its first cell: ``make TARGET`` or a
    preset's name): the row, and the pages that may state its time: docs/times.md where the row gives a time, else
    the pages the row links to (a preset whose own page states it)."""
    times = root / TIMES_PAGE
    found = {}
    for row in times.read_text().splitlines() if times.is_file() else []:
        cells = row.split("|")
        first = re.search(r"`([^`]+)`", cells[1]) if row.startswith("|") and len(cells) > 2 else None
        if not first:
            continue
        key = first.group(1) if first.group(1).startswith("make ") else f"--preset {first.group(1)}"
        links = {TIMES_PAGE if t.startswith("#") else _rel((times.parent / t.split("#")[0]).resolve(), root.resolve())
                 for t in LINK.findall(row) if not re.match(r"[a-zA-Z][\w+.-]*:", t)}
        found[key] = (row, {TIMES_PAGE} if TIME.search(row) else links)
    return found


def time_conflicts(root: Path) -> list[str]:
    """A keyed command's time stated on a page its row on docs/times.md does not name, a keyed command without such
    a row, and another command's time stated on two pages."""
    where: dict[str, dict[str, str]] = defaultdict(dict)
    for page in pages(root):
        for key, words in time_statements(page.read_text()):
            where[key].setdefault(_rel(page, root), words)
    rows = times_rows(root)
    problems = []
    for key in [f"make {t}" for t in TIMED_TARGETS] + [f"--preset {p}" for p in LAB_PRESETS]:
        if not rows.get(key, ("", set()))[1]:
            problems.append(f"{TIMES_PAGE}: no row for `{key}` that gives its time or links the page that does")
    for key, stated in sorted(where.items()):
        if is_keyed(key):
            owners = rows.get(key, ("", {TIMES_PAGE}))[1] or {TIMES_PAGE}
            problems += [f"{page}: the time of `{key}` belongs on {' or '.join(sorted(owners))} only (link there): "
                         f"{words[:160]}" for page, words in sorted(stated.items()) if page not in owners]
        elif len(stated) > 1:
            problems.append(f"`{key}` has its time on {len(stated)} pages ({', '.join(sorted(stated))}): state it on "
                            "one and link there")
    return problems


# --- this checkout ---------------------------------------------------------------------------------------------------

def test_no_page_points_outside_the_clone():
    assert outside_references(ROOT) == []


def test_no_issue_numbers_in_docs_output_or_test_names():
    assert issue_mentions(ROOT) == []


def test_each_command_has_its_time_on_one_page():
    assert time_conflicts(ROOT) == []


def test_the_readme_links_the_times_page():
    assert "](docs/times.md" in (ROOT / "README.md").read_text()


# --- planted violations: each rule fails where it should -------------------------------------------------------------

def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


TIMES_OK = "| command | time |\n|---|---|\n" + "".join(f"| `make {t}` | 1 min |\n" for t in TIMED_TARGETS) + \
    "".join(f"| `{p}` | 2 min |\n" for p in LAB_PRESETS)


def test_planted_references_outside_the_clone_are_named(tmp_path):
    root = _tree(tmp_path / "clone", {
        "README.md": "See [docs](docs/times.md) and [the web](https://example.org) and [here](#top).\n",
        "docs/times.md": TIMES_OK,
        "launch/README.md": "Facts: `../shared/design/SLIME.md` section 8; [up](../../elsewhere.md); "
                            "[gone](../docs/missing.md); [fine](../docs/times.md#x).\n",
        "docs/a.md": "Written on /work/main/docs.\n",
        "tests/test_y.py": "# facts: /work/shared/design/SLIME.md section 8\n"})
    problems = outside_references(root)
    assert "launch/README.md: ../shared (outside the clone)" in problems
    assert "launch/README.md: ../shared/design/SLIME.md (no such file in the clone)" in problems
    assert any("../../elsewhere.md (outside the clone)" in p for p in problems)
    assert any("../docs/missing.md (no such file" in p for p in problems)
    assert any(p.startswith("docs/a.md: /work/") for p in problems)
    assert "tests/test_y.py:1: /work/ (outside the clone)" in problems
    assert not any("times.md" in p or "example.org" in p or "#top" in p for p in problems)
    assert outside_references(_tree(tmp_path / "clean", {"README.md": "[d](docs/times.md)\n",
                                                         "docs/times.md": "x\n"})) == []


def test_planted_issue_numbers_are_named_in_pages_strings_and_test_names(tmp_path):
    root = _tree(tmp_path, {
        "README.md": "As issue #12 asked.\n",
        "docs/times.md": "Since issue-18 it is fast.\n",
        "mismatch_ctrl/m.py": '"""Module text."""\nprint(f"target of Issue 22: {1}")\n',
        "benchmarks/b.py": '"""Targets (issue 11)."""\n',
        "launch/run.sh": "echo 'see issue 3'\n",
        "tests/test_x.py": '"""Developers\' note: issue 37."""\n\ndef test_issue_40_case():\n'
                           '    """issue 41 in a test docstring is not printed."""\n    assert 1, "issue 42"\n'})
    found = {p.split(":")[0] + ":" + p.rsplit(": ", 1)[1] for p in issue_mentions(root)}
    assert found == {"README.md:issue #12", "docs/times.md:issue-18", "mismatch_ctrl/m.py:Issue 22",
                     "benchmarks/b.py:issue 11", "launch/run.sh:issue 3", "tests/test_x.py:issue 40",
                     "tests/test_x.py:issue 42"}


def test_planted_times_on_two_pages_are_named(tmp_path):
    root = _tree(tmp_path, {
        "docs/times.md": TIMES_OK,
        "README.md": "```bash\nmake demo   # the lab (3-4 min on 2 cores)\n```\n\nThe tests take ~11 min with "
                     "`make test`. Five seeds: `mismatch-ctrl lab --preset demo-seeds --out runs/s` (~9 min).\n",
        "docs/a.md": "```bash\nmismatch-ctrl analyze runs/d --arch moe   # ~12 s\n"
                     "mismatch-ctrl lab --preset demo-seeds --seeds 5,6 --out runs/t   # ~4 min: not the preset\n```\n",
        "docs/b.md": "Then `mismatch-ctrl analyze runs/d --arch moe` takes 12 s.\n\n| `make bench` | fast |\n"})
    problems = time_conflicts(root)
    assert sum("README.md: the time of `make demo`" in p for p in problems) == 1
    assert sum("README.md: the time of `make test`" in p for p in problems) == 1
    assert sum("README.md: the time of `--preset demo-seeds`" in p for p in problems) == 1
    assert any(p.startswith("`mismatch-ctrl analyze runs/d --arch moe` has its time on 2 pages") for p in problems)
    assert len(problems) == 4, problems  # the --seeds variant is another command; `make bench` has no time there
    (root / "docs/times.md").write_text(TIMES_OK.replace("| `make bench` | 1 min |\n", "| `make bench` | fast |\n")
                                        .replace("| `demo-seeds` | 2 min |", "| `demo-seeds` | [its page](b.md) |"))
    problems = time_conflicts(root)
    assert f"{TIMES_PAGE}: no row for `make bench` that gives its time or links the page that does" in problems
    assert any(p.startswith("README.md: the time of `--preset demo-seeds` belongs on docs/b.md only") for p in problems)


@pytest.mark.parametrize("text, stated", [
    ("`make test` prints `2157 passed` in ~11 min on 2 cores.", True),
    ("`make test-verl` runs tests/verl. It took 5 min.", False),  # another sentence
    ("`make test-verl` is part of `make test`; about 2 h in all.", True),
    ("Run `make demo` on 2 cores with 24 GiB.", False),
    ("| `make venv` | 1.7 GB | 3 min 10 s at load 8 |", True)])
def test_a_time_counts_for_the_commands_of_its_sentence_or_table_row(text, stated):
    assert bool(time_statements(text)) == stated
