"""An in-process all-gather: P threads play the P ranks of a data- or context-parallel group.

Each participant runs in its own thread and calls its own gather (the :class:`mismatch_ctrl.dist.Gather` protocol).
A call blocks on a barrier until all P participants have contributed, then every participant receives the P tensors
stacked in rank order (``[P, *shape]``), assembled by one thread, so the result is identical everywhere. Participants
that pass different shapes or dtypes all raise :class:`GroupError`; a participant that never arrives makes the others
raise ``TimeoutError`` after ``timeout`` seconds, so a bug cannot hang the suite. ``rounds`` counts the collectives.

    group = FakeGroup(3)
    results = run_ranks(3, lambda rank: core_function(shard[rank], Reducers(seq=group.gather(rank))), [group])
"""

from __future__ import annotations

import threading
from typing import Callable, Iterable, TypeVar

import torch

from mismatch_ctrl.dist import Gather

T = TypeVar("T")


class GroupError(RuntimeError):
    """The participants of a :class:`FakeGroup` disagree (shape, dtype) or one of them failed."""


class FakeGroup:
    """An all-gather among ``size`` threads; get each participant's gather with :meth:`gather`."""

    def __init__(self, size: int, timeout: float = 10.0) -> None:
        if size < 1:
            raise ValueError(f"a group needs at least one participant, got size={size}")
        self.size = size
        self.timeout = timeout
        self.rounds = 0
        self._slots: list[torch.Tensor | None] = [None] * size
        self._result: torch.Tensor | GroupError | None = None
        self._aborted = False
        self._barrier = threading.Barrier(size, action=self._combine, timeout=timeout)

    def gather(self, rank: int) -> Gather:
        """The gather of participant ``rank`` (0 <= rank < size)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside the group of size {self.size}")

        def gather(tensor: torch.Tensor) -> torch.Tensor:
            return self._gather(rank, tensor)

        return gather

    def abort(self) -> None:
        """Release every waiting participant with a :class:`GroupError` (used when one participant failed)."""
        self._aborted = True
        self._barrier.abort()

    def _gather(self, rank: int, tensor: torch.Tensor) -> torch.Tensor:
        self._slots[rank] = tensor.detach().clone()
        call = self.rounds
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            if self._aborted:
                raise GroupError(f"rank {rank}: gather call #{call} aborted because another participant failed") \
                    from None
            raise TimeoutError(
                f"rank {rank}: gather call #{call} waited more than {self.timeout}s for the other participants of a "
                f"group of {self.size} (one of them skipped a gather, gathered more often, or is stuck)") from None
        result = self._result
        if isinstance(result, GroupError):
            raise GroupError(f"rank {rank}: {result}")
        return result.clone()

    def _combine(self) -> None:
        """Run by one thread once all participants have arrived: the rank-ordered stack, or the disagreement."""
        slots = list(self._slots)
        self._slots = [None] * self.size
        call = self.rounds
        self.rounds += 1
        shapes = [tuple(t.shape) for t in slots]
        dtypes = [t.dtype for t in slots]
        if len(set(shapes)) > 1 or len(set(dtypes)) > 1:
            self._result = GroupError(f"gather call #{call}: participants disagree: shapes {shapes}, dtypes {dtypes}")
            return
        self._result = torch.stack(slots)


def run_ranks(size: int, fn: Callable[[int], T], groups: Iterable[FakeGroup] = (), timeout: float = 30.0) -> list[T]:
    """Run ``fn(rank)`` for ``rank in range(size)`` in ``size`` threads and return the results in rank order.

    If a participant raises, ``groups`` are aborted so the others stop waiting, and the first original error (not a
    consequential abort) is re-raised. A participant still running after ``timeout`` seconds raises ``TimeoutError``.
    """
    groups = list(groups)
    results: list[object] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def target(rank: int) -> None:
        try:
            results[rank] = fn(rank)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            errors[rank] = exc
            if not isinstance(exc, GroupError):
                for group in groups:
                    group.abort()

    threads = [threading.Thread(target=target, args=(rank,), name=f"fake-rank-{rank}", daemon=True)
               for rank in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        for group in groups:
            group.abort()
        raise TimeoutError(f"participants {stuck} still running after {timeout}s")
    failures = [e for e in errors if e is not None]
    if failures:
        primary = [e for e in failures if not isinstance(e, GroupError)] or failures
        raise primary[0]
    return results  # type: ignore[return-value]
