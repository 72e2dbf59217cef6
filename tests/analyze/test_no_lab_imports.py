"""The layers point downward: no module of the package but the CLI imports the CPU lab - not ``analyze``, ``slime``,
``launch``, the configs or the core - at the top or inside a function (ARCHITECTURE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
from import_graph import PACKAGE, imports_of, module_name

LAB = "mismatch_ctrl.lab"
CHECKED = sorted(p for p in PACKAGE.rglob("*.py")
                 if (PACKAGE / "cli") not in p.parents and (PACKAGE / "lab") not in p.parents)
"""Every module of the package but the CLI and the lab itself: only the CLI (and the benchmarks) may import the lab."""


def lab_imports(path: Path) -> list[str]:
    """The imports of the lab in the module at ``path``, as ``file:line name``."""
    names = imports_of(path.read_text(), module_name(path), path.name == "__init__.py")
    return sorted({f"{path.relative_to(PACKAGE.parent)}:{line} {name}" for line, name in names
                   if name == LAB or name.startswith(LAB + ".")})


def test_the_checked_modules_include_every_layer():
    names = {module_name(p) for p in CHECKED}
    assert {"mismatch_ctrl.dcgrpo", "mismatch_ctrl.analyze.report", "mismatch_ctrl.analyze.dumps.rollout",
            "mismatch_ctrl.slime.advantage", "mismatch_ctrl.launch.main"} <= names
    assert not any(n.startswith("mismatch_ctrl.cli") for n in names) and not any(n.startswith(LAB) for n in names)


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_does_not_import_the_lab(path):
    found = lab_imports(path)
    assert not found, f"{found}: the lab sits above this layer; move what is shared out of mismatch_ctrl.lab"


@pytest.mark.parametrize("source", [
    "from ..lab.plots import moving_average",
    "from .. import lab",
    "from ..lab import plots",
    "import mismatch_ctrl.lab.sweeps.run",
    "from mismatch_ctrl.lab.sweeps import run",
    "def f():\n    from ..lab.trainer import Trainer",
    "import importlib\nimportlib.import_module('mismatch_ctrl.lab.results.report')",
])
def test_every_form_of_a_lab_import_is_found(source):
    names = [name for _, name in imports_of(source, "mismatch_ctrl.analyze.report", is_package=False)]
    assert any(name == LAB or name.startswith(LAB + ".") for name in names), names


@pytest.mark.parametrize("source", ["from ..smoothing import moving_average", "from .lab import x",
                                    "import mismatch_ctrl.labels"])
def test_imports_of_other_modules_are_not_the_lab(source):
    names = [name for _, name in imports_of(source, "mismatch_ctrl.analyze.report", is_package=False)]
    assert not any(name == LAB or name.startswith(LAB + ".") for name in names), names
