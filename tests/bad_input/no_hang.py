"""Call something that must not block on a FIFO, with a deadline: a call still waiting after it fails the test
instead of hanging the suite (every FIFO it may wait on is then opened for writing and closed, which releases it)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable

DEADLINE = 300.0
"""Long enough for a lab report on a loaded machine; a call blocked on a FIFO would wait forever."""


def make_fifo(path: Path) -> Path:
    """A FIFO at ``path`` (its parent created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _release(fifo: Path) -> None:
    """Unblock a reader waiting in ``open(fifo)``: a writer opens the FIFO and closes it (the reader reads EOF)."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # nobody is waiting to read
        return
    os.close(fd)


def within_deadline(call: Callable[[], Any], fifos: list[Path], deadline: float = DEADLINE) -> Any:
    """``call()``'s result or exception; AssertionError when it has not returned after ``deadline`` seconds."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test below
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(deadline)
    if thread.is_alive():
        for _ in range(50):
            for fifo in fifos:
                _release(fifo)
            thread.join(0.1)
            if not thread.is_alive():
                break
        raise AssertionError(f"still waiting after {deadline:.0f} s: it opened a FIFO ({', '.join(map(str, fifos))})")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
