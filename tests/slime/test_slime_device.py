"""The hooks with their tensors on an accelerator, as slime calls them (log-probs, loss masks and ``pg_loss`` on the
GPU; rewards and lengths as Python lists), in every configuration under ``configs/methods/``.

On every machine :class:`~mismatch_ctrl.hostguard.HostGuard` stands in for the GPU: it refuses what CUDA refuses or
synchronises for (``numpy()`` of a device tensor, a host tensor in a device op, data-dependent shapes) and counts the
host synchronisations made through :mod:`mismatch_ctrl.host`: at most 2 per advantage-hook call (the input check,
the controllers' read of the batch numbers) and 1 per TIS-hook call (the input check), whatever the number of
sequences. Where CUDA is present (``-m cuda``), the same calls run on the GPU: results equal the CPU's within 1e-6
and ``torch.cuda.set_sync_debug_mode`` counts the real synchronisations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, Callable

import pytest
import torch
from slime_data import FULL, METHODS_DIR, PREFIX, View, make_args, make_batch, method, micro_batches, rollout_data

from mismatch_ctrl import host
from mismatch_ctrl.dist import Reducers
from mismatch_ctrl.hostguard import HostGuard
from mismatch_ctrl.slime import advantage, hooks, tis
from mismatch_ctrl.slime._groups import Topology

METHOD_FILES = sorted(path.stem for path in METHODS_DIR.glob("*.yaml"))
ROLLOUTS = 3
ADVANTAGE_SYNCS, TIS_SYNCS = 2, 1
"""The most host synchronisations one call of each hook may make."""
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


class Syncs:
    """A counting context: ``syncs`` (and, on CUDA, ``sites``: where each happened) after the block."""

    syncs = 0
    sites: Sequence[str] = ()

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Syncs]:
        yield self


class GuardSyncs(Syncs):
    @contextlib.contextmanager
    def __call__(self) -> Iterator[Syncs]:
        with HostGuard() as guard:
            yield self
        self.syncs = guard.syncs


class CudaSyncs(Syncs):
    """Synchronisations the CUDA runtime reports (:func:`mismatch_ctrl.host.cuda_syncs`), with their sites."""

    @contextlib.contextmanager
    def __call__(self) -> Iterator[Syncs]:
        with host.cuda_syncs() as sites:
            yield self
        self.syncs, self.sites = len(sites), sites


def moved(value: Any, device: str) -> Any:
    """``value`` with every tensor (in lists and dicts too) on ``device``."""
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, device) for v in value)
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def run_hooks(name: str | dict[str, Any], device: str, groups: int, count: Syncs, view: View = FULL) -> dict[str, Any]:
    """``ROLLOUTS`` rollouts of method ``name`` (a file under ``configs/methods/``, or a ``mismatch_ctrl`` section) as
    rank ``view`` sees them: the advantage hook on the rollout, then the TIS hook on each of its two micro-batches;
    every output on the CPU, and the host synchronisations of each call."""
    args = make_args(method(name) if isinstance(name, str) else name)
    out: dict[str, list[Any]] = {key: [] for key in ("advantages", "rollout_metrics", "pg_loss", "masks",
                                                     "train_metrics", "advantage_syncs", "tis_syncs", "sites")}
    for r in range(ROLLOUTS):
        batch = make_batch(seed=100 + r, groups=groups)
        data = moved(rollout_data(batch, view), device)
        with count() as counted:
            hooks.advantages(args, data)
        out["advantage_syncs"].append(counted.syncs)
        out["sites"] += [f"rollout {r} advantages: {site}" for site in counted.sites]
        out["advantages"].append(moved(data["advantages"], "cpu"))
        out["rollout_metrics"].append({k: v for k, v in data.items() if k.startswith(PREFIX)})
        losses = torch.randn(len(data["rewards"]), 2, generator=torch.Generator().manual_seed(r))
        for samples in micro_batches(list(range(len(data["rewards"])))):
            pick: Callable[[str], list[Any]] = lambda key: [data[key][i] for i in samples]  # noqa: E731
            pg_loss = torch.cat([losses[i, 0] + losses[i, 1] * data["log_probs"][i].cpu() for i in samples])
            pg_loss = pg_loss.to(device).requires_grad_()
            with count() as counted:
                new_loss, masks, metrics = hooks.rollout_correction(
                    args, pg_loss=pg_loss, train_log_probs=pick("log_probs"),
                    rollout_log_probs=pick("rollout_log_probs"), loss_masks=pick("loss_masks"),
                    total_lengths=pick("total_lengths"), response_lengths=pick("response_lengths"))
            out["tis_syncs"].append(counted.syncs)
            out["sites"] += [f"rollout {r} TIS: {site}" for site in counted.sites]
            assert new_loss.device == pg_loss.device and all(m.device == pg_loss.device for m in masks)
            assert all(v.device == pg_loss.device for v in metrics.values())
            out["pg_loss"].append(new_loss.detach().cpu())
            out["masks"].append(moved(masks, "cpu"))
            out["train_metrics"].append(moved(metrics, "cpu"))
    return out


def assert_same(got: Any, expected: Any, where: str = "", tolerance: float = 0.0) -> None:
    if isinstance(expected, dict):
        assert got.keys() == expected.keys(), where
        for key in expected:
            assert_same(got[key], expected[key], f"{where}/{key}", tolerance)
    elif isinstance(expected, list):
        assert len(got) == len(expected), where
        for k, (g, e) in enumerate(zip(got, expected)):
            assert_same(g, e, f"{where}[{k}]", tolerance)
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got.double(), expected.double(), rtol=tolerance, atol=tolerance, equal_nan=True,
                                   msg=lambda m: f"{where}: {m}")
    else:
        assert got == pytest.approx(expected, rel=tolerance, abs=tolerance, nan_ok=True), where


@pytest.mark.parametrize("name", METHOD_FILES)
def test_hooks_run_as_on_a_gpu_with_few_host_syncs_constant_in_the_batch(name):
    """Under the GPU stand-in: no refused transfer, at most 2 (advantage) and 1 (TIS) host synchronisations per call,
    the same count for 8 and 64 sequences, and the same results as without the guard."""
    small, large = (run_hooks(name, "cpu", groups, GuardSyncs()) for groups in (2, 16))
    for counts in ("advantage_syncs", "tis_syncs"):
        assert small[counts] == large[counts], counts
    assert max(small["advantage_syncs"]) <= ADVANTAGE_SYNCS and max(small["tis_syncs"]) <= TIS_SYNCS
    plain = run_hooks(name, "cpu", 16, Syncs())
    for key in ("advantages", "rollout_metrics", "pg_loss", "masks", "train_metrics"):
        assert_same(large[key], plain[key], key)


def identity_gather(tensor: torch.Tensor) -> torch.Tensor:
    """A gather of one participant that is not ``dist.local_gather``: the hooks take their sharded paths."""
    return tensor.unsqueeze(0)


@pytest.mark.parametrize("name", METHOD_FILES)
def test_the_context_parallel_paths_run_as_on_a_gpu(name, monkeypatch):
    """Rank 1 of a context-parallel pair (CP-local log-probs, full-length masks, the zigzag index on the device) with
    gathers that take the sharded paths: no refused transfer, the same sync budget."""
    topo = Topology(cp_size=2, cp_rank=1, reducers=Reducers(seq=identity_gather, batch=identity_gather))
    for module in (advantage, tis):
        monkeypatch.setattr(module, "topology", lambda: topo)
    out = run_hooks(name, "cpu", 4, GuardSyncs(), View(cp_rank=1, cp_size=2))
    assert max(out["advantage_syncs"]) <= ADVANTAGE_SYNCS and max(out["tis_syncs"]) <= TIS_SYNCS
    assert all(len(masks) for masks in out["masks"])


@CUDA
@pytest.mark.cuda
@pytest.mark.parametrize("name", METHOD_FILES)
def test_hooks_on_cuda_equal_the_cpu_with_few_host_syncs(name):
    """On the GPU: the CPU's results within 1e-6, and the synchronisations the CUDA runtime reports within the
    budget, the same for 8 and 64 sequences."""
    cpu = run_hooks(name, "cpu", 16, Syncs())
    gpu = run_hooks(name, "cuda", 16, CudaSyncs())
    small = run_hooks(name, "cuda", 2, CudaSyncs())
    for key in ("advantages", "rollout_metrics", "pg_loss", "masks", "train_metrics"):
        assert_same(gpu[key], cpu[key], key, tolerance=1e-6)
    where = "\n".join(["sites, 64 sequences:", *gpu["sites"], "sites, 8 sequences:", *small["sites"]])
    assert max(gpu["advantage_syncs"]) <= ADVANTAGE_SYNCS, f"{gpu['advantage_syncs']}\n{where}"
    assert max(gpu["tis_syncs"]) <= TIS_SYNCS, f"{gpu['tis_syncs']}\n{where}"
    assert small["advantage_syncs"] == gpu["advantage_syncs"] and small["tis_syncs"] == gpu["tis_syncs"], where
