"""``OUT/.lab.lock``: one lab process writes into an output directory at a time.

The lock is the kernel's (``flock`` on the file), so it ends with the process that held it, however it ended: a lock
file left by a killed lab is free whatever PID it names - a PID the system gave to another process since, this
process's own PID, 0, or a number beyond any PID - and is taken over with a message. The PID written in the file only
names the holder in the refusal. A lock file that cannot be a lock (a directory, a FIFO, a symbolic link) is refused
with the command that removes it. On a file system without locks the lab goes on with a warning.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from pathlib import Path
from typing import Any

from ...formatting import brief
from .sweep import SweepError

LOCK_FILE = ".lab.lock"
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)


class OutLock:
    """``OUT/.lab.lock`` held (``flock``) while a lab process writes into ``OUT``, with its PID in it: a second
    process refuses, naming that PID; a lock file nobody holds is taken over (with a message)."""

    def __init__(self, out_dir: Path, log: Any = print) -> None:
        self.path = out_dir / LOCK_FILE
        self.log = log
        self.fd: int | None = None

    def __enter__(self) -> OutLock:
        for _ in range(3):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _text(fd)
                os.close(fd)
                raise SweepError(f"--out {self.path.parent}: another lab process ({_holder(holder)}) is writing there "
                                 f"(lock {self.path}); wait for it, or use another --out") from None
            except OSError as exc:
                if exc.errno not in _UNSUPPORTED:
                    os.close(fd)
                    raise SweepError(f"--out {self.path.parent}: cannot lock {self.path} ({exc.strerror or exc}); "
                                     "choose a directory on a local file system") from None
                self.log(f"warning: the file system of {self.path.parent} does not lock files; make sure no other "
                         "lab writes there")
            if self._same_file(fd):
                self._take(fd)
                return self
            os.close(fd)  # the holder removed the file between our open and our lock: try the new one
        raise SweepError(f"--out {self.path.parent}: cannot take the lock {self.path}; if no lab runs there, remove "
                         f"it (rm {self.path}) and rerun")

    def _open(self) -> int:
        """The lock file, created if absent; a regular file, not followed through a symbolic link."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise SweepError(self._not_a_lock()) from None
            raise SweepError(f"--out {self.path.parent}: cannot create the lock {self.path} "
                             f"({exc.strerror or exc}); choose a writable directory") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise SweepError(self._not_a_lock())
        return fd

    def _not_a_lock(self) -> str:
        return (f"--out {self.path.parent}: {self.path} is not a regular file, so it cannot be the lab's lock; if no "
                f"lab runs there, remove it (rm -r {self.path}) and rerun")

    def _same_file(self, fd: int) -> bool:
        try:
            return os.path.samestat(os.fstat(fd), os.stat(self.path, follow_symlinks=False))
        except OSError:
            return False

    def _take(self, fd: int) -> None:
        """Note a lock file left behind, then write this process's PID into it."""
        left = _text(fd)
        if left.strip():
            self.log(f"taking over the stale lock {self.path} (left by {_holder(left)}, which no longer holds it)")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self.fd = fd

    def __exit__(self, *exc: Any) -> None:
        if self.fd is None:
            return
        if self._same_file(self.fd):
            self.path.unlink(missing_ok=True)
        os.close(self.fd)
        self.fd = None


def _text(fd: int) -> str:
    """The first bytes of the lock file (the holder's PID), as text."""
    try:
        return os.pread(fd, 64, 0).decode(errors="replace")
    except OSError:
        return ""


def _holder(text: str) -> str:
    """``pid N`` from a lock file's text, or what the text holds instead."""
    words = text.split()
    if not words:
        return "its pid not written yet"
    return f"pid {words[0]}" if words[0].isdigit() else f"a lock file holding {brief(text.strip(), 40)}"
