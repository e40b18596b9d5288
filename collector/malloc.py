"""glibc's allocator, set for a long-lived process whose start-up allocates far more than it keeps.

The controller's initial list decodes pages of up to 500 objects (megabytes each) and 256 KiB
socket reads, then keeps only small records. glibc serves allocations under its mmap threshold
from the heap, and that threshold grows (up to 32 MiB) each time a large mmapped block is freed:
after a fleet-size list the page bodies' memory sat free in the heap, fragmented among the
long-lived records (≈ 63 MiB that `malloc_trim` could not return; docs/benchmarks.md). A fixed
threshold keeps every block of 128 KiB or more in its own mapping, returned to the system when
freed. Measured at 48,700 pods: steady RSS 306 → 288 MiB, sync CPU +12%.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
from collections.abc import Callable

log = logging.getLogger("taugrid.malloc")

M_MMAP_THRESHOLD = -3  # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD = 128 * 1024


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    """The C library where it is glibc (None elsewhere: musl has mallopt as a no-op stub and no
    malloc_trim)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.gnu_get_libc_version  # noqa: B018  # glibc only
    except (OSError, AttributeError):
        return None
    return libc


def fix_mmap_threshold(threshold: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc's mmap threshold (which also stops its growth); False where the C library is not
    glibc or refused. Call before the threads start: it is process-wide."""
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = bool(mallopt(M_MMAP_THRESHOLD, threshold))
    if not ok:
        log.warning("mallopt refused", extra={"threshold": threshold})
    return ok


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    libc = _glibc()
    if libc is None:
        return None
    fn = libc.malloc_trim
    fn.argtypes = (ctypes.c_size_t,)
    fn.restype = ctypes.c_int
    return fn


def release_free() -> bool:
    """Hand the heap's free pages back to the system (glibc's `malloc_trim(0)`); False where the C
    library is not glibc. For after a pass that replaced many records past pymalloc's 512 bytes (the
    agents' GPU pass: a pod's packed readings, ~0.7 KB, made on the poller's thread and freed on the
    loop's): their pages sat free between passes (≈ 60 MiB at 50k GPU pods, docs/benchmarks.md)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
