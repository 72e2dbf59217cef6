"""``torch.compile`` for a hook's device work (``torch_compile: true`` in the config; off by default).

On a GPU a hook call costs its host work: the Python of the hook and the dispatch of each of its few hundred small
ops (docs/performance.md). Compiled, the device work of a call is one graph whose kernels the compiler fuses, so the
host launches a few fused kernels instead. A function compiled here

- is traced whole (``fullgraph=True``): it must hold no host transfer and no ``torch.distributed`` call (its gathers
  are functional collectives, :meth:`mismatch_ctrl.dist.Reducers.traceable`);
- takes tensors whose sizes are symbolic (``dynamic=True``), so a graph serves a whole class of sizes the compiler
  tells apart (one sequence, fewer than two whole blocks, ...): a few graphs serve micro-batches of every size;
- compiles on its first call of each class (tens of seconds) and again when a setting it reads changes;
- falls back to eager, with one warning, where compiling fails (e.g. no C++ compiler for the CPU, no Triton for the
  GPU), and runs eager while a torch function or dispatch mode intercepts ops (such as
  :class:`~mismatch_ctrl.hostguard.HostGuard`): the results are the same, only the host work differs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Callable, Iterator, TypeVar

import torch

log = logging.getLogger("mismatch_ctrl")

F = TypeVar("F", bound=Callable[..., Any])

BACKEND = "inductor"
"""The ``torch.compile`` backend (tests use ``aot_eager``, which traces the same graph without generating code)."""

_failed: set[str] = set()
"""Qualified names of the functions whose compilation failed (run eager from then on)."""
_under_modes: set[str] = set()
"""Qualified names of the functions that ran eager under a mode (said once)."""


def compiled(fn: F) -> F:
    """``fn`` compiled on first use (with :data:`BACKEND` at that time), else ``fn`` itself after a failure."""
    graphs: dict[str, Callable[..., Any]] = {}
    name = f"{fn.__module__}.{fn.__qualname__}"

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if name in _failed:
            return fn(*args, **kwargs)
        if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
            if name not in _under_modes:  # a mode intercepting ops (a test's HostGuard, an op counter)
                _under_modes.add(name)
                log.info("mismatch_ctrl: %s runs eager while a torch function or dispatch mode is active", name)
            return fn(*args, **kwargs)
        if BACKEND not in graphs:
            graphs[BACKEND] = torch.compile(fn, backend=BACKEND, dynamic=True, fullgraph=True)
        try:
            with _settings():
                return graphs[BACKEND](*args, **kwargs)
        except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit) as exc:
            # tracing, code generation or the recompile limit: not the inputs
            _failed.add(name)
            cause: BaseException = exc  # the backend's own error, under dynamo's wrappers
            while (inner := getattr(cause, "inner_exception", None) or cause.__cause__) is not None:
                cause = inner
            log.warning("mismatch_ctrl: torch.compile of %s failed, so it runs eager from now on (same results, "
                        "more host work; set torch_compile: false to silence this): %s: %s", name,
                        type(cause).__name__, (str(cause).strip().splitlines() or [""])[0])
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]


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
    costs ~0.2 ms a call)."""
    import importlib

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
