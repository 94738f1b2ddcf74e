"""Host (CPU) memory allocator settings for training on a CPU.

A CPU training step allocates and frees the same activation and gradient buffers every step. glibc's
malloc serves blocks above its mmap threshold (128 KiB, raised dynamically up to 32 MiB) with fresh
`mmap` pages and returns them to the kernel on free, and trims the heap top above its trim threshold,
so each step page-faults (and the kernel zeroes) its buffers again: about 9,400 minor faults (37 MiB)
per step of a 4-layer d_model 128 model at batch 16 x 256 tokens under bf16 autocast (bench/RESULTS.md,
issue 29). Raising both thresholds keeps freed blocks in the heap for the next step's reuse: after a
few steps, once the heap has grown to fit a step's blocks, the faults go to about zero. The price is
resident memory: the process keeps its peak heap, and fragmentation can add up to about one step's
working set on top (measured: 124 MiB of buffers per step raised the peak by 152 MiB).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""mallopt parameter numbers (glibc malloc.h)."""

KEEP_BYTES = 1 << 30
"""Blocks up to this size come from the heap, and up to this much free heap top is kept (1 GiB)."""


def keep_freed_memory(limit_bytes: int = KEEP_BYTES, *, device_type: str = "cpu") -> bool:
    """Have glibc's malloc reuse freed blocks up to `limit_bytes` instead of unmapping them
    (mallopt M_MMAP_THRESHOLD and M_TRIM_THRESHOLD, see mallopt(3)). Process-wide and idempotent;
    blocks above the limit are still mapped and unmapped as before. `device_type`: the torch device
    type the caller trains or times on; for any but "cpu" nothing is changed (its step's buffers are
    not host memory).

    Returns True when applied; False for another device type, or on a C library other than glibc
    (musl, macOS, Windows), where nothing is changed.
    """
    if device_type != "cpu":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, limit_bytes)) and bool(mallopt(M_TRIM_THRESHOLD, limit_bytes))
