"""``torch.compile`` for a hook's device work (``torch_compile: true`` in the config; off by default).

On a GPU a hook call costs its host work: the Python of the hook and the dispatch of each of its few hundred small
ops (docs/performance.md). Compiled, the device work of a call is one graph whose kernels the compiler fuses, so the
host launches a few fused kernels instead. A function compiled here

- is traced whole (``fullgraph=True``): it must hold no host transfer and no ``torch.distributed`` call (its gathers
  are functional collectives, :meth:`mismatch_ctrl.dist.Reducers.bound`);
- takes tensors whose sizes are symbolic (``dynamic=True``), so a graph serves a whole class of sizes the compiler
  tells apart (one sequence, fewer than two whole blocks, ...): a few graphs serve micro-batches of every size;
- compiles on its first call of each class (tens of seconds) and again when a setting it reads changes;
- tells its caller to run the eager code (returns None), with one warning, where compiling fails (e.g. no C++
  compiler for the CPU, no Triton for the GPU, past the recompile limit) and while a torch function or dispatch mode
  intercepts ops (such as :class:`~mismatch_ctrl.hostguard.HostGuard`): the results are the same, only the host work
  differs. The caller's eager code, not the traced function, runs then: its gathers are ``torch.distributed`` calls.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import threading
from typing import Any, Callable, Iterator, TypeVar

import torch

log = logging.getLogger("mismatch_ctrl")

T = TypeVar("T")

BACKEND = "inductor"
"""The ``torch.compile`` backend (tests use ``aot_eager``, which traces the same graph without generating code)."""

_failed: set[str] = set()
"""Qualified names of the functions whose compilation failed (run eager from then on)."""
_under_modes: set[str] = set()
"""Qualified names of the functions that could not run compiled under a mode (said once)."""


def compiled(fn: Callable[..., T]) -> Callable[..., T | None]:
    """``fn`` compiled on first use (with :data:`BACKEND` at that time): its result, or None where it cannot run
    compiled (its compile failed, now or before, or a torch function or dispatch mode intercepts ops), and the
    caller runs its eager code instead. The failed compile or the mode is said once, as a warning.

    A compile fails with any exception raised before the graph runs (dynamo's own, or one it re-raises as it is,
    such as an internal ``AssertionError``): with ``fullgraph=True`` nothing of ``fn`` has run then, no collective
    either, so the eager code may run in its place. An exception once the graph runs is the inputs' or the
    kernels' and is raised."""
    graphs: dict[object, Callable[..., T]] = {}
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T | None:
        if name in _failed:
            return None
        if _intercepting_mode():
            if name not in _under_modes:
                _under_modes.add(name)
                log.warning("mismatch_ctrl: %s runs eager while a torch function or dispatch mode is active "
                            "(torch_compile: true has no effect under it)", name)
            return None
        _RUNNING.flag = running = [False]
        try:
            if BACKEND not in graphs:  # torch.compile raises here on a Python it does not support
                graphs[BACKEND] = torch.compile(fn, backend=_marking(BACKEND), dynamic=True, fullgraph=True)
            with _settings():
                return graphs[BACKEND](*args, **kwargs)
        except Exception as exc:
            if running[0]:
                raise  # from the inputs or the kernels' run, not from the compiler
            _failed.add(name)
            cause: BaseException = exc  # the backend's own error, under dynamo's wrappers
            while (inner := getattr(cause, "inner_exception", None) or cause.__cause__) is not None:
                cause = inner
            log.warning("mismatch_ctrl: torch.compile of %s failed, so it runs eager from now on (same results, "
                        "more host work; set torch_compile: false to silence this): %s: %s", name,
                        type(cause).__name__, (str(cause).strip().splitlines() or [""])[0])
            return None

    return call


class _Running(threading.local):
    flag: list[bool] = [False]


_RUNNING = _Running()
"""The current call's flag (per thread), set when its graph starts to run."""


def _marking(backend: str | Callable[..., Any]) -> Callable[..., Any]:
    """``backend`` whose compiled graphs set the current call's flag (:data:`_RUNNING`) when they start to run."""
    compile_graph = torch._dynamo.lookup_backend(backend) if isinstance(backend, str) else backend

    def marking_backend(gm: torch.fx.GraphModule, inputs: list[Any]) -> Callable[..., Any]:
        graph = compile_graph(gm, inputs)

        def run(*args: Any) -> Any:
            _RUNNING.flag[0] = True
            return graph(*args)

        run._boxed_call = getattr(graph, "_boxed_call", False)  # type: ignore[attr-defined]
        return run

    return marking_backend


def _intercepting_mode() -> bool:
    """Whether a torch function or dispatch mode intercepts ops, other than ``torch.set_default_device``'s (which the
    compiler handles): a profiler's, an op counter, a test's HostGuard."""
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._device import DeviceContext

    return bool(torch._C._len_torch_dispatch_stack()) or any(
        not isinstance(mode, DeviceContext) for mode in _get_current_function_mode_stack())


NEEDED = ("torch._dynamo.eval_frame.check_if_dynamo_supported", "torch._dynamo.lookup_backend",
          "torch._C._len_torch_dispatch_stack", "torch.overrides._get_current_function_mode_stack",
          "torch.utils._device.DeviceContext", "torch._C._distributed_c10d._register_process_group",
          "torch._C._distributed_c10d._unregister_process_group", "torch._C._distributed_c10d._resolve_process_group",
          "torch.ops._c10d_functional.all_gather_into_tensor", "torch.ops._c10d_functional.wait_tensor",
          "torch._dynamo.config.recompile_limit", "torch._dynamo.config.specialize_float",
          "torch.fx.experimental._config.use_duck_shape")
"""What a compiled hook uses of torch (tested with torch 2.13); ``torch_compile: true`` is refused without it."""


def missing_support() -> list[str]:
    """What this torch lacks of :data:`NEEDED`, or why it cannot compile at all (this Python); empty if nothing."""
    missing = []
    for path in NEEDED:
        parts = path.split(".")
        for k in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
            try:
                found: Any = importlib.import_module(".".join(parts[:k]))
            except ImportError:
                continue
            try:
                for attr in parts[k:]:
                    found = getattr(found, attr)
            except (AttributeError, RuntimeError):
                missing.append(path)
            break
        else:
            missing.append(path)
    if not missing:
        try:
            torch._dynamo.eval_frame.check_if_dynamo_supported()
        except RuntimeError as exc:
            missing.append(str(exc))
    return missing


SETTINGS = (("torch.fx.experimental._config", "use_duck_shape", False),
            ("torch._dynamo.config", "specialize_float", True),
            ("torch._dynamo.config", "recompile_limit", 32))
"""The compiler settings a hook's graph needs, in force during its calls:

- ``use_duck_shape=False``: no size taken as equal to another because it was once (two index arrays of equal length
  would compile anew when they differ);
- ``specialize_float=True``: the config's floats are constants, not graph inputs read back with ``item()``;
- ``recompile_limit=32``: graphs kept per function, one per class of sizes the compiler tells apart (one sequence,
  fewer than two whole blocks, a token count a multiple of the block, ...: at most 12 for the 20 micro-batch sizes
  of tests/slime/test_slime_compiled.py), with room to spare; past it the function runs eager, with the warning of
  a failed compile."""


@contextlib.contextmanager
def _settings() -> Iterator[None]:
    """:data:`SETTINGS` in force inside the block, where this torch has them (set and restored by hand: ``patch``
    costs ~0.2 ms a call). Process-wide while in force: a hook call is the only compiling code in its thread."""
    saved = []
    try:
        for module, key, value in SETTINGS:
            config = importlib.import_module(module)
            if hasattr(config, key):
                saved.append((config, key, getattr(config, key)))
                setattr(config, key, value)
        yield
    finally:
        for config, key, value in reversed(saved):
            setattr(config, key, value)
