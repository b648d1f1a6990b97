"""The start-up measurements' one timing rule: interleaved passes, best of a few, a margin to win."""
from __future__ import annotations

import time

__all__ = ["MARGIN", "timed_pass"]

# a non-default way must be faster by this fraction to be chosen (measurement noise on 2 cores)
MARGIN = 0.03


def timed_pass(fns, repeats: int, before=None) -> list[float]:
    """Best-of-``repeats`` seconds of each zero-argument ``fn`` (interleaved, after one warm-up each);
    ``before()``, untimed, before each timed call (e.g. evicting the caches)."""
    best = [float("inf")] * len(fns)
    for fn in fns:
        fn()
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            if before is not None:
                before()
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best
