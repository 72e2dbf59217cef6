"""The layers of ARCHITECTURE.md for the verl adapter, read from the source (nothing imported): the core imports no
framework, and the adapter's modules that the launchers and the core-side checks use import no verl."""

from __future__ import annotations

import pytest

from import_graph import PACKAGE, imports_of, module_name

FRAMEWORKS = ("verl", "transfer_queue", "ray", "hydra", "omegaconf", "tensordict", "megatron", "slime", "sglang")
VERL_FREE = ("checks", "lr", "recipe", "runtime", "__init__")
"""mismatch_ctrl.verl modules that must import without verl (the trainer hands them plain tensors and configs)."""


def _imports(path):
    return {name for _, name in imports_of(path.read_text(), module_name(path), path.name == "__init__.py")}


CORE = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] not in ("slime", "verl", "lab"))
"""The core and its tools (config/, correction/, dcgrpo/, cli/, analyze/, launch/): everything but the adapters and
the lab (whose executors may use Ray)."""


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_imports_no_framework(path):
    wrong = sorted(n for n in _imports(path) if n.split(".")[0] in FRAMEWORKS)
    assert not wrong, f"{path.relative_to(PACKAGE)} imports {wrong}"


@pytest.mark.parametrize("name", VERL_FREE)
def test_verl_adapter_pure_modules_import_no_verl(name):
    path = PACKAGE / "verl" / f"{name}.py"
    wrong = sorted(n for n in _imports(path) if n.split(".")[0] in FRAMEWORKS or n.startswith("mismatch_ctrl.slime"))
    assert not wrong, f"mismatch_ctrl.verl.{name} imports {wrong}"
