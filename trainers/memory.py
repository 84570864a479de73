"""glibc allocator settings for training on CPU.

TensorFlow's tf.data lowers glibc's ``M_TRIM_THRESHOLD`` to 128 KiB the first time a generator
dataset runs (it logs "Memory patch applied"). From then on every training step hands the
megabytes of freed activations back to the kernel and faults them in again on the next step,
in system time the step waits for. `keep_freed_memory` sets
the trim and mmap thresholds high, so the process keeps and reuses what it freed: faster steps
for a higher resident size (freed blocks stay in the process and fragment). Measured in
``benchmarks/results/malloc.json``; the trainer's ``--keep_freed_memory`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Blocks below this come from the heap (reused) rather than from mmap (returned at every free).
MMAP_THRESHOLD = 2**30
TRIM_THRESHOLD = 2**30


@functools.lru_cache(maxsize=None)
def _libc():
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        return libc if hasattr(libc, "mallopt") else None
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Raises glibc's trim and mmap thresholds; False where there is no glibc ``mallopt``
    (macOS, musl), where it changes nothing. Call it after the input pipeline has started:
    tf.data lowers the trim threshold again when its first generator dataset runs."""
    libc = _libc()
    if libc is None:
        return False
    ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and ok)
