"""Timing shared by the side-by-side benchmarks. Standard library only: the reference's side
imports it in a torch process without TensorFlow."""

import time


def fastest(fn, steps):
    """The shortest of ``steps`` timed calls of ``fn``, in seconds, after one untimed call (tracing,
    allocation)."""
    fn()
    best = float("inf")
    for _ in range(steps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best
