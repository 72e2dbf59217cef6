"""The lab is four rooms, each a subpackage with one concern, and its imports point one way: ``model`` <- ``training``
<- ``results`` <- ``sweeps`` (a room imports only the rooms before it), so a reader knows from a file's path what it
does and what it may use. Every lab module is short enough to read in one sitting."""

from __future__ import annotations


import pytest
from import_graph import PACKAGE, imports_of, module_name

LAB = PACKAGE / "lab"
ROOMS = ("model", "training", "results", "sweeps")
"""In import order: each room may import the rooms before it, never one after it."""
MODULES = sorted(LAB.rglob("*.py"))
MAX_LINES = 400


def room_of(name: str) -> str | None:
    """The room of a dotted module name inside the lab (None outside it or for the lab package itself)."""
    parts = name.split(".")
    return parts[2] if parts[:2] == ["mismatch_ctrl", "lab"] and len(parts) > 2 else None


def test_every_lab_module_lives_in_a_room():
    loose = [p.name for p in LAB.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"{loose}: put each in the room of its concern ({', '.join(ROOMS)})"
    assert sorted(p.name for p in LAB.iterdir() if p.is_dir() and p.name != "__pycache__") == sorted(ROOMS)
    assert all((LAB / room / "__init__.py").read_text().startswith('"""') for room in ROOMS)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LAB)))
def test_rooms_import_only_the_rooms_before_them(path):
    own = room_of(module_name(path))
    allowed = set(ROOMS[:ROOMS.index(own) + 1]) if own else set()
    wrong = sorted({f"line {line}: {name}" for line, name in imports_of(path.read_text(), module_name(path),
                                                                       path.name == "__init__.py")
                    if room_of(name) is not None and room_of(name) not in allowed})
    assert not wrong, f"{path.relative_to(LAB)} ({own}) imports a room after its own: {wrong}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(LAB)))
def test_lab_modules_are_short(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(LAB)} has {lines} lines; split it by concern (<= {MAX_LINES})"


@pytest.mark.parametrize("source, module, room", [
    ("from ..sweeps.run import run_lab", "mismatch_ctrl.lab.results.report", "sweeps"),
    ("from ...lab.sweeps import options", "mismatch_ctrl.lab.model.policy", "sweeps"),
    ("def f():\n    from mismatch_ctrl.lab.results import stats", "mismatch_ctrl.lab.model.task", "results"),
])
def test_a_backward_import_is_found(source, module, room):
    assert room in {room_of(name) for _, name in imports_of(source, module, is_package=False)}
