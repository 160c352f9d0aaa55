"""glibc's heap set to keep the memory a command frees, for ``python -m avex.train`` and
``python -m avex.evaluate``.

By default glibc hands freed memory back to the kernel once a few hundred kB sit free at the
top of its heap, and serves large blocks with their own ``mmap``. A training step frees and
reallocates the same activations every step, so each step faults the same pages in again: in
the RL phase of ``make train`` on a 2-core box that was ~9 million page faults and ~25 s of
system time out of ~85 s (docs/results.md, "make train"). Keeping up to ``TRIM_BYTES`` free at
the top of the heap, and ``mmap`` only for blocks over ``MMAP_BYTES``, removes nearly all of
them; the results are bit for bit the same (an allocator's placement changes no arithmetic).

Only the commands call :func:`keep_freed_memory`: a library does not set its host process's
allocator. From Python, call it yourself before training. ``AVEX_KEEP_FREED_HEAP=0`` turns it
off; on other C libraries (macOS, musl) it does nothing.
"""
from __future__ import annotations

import ctypes
import os
import platform

#: glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: free memory kept at the top of the heap before it is handed back (default ~128 kB, dynamic)
TRIM_BYTES = 1 << 30
#: blocks from this size up get their own mapping (glibc's ceiling for this setting: 32 MiB)
MMAP_BYTES = 32 << 20
ENV = "AVEX_KEEP_FREED_HEAP"


def keep_freed_memory(libc=None) -> bool:
    """Set this process's glibc heap to keep what it frees (this module's docstring); whether
    it was set. ``libc``: the C library to call (tests pass a stand-in). A value of
    ``AVEX_KEEP_FREED_HEAP`` other than 0 or 1 is a ValueError naming it."""
    value = os.environ.get(ENV, "1").strip()
    if value not in ("0", "1"):
        raise ValueError(f"{ENV} must be 0 (glibc's default heap) or 1 (keep freed memory), "
                         f"got {value!r}")
    if value == "0":
        return False
    if libc is None:
        if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
            return False
        try:
            libc = ctypes.CDLL("libc.so.6")
        except OSError:
            return False
    mallopt = getattr(libc, "mallopt", None)
    if mallopt is None:
        return False
    # mallopt returns 1 on success; a refused value leaves glibc's default in place
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_BYTES) == 1
                and mallopt(M_TRIM_THRESHOLD, TRIM_BYTES) == 1)
