"""glibc malloc settings for the CPU benchmarks."""

from __future__ import annotations

import ctypes
import ctypes.util


def keep_freed_memory() -> bool:
    """Ask glibc malloc to keep freed memory instead of returning it to the kernel (as a caching allocator does), so
    a fresh temporary does not page-fault. Returns False where this is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_trim_threshold, 2**30) and libc.mallopt(m_mmap_threshold, 2**30))
    except (OSError, AttributeError):
        return False
