"""Comparison helpers for the slime adapter tests: nested results against references, with a path in every message."""

from __future__ import annotations

import math
from typing import Any

import torch
from slime_data import View

RTOL, ATOL = 1e-5, 1e-6
"""Tolerance between layouts: CP shards and DP ranks sum the same fp32 pieces in a different order."""

WORLD_IDS = {0: "lab", 1: "world1", 2: "world2_cp2", 4: "world4_dp2xcp2", "w4pp": "world4_pp2xcp2",
             "w4tp": "world4_tp2xdp2", "w4tpcp": "world4_tp2xcp2"}
"""Phases of the spawned processes: 0 is megatron imported but not initialised (the CPU lab's path)."""


def tolerance(world: int | str) -> tuple[float, float]:
    """Exact where the hooks must run the very same arithmetic as the single-process reference (one rank, so every
    reducer is the identity), else :data:`RTOL` / :data:`ATOL`."""
    return (0.0, 0.0) if world in (0, 1) else (RTOL, ATOL)


def assert_tree_close(actual: Any, expected: Any, rtol: float = 0.0, atol: float = 0.0, path: str = "") -> None:
    """Equal structure; numbers and tensors equal within ``rtol``/``atol`` (NaN equals NaN); everything else equal."""
    where = path or "<root>"
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected a dict, got {type(actual).__name__}"
        assert sorted(actual) == sorted(expected), f"{where}: keys {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_tree_close(actual[key], expected[key], rtol, atol, f"{path}.{key}")
    elif isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)), f"{where}: expected a sequence, got {type(actual).__name__}"
        assert len(actual) == len(expected), f"{where}: length {len(actual)} != {len(expected)}"
        for k, (a, e) in enumerate(zip(actual, expected)):
            assert_tree_close(a, e, rtol, atol, f"{path}[{k}]")
    elif isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{where}: expected a tensor, got {type(actual).__name__}"
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
    elif isinstance(expected, float) and not isinstance(actual, bool) and isinstance(actual, (int, float)):
        ok = actual == expected or (math.isnan(actual) and math.isnan(expected)) or \
            abs(actual - expected) <= atol + rtol * abs(expected)
        assert ok, f"{where}: {actual!r} != {expected!r} (rtol {rtol}, atol {atol})"
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


def rank_name(view: View) -> str:
    stage = "" if view.last_stage else ", not the last pipeline stage"
    tp = f", tp {view.tp_rank}/{view.tp_size}" if view.tp_size > 1 else ""
    return f"dp {view.dp_rank}/{view.dp_size}, cp {view.cp_rank}/{view.cp_size}{tp}{stage}"
