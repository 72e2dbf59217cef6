"""Pin every distribution installed in the image to its version, as pip constraints, for ``pip install -c``.

Reads ``pip list --format=json`` on standard input and writes ``name==version`` lines to standard output, each a
line pip accepts as a constraint: a PEP 508 name (no extras, no URL, no marker) and a PEP 440 version, one line per
normalised name. pip refuses a whole constraints file over one line it cannot use, and images carry such
distributions: versions that are not PEP 440 (``dev``, ``1.0 beta``), editable installs from a source tree, the same
distribution installed twice (``Foo`` and ``foo``, ``a_b`` and ``a-b``) at two versions. Those are skipped, each named
on standard error; ``--exclude NAME`` leaves a distribution out (the package being installed). Input that is not a
JSON list of ``{name, version}`` tables (too deeply nested to parse, entries that are not tables) is refused or
skipped with a message, never a traceback. Needs only ``packaging`` (pip's own copy when it is not installed), so it
parses exactly as pip does.
"""

from __future__ import annotations

import argparse
import json
import re
import reprlib
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip's own copy: the rule pip applies to the constraints file
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.version import InvalidVersion, Version

NAME = re.compile(r"[A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9]", re.IGNORECASE)
"""A PEP 508 distribution name (nothing else: no extras, URL, marker or version)."""


def normalized(name: str) -> str:
    """The PEP 503 normal form of a distribution name (``Foo_Bar`` and ``foo-bar`` are one distribution)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pin(entry: object) -> tuple[str | None, str]:
    """(``name==version``, normalised name) of one ``pip list`` entry, or (None, why it cannot be pinned)."""
    if not isinstance(entry, dict):
        return None, f"{reprlib.repr(entry)}: not a {{name, version}} table"
    name, version = entry.get("name"), entry.get("version")
    shown = f"{reprlib.repr(name)} {reprlib.repr(version)}"
    if not isinstance(name, str) or not isinstance(version, str):
        return None, f"{shown}: name and version must be strings"
    if entry.get("editable_project_location"):
        return None, f"{name} {version}: an editable install from {reprlib.repr(entry['editable_project_location'])}"
    if not NAME.fullmatch(name):
        return None, f"{shown}: not a PEP 508 name (extras, a URL or a marker cannot be constraints)"
    line = f"{name}=={version.strip()}"
    try:
        Version(version)
        requirement = Requirement(line)
    except (InvalidVersion, InvalidRequirement):
        return None, f"{shown}: not a PEP 440 version, pip cannot parse the pin"
    if requirement.extras or requirement.url or requirement.marker or len(requirement.specifier) != 1:
        return None, f"{shown}: {line!r} is not a plain pin"
    return line, normalized(name)


def constraints(installed: list[object], exclude: set[str]) -> tuple[list[str], list[str]]:
    """(``name==version`` lines, skipped ``name version: why`` lines) for ``pip list --format=json`` entries: one
    line per normalised name (a second version of the same distribution is skipped, named)."""
    excluded = {normalized(name) for name in exclude}
    keep: dict[str, str] = {}
    skipped: list[str] = []
    for entry in installed:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str) and normalized(entry["name"]) in excluded:
            continue
        line, key = pin(entry)
        if line is None:
            skipped.append(key)
        elif key not in keep:
            keep[key] = line
        elif Version(keep[key].partition("==")[2]) != Version(line.partition("==")[2]):
            skipped.append(f"{line}: {key} is also installed as {keep[key]}; pinned to that one only")
    return list(keep.values()), skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exclude", action="append", default=[], metavar="NAME", help="leave this distribution out")
    ns = parser.parse_args(argv)
    try:
        installed = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    except (ValueError, RecursionError) as exc:
        print(f"image_constraints: standard input is not pip list --format=json output "
              f"({str(exc)[:120] or type(exc).__name__})", file=sys.stderr)
        return 2
    if not isinstance(installed, list):
        print("image_constraints: expected a JSON list of {name, version} (pip list --format=json)", file=sys.stderr)
        return 2
    keep, skipped = constraints(installed, set(ns.exclude))
    for line in skipped:
        print(f"image_constraints: not pinned: {line}", file=sys.stderr)
    print("\n".join(keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
