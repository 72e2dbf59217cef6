"""Host <-> device transfers: the only way a hook's tensor that may live on a GPU reaches the host, and host data the
device.

slime hands the hooks CUDA tensors. Reading one on the host (``.tolist()``, ``.item()``, ``float(t)``, ``bool(t)``)
waits for every kernel queued before it: a host synchronisation, which stalls the CPU that should be queueing
Megatron's next kernels; ``numpy()`` of a CUDA tensor is an error. So the core reads the device through
:func:`fetch` alone, a fixed few times per hook call, every number it needs at once; host data (sequence lengths,
rewards, index layouts) reaches the device through :func:`to_device`, from pinned memory without waiting.
:class:`~mismatch_ctrl.hostguard.HostGuard` runs code on the CPU as if its tensors lived on a GPU: it counts these
two calls and refuses every other transfer, so a CPU-only test finds what a GPU would refuse or wait for. On a GPU,
:func:`cuda_syncs` lists the synchronisations the CUDA runtime reports in a block, each with the line that made it
(``tests/slime/test_slime_device.py``, ``benchmarks/bench_gpu.py``).
"""

from __future__ import annotations

import contextlib
import re
import traceback
import warnings
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np
import torch

_listeners: list[Callable[[str], None]] = []
"""Called with ``"fetch"`` or ``"upload"`` at each transfer (:class:`~mismatch_ctrl.hostguard.HostGuard` counts)."""
_depth = 0


def transferring() -> bool:
    """Whether the caller runs inside :func:`fetch` or :func:`to_device`."""
    return _depth > 0


@contextlib.contextmanager
def _transfer(kind: str) -> Iterator[None]:
    global _depth
    for listener in list(_listeners):
        listener(kind)
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1


def fetch(*tensors: torch.Tensor) -> list[float]:
    """The values of ``tensors`` (any shapes, flattened in order) as Python floats, in one device-to-host transfer:
    one host synchronisation on a GPU, none on a CPU (tensors on several devices: one transfer per device). Integers
    are exact up to 2^53."""
    with _transfer("fetch"):
        devices = list(dict.fromkeys(t.device for t in tensors))
        if len(devices) <= 1:
            return _values(tensors)
        parts = {device: iter(_values([t for t in tensors if t.device == device])) for device in devices}
        return [next(parts[t.device]) for t in tensors for _ in range(t.numel())]  # CUDA joins one device's only


def _values(tensors: Sequence[torch.Tensor]) -> list[float]:
    """The values of tensors of one device, flattened in order, in one transfer: joined straight into float64 (a
    common dtype such as float32 would round counts above 2^24)."""
    if len(tensors) <= 1:
        return tensors[0].reshape(-1).to(torch.float64).tolist() if tensors else []
    scalars = all(t.dim() == 0 for t in tensors)
    out = tensors[0].new_empty(sum(t.numel() for t in tensors), dtype=torch.float64)
    if scalars:
        torch.stack(list(tensors), out=out)
    else:
        torch.cat([t.reshape(-1) for t in tensors], out=out)
    return out.tolist()


def to_device(data: np.ndarray | Sequence[float] | torch.Tensor, device: torch.device,
              dtype: torch.dtype | None = None) -> torch.Tensor:
    """Host ``data`` (an array, a list of numbers or a CPU tensor) as a tensor of ``dtype`` on ``device``, without a
    host synchronisation: on CUDA through pinned memory and a non-blocking copy (PyTorch keeps the pinned block
    until the copy is done); elsewhere a copy on the host. A tensor already on a device is copied there directly."""
    with _transfer("upload"):
        if isinstance(data, torch.Tensor) and data.device.type != "cpu":  # already on a device: a device copy
            return data.to(device, dtype, copy=True)
        host = torch.as_tensor(data, dtype=dtype)
        if torch.device(device).type != "cuda":
            return host.to(device, copy=True)
        return host.pin_memory().to(device, non_blocking=True)


_PACKAGE = Path(__file__).resolve().parent
_WARNING_MACHINERY = frozenset({"warnings.py", "_py_warnings.py"})
"""Files of Python's warnings module (3.14 moved its Python part to ``_py_warnings.py``): not a sync's site."""
_SYNC_MESSAGE = re.compile(r".*synchroniz")
"""What the CUDA runtime's report of a synchronisation matches (``called a synchronizing CUDA operation``)."""
_recording = False


@contextlib.contextmanager
def cuda_syncs(frames: int = 4) -> Iterator[list[str]]:
    """The host synchronisations the CUDA runtime reports inside the block (``torch.cuda.set_sync_debug_mode``), one
    entry each: the Python frames that led to it, innermost first (at most ``frames``, this package's frames
    preferred), as ``file:line function``, so a count over budget names its sites. The device is synchronised
    before the block; other warnings follow the filters in force, and the debug mode in force before comes back
    after it. Blocks do not nest (an inner one would take the outer one's reports).

    What the mode switch itself reports is not the block's and is not counted: on an H200 (torch 2.11), the first
    switch to ``warn`` in a process reported one synchronisation at the switch, before any code of the block ran."""
    global _recording
    if frames < 1:
        raise ValueError(f"frames must be >= 1, got {frames}")
    if _recording:
        raise RuntimeError("cuda_syncs blocks do not nest: count the inner code in a block of its own")
    sites: list[str] = []
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    _recording = True
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("always", message=_SYNC_MESSAGE.pattern)
            with warnings.catch_warnings(record=True):  # the switch's own report
                torch.cuda.set_sync_debug_mode("warn")
            show = warnings.showwarning

            def record(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                       file: object = None, line: str | None = None) -> None:
                if not _SYNC_MESSAGE.match(str(message)):
                    show(message, category, filename, lineno, file, line)
                    return
                stack = [f for f in traceback.extract_stack()[:-1] if Path(f.filename).name not in _WARNING_MACHINERY]
                sites.append(_site(stack, frames))

            warnings.showwarning = record
            try:
                yield sites
            finally:
                torch.cuda.set_sync_debug_mode(previous)
    finally:
        _recording = False


def _site(stack: list[traceback.FrameSummary], frames: int) -> str:
    """``file:line function`` of the innermost ``frames`` frames of ``stack`` in this package (of any file, where
    none is), innermost first."""
    ours = [f for f in stack if Path(f.filename).resolve().is_relative_to(_PACKAGE)] or stack
    return " < ".join(f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(ours[-frames:]))
