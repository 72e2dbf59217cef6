"""The layers point downward: no module of ``analyze``, ``slime``, ``launch`` or the core (the modules directly under
``mismatch_ctrl/`` except ``cli.py``) imports the CPU lab, at the top or inside a function (ARCHITECTURE.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import mismatch_ctrl

PACKAGE = Path(mismatch_ctrl.__file__).parent
LAB = "mismatch_ctrl.lab"
CHECKED = sorted([*(p for p in PACKAGE.glob("*.py") if p.name != "cli.py"),
                  *(p for sub in ("analyze", "slime", "launch") for p in (PACKAGE / sub).rglob("*.py"))])


def module_name(path: Path) -> str:
    """The dotted name of the module at ``path`` (a package's ``__init__.py`` is the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, absolute name)`` of everything ``source`` (the text of ``module``) imports anywhere: ``import x``,
    ``from x import y`` (as ``x`` and ``x.y``, relative ones resolved) and ``importlib.import_module("x")`` /
    ``__import__("x")`` with a literal name."""
    package = module if is_package else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [(node.lineno, base), *((node.lineno, f"{base}.{alias.name}") for alias in node.names)]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            called = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if called in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value))
    return found


def lab_imports(path: Path) -> list[str]:
    """The imports of the lab in the module at ``path``, as ``file:line name``."""
    names = imports_of(path.read_text(), module_name(path), path.name == "__init__.py")
    return sorted({f"{path.relative_to(PACKAGE.parent)}:{line} {name}" for line, name in names
                   if name == LAB or name.startswith(LAB + ".")})


def test_the_checked_modules_include_every_layer():
    names = {module_name(p) for p in CHECKED}
    assert {"mismatch_ctrl.dcgrpo", "mismatch_ctrl.analyze.report", "mismatch_ctrl.analyze.dumps.rollout",
            "mismatch_ctrl.slime.advantage", "mismatch_ctrl.launch.main"} <= names
    assert "mismatch_ctrl.cli" not in names and not any(n.startswith(LAB) for n in names)


@pytest.mark.parametrize("path", CHECKED, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_does_not_import_the_lab(path):
    found = lab_imports(path)
    assert not found, f"{found}: the lab sits above this layer; move what is shared out of mismatch_ctrl.lab"


@pytest.mark.parametrize("source", [
    "from ..lab.plots import moving_average",
    "from .. import lab",
    "from ..lab import plots",
    "import mismatch_ctrl.lab.run",
    "from mismatch_ctrl.lab import run",
    "def f():\n    from ..lab.trainer import Trainer",
    "import importlib\nimportlib.import_module('mismatch_ctrl.lab.report')",
])
def test_every_form_of_a_lab_import_is_found(source):
    names = [name for _, name in imports_of(source, "mismatch_ctrl.analyze.report", is_package=False)]
    assert any(name == LAB or name.startswith(LAB + ".") for name in names), names


@pytest.mark.parametrize("source", ["from ..smoothing import moving_average", "from .lab import x",
                                    "import mismatch_ctrl.labels"])
def test_imports_of_other_modules_are_not_the_lab(source):
    names = [name for _, name in imports_of(source, "mismatch_ctrl.analyze.report", is_package=False)]
    assert not any(name == LAB or name.startswith(LAB + ".") for name in names), names
