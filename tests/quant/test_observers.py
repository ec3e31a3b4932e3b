"""Observers against brute force on the same data, fed in batches (streaming)."""
import numpy as np
import pytest

from qcompiler.quant.observers import MSE, Entropy, Histogram, MinMax, Percentile, kl_threshold, make_observer
from qcompiler.quant.qparams import asymmetric, fake_quantize, symmetric


def feed(obs, x, parts=10):
    for b in np.array_split(x, parts):
        obs.update(b)
    return obs


def quant_mse(x, rng, sym=False):
    qp = symmetric(*rng) if sym else asymmetric(*rng)
    return float(np.mean((fake_quantize(x, qp).astype(np.float64) - x) ** 2))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_minmax_exact_and_ignores_nonfinite(rng):
    x = rng.standard_normal(10_000).astype(np.float32)
    o = feed(MinMax(), x)
    assert o.range() == (float(x.min()), float(x.max())) and o.count == x.size
    o.update(np.array([np.nan, np.inf, -np.inf, 1e3], np.float32))
    assert o.range() == (float(x.min()), 1e3) and o.nonfinite == 3


def test_no_data_is_an_error():
    o = Percentile()
    o.update(np.array([np.nan]))
    with pytest.raises(ValueError, match="no finite values"):
        o.range()


def test_histogram_growth_is_exact_rebinning(rng):
    # batches of growing spread force several re-binnings in both directions
    parts = [rng.standard_normal(5_000) * s + o for s, o in [(0.1, 0), (1, 2), (5, -3), (0.5, 40), (20, -90)]]
    h = Histogram(256)
    for p in parts:
        h.add(p, p.min(), p.max())
    x = np.concatenate(parts)
    assert h.lo <= x.min() and h.hi >= x.max() and h.counts.sum() == x.size
    direct = np.bincount(np.clip(np.floor((x - h.lo) / h.width), 0, h.bins - 1).astype(int), minlength=h.bins)
    assert np.abs(direct - h.counts).sum() <= 4             # only float ties at edges may differ
    assert (h.counts > 0).sum() > 0.2 * h.bins or h.hi - h.lo < 2 * (x.max() - x.min())   # range stays tight


def test_histogram_from_constant_batch_then_wide(rng):
    h = Histogram(64)
    h.add(np.zeros(10), 0.0, 0.0)
    big = rng.uniform(-1e6, 1e6, 1000)
    h.add(big, big.min(), big.max())
    assert h.counts.sum() == 1010 and h.lo <= big.min() and h.hi >= big.max()
    assert h.hi - h.lo < 4 * (big.max() - big.min())


@pytest.mark.parametrize("p", [99.0, 99.9, 99.99])
@pytest.mark.parametrize("dist", ["normal", "lognormal", "relu"])
def test_percentile_matches_numpy_within_a_bin(rng, p, dist):
    x = {"normal": rng.standard_normal(200_000), "lognormal": rng.lognormal(0, 1, 200_000),
         "relu": np.maximum(rng.standard_normal(200_000), 0)}[dist].astype(np.float32)
    x[:50_000] *= 0.2          # the first batches have a narrower range: the histogram must grow
    o = feed(Percentile(p), x)
    lo, hi = o.range()
    w, xs = o.hist.width, np.sort(x)

    def near(est, q):          # within a bin of the order statistics around numpy's percentile
        k = q / 100 * (x.size - 1)
        a, b = xs[max(int(np.floor(k)) - 1, 0)], xs[min(int(np.ceil(k)) + 1, x.size - 1)]
        return a - w <= est <= b + w and abs(est - np.percentile(x, q)) <= max(w, b - a) + w

    assert near(hi, p) and near(lo, 100 - p)
    if dist == "relu":
        assert lo == 0.0                                     # snapped to the exact minimum
    assert feed(Percentile(100.0), x).range() == (float(x.min()), float(x.max()))


def test_entropy_clips_outliers_of_a_gaussian(rng):
    x = rng.standard_normal(500_000).astype(np.float32)
    x[rng.integers(0, x.size, 20)] = 50.0
    lo, hi = feed(Entropy(), x).range()
    assert lo == -hi and 2.5 < hi < 25.0                     # well below the outliers, not inside the bulk


def test_entropy_unsigned_after_relu(rng):
    x = np.maximum(rng.standard_normal(300_000), 0).astype(np.float32)
    x[:5] = 60.0
    lo, hi = feed(Entropy(), x).range()
    assert lo == 0.0 and 2.0 < hi < 30.0
    lo128, hi128 = feed(Entropy(quantized_bins=128), x).range()     # TensorRT's setting clips harder
    assert lo128 == 0.0 and hi128 <= hi


def test_entropy_keeps_a_bounded_distribution(rng):
    x = rng.uniform(-1, 1, 200_000).astype(np.float32)
    lo, hi = feed(Entropy(), x).range()
    assert hi > 0.9                                          # nothing to clip: keep (nearly) all
    assert kl_threshold(np.array([0, 5, 0, 3.0]), 0.5) == 2.0    # fewer bins than levels: no clipping
    assert kl_threshold(np.zeros(4), 1.0) == 0.0


@pytest.mark.parametrize("sym", [False, True])
def test_mse_beats_minmax_on_heavy_tails(rng, sym):
    x = rng.standard_t(2, 300_000).astype(np.float32)         # heavy tails both sides
    r = feed(MSE(symmetric=sym), x).range()
    mm = feed(MinMax(), x).range()
    if sym:
        a = max(-mm[0], mm[1])
        mm = (-a, a)
    assert r[0] > mm[0] and r[1] < mm[1]
    assert quant_mse(x, r, sym) < 0.8 * quant_mse(x, mm, sym)


def test_mse_range_is_near_the_brute_force_optimum(rng):
    x = rng.standard_normal(20_000)
    pos = x > 0
    x[pos] = np.abs(rng.standard_t(2.5, pos.sum()))         # heavy positive tail, light negative one
    x = x.astype(np.float32)
    lo, hi = feed(MSE(), x).range()
    grid = [(a * x.min(), b * x.max()) for a in np.linspace(0.3, 1, 25) for b in np.linspace(0.05, 1, 40)]
    best = min(quant_mse(x, r) for r in grid)
    assert quant_mse(x, (lo, hi)) <= 1.05 * best


def test_mse_unsigned_and_constant():
    x = np.maximum(np.random.default_rng(2).standard_normal(50_000), 0)
    assert feed(MSE(), x).range()[0] == 0.0
    z = MSE()
    z.update(np.zeros(100))
    assert z.range() == (0.0, 0.0)


def test_make_observer():
    assert isinstance(make_observer("percentile", p=99.9), Percentile)
    assert make_observer("percentile", p=99.9).p == 99.9
    with pytest.raises(ValueError, match="unknown calibration method 'kl'"):
        make_observer("kl")
    with pytest.raises(ValueError, match="bad option"):
        make_observer("minmax", p=3)
    with pytest.raises(ValueError, match="percentile p"):
        Percentile(20)


def kl_loop(counts, nq, eps=1e-4):
    """The KL search written out bin by bin, as in TensorRT's description."""
    n = np.flatnonzero(counts)[-1] + 1
    counts = counts[:n]
    kls = {}
    for i in range(nq, n + 1):
        p = counts[:i].copy()
        p[-1] += counts[i:].sum()
        m, q = i // nq, np.zeros(i)
        for j in range(nq):
            a, b = j * m, (i if j == nq - 1 else (j + 1) * m)
            nz = (p[a:b] != 0).sum()
            if nz:
                q[a:b] = np.where(p[a:b] != 0, max(counts[a:b].sum(), eps) / nz, 0)
        P, Q = p / p.sum(), q / counts[:i].sum()
        with np.errstate(divide="ignore", invalid="ignore"):
            kls[i] = np.sum(np.where(P > 0, P * np.log(P / Q), 0))
    return kls


@pytest.mark.parametrize("nq,outlier", [(16, 30.0), (32, 6.0), (8, 12.0)])
def test_kl_threshold_equals_the_bin_by_bin_search(rng, nq, outlier):
    x = np.abs(rng.standard_normal(20_000))
    x[:3] = outlier
    h = Histogram(256)
    h.add(x, 0.0, x.max())
    kls = kl_loop(h.counts, nq)
    best = min(kls.values())
    t = kl_threshold(h.counts, h.width, nq)
    assert kls[round(t / h.width)] == pytest.approx(best, rel=1e-6, abs=1e-12)
