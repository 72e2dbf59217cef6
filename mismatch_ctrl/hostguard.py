"""Run tensor code on the CPU as if its tensors lived on a GPU: refuse what CUDA refuses or waits for, count the rest.

CI has no GPU, and the CPU accepts what CUDA does not (``numpy()`` of any tensor, a host tensor mixed into any op,
data-dependent shapes for free). Inside ``with HostGuard() as guard:`` every tensor is either a *device* tensor (the
caller's inputs, results of ops on them, factories given a ``device``) or a *host* tensor (from host data:
``torch.tensor`` / ``as_tensor`` / ``from_numpy`` without a ``device``, factories without one, ``.cpu()``), and:

- reading a device tensor on the host (``numpy``, ``__array__``, ``tolist``, ``item``, ``bool`` / ``float`` /
  ``int`` / ``format`` of it, ``.cpu()``, ``.to("cpu")``) raises :class:`HostTransferError`: on CUDA ``numpy`` is an
  error and the others synchronise with the device;
- ops whose output size depends on device values (``nonzero``, boolean-mask indexing, ``masked_select``,
  ``unique``, ``bincount``, ``repeat_interleave`` without ``output_size``, ``segment_reduce`` without
  ``unsafe=True``, ``one_hot`` without ``num_classes``, ``histc`` over the data's own range, ...) raise: CUDA
  synchronises for them;
- a host tensor of one or more dimensions in an op with a device tensor raises (CUDA: "Expected all tensors to be on
  the same device"; as an index, a blocking copy), a 0-d one as the index or mask of an indexing op too, and so does
  a blocking host-to-device copy (``.to(device)`` of a host tensor, ``torch.tensor(..., device=...)``);
- transfers through :func:`mismatch_ctrl.host.fetch` and :func:`mismatch_ctrl.host.to_device` pass and are counted:
  ``guard.syncs`` (fetches: host synchronisations on a GPU) and ``guard.uploads``.

The device of a tensor is decided by how it was made, not by ``.device`` (every tensor here is on the CPU), so
``.to(x.device)`` of a device tensor stays on the device, and ``.to("cpu")`` (a string) leaves it. What the guard
cannot see: ``.to(torch.device("cpu"))`` (it reads as ``.to(x.device)``), a Python list as an index (on CUDA a
copy from pageable memory), random numbers drawn with a host generator for the device, and CUDA's own numerics.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from . import host

_HOST = "_mismatch_ctrl_host"
"""Attribute set on host tensors."""

READS = frozenset({"numpy", "__array__", "tolist", "item", "__bool__", "__float__", "__int__", "__index__",
                   "__complex__", "__format__", "__repr__", "__str__", "__contains__", "cpu", "is_nonzero"})
"""Methods that read a device tensor on the host."""
SYNCING = frozenset({"nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount", "equal",
                     "allclose", "masked_scatter", "masked_scatter_"})
"""Ops whose output depends on device values in a way the host must wait for."""
FACTORIES_FROM_DATA = frozenset({"tensor", "as_tensor", "asarray", "new_tensor"})
"""Factories that copy data into a new tensor: from the host, a blocking upload when given a device; from device
tensors, a read of each value."""
NO_HOST_SCALARS = frozenset({"cat", "stack", "hstack", "vstack", "copy_"})
"""Ops that refuse even a 0-d host tensor beside a device tensor (elsewhere CUDA treats one as a scalar)."""
INDEX_ARGUMENTS = {name: (position, keyword) for names, position, keyword in (
    (("index_select", "index_add", "index_add_", "index_copy", "index_copy_", "index_fill", "index_fill_", "gather",
      "scatter", "scatter_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"), 2, "index"),
    (("take",), 1, "index"), (("take_along_dim",), 1, "indices"), (("masked_fill", "masked_fill_"), 1, "mask"),
) for name in names}
"""Ops whose index (or mask) CUDA wants on the device even when it is 0-d: its position in the call and keyword."""


class HostTransferError(RuntimeError):
    """Code under :class:`HostGuard` did what a GPU refuses or synchronises for, outside :mod:`mismatch_ctrl.host`."""


def is_host(t: torch.Tensor) -> bool:
    """Whether ``t`` is a host tensor under the guard (see the module docstring)."""
    return getattr(t, _HOST, False)


def _tensors(values: Any) -> Iterator[torch.Tensor | np.ndarray]:
    for value in values:
        if isinstance(value, (torch.Tensor, np.ndarray)):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def _moves_to_device(func_name: str, args: tuple, kwargs: dict) -> bool | str:
    """For ``to`` / ``cuda`` / ``copy``: the target, if the call names a device (``"cpu"`` for a string naming the
    CPU, True for any other device); False for a dtype-only conversion."""
    if func_name == "cuda":
        return True
    targets = [*args[1:], kwargs.get("device")]
    for target in targets:
        if isinstance(target, str):
            return "cpu" if torch.device(target).type == "cpu" else True
        if isinstance(target, (torch.device, torch.Tensor)):
            return True
    return False


def _histc_range(args: tuple, kwargs: dict) -> tuple[float, float]:
    """``histc``'s ``(min, max)``: both 0 (the default) make CUDA read the data's extremes on the host."""
    values = {"min": 0, "max": 0, **dict(zip(("bins", "min", "max"), args[1:])), **kwargs}
    return values["min"], values["max"]


def _bool_index(index: Any) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype in (torch.bool, torch.uint8) for t in _tensors([index]))


class HostGuard(TorchFunctionMode):
    """See the module docstring. ``events`` lists the counted transfers in order (``"fetch"`` / ``"upload"``)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []
        self._from_numpy: Callable[..., torch.Tensor] | None = None

    @property
    def syncs(self) -> int:
        """Host synchronisations on a GPU: :func:`~mismatch_ctrl.host.fetch` calls."""
        return self.events.count("fetch")

    @property
    def uploads(self) -> int:
        """Non-blocking host-to-device copies: :func:`~mismatch_ctrl.host.to_device` calls."""
        return self.events.count("upload")

    def __enter__(self) -> HostGuard:
        self._from_numpy = torch.from_numpy

        def from_numpy(array: np.ndarray) -> torch.Tensor:
            out = self._from_numpy(array)
            if not host.transferring():
                setattr(out, _HOST, True)
            return out

        torch.from_numpy = from_numpy
        host._listeners.append(self.events.append)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.from_numpy = self._from_numpy
        host._listeners.remove(self.events.append)
        super().__exit__(*exc)

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if host.transferring():
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        inputs = list(_tensors([*args, *kwargs.values()]))
        on_device = [t for t in inputs if isinstance(t, torch.Tensor) and not is_host(t)]
        host_inputs = [t for t in inputs if isinstance(t, np.ndarray) or is_host(t)]
        if on_device:
            self._check_device_call(name, args, kwargs, host_inputs)
            output_on_host = name == "cpu" or (name == "to" and _moves_to_device(name, args, kwargs) == "cpu")
        elif host_inputs:
            if name in ("to", "cuda") and _moves_to_device(name, args, kwargs) is True:
                raise HostTransferError(f"{name}(): a blocking host-to-device copy (a host synchronisation on a GPU); "
                                        "use mismatch_ctrl.host.to_device")
            output_on_host = True
        else:  # a factory
            if name in FACTORIES_FROM_DATA and "device" in kwargs:
                raise HostTransferError(f"torch.{name}(..., device=...): a blocking host-to-device copy (a host "
                                        "synchronisation on a GPU); use mismatch_ctrl.host.to_device")
            output_on_host = "device" not in kwargs
        out = func(*args, **kwargs)
        if output_on_host:
            for t in _tensors([out]):
                if isinstance(t, torch.Tensor):
                    setattr(t, _HOST, True)
        return out

    @staticmethod
    def _check_device_call(name: str, args: tuple, kwargs: dict, host_inputs: list) -> None:
        if name in READS or name in FACTORIES_FROM_DATA or \
                (name == "to" and _moves_to_device(name, args, kwargs) == "cpu"):
            what = "is an error" if name in ("numpy", "__array__") else "waits for the device (a host synchronisation)"
            raise HostTransferError(f"{name}() of a device tensor: on a GPU this {what}; read device values with "
                                    "mismatch_ctrl.host.fetch, all at once")
        if name in SYNCING or (name == "where" and len(args) + len(kwargs) == 1) or \
                (name == "repeat_interleave" and "output_size" not in kwargs and
                 (len(args) + len(kwargs) == 1 or
                  isinstance(args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor))) or \
                (name == "one_hot" and (args[1] if len(args) > 1 else kwargs.get("num_classes", -1)) == -1) or \
                (name == "histc" and _histc_range(args, kwargs) == (0, 0)) or \
                (name == "segment_reduce" and not kwargs.get("unsafe", False)) or \
                (name in ("__getitem__", "__setitem__", "index_put", "index_put_") and _bool_index(args[1:2])):
            raise HostTransferError(f"{name}(): its result depends on device values, so a GPU synchronises with the "
                                    "host; use a fixed-shape form (torch.where, masked_fill, index_add_, "
                                    "segment_reduce(unsafe=True), repeat_interleave(output_size=...))")
        if name in INDEX_ARGUMENTS:
            position, keyword = INDEX_ARGUMENTS[name]
            index = args[position] if len(args) > position else kwargs.get(keyword)
            if isinstance(index, np.ndarray) or (isinstance(index, torch.Tensor) and is_host(index)):
                raise HostTransferError(f"{name}(): a host tensor as the {keyword} of a device tensor: on a GPU "
                                        "'Expected all tensors to be on the same device' (even 0-d); create it on the "
                                        "device or move it with mismatch_ctrl.host.to_device")
        mixed = [t for t in host_inputs if t.ndim > 0 or name in NO_HOST_SCALARS]
        if mixed:
            shapes = ", ".join(str(tuple(t.shape)) for t in mixed)
            raise HostTransferError(f"{name}(): host tensor(s) of shape {shapes} beside a device tensor: on a GPU "
                                    "'Expected all tensors to be on the same device' (or, as an index, a blocking "
                                    "copy); create them on the device or move them with mismatch_ctrl.host.to_device")
