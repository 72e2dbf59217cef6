"""The one way the project reads a file a user or a run left on disk: regular files only, bounded in size, UTF-8 where
text.

A path is checked by ``os.stat`` before it is opened: a FIFO (opening one for reading waits for a writer), a device
(``/dev/zero`` never ends), a socket or a directory is refused by name at once. The file is then opened with
``O_NONBLOCK | O_NOCTTY`` and checked again on the open descriptor, so a path swapped for a FIFO in between cannot
block either, and at most ``limit + 1`` bytes are read: a file larger than ``limit`` is refused, never read into
memory. Standard library only (the launchers run it under a plain ``python3``).

Every refusal is a :class:`FileRefused`, an ``OSError`` whose ``strerror`` says what the path is and whose ``str`` is
``"<path>: <reason>"``; a missing file stays ``FileNotFoundError``. Callers wrap either into their own error with the
fix.
"""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

MiB = 1 << 20
TEXT_LIMIT = 64 * MiB
"""The default bound of a file read whole: far above any metrics, config or report file the project reads."""
_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class FileRefused(OSError):
    """A path that is not a regular file, is larger than the reader's bound, or is not UTF-8 text."""

    def __init__(self, path: str | Path, reason: str) -> None:
        super().__init__(errno.EINVAL, reason, str(path))

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class TooLarge(FileRefused):
    """A regular file holding more bytes than the reader's bound."""


def kind_of(mode: int) -> str | None:
    """What a ``st_mode`` that is no regular file is (``"a FIFO (named pipe)"``, ...); None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def what_is(path: str | Path) -> str | None:
    """What ``path`` is when it is no regular file (``"a FIFO (named pipe)"``, ``"a directory"``, ``"a broken
    link"``, ``"missing"``, ``"unreadable (<reason>)"``); None for a regular file (or a link to one)."""
    try:
        return kind_of(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return "a broken link" if os.path.islink(path) else "missing"
    except OSError as exc:
        return f"unreadable ({exc.strerror or exc})"


def regular_file(path: str | Path) -> os.stat_result:
    """``os.stat(path)`` (symbolic links followed) of a regular file; :class:`FileRefused` naming what else it is,
    ``FileNotFoundError`` when nothing is there (a broken link included)."""
    found = os.stat(path)
    kind = kind_of(found.st_mode)
    if kind is not None:
        raise FileRefused(path, f"{kind}, not a regular file")
    return found


def _open(path: str | Path) -> int:
    """A read-only descriptor of the regular file ``path``, checked before and after opening."""
    regular_file(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    kind = kind_of(os.fstat(fd).st_mode)
    if kind is not None:  # replaced between the stat and the open
        os.close(fd)
        raise FileRefused(path, f"{kind}, not a regular file")
    return fd


def read_bytes(path: str | Path, limit: int = TEXT_LIMIT) -> bytes:
    """The content of the regular file ``path``; :class:`FileRefused` when it is no regular file, :class:`TooLarge`
    when it holds more than ``limit`` bytes."""
    fd = _open(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(path, f"larger than {_size(limit)}, more than such a file holds")
    return data


def read_text(path: str | Path, limit: int = TEXT_LIMIT) -> str:
    """:func:`read_bytes` decoded as UTF-8; :class:`FileRefused` naming the first byte that is not."""
    data = read_bytes(path, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(path, f"not UTF-8 text (byte {exc.start}: {data[exc.start:exc.start + 8]!r})") from None


def read_json(path: str | Path, limit: int = TEXT_LIMIT, **options: Any) -> Any:
    """:func:`read_text` parsed as JSON (``options`` go to ``json.loads``); ``ValueError`` for text that is not."""
    return json.loads(read_text(path, limit), **options)


def sha256_of(path: str | Path) -> str:
    """The sha256 (hex) of the regular file ``path``, read in blocks (any size; nothing but a regular file)."""
    digest = hashlib.sha256()
    with os.fdopen(_open(path), "rb") as f:
        for block in iter(lambda: f.read(MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def save_figure(fig: Any, path: str | Path, **options: Any) -> None:
    """A matplotlib figure saved as PNG through :func:`write_atomic` (``options`` go to ``savefig``)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", **options)
    write_atomic(path, buffer.getvalue())


def write_atomic(path: str | Path, data: bytes) -> None:
    """``data`` written to ``path`` through a temporary file in its directory and one rename: whatever was at
    ``path`` (a FIFO or a link included) is replaced, never opened, and a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)  # as open() makes a file under the usual umask 022 (mkstemp: 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _size(limit: int) -> str:
    return f"{limit / MiB:g} MiB" if limit >= MiB else f"{limit} bytes"
