"""The CPU stand-in for a GPU (:class:`mismatch_ctrl.hostguard.HostGuard`) refuses what CUDA refuses or synchronises
for, and counts the transfers made through :mod:`mismatch_ctrl.host`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mismatch_ctrl import host
from mismatch_ctrl.hostguard import HostGuard, HostTransferError, is_host


@pytest.fixture
def device_tensor():
    return torch.arange(6, dtype=torch.float32)


@pytest.mark.parametrize("read", [
    lambda t: t.numpy(), lambda t: np.asarray(t), lambda t: t.tolist(), lambda t: t.sum().item(),
    lambda t: bool(t[0] > 1), lambda t: float(t[0]), lambda t: int(t[0]), lambda t: f"{t[0]:.3f}",
    lambda t: t.cpu(), lambda t: t.to("cpu"), lambda t: np.float64(2.0) * t.numpy(),
], ids=["numpy", "asarray", "tolist", "item", "bool", "float", "int", "format", "cpu", "to-cpu", "numpy-arith"])
def test_host_reads_of_a_device_tensor_are_refused(device_tensor, read):
    with HostGuard(), pytest.raises(HostTransferError, match="device tensor"):
        read(device_tensor)


@pytest.mark.parametrize("op", [
    lambda t: t.nonzero(), lambda t: t[t > 2], lambda t: torch.masked_select(t, t > 2), lambda t: t.unique(),
    lambda t: torch.bincount(t.long()), lambda t: torch.where(t > 2),
    lambda t: torch.repeat_interleave(t, t.long()),
    lambda t: torch.segment_reduce(t, "sum", lengths=t.new_tensor([6]).long()),
], ids=["nonzero", "bool-index", "masked_select", "unique", "bincount", "where1", "repeat_interleave",
        "segment_reduce"])
def test_ops_whose_size_depends_on_device_values_are_refused(device_tensor, op):
    with HostGuard(), pytest.raises(HostTransferError):
        op(device_tensor)


def test_fixed_shape_forms_pass(device_tensor):
    with HostGuard() as guard:
        lengths = torch.full((2,), 3, dtype=torch.long, device=device_tensor.device)
        torch.segment_reduce(device_tensor, "sum", lengths=lengths, unsafe=True)
        torch.repeat_interleave(device_tensor, lengths.repeat(3), output_size=18)
        device_tensor.masked_fill(device_tensor > 2, 0.0)
        torch.where(device_tensor > 2, device_tensor, 0.0)
        device_tensor * torch.tensor(2.0)  # a 0-d host tensor is a scalar to CUDA
    assert guard.events == []


@pytest.mark.parametrize("mix", [
    lambda t: t + torch.ones(6), lambda t: t + np.ones(6), lambda t: torch.cat([t, torch.zeros(2)]),
    lambda t: t[torch.tensor([0, 2])], lambda t: t.index_select(0, torch.from_numpy(np.array([1, 2]))),
    lambda t: torch.stack([t.sum(), torch.tensor(1.0)]), lambda t: t.copy_(torch.zeros(6)),
], ids=["add", "add-numpy", "cat", "index", "from_numpy-index", "stack-0d", "copy"])
def test_a_host_tensor_beside_a_device_tensor_is_refused(device_tensor, mix):
    with HostGuard(), pytest.raises(HostTransferError, match="device"):
        mix(device_tensor)


@pytest.mark.parametrize("upload", [
    lambda t: torch.ones(3).to(t.device), lambda t: torch.tensor([1.0, 2.0], device=t.device),
    lambda t: torch.from_numpy(np.ones(2)).to(t), lambda t: torch.tensor([t[0], t[1]]),
], ids=["to", "tensor-device", "from_numpy-to", "tensor-of-device-values"])
def test_blocking_uploads_and_device_values_in_host_factories_are_refused(device_tensor, upload):
    with HostGuard(), pytest.raises(HostTransferError):
        upload(device_tensor)


def test_tags_follow_how_a_tensor_was_made(device_tensor):
    with HostGuard():
        made = {"device op": device_tensor * 2, "device factory": torch.zeros(3, device=device_tensor.device),
                "like": torch.empty_like(device_tensor), "new": device_tensor.new_zeros(2),
                "to device": device_tensor.to(device_tensor.device, torch.float64),
                "host factory": torch.zeros(3), "host data": torch.tensor([1.0]),
                "from_numpy": torch.from_numpy(np.zeros(2)), "host op": torch.zeros(3) + 1}
    assert {name for name, t in made.items() if is_host(t)} == {"host factory", "host data", "from_numpy", "host op"}


def test_transfers_through_host_are_counted_and_pass(device_tensor):
    with HostGuard() as guard:
        up = host.to_device(np.arange(4), device_tensor.device, torch.int64)
        assert not is_host(up)
        values = host.fetch(device_tensor.sum(), up)
        assert values == [15.0, 0.0, 1.0, 2.0, 3.0]
        assert host.fetch() == []
    assert guard.events == ["upload", "fetch", "fetch"] and guard.syncs == 2 and guard.uploads == 1
    assert torch.from_numpy is not None and not is_host(torch.from_numpy(np.zeros(1)))  # restored on exit


def test_host_tensors_are_free_to_read():
    with HostGuard() as guard:
        t = torch.tensor([1.0, 2.0])
        assert t.tolist() == [1.0, 2.0] and float(t.sum()) == 3.0 and t.numpy().sum() == 3.0
    assert guard.events == []
