"""The rule "times stated once" of tests/test_docs_consistency.py (the convention of docs/times.md): on this checkout,
and on planted violations in a temporary tree, one test per way a time is found to belong to a command."""

from __future__ import annotations

import pytest

from mismatch_ctrl.lab.sweeps.options import LAB_PRESETS
from test_docs_consistency import (ROOT, TIMES_OK, TIMES_PAGE, _tree, command_key, header_statements,
                                   time_conflicts, time_statements)

# --- this checkout ---------------------------------------------------------------------------------------------------

def test_the_docs_state_no_time_twice():
    assert time_conflicts(ROOT) == []


# --- the command a time is filed under -------------------------------------------------------------------------------

EDGE = LAB_PRESETS["e5m2-edge"]


@pytest.mark.parametrize("command, key", [
    ("make demo", "make demo"),
    ("make clean", "make clean"),
    ("mismatch-ctrl lab --preset e5m2-edge --out runs/x --jobs 2 --cache-dir c", "--preset e5m2-edge"),
    ("python3 -m mismatch_ctrl lab --preset e5m2-edge --device cuda --out=runs/y", "--preset e5m2-edge"),
    (f"mismatch-ctrl lab --preset e5m2-edge --methods {','.join(reversed(EDGE['methods'].split(',')))} "
     "--seeds 4,3,2,1,0 --lr 1.5e-3 --quant e5m2 --steps 200 --out runs/e", "--preset e5m2-edge"),  # its own values
    ("mismatch-ctrl lab --preset demo-seeds --methods dcgrpo_floor_guard --out runs/lab-seeds",
     "mismatch-ctrl lab --preset demo-seeds --methods dcgrpo_floor_guard"),
    ("mismatch-ctrl lab --preset demo-seeds --out b --seeds 6,5 --jobs 1",
     "mismatch-ctrl lab --preset demo-seeds --seeds 5,6"),
    ("mismatch-ctrl lab --quant e4m3 --lr 1.5e-3 --dump-details --out x",
     "mismatch-ctrl lab --dump-details --lr 0.0015"),
    ("mismatch-ctrl lab compare runs/a runs/b", "mismatch-ctrl lab compare runs/a runs/b"),
    (".venv/bin/python benchmarks/lab_mismatch.py --seeds 0,1 --json a.json",
     "python benchmarks/lab_mismatch.py --seeds 0,1"),
    ('STEPS=2 bash benchmarks/lab_precision_16core.sh "$OUT" > log.txt 2>&1',
     "bash benchmarks/lab_precision_16core.sh"),
])
def test_a_command_is_keyed_by_what_it_runs(command, key):
    assert command_key(command) == key


# --- planted violations ----------------------------------------------------------------------------------------------

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
    ("| `make venv` | 1.7 GB | 3 min 10 s at load 8 |", True),
    ("`make demo` runs the lab (on 2 cores; `--seeds 1` took 4 min).", True)])  # no sentence ends inside parentheses
def test_a_time_counts_for_the_commands_of_its_sentence_or_table_row(text, stated):
    assert bool(time_statements(text)) == stated


def test_a_preset_run_with_options_that_change_nothing_is_the_preset(tmp_path):
    root = _tree(tmp_path, {"docs/times.md": TIMES_OK, "docs/a.md": (
        "```bash\nmismatch-ctrl lab --preset e5m2-edge --methods " + EDGE["methods"] + " --out runs/e --jobs 2   # ~12 "
        "min\nmismatch-ctrl lab --preset e5m2-edge --methods grpo,dcgrpo --out runs/f   # ~4 min: a command of its "
        "own\n```\n")})
    assert [p.split(" belongs")[0] for p in time_conflicts(root)] == ["docs/a.md: the time of `--preset e5m2-edge`"]


def test_an_option_span_of_a_preset_row_is_that_preset_run_with_it(tmp_path):
    root = _tree(tmp_path, {
        "docs/times.md": TIMES_OK.replace(
            "| `demo-seeds` | 2 min |", "| `demo-seeds` | 2 min, then 9 min for its `--methods dcgrpo_floor_guard` |"),
        "docs/lab.md": "```bash\nmismatch-ctrl lab --preset demo-seeds --methods dcgrpo_floor_guard --out runs/s  # ~2 "
                       "min\n```\n"})
    assert time_conflicts(root) == ["`mismatch-ctrl lab --preset demo-seeds --methods dcgrpo_floor_guard` has its "
                                    "time on 2 pages (docs/lab.md, docs/times.md): state it on one and link there"]


@pytest.mark.parametrize("text, key", [
    ("```bash\nmismatch-ctrl lab --preset frontier --out runs/f\n```\n\n(37 min on 2 cores, warm-ups cached.)\n",
     "--preset frontier"),  # the paragraph right after a block of one command
    ("It took 4 min on 2 cores:\n\n```bash\nmake bench\n```\n", "make bench"),  # the sentence before, ending in ':'
    ("```bash\nbash launch/x.sh --help\nbash launch/x.sh --prepare\n```\n\n`--help` runs in seconds (2 s here; "
     "`--prepare` takes hours).\n", "bash launch/x.sh --help"),  # an option span: the block's one command with it
])
def test_a_time_next_to_a_code_block_counts_for_its_command(text, key):
    assert key in {k for k, _ in time_statements(text)}


@pytest.mark.parametrize("text", [
    "```bash\nmake bench\nmake demo\n```\n\n(37 min on 2 cores.)\n",  # two commands: whose?
    "It took 4 min on 2 cores.\n\n```bash\nmake bench\n```\n",  # not a sentence that introduces the block
    "```bash\nmake demo\n```\n\nThen:\n\n| run | time |\n|---|---|\n| `grpo` | 2 min |\n",  # a table is not prose
    "Warm-ups are cached (`make clean` keeps them): 8-11 s each the first time.",  # an aside names the command
    "On 16 cores (`python3` with torch), it takes 8 minutes.",
    "With `python3` and torch it takes 8 minutes.",  # a program named, no command
])
def test_no_time_is_filed_under_a_command_it_is_not_next_to(text):
    assert time_statements(text) == []


def test_planted_preset_times_in_the_benchmarks_headers_are_named(tmp_path):
    root = _tree(tmp_path, {
        "docs/times.md": TIMES_OK,
        "benchmarks/figures.sh": "#!/usr/bin/env bash\n# Redraw figures:\n#   overview   a.png = OUT of `lab --preset "
                                 "demo-seeds`.\n# Sizes: overview ~11 min, frontier 37 min on 2 cores.\nset -e\n",
        "benchmarks/b.py": '"""Runs ``mismatch-ctrl lab --preset offpolicy`` (25 min), ``make bench`` too."""\n',
        "benchmarks/sized.sh": "#!/usr/bin/env bash\n# Sized for 16 cores in under 9 minutes:\n#   1. warm-ups;\n#   "
                               "2. `mismatch-ctrl lab --preset precision`: 42 runs.\n# It takes 3 h of CPU "
                               "(`make demo` aside).\n"})
    assert header_statements(root / "benchmarks/sized.sh") == []  # the script's time; a list item holds the preset
    assert sorted(p.split(" belongs")[0] for p in time_conflicts(root)) == [
        "benchmarks/b.py: the time of `--preset offpolicy`", "benchmarks/b.py: the time of `make bench`",
        "benchmarks/figures.sh: the time of `--preset demo-seeds`", "benchmarks/figures.sh: the time of `--preset "
        "frontier`"]
