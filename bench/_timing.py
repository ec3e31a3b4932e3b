"""Shared timing helper of the benchmark scripts (run as ``python bench/NAME.py``)."""
from __future__ import annotations

import time

import numpy as np


def median_ms(fn, iters: int) -> float:
    """Median wall time of ``iters`` calls of ``fn``, in milliseconds."""
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts) * 1e3)
