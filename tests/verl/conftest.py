"""The verl adapter's tests run against the real verl 0.9.1 in its own venv (``make test-verl``; ``make test`` runs
them after the main suite). In the main venv, which has no verl, this directory is skipped, unless
``MISMATCH_CTRL_REQUIRE_VERL`` is set (as the Makefile does): then a missing verl is an error, not a skip."""

import importlib.util
import os

import pytest

# pytest puts tests/ on sys.path (rootdir conftest), where this very directory is a namespace package named ``verl``:
# only a spec with a file of its own (verl's __init__.py) is the real verl.
_SPEC = importlib.util.find_spec("verl")
if _SPEC is None or _SPEC.origin in (None, "namespace"):
    if os.environ.get("MISMATCH_CTRL_REQUIRE_VERL"):
        raise pytest.UsageError("tests/verl: verl is not importable in this Python; run them with `make test-verl` "
                                "(which builds .venv-verl with verl 0.9.1)")
    collect_ignore_glob = ["test_*.py"]
