"""The import graph of the package, read from its source with ``ast`` (nothing is imported): what each module
imports, at the top or inside a function, relative imports resolved."""

from __future__ import annotations

import ast
from pathlib import Path

import mismatch_ctrl

PACKAGE = Path(mismatch_ctrl.__file__).parent


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
