"""Streaming range observers: see batches of one activation, give the range (lo, hi) to quantize.

Every observer takes ``update(x)`` once per batch and answers ``range()``; none keeps the data, so
memory does not grow with the number of samples. Non-finite values (e.g. -inf attention masks) are
counted in ``nonfinite`` and otherwise ignored.

=============== ============================================================================
``MinMax``      the exact min and max seen.
``Percentile``  the (100-p)th and p-th percentiles (two-sided), read off a streaming histogram
                with linear interpolation inside a bin: error below one bin width.
``Entropy``     TensorRT's calibration (Migacz, "8-bit Inference with TensorRT", GTC 2017):
                over a 2048-bin histogram of |x|, the threshold T whose clipped distribution P
                and its quantized version Q (``quantized_bins`` levels) have the least
                KL(P || Q). Range (0, T) for unsigned data (after ReLU), (-T, T) for signed.
``MSE``         the clipping range [lo, hi] minimising the expected squared error of 8-bit
                quantization over the histogram: clipping error of the values outside plus
                step^2/12 for those inside. ``symmetric=True`` searches (-T, T).
=============== ============================================================================

The histogram (:class:`Histogram`) has a fixed number of bins over a range that always includes
0. When a batch falls outside, the bin width grows by an integer factor k with the new edges on old
edges, so re-binning is exact (old bins are summed in groups); at least half the bins stay in use.
"""
from __future__ import annotations

import math
from enum import Enum

import numpy as np


class Method(str, Enum):
    MINMAX = "minmax"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"
    MSE = "mse"


def _finite_flat(x: np.ndarray) -> tuple[np.ndarray, int, float, float]:
    """x flattened without NaN/Inf, how many were dropped, and its min and max."""
    x = np.asarray(x).reshape(-1)
    if x.size == 0:
        return x, 0, math.inf, -math.inf
    mn, mx = x.min(), x.max()
    if np.isfinite(mn) and np.isfinite(mx):
        return x, 0, float(mn), float(mx)
    keep = np.isfinite(x)
    x = x[keep]
    dropped = int(keep.size - x.size)
    if x.size == 0:
        return x, dropped, math.inf, -math.inf
    return x, dropped, float(x.min()), float(x.max())


class Observer:
    """Base class: counts, exact min/max, ``update`` and ``range``."""

    def __init__(self):
        self.count = 0            # finite elements seen
        self.nonfinite = 0        # NaN/Inf elements ignored
        self.min = math.inf
        self.max = -math.inf

    def update(self, x: np.ndarray) -> None:
        flat, dropped, lo, hi = _finite_flat(x)
        self.nonfinite += dropped
        if flat.size == 0:
            return
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.count += flat.size
        self._observe(flat, lo, hi)

    def _observe(self, flat: np.ndarray, lo: float, hi: float) -> None:
        pass

    def range(self) -> tuple[float, float]:
        if self.count == 0:
            raise ValueError(f"{type(self).__name__} has seen no finite values")
        return self._range()

    def _range(self) -> tuple[float, float]:
        return self.min, self.max

    def __repr__(self) -> str:
        return f"{type(self).__name__}(count={self.count}, min={self.min:g}, max={self.max:g})"


class MinMax(Observer):
    """The exact range seen."""


class Histogram:
    """``bins`` equal bins over [lo, lo + bins*width], a range that always contains 0.

    ``add`` grows the range when data falls outside: the width is multiplied by the smallest
    integer k that makes the data fit, and the old range starts m old widths above the new lo, so
    old bin i lands exactly in new bin (i + m) // k."""

    def __init__(self, bins: int = 2048):
        if bins < 8:
            raise ValueError(f"a histogram needs at least 8 bins, got {bins}")
        self.bins = bins
        self.counts = np.zeros(bins, np.float64)
        self.lo = 0.0
        self.width = 0.0          # 0 until the first add

    @property
    def hi(self) -> float:
        return self.lo + self.bins * self.width

    @property
    def edges(self) -> np.ndarray:
        return self.lo + self.width * np.arange(self.bins + 1)

    @property
    def centers(self) -> np.ndarray:
        return self.lo + self.width * (np.arange(self.bins) + 0.5)

    def add(self, x: np.ndarray, xmin: float, xmax: float) -> None:
        if self.width == 0.0:
            self.lo = min(xmin, 0.0)
            self.width = max((max(xmax, 0.0) - self.lo) / self.bins, 1e-30)
        elif xmin < self.lo or xmax > self.hi:
            self._grow(xmin, xmax)
        idx = np.floor((x.astype(np.float64) - self.lo) / self.width)
        idx = np.clip(idx, 0, self.bins - 1).astype(np.intp)
        self.counts += np.bincount(idx, minlength=self.bins)

    def _grow(self, xmin: float, xmax: float) -> None:
        b, w = self.bins, self.width
        down = max(0, math.ceil((self.lo - xmin) / w))          # old-width bins needed below
        up = max(0, math.ceil((xmax - self.hi) / w))            # ... and above
        k = -(-(b + down + up) // b)                             # ceil, Python ints: no overflow
        slack = b * k - (b + down + up)
        if down == 0:
            m = 0                                                # keep lo (e.g. 0 after ReLU)
        elif up == 0:
            m = down + slack                                     # keep hi
        else:
            m = down + slack // 2
        if k <= b:                                               # m <= b*k fits in int64
            new_idx = (np.arange(b) + m) // k
        else:                                # k huge: (i + m) // k = q0 + (i + r >= k), i < b < k
            q0, r = divmod(m, k)
            new_idx = q0 + (np.arange(b) >= min(k - r, b))
        self.counts = np.bincount(new_idx, weights=self.counts, minlength=b)[:b]
        self.lo -= m * w
        self.width = k * w

    def quantile(self, q: float) -> float:
        """The q-quantile (0 <= q <= 1), linear inside the bin where the CDF crosses q*N."""
        total = self.counts.sum()
        cdf = np.cumsum(self.counts)
        target = q * total
        j = int(np.searchsorted(cdf, target, side="left"))
        j = min(j, self.bins - 1)
        before = cdf[j - 1] if j > 0 else 0.0
        frac = (target - before) / self.counts[j] if self.counts[j] > 0 else 0.0
        return self.lo + (j + float(np.clip(frac, 0.0, 1.0))) * self.width


class _HistogramObserver(Observer):
    def __init__(self, bins: int = 2048):
        super().__init__()
        self.hist = Histogram(bins)

    def _observe(self, flat, lo, hi):
        self.hist.add(flat, lo, hi)


class Percentile(_HistogramObserver):
    """Range from the (100 - p)-th to the p-th percentile (p = 100: min and max)."""

    def __init__(self, p: float = 99.99, bins: int = 2048):
        if not 50.0 < p <= 100.0:
            raise ValueError(f"percentile p must be in (50, 100], got {p}")
        super().__init__(bins)
        self.p = p

    def _range(self):
        w = self.hist.width
        lo = max(self.min, self.hist.quantile(1.0 - self.p / 100.0))
        hi = min(self.max, self.hist.quantile(self.p / 100.0))
        lo = self.min if lo - self.min < w else lo       # within a bin of the extreme: the extreme
        hi = self.max if self.max - hi < w else hi       # (keeps ReLU/ReLU6 ranges at exactly 0, 6)
        return lo, max(lo, hi)


class Entropy(_HistogramObserver):
    """TensorRT's KL-divergence threshold over a histogram of |x|.

    ``quantized_bins``: the number of levels of the target grid over [0, T]: 128 for signed int8
    (TensorRT) and, by default (None), 256 for data that was never negative (uint8 covers [0, T]
    with 256 levels); give 128 to reproduce TensorRT exactly."""

    def __init__(self, bins: int = 2048, quantized_bins: int | None = None):
        super().__init__(bins)
        if quantized_bins is not None and not 2 <= quantized_bins <= bins:
            raise ValueError(f"quantized_bins must be in [2, {bins}], got {quantized_bins}")
        self.quantized_bins = quantized_bins

    def _observe(self, flat, lo, hi):
        self.hist.add(np.abs(flat), 0.0, max(-lo, hi))

    def _range(self):
        signed = self.min < 0
        nq = self.quantized_bins or (128 if signed else 256)
        amax = max(-self.min, self.max)
        t = min(amax, kl_threshold(self.hist.counts, self.hist.width, nq))
        return (-t, t) if signed else (0.0, t)


def kl_threshold(counts: np.ndarray, width: float, quantized_bins: int = 128, eps: float = 1e-4) -> float:
    """TensorRT's entropy calibration over a histogram of |x| (bin k covers [k*w, (k+1)*w)).

    For each candidate i >= quantized_bins: P = counts[:i] with the outliers counts[i:] added to
    its last bin; Q = counts[:i] merged into ``quantized_bins`` levels of i // quantized_bins bins
    (the last level takes the rest), each level's sum spread evenly over the bins where P is
    nonzero. Returns i*width for the i with the least KL(P || Q) (both normalized). Where Q would
    be 0 but P is not (outliers folded into an empty top level), the level gets ``eps`` counts,
    as MXNet's and ONNX Runtime's smoothing does, so that clipping isolated outliers stays finite.

    Q is constant over a level, so KL = sum_k P log P / T - log T - sum_levels P_level log q_level / T
    + log sum(Q), with T = sum(P): prefix sums make every candidate O(levels), all at once."""
    counts = np.asarray(counts, np.float64)
    nonzero = np.flatnonzero(counts)
    if nonzero.size == 0:
        return 0.0
    n = int(nonzero[-1]) + 1
    nq = quantized_bins
    if n <= nq:
        return n * width
    counts = counts[:n]
    total = counts.sum()
    cs = np.concatenate([[0.0], np.cumsum(counts)])
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(counts > 0, counts * np.log(counts), 0.0)
    cs_plogp = np.concatenate([[0.0], np.cumsum(plogp)])
    cs_nz = np.concatenate([[0], np.cumsum(counts > 0)])

    i = np.arange(nq, n + 1)[:, None]                            # (c, 1) candidates
    out = total - cs[i[:, 0]]                                    # outliers beyond each candidate
    last = counts[i[:, 0] - 1] + out                             # P's last bin
    m = i // nq
    j = np.arange(nq)[None, :]
    lo = j * m
    hi = np.where(j == nq - 1, i, lo + m)                        # (c, nq) level bounds
    level_sum = cs[hi] - cs[lo]                                  # sliced counts per level (Q mass)
    level_nz = cs_nz[hi] - cs_nz[lo]                             # nonzero bins of P per level
    level_nz[:, -1] += (counts[i[:, 0] - 1] == 0) & (out > 0)
    p_level = level_sum.copy()
    p_level[:, -1] += out                                        # P mass per level
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q = np.log(np.maximum(level_sum, eps) / np.maximum(level_nz, 1))
        cross = np.where(p_level > 0, p_level * log_q, 0.0).sum(axis=1)      # sum_k P_k log q_k
        plogp_p = cs_plogp[i[:, 0] - 1] + np.where(last > 0, last * np.log(last), 0.0)
        kl = (plogp_p - cross) / total - np.log(total) + np.log(cs[i[:, 0]])
    kl = np.where(np.isfinite(kl), kl, np.inf)
    return int(i[int(np.argmin(kl)), 0]) * width


class MSE(_HistogramObserver):
    """The clipping range with the least expected ``bits``-bit quantization error over the histogram.

    The error of a range [lo, hi] with step s = (hi - lo) / levels, over the bins (count n, center
    c): sum n * (c - clip(c, lo, hi))^2 over the bins outside plus n * s^2 / 12 over those inside.
    Asymmetric (default, levels = 2**bits - 1 as :func:`~qcompiler.quant.qparams.asymmetric`):
    lo and hi are searched independently over the bin edges (up to ``steps`` each, lo <= 0 <= hi)
    with prefix sums, so a one-sided outlier is clipped without clipping the other side.
    ``symmetric``: (-T, T) with levels = 2**bits - 2 (restricted int8)."""

    def __init__(self, bins: int = 2048, bits: int = 8, symmetric: bool = False, steps: int = 512):
        super().__init__(bins)
        if not 2 <= bits <= 16:
            raise ValueError(f"bits must be in [2, 16], got {bits}")
        self.bits, self.symmetric, self.steps = bits, symmetric, steps

    def _candidates(self, a: float, b: float) -> np.ndarray:
        """Bin edges strictly between a and b, thinned to at most ``steps``, plus b."""
        e = self.hist.edges
        e = e[(e > min(a, b)) & (e < max(a, b))]
        if e.size > self.steps:
            e = e[np.linspace(0, e.size - 1, self.steps).astype(np.intp)]
        return np.append(e, b)

    def _range(self):
        h = self.hist
        used = h.counts > 0
        v, n = h.centers[used], h.counts[used]                   # ascending
        s0, s1, s2 = (np.concatenate([[0.0], np.cumsum(n * v ** p)]) for p in (0, 1, 2))

        def outside(t: np.ndarray, above: bool):
            """(count, squared clipping error) of the bins beyond t."""
            if above:
                i = np.searchsorted(v, t, "right")
                c0, c1, c2 = s0[-1] - s0[i], s1[-1] - s1[i], s2[-1] - s2[i]
            else:
                i = np.searchsorted(v, t, "left")
                c0, c1, c2 = s0[i], s1[i], s2[i]
            return c0, np.maximum(c2 - 2 * t * c1 + t * t * c0, 0.0)

        total = s0[-1]
        if self.symmetric:
            amax = max(-self.min, self.max)
            if amax == 0:
                return 0.0, 0.0
            t = self._candidates(0.0, amax)
            (na, ea), (nb, eb) = outside(t, True), outside(-t, False)
            err = ea + eb + (total - na - nb) * (2 * t / (2 ** self.bits - 2)) ** 2 / 12
            best = float(t[int(np.argmin(err))])
            return -best, best
        lo0, hi0 = min(self.min, 0.0), max(self.max, 0.0)
        if lo0 == hi0:
            return lo0, hi0
        his = self._candidates(0.0, hi0) if hi0 > 0 else np.zeros(1)
        los = self._candidates(0.0, lo0) if lo0 < 0 else np.zeros(1)
        na, ea = outside(his, True)
        nb, eb = outside(los, False)
        levels = 2 ** self.bits - 1
        err = eb[:, None] + ea[None, :] + (total - nb[:, None] - na[None, :]) \
            * ((his[None, :] - los[:, None]) / levels) ** 2 / 12
        r, c = np.unravel_index(int(np.argmin(err)), err.shape)
        return float(los[r]), float(his[c])


def make_observer(method: Method | str = Method.MINMAX, **opts) -> Observer:
    """An observer by method name (``minmax``, ``percentile``, ``entropy``, ``mse``) and options
    (``p`` for percentile, ``bins``, ``quantized_bins``, ``symmetric``, ...)."""
    try:
        m = Method(method)
    except ValueError:
        raise ValueError(f"unknown calibration method '{method}' "
                         f"(known: {', '.join(x.value for x in Method)})") from None
    cls = {Method.MINMAX: MinMax, Method.PERCENTILE: Percentile,
           Method.ENTROPY: Entropy, Method.MSE: MSE}[m]
    try:
        return cls(**opts)
    except TypeError as e:
        raise ValueError(f"bad option for calibration method '{m.value}': {e}") from None
