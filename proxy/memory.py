"""Freed request buffers go back to the operating system.

glibc serves an allocation above its mmap threshold (128 KiB at start) from a mapping of its own, unmapped when
freed; but every such free raises the threshold to the freed size (up to 32 MiB), so after a few large request
bodies the next ones come from the heap, whose freed pages stay in the process. A storm of 2,400 malformed
requests (some with bodies of up to 2 MiB) left the proxy at 96 MiB from 47, where a second storm added nothing
(benchmarks/results/2026-11-25-cpu-proxy-rss-malformed/summary.md). Setting the threshold once turns that
adjustment off: a large buffer costs one mmap/munmap pair (microseconds, only for bodies above 128 KiB), and
the RSS returns to its baseline after the storm (49 MiB).

An operator's MALLOC_MMAP_THRESHOLD_ wins (glibc applied it at start); on another C library nothing is set.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own starting value, kept for good


def return_large_buffers_to_the_os(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Fix glibc's mmap threshold; True when it was set here."""
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (macOS, Windows): its allocator has no such threshold
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, threshold) == 1
