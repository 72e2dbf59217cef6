"""Pin every distribution installed in the image to its version, as pip constraints, for ``pip install -c``.

Reads ``pip list --format=json`` on standard input and writes ``name==version`` lines to standard output. pip refuses
a whole constraints file over one line it cannot parse, and images carry such distributions: versions that are not
PEP 440 (``dev``, ``1.0 beta``), editable installs from a source tree. Those are skipped, each named on
standard error; ``--exclude NAME`` leaves a distribution out (the package being installed). Needs only ``packaging``
(pip's own copy when it is not installed), so it parses exactly as pip does.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

try:
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version
except ImportError:  # pip's own copy: the rule pip applies to the constraints file
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement
    from pip._vendor.packaging.version import InvalidVersion, Version


def pinnable(name: str, version: str) -> bool:
    """Whether ``name==version`` is a requirement pip parses (PEP 440 version, PEP 508 name)."""
    try:
        Version(version)
        Requirement(f"{name}=={version}")
    except (InvalidVersion, InvalidRequirement):
        return False
    return True


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints(installed: list[dict], exclude: set[str]) -> tuple[list[str], list[str]]:
    """(``name==version`` lines, skipped ``name version: why`` lines) for ``pip list --format=json`` entries."""
    keep, skipped = [], []
    excluded = {normalized(name) for name in exclude}
    for entry in installed:
        name, version = str(entry.get("name", "")), str(entry.get("version", ""))
        if normalized(name) in excluded:
            continue
        if entry.get("editable_project_location"):
            skipped.append(f"{name} {version}: an editable install from {entry['editable_project_location']}")
        elif not pinnable(name, version):
            skipped.append(f"{name!r} {version!r}: not a PEP 440 name and version, pip cannot parse the pin")
        else:
            keep.append(f"{name}=={version}")
    return keep, skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--exclude", action="append", default=[], metavar="NAME", help="leave this distribution out")
    ns = parser.parse_args(argv)
    try:
        installed = json.load(sys.stdin)
    except ValueError as exc:
        print(f"image_constraints: standard input is not pip list --format=json output ({exc})", file=sys.stderr)
        return 2
    if not isinstance(installed, list):
        print("image_constraints: expected a JSON list of {name, version} (pip list --format=json)", file=sys.stderr)
        return 2
    keep, skipped = constraints([e for e in installed if isinstance(e, dict)], set(ns.exclude))
    for line in skipped:
        print(f"image_constraints: not pinned: {line}", file=sys.stderr)
    print("\n".join(keep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
