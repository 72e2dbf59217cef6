"""The suite's root: pytest puts this directory on ``sys.path``, so every test directory can import the shared
helpers here (``reference``: the straightforward per-sequence implementations; ``import_graph``; ``fake_group``;
``measure``)."""

import logging

import pytest


@pytest.fixture(autouse=True)
def _package_log_level():
    """Each test starts with the package logger's level as the suite found it: a script's ``main()`` run by a test
    (the benchmarks quiet the package) must not silence the warnings a later test reads."""
    logger = logging.getLogger("mismatch_ctrl")
    level = logger.level
    yield
    logger.setLevel(level)
