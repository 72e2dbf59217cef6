"""Who trains the runs of a grid: this process (``--jobs 1``), a local pool of spawned processes (one thread each),
or Ray tasks on a cluster (``--ray-address``: one CPU each, one GPU when the run's device is cuda). Each executor
calls ``on_event(event)`` for progress (``("start", key)``, ``("step", key, n)``, ``("warn", key, text)``) and
``on_result(task, files_and_summary)`` as runs finish, in this process; nothing else in the lab knows which one ran.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import multiprocessing
import os
import queue
import signal
import socket
import sys
import tempfile
import threading
import warnings
from multiprocessing.managers import SyncManager
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import torch

from ...formatting import clip
from ..training.trainer import Trainer
from .sweep import RunTask, SweepError

RunOutput = tuple[dict[str, Any], dict[str, bytes]]
"""A finished run: its summary and its files (path relative to the run folder -> bytes)."""
OnEvent = Callable[[tuple[Any, ...]], None]
OnResult = Callable[[RunTask, RunOutput], None]


class _Forward(logging.Handler):
    def __init__(self, emit: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self.forward = emit

    def emit(self, record: logging.LogRecord) -> None:
        self.forward(record.getMessage())


def train_task(task: RunTask, sink: Any) -> RunOutput:
    """Train one run in a scratch folder and return its summary and files; progress and warnings go to
    ``sink.put(event)``. The same function runs in this process, a pool worker and a Ray task."""
    torch.set_num_threads(1)
    key = task.key
    sink.put(("start", key, os.getpid()))
    handler = _Forward(lambda text: sink.put(("warn", key, text)))
    logger = logging.getLogger("mismatch_ctrl")
    logger.addHandler(handler)
    try:
        state = torch.load(io.BytesIO(task.policy_bytes), weights_only=True)
        with warnings.catch_warnings(), tempfile.TemporaryDirectory(prefix="mismatch-ctrl-run-") as scratch:
            warnings.simplefilter("default")
            warnings.showwarning = lambda message, category, *_: sink.put(("warn", key, f"{category.__name__}: "
                                                                                         f"{message}"))
            folder = Path(scratch) / "run"
            summary = Trainer(task.spec, task.settings, state, folder).run(lambda n: sink.put(("step", key, n)))
            files = {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    except Exception as exc:
        raise RunFailed.of(task, exc) from None
    finally:
        logger.removeHandler(handler)
    return summary, files


class RunFailed(SweepError):
    """A run that raised while training (e.g. out of memory): named by run and seed with the error's first line, as
    one picklable message (it crosses process and Ray boundaries); the sweep stops, finished runs are kept."""

    @classmethod
    def of(cls, task: RunTask, exc: BaseException) -> RunFailed:
        label, seed = task.key
        first = (str(exc).strip().splitlines() or [""])[0]
        memory = isinstance(exc, MemoryError) or "allocate" in first.lower() or "out of memory" in first.lower()
        return cls(f"run {label} seed {seed} failed: {type(exc).__name__}: {clip(first, 240)}; the runs finished "
                   "before it are kept" + (" (too large for this machine's memory: lower --prompts / --samples)"
                                           if memory else ""))


class Executor(Protocol):
    """Runs a list of tasks, reporting events and results in the calling process."""

    def connect(self) -> None:
        """Reach the workers now (before any warm-up), or raise SweepError."""

    def run(self, tasks: list[RunTask], on_event: OnEvent, on_result: OnResult) -> None:
        """Train ``tasks``; call ``on_event`` with progress and ``on_result`` with each finished run."""


class _Direct:
    def __init__(self, on_event: OnEvent) -> None:
        self.put = on_event


class LocalExecutor:
    """``jobs`` runs at a time: in this process when ``jobs`` is 1, else in spawned processes (one thread each).
    ``target`` trains one task (``train_task``; a test may give another module-level function)."""

    def __init__(self, jobs: int = 1, target: Callable[[RunTask, Any], RunOutput] = train_task) -> None:
        self.jobs = jobs
        self.target = target

    def connect(self) -> None:
        """Nothing to reach: the processes start with the sweep."""

    def run(self, tasks: list[RunTask], on_event: OnEvent, on_result: OnResult) -> None:
        if self.jobs == 1 or len(tasks) <= 1:
            sink = _Direct(on_event)
            for task in tasks:
                on_result(task, self.target(task, sink))
            return
        context = multiprocessing.get_context("spawn")
        workers: dict[tuple[str, int], int] = {}  # run key -> pid of the worker training it

        def event(item: tuple[Any, ...]) -> None:
            if item[0] == "start":
                workers[item[1]] = item[2]
            on_event(item)

        manager = SyncManager(ctx=context)
        manager.start(_init_worker, (os.getpid(),))  # the events queue's server: it must end with this process too
        with manager, _terminate_as_interrupt():
            events = manager.Queue()
            pool = context.Pool(min(self.jobs, len(tasks)), initializer=_init_worker, initargs=(os.getpid(),))
            try:
                pending = {task.key: (task, pool.apply_async(self.target, (task, events))) for task in tasks}
                while pending:
                    _drain(events, event)
                    for key in [key for key, (_, result) in pending.items() if result.ready()]:
                        task, result = pending.pop(key)
                        workers.pop(key, None)
                        on_result(task, result.get())
                    for key, pid in workers.items():
                        if key in pending and not pending[key][1].ready() and not _alive(pid):
                            raise RunFailed(f"run {key[0]} seed {key[1]}: its worker process (pid {pid}) died "
                                            "without a result, killed by the system (out of memory?); the runs "
                                            "finished before it are kept (lower --prompts / --samples / --jobs)")
                    if pending:
                        next(iter(pending.values()))[1].wait(0.2)
                _drain(events, event)
                pool.close()
            finally:
                pool.terminate()
                pool.join()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still exists (the pool reaps a dead worker within ~0.1 s)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, owned by another user
        pass
    return True


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While the pool runs, SIGTERM (``kill``, ``timeout``, a job scheduler) stops the sweep as Ctrl-C does: the pool's
    workers are terminated and the finished runs kept. Without it the parent died at once and its workers trained on,
    orphaned, for results nobody would read."""
    if threading.current_thread() is not threading.main_thread():  # signal handlers belong to the main thread
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:  # None: a handler not installed from Python, which cannot be put back; the default then
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _init_worker(parent: int) -> None:
    """The pool's workers and the queue's server leave Ctrl-C to the parent, which stops them (no traceback from every
    worker), and on Linux end with it if it is killed outright (``PR_SET_PDEATHSIG``: SIGTERM when the parent dies;
    a parent that died before that was set is seen as a new parent pid)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # no prctl: an orphan ends with its run
            pass
        if os.getppid() != parent:
            os._exit(1)


PR_SET_PDEATHSIG = 1
"""``prctl`` option: the signal a process gets when its parent dies (``linux/prctl.h``)."""


def _drain(events: Any, on_event: OnEvent) -> None:
    while True:
        try:
            on_event(events.get_nowait())
        except queue.Empty:
            return


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """Refuse a Ray address nothing listens on, fast (``ray.init`` itself may wait for minutes): ``auto`` needs a
    running local cluster; ``HOST:PORT`` (or ``ray://HOST:PORT``) must accept a TCP connection."""
    try:
        import ray  # noqa: F401
    except ImportError:
        raise SweepError("--ray-address: Ray is not installed; pip install 'mismatch-ctrl[ray]'") from None
    if address == "auto":
        return
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise SweepError(f"--ray-address {clip(address, 80)}: expected HOST:PORT (the GCS address `ray start --head` "
                         "prints, e.g. 10.0.0.1:6379), ray://HOST:PORT, or auto")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise SweepError(f"--ray-address {address}: cannot reach a Ray cluster there ({exc.strerror or exc}); start "
                         "one with `ray start --head` or give its address") from None


class RayExecutor:
    """One Ray task per run: ``num_cpus=1``, plus ``num_gpus=1`` when the run's ``device`` setting is cuda."""

    def __init__(self, address: str) -> None:
        self.address = address

    def connect(self) -> None:
        """Connect now (before any warm-up), or raise SweepError naming the address."""
        import ray

        if ray.is_initialized():
            return
        check_ray_address(self.address)
        try:
            ray.init(address=self.address, log_to_driver=False, include_dashboard=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise SweepError(f"--ray-address {self.address}: cannot connect ({str(exc).splitlines()[0]}); start a "
                             "cluster with `ray start --head` or give its address") from None

    def run(self, tasks: list[RunTask], on_event: OnEvent, on_result: OnResult) -> None:
        import ray
        from ray.util.queue import Queue

        self.connect()
        events = Queue()
        refs: dict[Any, RunTask] = {}
        for task in tasks:
            gpus = 1 if str(getattr(task.settings, "device", "cpu")).startswith("cuda") else 0
            remote = ray.remote(num_cpus=1, num_gpus=gpus, max_retries=0)(train_task)
            refs[remote.remote(task, events)] = task
        try:
            while refs:
                done, _ = ray.wait(list(refs), num_returns=1, timeout=0.2)
                for event in events.get_nowait_batch(events.qsize()):
                    on_event(event)
                for ref in done:
                    task = refs.pop(ref)
                    try:
                        output = ray.get(ref)
                    except SweepError:
                        raise
                    except Exception as exc:  # the task's worker died: Ray's WorkerCrashedError, OutOfMemoryError
                        raise RunFailed.of(task, exc) from None
                    on_result(task, output)
            for event in events.get_nowait_batch(events.qsize()):
                on_event(event)
        finally:
            for ref in refs:
                ray.cancel(ref, force=True)
            events.shutdown()
