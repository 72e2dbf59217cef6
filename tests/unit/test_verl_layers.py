"""The layers of ARCHITECTURE.md for the verl adapter, read from the source (nothing imported): the core imports no
framework, and the adapter's modules that the launchers and the core-side checks use import no verl."""

from __future__ import annotations

import pytest

from import_graph import PACKAGE, imports_of, module_name

FRAMEWORKS = ("verl", "transfer_queue", "ray", "hydra", "omegaconf", "tensordict", "megatron", "slime", "sglang")
VERL_FREE = ("checks", "lr", "runtime", "__init__")
"""mismatch_ctrl.verl modules that must import without verl (the trainer hands them plain tensors and configs)."""


def _imports(path):
    return {name for _, name in imports_of(path.read_text(), module_name(path), path.name == "__init__.py")}


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_core_imports_no_framework(path):
    wrong = sorted(n for n in _imports(path) if n.split(".")[0] in FRAMEWORKS)
    assert not wrong, f"{path.name} imports {wrong}"


@pytest.mark.parametrize("name", VERL_FREE)
def test_verl_adapter_pure_modules_import_no_verl(name):
    path = PACKAGE / "verl" / f"{name}.py"
    wrong = sorted(n for n in _imports(path) if n.split(".")[0] in FRAMEWORKS or n.startswith("mismatch_ctrl.slime"))
    assert not wrong, f"mismatch_ctrl.verl.{name} imports {wrong}"
