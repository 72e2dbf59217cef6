"""The CPU stand-in for a GPU (:class:`mismatch_ctrl.hostguard.HostGuard`) refuses what CUDA refuses or synchronises
for, and counts the transfers made through :mod:`mismatch_ctrl.host`."""

from __future__ import annotations

import warnings

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


@pytest.mark.parametrize("op", [
    lambda t: torch.repeat_interleave(t.long()), lambda t: torch.nn.functional.one_hot(t.long()),
    lambda t: torch.histc(t), lambda t: torch.histc(t, bins=4, min=0, max=0),
], ids=["repeat_interleave-counts", "one_hot", "histc", "histc-zero-range"])
def test_more_ops_that_read_device_values_for_their_shape_or_range_are_refused(device_tensor, op):
    with HostGuard(), pytest.raises(HostTransferError, match="depends on device values"):
        op(device_tensor)


def test_their_fixed_forms_pass(device_tensor):
    with HostGuard() as guard:
        torch.nn.functional.one_hot(device_tensor.long(), num_classes=6)
        torch.histc(device_tensor, bins=4, min=0, max=6)
    assert guard.events == []


@pytest.mark.parametrize("index", [
    lambda t: t.index_select(0, torch.tensor(1)), lambda t: t.masked_fill(torch.tensor(True), 0.0),
    lambda t: torch.gather(t, 0, torch.tensor([1])), lambda t: t.index_add_(0, torch.tensor(2), t[:1]),
    lambda t: torch.take(t, torch.tensor(3)), lambda t: t.masked_fill(mask=torch.tensor(False), value=1.0),
    lambda t: torch.take_along_dim(t, indices=torch.tensor([1])),
], ids=["index_select-0d", "masked_fill-0d", "gather", "index_add-0d", "take-0d", "masked_fill-keyword",
        "take_along_dim-keyword"])
def test_a_host_index_or_mask_is_refused_even_0d(device_tensor, index):
    """CUDA takes a 0-d host tensor as a scalar operand, not as an index or a mask."""
    with HostGuard(), pytest.raises(HostTransferError, match="host tensor as the (index|indices|mask)"):
        index(device_tensor)


def test_fetch_and_to_device_take_tensors_of_several_devices_and_dtypes():
    """One transfer per device, values in the order given; counts beside float32 values stay exact (joined in
    float64, not in float32); a tensor already on a device is copied, not pinned."""
    meta = torch.empty(2, device="meta")
    count = torch.tensor(2**24 + 1)
    assert host.fetch(torch.tensor([0.5], dtype=torch.float32), count) == [0.5, 2**24 + 1]
    mixed = [torch.tensor([1.0, 2.0]), torch.tensor(3, dtype=torch.int64)]
    assert host.fetch(*mixed) == [1.0, 2.0, 3.0]
    with HostGuard() as guard:
        assert host.fetch(torch.arange(3.0), torch.tensor(7)) == [0.0, 1.0, 2.0, 7.0]
    assert guard.syncs == 1
    copied = host.to_device(meta, torch.device("meta"), torch.float64)
    assert copied.device.type == "meta" and copied.dtype == torch.float64


def test_fetch_reads_each_device_once_and_keeps_the_order(monkeypatch):
    """Tensors on the CPU and on another device (``meta`` stands in for a GPU, whose values it reads as -1)."""
    real, calls = host._values, []

    def values(tensors):
        calls.append([t.device.type for t in tensors])
        return [-1.0] * sum(t.numel() for t in tensors) if tensors[0].device.type == "meta" else real(tensors)

    monkeypatch.setattr(host, "_values", values)
    got = host.fetch(torch.tensor([1.0, 2.0]), torch.empty(2, device="meta"), torch.tensor(3.0),
                     torch.empty((), device="meta"))
    assert got == [1.0, 2.0, -1.0, -1.0, 3.0, -1.0]
    assert calls == [["cpu", "cpu"], ["meta", "meta"]]


@pytest.fixture
def cuda_switch(monkeypatch):
    """The CUDA runtime's sync reporting stood in for: the modes set, in order (the mode in force before: 1), and, as
    torch 2.11 did on an H200, one sync reported by the first switch to "warn" itself."""
    modes = []

    def switch(mode):
        if not modes:
            warnings.warn("called a synchronizing CUDA operation", UserWarning)
        modes.append(mode)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", switch)
    return modes


def test_cuda_syncs_names_the_site_of_each_synchronisation(cuda_switch, monkeypatch):
    """A read inside :func:`host.fetch` is reported at its line in this package, innermost first; a sync from code
    outside the package at the caller's line; another warning follows the filters in force (shown here, ignored
    where they say so), not counted; the mode switch's own report is not counted; the mode in force before comes
    back."""
    tolist = torch.Tensor.tolist

    def syncing_tolist(self):
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", syncing_tolist)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message="filtered")
        with host.cuda_syncs() as sites:
            assert host.fetch(torch.ones(2), torch.zeros(())) == [1.0, 1.0, 0.0]
            warnings.warn("unrelated", RuntimeWarning)
            warnings.warn("filtered", RuntimeWarning)
            warnings.warn("called a synchronizing CUDA operation", UserWarning)
    assert [str(w.message) for w in shown] == ["unrelated"]
    assert cuda_switch == ["warn", 1] and len(sites) == 2
    assert sites[0].startswith("host.py:") and " _values < host.py:" in sites[0] and sites[0].endswith(" fetch")
    assert sites[1].startswith("test_hostguard.py:") and "test_cuda_syncs_names_the_site" in sites[1]


def test_cuda_syncs_restores_everything_after_an_error_and_refuses_to_nest(cuda_switch):
    filters, show = list(warnings.filters), warnings.showwarning
    with pytest.raises(KeyError), host.cuda_syncs():
        raise KeyError("inside")
    assert cuda_switch == ["warn", 1] and warnings.filters == filters and warnings.showwarning is show
    with host.cuda_syncs(), pytest.raises(RuntimeError, match="do not nest"), host.cuda_syncs():
        pass
    with pytest.raises(ValueError, match="frames must be >= 1"), host.cuda_syncs(frames=0):
        pass
    with host.cuda_syncs() as sites:  # usable again after each refusal
        warnings.warn("called a synchronizing CUDA operation", UserWarning)
    assert len(sites) == 1 and warnings.filters == filters and warnings.showwarning is show
