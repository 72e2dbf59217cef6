"""docker/image_constraints.py on hostile ``pip list --format=json`` input (issue 23, item 10): only lines pip accepts
as constraints (a plain name, one ``==`` version, one line per normalised name), every skipped entry named, and no
traceback for input too deeply nested to parse or entries that are not tables."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

SCRIPT = Path(__file__).resolve().parents[2] / "docker" / "image_constraints.py"


def run(stdin: str | bytes, *args: str) -> subprocess.CompletedProcess:
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run([sys.executable, str(SCRIPT), *args], input=data, capture_output=True)


def assert_pip_accepts(lines: list[str]) -> None:
    """Each line a constraint pip's new resolver takes: no extras, URL or marker, one ``==``, one per name."""
    names = []
    for line in lines:
        requirement = Requirement(line)
        assert not requirement.extras and requirement.url is None and requirement.marker is None, line
        assert [s.operator for s in requirement.specifier] == ["=="], line
        names.append(re.sub(r"[-_.]+", "-", requirement.name).lower())
    assert len(names) == len(set(names)), lines


HOSTILE = [
    ({"name": "foo[bar]", "version": "1.0"}, "'foo[bar]' '1.0': not a PEP 508 name"),
    ({"name": "baz @ https://example.com/baz-1.0.whl", "version": "1.0"}, "not a PEP 508 name"),
    ({"name": "qux; python_version > '3'", "version": "1.0"}, "not a PEP 508 name"),
    ({"name": "evil", "version": "1.0 ; python_version > '3'"}, "'evil' \"1.0 ; python_version > '3'\": not a PEP 440"),
    ({"name": "evil2", "version": "1.0\n--index-url http://x"}, "'evil2'"),
    ({"name": None, "version": "1.0"}, "None '1.0': name and version must be strings"),
    ({"name": 5, "version": 1.0}, "5 1.0: name and version must be strings"),
    ({"name": ["x"], "version": "1"}, "['x'] '1': name and version must be strings"),
    ({"version": "1.0"}, "None '1.0': name and version must be strings"),
    (1, "1: not a {name, version} table"),
    ("numpy==1.0", "'numpy==1.0': not a {name, version} table"),
    (None, "None: not a {name, version} table"),
    ([[[["deep"]]]], "not a {name, version} table"),
    ({"name": "-r", "version": "1"}, "'-r' '1': not a PEP 508 name"),
    ({"name": "#comment", "version": "1"}, "not a PEP 508 name"),
]


@pytest.mark.parametrize("entry, needle", HOSTILE)
def test_an_entry_pip_could_not_take_as_a_constraint_is_skipped_and_named(entry, needle):
    done = run(json.dumps([{"name": "numpy", "version": "1.26.4"}, entry]))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.decode().split()
    assert lines == ["numpy==1.26.4"]
    assert_pip_accepts(lines)
    assert "image_constraints: not pinned: " in done.stderr.decode() and needle in done.stderr.decode()


def test_one_version_per_normalised_name_the_second_named():
    installed = [{"name": "Foo_Bar", "version": "1.0"}, {"name": "foo-bar", "version": "2.0"},
                 {"name": "a.b", "version": "1.0"}, {"name": "A_B", "version": "1.0.0"},
                 {"name": "zeta", "version": "3"}, {"name": "zeta", "version": "3"}]
    done = run(json.dumps(installed))
    lines = done.stdout.decode().split()
    assert lines == ["Foo_Bar==1.0", "a.b==1.0", "zeta==3"]
    assert_pip_accepts(lines)
    err = done.stderr.decode()
    assert "not pinned: foo-bar==2.0: foo-bar is also installed as Foo_Bar==1.0; pinned to that one only" in err
    assert "A_B" not in err and err.count("not pinned") == 1  # 1.0.0 is 1.0, the same pin


# explicit short ids: some pytest versions name a test by its string parameter and put the name in the children's
# environment (PYTEST_CURRENT_TEST), where 200k characters are more than Linux passes to a new process (E2BIG)
@pytest.mark.parametrize("stdin", ["[" * 100_000 + "]" * 100_000, '[{"name": ' + "[" * 100_000, b"\xff\xfe[]", "",
                                   "{}", '{"name": "numpy", "version": "1.0"}', "NaN"],
                         ids=["deep-list", "deep-name", "not-utf8", "empty", "object", "one-entry", "nan"])
def test_input_that_is_not_a_pip_list_is_refused_without_a_traceback(stdin):
    done = run(stdin)
    err = done.stderr.decode()
    assert done.returncode == 2 and done.stdout == b"" and "Traceback" not in err
    assert err.startswith("image_constraints: ")


def test_an_excluded_distribution_is_left_out_silently_whatever_it_is():
    installed = [{"name": "mismatch_ctrl", "version": "0.1.0", "editable_project_location": "/w"},
                 {"name": "Mismatch.Ctrl", "version": "dev"}, {"name": "torch", "version": "2.9.0a0+git1234abc"}]
    done = run(json.dumps(installed), "--exclude", "mismatch-ctrl")
    assert done.stdout.decode().split() == ["torch==2.9.0a0+git1234abc"] and done.stderr == b""
