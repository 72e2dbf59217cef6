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
  and of a lab preset run as itself (:func:`command_key`: no option that changes which runs are trained) is stated
  on docs/times.md only, which has a row for each; any other command has its time on one page at most. A time (a
  number with a unit: ``s``, ``min``, ``h``) is stated in a command's code-block comment; in the sentence (never cut
  inside parentheses) or table row of a command's code span or ``make TARGET``, unless the command stands in an
  aside in parentheses that the time is not in; for a bare option span (``--methods X``), of the preset of its table
  row or of the one command of the code block next to it with that option; and, for a code block of one command, in
  the paragraph right after it or the sentence ending in ``:`` right before it. The benchmarks' header comments and
  docstrings count too, for the ``make`` targets and presets. Its tests: tests/test_docs_times.py.
"""

from __future__ import annotations

import ast
import re
import shlex
from collections import defaultdict
from pathlib import Path

from mismatch_ctrl.lab.sweeps.options import LAB_DEFAULTS, LAB_PRESETS

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
COMMAND_STARTS = ("mismatch-ctrl ", "make ", "bash ", "python", ".venv/bin/python", ".venv-verl/bin/python")


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

LAB_WHERE = ("--out", "--jobs", "--cache-dir", "--ray-address", "--device")
"""``mismatch-ctrl lab`` options that say where and how many at a time its runs go, not which runs are trained."""
INTERPRETER = re.compile(r"(?:\S*/)?python3?")


def _lab_value(flag: str, value: object) -> str:
    """A lab option's value as the runs see it: lists as sorted sets, numbers as numbers."""
    text = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    try:
        if flag in ("--methods", "--quant", "--seeds"):
            items = {int(v) if flag == "--seeds" else v.strip() for v in text.split(",") if v.strip()}
            return ",".join(map(str, sorted(items)))
        return f"{float(text):g}" if flag in ("--lr", "--steps", "--num-steps-per-rollout") else text
    except ValueError:
        return text


def command_key(command: str) -> str:
    """The name a command's time is filed under, decided as the docs write commands.

    ``make TARGET``: the target. A ``mismatch-ctrl lab`` run (``python -m mismatch_ctrl`` the same): ``--preset NAME``
    and the options that change which runs are trained, each as the runs see it (:func:`_lab_value`); an option equal
    to the preset's own or the lab's default changes nothing and is left out, and so are :data:`LAB_WHERE`. So
    ``--preset e5m2-edge --out runs/x --jobs 2`` is ``--preset e5m2-edge``, the preset run as itself, whose time only
    docs/times.md states, while ``--preset demo-seeds --methods dcgrpo_floor_guard`` is a command of its own. Any
    other command: its program (``python`` for any interpreter) and arguments, without environment settings, output
    paths (``--out``/``--json`` and their values, ``OUT``) and redirections."""
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    while argv and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", argv[0]):
        argv.pop(0)
    if argv[:1] == ["make"]:
        return " ".join(["make", *(a for a in argv[1:] if "=" not in a and not a.startswith("-"))])
    if argv and INTERPRETER.fullmatch(argv[0]):
        argv = ["mismatch-ctrl", *argv[3:]] if argv[1:3] == ["-m", "mismatch_ctrl"] else ["python", *argv[1:]]
    options: dict[str, str] = {}
    rest = argv[2:] if argv[:2] == ["mismatch-ctrl", "lab"] else ["not a lab run"]
    while rest and rest[0].startswith("--"):
        flag, _, value = rest.pop(0).partition("=")
        options[flag] = value or (rest.pop(0) if rest and not rest[0].startswith("--") else "")
    if rest:
        words, skip = [], False
        for word in argv:
            drop, skip = skip, word in ("--out", "--json") or re.fullmatch(r"\d?>>?", word) is not None
            words += [] if drop or skip or re.fullmatch(r"\d?>>?\S+|\d>&\d|\$?OUT(/\S*)?", word) else [word]
        return " ".join(words)
    preset = options.pop("--preset", "")
    base = {**LAB_DEFAULTS, **LAB_PRESETS.get(preset, {})}
    kept = sorted(f"{flag} {_lab_value(flag, value)}".strip() for flag, value in options.items()
                  if flag not in LAB_WHERE and _lab_value(flag, value) != _lab_value(flag, base.get(
                      flag[2:].replace("-", "_"), None)))
    if preset in LAB_PRESETS and not kept:
        return f"--preset {preset}"
    return " ".join(["mismatch-ctrl lab", *([f"--preset {preset}"] if preset else []), *kept])


def is_keyed(key: str) -> bool:
    """Whether only docs/times.md may state this command's time."""
    return key in {f"make {t}" for t in TIMED_TARGETS} | {f"--preset {p}" for p in LAB_PRESETS}


def _units(text: str) -> list[str]:
    """Prose split into sentences (none inside parentheses) and table rows, code blocks removed."""
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    units = []
    for block in re.split(r"\n\s*\n", prose):
        rows = [line for line in block.splitlines() if line.lstrip().startswith("|")]
        units += rows
        rest = " ".join(line for line in block.splitlines() if not line.lstrip().startswith("|"))
        sentences: list[str] = []
        for piece in re.split(r"(?<=[.;!?])\s+(?=[A-Z`(\[*])", rest):
            unclosed = sentences and sentences[-1].count("(") > sentences[-1].count(")")
            sentences[-1:] = [sentences[-1] + " " + piece] if unclosed else sentences[-1:] + [piece]
        units += sentences
    return units


def _aside(unit: str, at: int) -> str:
    """The innermost parenthesised aside of ``unit`` around position ``at``, or the whole unit: a command named
    inside an aside owns only the times of that aside."""
    opened: list[int] = []
    for i, char in enumerate(unit[:at]):
        opened = opened + [i] if char == "(" else opened[:-1] if char == ")" else opened
    depth = 0
    for i in range(opened[-1], len(unit)) if opened else ():
        depth += {"(": 1, ")": -1}.get(unit[i], 0)
        if depth == 0:
            return unit[opened[-1]:i + 1]
    return unit[opened[-1]:] if opened else unit


def _block_commands(block: str) -> list[tuple[str, str]]:
    """(line, comment) per line of a fenced code block (continuations joined) that is not blank or a comment."""
    found = []
    for line in re.sub(r"\\\n\s*", " ", block.split("\n", 1)[-1].rsplit("```", 1)[0]).splitlines():
        command, _, comment = line.partition(" #")
        found += [(command.strip(), comment)] if command.strip() and not command.lstrip().startswith("#") else []
    return found


def _runs_command(line: str) -> bool:
    """Whether a code-block line runs one of the commands the docs time (environment settings before it aside)."""
    return re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)+", "", line).startswith(COMMAND_STARTS + ("export ",))


def _unit_statements(unit: str, near: list[str]) -> list[tuple[str, str]]:
    """(key, words) for each command a unit states a time of: a command span (two words at least) or ``make TARGET``
    whose aside holds a time; a bare option span (``--methods X``) of a preset's table row, as that preset run with
    it, or of the prose next to a code block, as the block's one command with it; else the block's one command."""
    cells = unit.split("|") if unit.lstrip().startswith("|") else []
    first = re.search(r"`([^`]+)`", cells[1]) if len(cells) > 2 else None
    row_preset = first.group(1) if first and first.group(1) in LAB_PRESETS else None
    keys = set()
    for span in re.finditer(r"`([^`]+)`", unit):
        words, command = " ".join(span.group(1).split()), None
        if words.startswith(COMMAND_STARTS) and " " in words or words.startswith("--preset "):
            command = words if words.startswith(COMMAND_STARTS) else f"mismatch-ctrl lab {words}"
        elif words.startswith("--") and row_preset:
            command = f"mismatch-ctrl lab --preset {row_preset} {words}"
        elif words.startswith("--") and not cells:
            holding = [c for c in near if f" {words} " in f" {' '.join(c.split())} "]
            command = holding[0] if len(holding) == 1 else None
        if command and TIME.search(_aside(unit, span.start())):
            keys.add(command_key(command))
    for target in TIMED_TARGETS:
        keys |= {f"make {target}" for m in re.finditer(rf"\bmake {re.escape(target)}(?![\w-])", unit)
                 if TIME.search(_aside(unit, m.start()))}
    alone = not cells and not keys and len(near) == 1 and _runs_command(near[0]) and TIME.search(unit)
    keys |= {command_key(near[0])} if alone else set()
    return [(key, " ".join(unit.split())) for key in sorted(keys)]


def time_statements(text: str) -> list[tuple[str, str]]:
    """(command key, the words stating its time) for each command of a page that has a time next to it: in its code
    block line's comment, in its sentence or table row (:func:`_unit_statements`), or, for a block of one command, in
    the paragraph right after the block or the sentence ending in ``:`` right before it."""
    found, parts = [], re.split(r"(```[^\n]*\n.*?```)", text, flags=re.S)
    for i, part in enumerate(parts):
        if i % 2:
            found += [(command_key(c), f"{c} #{comment}".strip()) for c, comment in _block_commands(part)
                      if TIME.search(comment)]
            continue
        after = [c for c, _ in _block_commands(parts[i - 1])] if i else []
        before = [c for c, _ in _block_commands(parts[i + 1])] if i + 1 < len(parts) else []
        paragraphs = [p for p in re.split(r"\n\s*\n", part) if p.strip()]
        for n, paragraph in enumerate(paragraphs):
            units = _units(paragraph)
            for k, unit in enumerate(units):
                last = n == len(paragraphs) - 1 and k == len(units) - 1 and unit.rstrip().endswith(":")
                found += _unit_statements(unit, before if last else after if n == 0 else [])
    return found


def header_statements(path: Path) -> list[tuple[str, str]]:
    """(key, words) for each time of a ``make`` target or a lab preset in the header comment of a script or the
    docstring of a module: by its sentence or list item (as on a page), or a name followed by a time (``frontier 37
    min``), the name a preset's or a label that a line of the header gives a preset (``overview ... --preset X``)."""
    if path.suffix == ".py":
        header = (ast.get_docstring(ast.parse(path.read_text()), clean=False) or "").replace("``", "`")
    else:
        header = "\n".join(re.sub(r"^# ?", "", line) for line in
                           re.match(r"(?:#!.*\n)?((?:#.*\n)*)", path.read_text()).group(1).splitlines())
    header = header.replace("`lab ", "`mismatch-ctrl lab ")
    labels = {p: p for p in LAB_PRESETS} | {m.group(1): m.group(2) for m in re.finditer(
        r"(?m)^\s+([\w-]+)\s{2,}.*?--preset ([\w-]+)", header) if m.group(2) in LAB_PRESETS}
    named = rf"(?<![\w-])({'|'.join(map(re.escape, sorted(labels, key=len, reverse=True)))})\s+(?:~\s*|about\s+)?"
    found = [(f"--preset {labels[m.group(1)]}", m.group()) for m in re.finditer(named + TIME.pattern, header)]
    return found + [(key, words) for item in re.split(r"\n(?=\s*(?:\d+\.|-)\s)", header)
                    for unit in _units(item) for key, words in _unit_statements(unit, []) if is_keyed(key)]


def timed_texts(root: Path) -> list[tuple[str, list[tuple[str, str]]]]:
    """(file, its time statements) for the pages and the benchmarks' headers."""
    scripts = sorted([*(root / "benchmarks").glob("*.sh"), *(root / "benchmarks").glob("*.py")])
    return [(_rel(p, root), time_statements(p.read_text())) for p in pages(root)] + \
        [(_rel(p, root), header_statements(p)) for p in scripts]


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
    for name, statements in timed_texts(root):
        for key, words in statements:
            where[key].setdefault(name, words)
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
