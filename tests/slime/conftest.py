"""Fixtures of the slime adapter tests.

The pytest process never imports megatron: every test here runs with it blocked, so the hooks take their
single-process path (identity reducers) exactly as on a machine without megatron-core. Real megatron runs in the
worlds that ``slime_worlds`` spawns once per session.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import slime_scenarios
from slime_worlds import CHECKOUT, Worlds

import mismatch_ctrl

BLOCKED = ("megatron", "megatron.core", "megatron.core.parallel_state")


@contextlib.contextmanager
def megatron_blocked() -> Iterator[None]:
    """``import megatron...`` raises ImportError inside the block (a ``None`` entry in ``sys.modules``)."""
    saved = {name: sys.modules.get(name, ...) for name in BLOCKED}
    sys.modules.update(dict.fromkeys(BLOCKED))
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is ...:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


@pytest.fixture(autouse=True)
def _no_megatron() -> Iterator[None]:
    with megatron_blocked():
        yield


@dataclass(repr=False)
class Runs:
    """The single-process reference and the spawned worlds' results of one session."""

    reference: dict[str, Any]
    worlds: Worlds
    workdir: Path

    def __repr__(self) -> str:  # pytest prints fixture arguments in failure reports: keep it short
        return f"Runs({self.workdir})"

    def world(self, world: int | str, scenario: str) -> list[dict[str, Any]]:
        return self.worlds.results(world, scenario)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """Launch the worlds, compute the single-process reference meanwhile, then wait for the worlds."""
    module = Path(mismatch_ctrl.__file__).resolve()
    assert module.is_relative_to(CHECKOUT), f"the tests import mismatch_ctrl from {module}, not from {CHECKOUT}"
    workdir = tmp_path_factory.mktemp("slime_worlds")
    worlds = Worlds(workdir)
    try:
        with megatron_blocked():
            reference = slime_scenarios.reference(workdir / "reference")
        worlds.wait()
        yield Runs(reference, worlds, workdir)
    finally:
        worlds.stop()
