"""Dense or sparse, per layer: an analytic size and time model, and the ``encode-sparse`` decision.

The model follows AdaPT's performance model (Kummer et al., *AdaPT: Fast Convergence and Resource
Efficient Training of Deep Neural Networks*, sec. 4.1.2, in ../shared/background): the cost of a
layer is its multiply-adds weighted by the word length ``WL`` of the weights and the fraction of
them that are non-zero, ``ops · sp · WL``; model size is ``Σ params · sp · WL``. AdaPT assumes an
ideal sparse format on ideal hardware. We keep its form and add what a real encoding stores and
what a real kernel on a real target does:

* size: exact bytes of the encoding, :func:`qcompiler.sparse.format.predicted_bytes` (values, index
  arrays, row pointers) - no model needed; plus, where CSR would run the kernel shared by all
  pointwise int8 convs (:func:`shares_kernel`), the code every other format's own kernel adds
  (:data:`KERNEL_CODE_BYTES`): on a 100 K-parameter model one kernel's code outweighs a layer's weights;
* time, for ``M`` output columns (batch x output pixels of the im2col gemm) of a ``[g, N, K]``
  weight, per format ``f`` and weight dtype (int8 or fp32)::

      t_f = F + G·[conv] + c_f·W_f + r_f·R_f + e_f·g·N·M + (v_f·[conv] + x_f·[im2col])·g·K·M

  in units of one dense bit-MAC of the dtype (``[conv]``: 1 for a conv; ``[im2col]``: 1 for a conv
  whose X is a k x k or padded expansion), with AdaPT's term ``W_f`` and the row tiles ``R_f``:

  ===========  =====================================================  ========================
  format       AdaPT work ``W_f`` (entries · columns · bits)          row tiles ``R_f``
  ===========  =====================================================  ========================
  dense        ``g·up(N, tn)·up(K, tk) · M · WL``                     -
  csr          ``nnz · M' · (WL + IB)``                               ``g·N · ceil(M / T)``
  bsr1x4       ``4·nnzb · M' · (WL + IB/4)``                          ``g·N · ceil(M / T)``
  bsr4x1       ``4·nnzb · M' · (WL + IB/4)``                          ``g·N/4 · ceil(M / T/2)``
  2:4          ``g·N·(Kp/2) · M' · (WL + 2)``                         ``g·N · ceil(M / T)``
  ===========  =====================================================  ========================

  ``WL`` = weight bits (8 or 32), ``IB`` = index bits of the encoding (8 or 16). ``c_f`` is AdaPT's
  factor: how much slower one stored entry-bit is processed than one dense bit-MAC (``c_dense = 1``
  defines the unit). What AdaPT's ideal model leaves out, and this one adds:

  - the target's vector shapes (:class:`Target`): the int8 dense kernel on x86 VNNI pads output
    channels to the ``tn = 16`` int32 lanes of ``vpdpbusd`` and the reduction to groups of
    ``tk = 4`` (64 MACs per instruction); the sparse kernels vectorize the columns,
    ``M' = up(M, 16)``, in register tiles of ``T = 64`` columns;
  - a GEMV (``M = 1``) runs other kernels (the dense gemv; the sparse row vectorized over its
    non-zeros with gathers): its work ``W_f`` (with ``M' = 1``) has its own factor ``c1_f``;
  - ``F``: the cost of a kernel call (the VM call, loop set-up), ``G`` more for a conv (packing /
    X stages are kernels of their own) - one per dtype, shared by the formats, so that a layer too
    small for any other term comes out a tie and stays dense by the margin; ``r_f``: per row and
    column tile (row pointer, accumulators' load and store); ``e_f``: per output element
    (requantization epilogue, write-back); ``v_f``: per element of a conv's ``X`` (``g·K·M``: the
    input re-laid out, NCHW{c} for the dense kernels, column tiles for the sparse ones); ``x_f``:
    more per element when ``X`` is the im2col expansion (every element's pixel coordinates and
    bounds, 9x the input for a 3x3 conv).

  The coefficients are per weight dtype because the kernels are: int8 dense runs on VNNI and fp32
  dense on FMA, and per bit they cost the same (fitted: 0.61 and 0.63 ps per dense bit-MAC - AdaPT's
  bit weighting holds for dense); but int8 CSR / BSR 4x1 sum their products on fp32 FMAs (exact below
  2^24, kernels/sparse.py), so per stored bit an int8 entry costs ~3-6x the fp32 one relative to
  dense (``c_csr`` 4.4 against 1.4, ``c_bsr4x1`` 8.0 against 1.2), while int8 BSR 1x4 runs on
  ``vpdpbusd`` (``c_bsr1x4`` 1.8 against 1.5). int8 therefore needs far more sparsity before a
  sparse format pays. ``F`` is 2.0 µs (int8) / 1.8 µs (fp32) per call, ``G`` 0.65 µs (int8).

The x86 defaults (:data:`X86_INT8`, :data:`X86_FP32`) are FITTED (:func:`fit`: relative-error
non-negative least squares) to measured times of SYNTHETIC layers only - random weights on a grid
of shapes, never the real models' layers the model is checked on (bench/bench_sparse.py,
``sweep_cases``: 19 gemms, 80 1x1 and 28 3x3 convs, 8 sparse variants each, int8 and fp32; 2286
timings on the 2-core host, 1 thread, 7 interleaved rounds, load average ~4-5; in
bench/sparse_fit_samples.json)::

    .venv/bin/python bench/bench_sparse.py --what sweep --threads 1 --rounds 7 --iters 10
    .venv/bin/python bench/bench_sparse.py --what fit        # prints the constants below

The fit's median relative error per format is 15-23 %; 5-fold cross-validation by layer on the
synthetic set picks the margin (5 %: within 10 % of the fastest on 648/762 held-out rows).
ARM and CUDA have no measurements: :meth:`CostModel.for_target` gives them AdaPT's form with the
assumed factors (``c_csr = 3``, ``c_bsr = 1.5``, ``c_24 = 1.25``, 8 units per output row and
column, no padding, no fixed cost) - the previous defaults.

``choose(layer)`` picks, per objective, the format of least predicted size and of least predicted
time; a sparse format must beat dense by ``margin`` (default 5 %), so a tie stays dense. For time,
a format that stores no fewer multiply-accumulates than dense (``4·nnzb >= N·K`` for BSR on a
weight with no all-zero block, ``nnz = N·K`` for CSR) skips nothing and is not a candidate: the
fit's per-format factors come from pruned layers and predicted BSR 1x4 / 4x1 at 0.85-0.94 of dense
for seven unpruned 1x1 convs of rapidocr-cls (8-32 channels, 576-2304 pixels), which measured
3.5-6x slower than the dense VNNI kernel at 1 thread (8->8 at 24x96: 33.5 against 7.6 us) and
cost the whole int8 model 0.3-0.6 ms at 2 threads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

import numpy as np

from .format import FORMATS, count_blocks, index_dtype, is_24, predicted_bytes

TERMS = ("fixed", "work", "work1", "tiles", "outputs", "xin", "im2col", "conv_fixed")


@dataclass(frozen=True)
class FormatCost:
    """Coefficients of one format's time, in dense bit-MAC units of the dtype (see the docstring)."""
    work: float = 1.0             # c_f: per entry-bit and column, M > 1
    work1: float = 1.0            # c1_f: the same for a GEMV (M = 1)
    fixed: float = 0.0            # F_f: per kernel call
    tiles: float = 0.0            # r_f: per row and column tile
    outputs: float = 0.0          # e_f: per output element
    xin: float = 0.0              # v_f: per element of a conv's X (input re-laid out / packed)
    im2col: float = 0.0           # x_f: more per element of X when it is a k x k / padded expansion
    conv_fixed: float = 0.0       # G_f: more per call for a conv (its packing / X stages)

    def coefs(self) -> np.ndarray:
        return np.array([getattr(self, t) for t in TERMS])


@dataclass(frozen=True)
class DtypeCost:
    """The five formats' coefficients for one weight dtype; ``ns`` turns units into nanoseconds."""
    dense: FormatCost = FormatCost()
    csr: FormatCost = FormatCost(3.0, 3.0, outputs=8.0)
    bsr1x4: FormatCost = FormatCost(1.5, 1.5, outputs=8.0)
    bsr4x1: FormatCost = FormatCost(1.5, 1.5, outputs=2.0)
    two_four: FormatCost = FormatCost(1.25, 1.25)
    ns: float = 0.0               # nanoseconds per unit (0: not fitted, units only)

    def of(self, fmt: str) -> FormatCost:
        return getattr(self, "two_four" if fmt == "2:4" else fmt)


@dataclass(frozen=True)
class Target:
    """The vector shapes the kernels of a target family pad to (the model's only target knowledge)."""
    family: str = "x86"
    dense_n: tuple[int, int] = (16, 1)    # dense: output channels padded to (int8, fp32)
    dense_k: tuple[int, int] = (4, 1)     # dense: reduction padded to (int8, fp32)
    vector: int = 16                      # sparse kernels: columns per vector
    tile: int = 64                        # sparse kernels: columns per register tile (half for bsr4x1)


# x86 (AVX-512 VNNI host), fitted on the synthetic sweep: see the module docstring for the command.
X86_INT8 = DtypeCost(
    dense=FormatCost(work=1, work1=10.43, fixed=3.347e+06, tiles=0, outputs=2052, xin=236.4, im2col=0, conv_fixed=1.056e+06),
    csr=FormatCost(work=4.447, work1=62.55, fixed=3.347e+06, tiles=1.012e+05, outputs=386.1, xin=254.4, im2col=2190, conv_fixed=1.056e+06),
    bsr1x4=FormatCost(work=1.769, work1=63.96, fixed=3.347e+06, tiles=7.493e+04, outputs=849.2, xin=67.4, im2col=1031, conv_fixed=1.056e+06),
    bsr4x1=FormatCost(work=8.023, work1=57.68, fixed=3.347e+06, tiles=8.301e+04, outputs=676, xin=264.2, im2col=2293, conv_fixed=1.056e+06),
    two_four=FormatCost(work=7.254, work1=228.7, fixed=3.347e+06, tiles=7.594e+04, outputs=560.8, xin=270.9, im2col=2402, conv_fixed=1.056e+06),
    ns=0.000611)
X86_FP32 = DtypeCost(
    dense=FormatCost(work=1, work1=4.002, fixed=2.882e+06, tiles=0, outputs=959.7, xin=465, im2col=0, conv_fixed=0),
    csr=FormatCost(work=1.427, work1=28.52, fixed=2.882e+06, tiles=7.479e+04, outputs=0, xin=173.8, im2col=1199, conv_fixed=0),
    bsr1x4=FormatCost(work=1.525, work1=70.43, fixed=2.882e+06, tiles=7.559e+04, outputs=0, xin=128.2, im2col=1389, conv_fixed=0),
    bsr4x1=FormatCost(work=1.249, work1=17.78, fixed=2.882e+06, tiles=5.252e+04, outputs=216.3, xin=181.6, im2col=1297, conv_fixed=0),
    two_four=FormatCost(work=1.726, work1=60.7, fixed=2.882e+06, tiles=5.218e+04, outputs=66, xin=151.5, im2col=1401, conv_fixed=0),
    ns=0.000633)


@dataclass(frozen=True)
class CostModel:
    int8: DtypeCost = X86_INT8
    fp32: DtypeCost = X86_FP32
    target: Target = Target()
    margin: float = 0.05          # a sparse format must beat dense by this (cross-validated: bench fit)

    def dtype(self, bits: int) -> DtypeCost:
        return self.int8 if bits <= 8 else self.fp32

    @classmethod
    def for_target(cls, family: str = "x86") -> "CostModel":
        """x86: the fitted defaults. arm / cuda: unmeasured, AdaPT's form with assumed factors and no
        padding (their kernels' vector shapes differ and no measurement backs any)."""
        if family == "x86":
            return cls()
        return cls(DtypeCost(), DtypeCost(), Target(family, (1, 1), (1, 1), 1, 1))


@dataclass(frozen=True)
class LayerShape:
    """What the model needs to know about one layer's weight ``[g, N, K]`` and its use."""
    groups: int
    n: int
    k: int
    m: int                        # output columns per inference: batch x output pixels
    bits: int                     # weight word length: 8 (int8) or 32 (fp32)
    nnz: int                      # non-zero weights (all groups)
    nnzb_1x4: int                 # non-zero 1x4 blocks
    nnzb_4x1: int                 # non-zero 4x1 blocks
    is_24: bool                   # every group of 4 along k has <= 2 non-zeros
    conv: bool = False            # a conv (its input is re-laid out); False: a gemm
    im2col: bool = False          # a conv whose X is a k x k expansion (kernel > 1x1 or padded)

    @classmethod
    def of(cls, mats: np.ndarray, m: int, conv: bool = False, im2col: bool = False) -> "LayerShape":
        """From the gemm matrices ``[g, N, K]`` of a weight (int8 or float) and its output columns."""
        mats = np.asarray(mats)
        g, n, k = mats.shape
        return cls(g, n, k, int(m), 8 * mats.dtype.itemsize, int(np.count_nonzero(mats)),
                   sum(count_blocks(w, (1, 4)) for w in mats), sum(count_blocks(w, (4, 1)) for w in mats),
                   all(is_24(w) for w in mats), bool(conv or im2col), bool(im2col))

    @property
    def macs(self) -> int:
        return self.groups * self.n * self.k * self.m

    @property
    def density(self) -> float:
        return self.nnz / max(self.groups * self.n * self.k, 1)

    def available(self) -> list[str]:
        return [f for f in FORMATS if f != "2:4" or self.is_24]


def size_bytes(s: LayerShape, fmt: str) -> int:
    """Exact stored bytes of all groups in ``fmt`` (values + indices + pointers): the sum over
    groups of :func:`qcompiler.sparse.format.stored_bytes`, from the counts alone."""
    eb = s.bits // 8
    if fmt == "dense":
        return s.groups * s.n * s.k * eb
    if fmt == "csr":
        return s.groups * 4 * (s.n + 1) + s.nnz * (index_dtype(max(s.k - 1, 0)).itemsize + eb)
    if fmt in ("bsr1x4", "bsr4x1"):
        br, bc = (1, 4) if fmt == "bsr1x4" else (4, 1)
        nnzb = s.nnzb_1x4 if fmt == "bsr1x4" else s.nnzb_4x1
        nbr, nbc = -(-s.n // br), -(-s.k // bc)
        return s.groups * 4 * (nbr + 1) + nnzb * (index_dtype(max(nbc - 1, 0)).itemsize + br * bc * eb)
    if fmt == "2:4":
        return s.groups * predicted_bytes("2:4", s.n, s.k, 0, None, eb)
    raise ValueError(f"unknown format '{fmt}'")


def _up(v: int, m: int) -> int:
    return -(-v // max(m, 1)) * max(m, 1)


def features(s: LayerShape, fmt: str, target: Target = Target()) -> np.ndarray:
    """The terms of ``fmt``'s time at unit coefficients, in :data:`TERMS` order: (1, work for M > 1,
    work for M = 1, row tiles, output elements, a conv's X elements, im2col X elements, 1 for a
    conv) - see the module docstring."""
    wl, i = s.bits, 0 if s.bits <= 8 else 1
    cols = 1 if s.m == 1 else _up(s.m, target.vector)
    tiles = -(-s.m // target.tile)
    outputs = s.groups * s.n * s.m
    if fmt == "dense":                 # vectorized over output channels: the columns are not padded
        work, rows, cols = s.groups * _up(s.n, target.dense_n[i]) * _up(s.k, target.dense_k[i]) * wl, 0, s.m
    elif fmt == "csr":
        work, rows = s.nnz * (wl + 8 * index_dtype(max(s.k - 1, 0)).itemsize), s.groups * s.n * tiles
    elif fmt in ("bsr1x4", "bsr4x1"):
        nnzb = s.nnzb_1x4 if fmt == "bsr1x4" else s.nnzb_4x1
        nbc = -(-s.k // 4) if fmt == "bsr1x4" else s.k
        work = 4 * nnzb * (wl + 8 * index_dtype(max(nbc - 1, 0)).itemsize / 4)
        rows = s.groups * s.n * tiles if fmt == "bsr1x4" else \
            s.groups * -(-s.n // 4) * -(-s.m // max(target.tile // 2, 1))
    elif fmt == "2:4":
        work, rows = s.groups * s.n * (_up(s.k, 4) // 2) * (wl + 2), s.groups * s.n * tiles
    else:
        raise ValueError(f"unknown format '{fmt}'")
    x = s.groups * s.k * s.m
    return np.array([1.0, work * cols if s.m > 1 else 0.0, work if s.m == 1 else 0.0, rows, outputs,
                     x if s.conv else 0.0, x if s.im2col else 0.0, 1.0 if s.conv else 0.0], float)


def time_units(s: LayerShape, fmt: str, cm: CostModel = CostModel()) -> float:
    """Predicted time of the layer in ``fmt``, in dense bit-MAC units of its dtype (module docstring)."""
    return float(features(s, fmt, cm.target) @ cm.dtype(s.bits).of(fmt).coefs())


def predicted_ns(s: LayerShape, fmt: str, cm: CostModel = CostModel()) -> float:
    """Predicted latency in nanoseconds (NaN when the dtype's model is not fitted to a clock)."""
    ns = cm.dtype(s.bits).ns
    return time_units(s, fmt, cm) * ns if ns > 0 else float("nan")


#: Machine code of one layer's own kernel (x86, measured with ``QCOMPILER_KEEP_SYMBOLS=1`` and ``nm`` on
#: fashion_mobilenet int8: dense 1x1 conv 1.9 KB, per-layer CSR 2.7 KB, BSR 4x1 2.6 KB, each with its
#: ~0.2 KB wrapper). A CSR pointwise int8 conv under the size objective on a CPU runs the shared
#: shape-generic kernel (codegen/kernels/sparse_shared.py): no code of its own.
KERNEL_CODE_BYTES = 2048


def shares_kernel(kind: str, attrs: dict, weight_shape, weight_dtype: str, target: str) -> bool:
    """Whether a layer encoded as CSR runs the shared sparse kernel under the size objective: an int8
    QLinearConv with a 1x1 kernel, unit strides, no padding, one group and a Relu/Clip/no activation,
    on x86 or ARM (the structural conditions of ``sparse_shared.plan``; it also checks layouts)."""
    if target not in ("x86", "arm") or kind != "QLinearConv" or weight_dtype != "int8":
        return False
    shape = tuple(int(v) for v in weight_shape)
    if len(shape) != 4 or shape[2:] != (1, 1):
        return False
    if any(int(v) != 1 for v in attrs.get("strides") or ()) or any(int(v) for v in attrs.get("pads") or ()):
        return False
    return int(attrs.get("group", 1) or 1) == 1 and (attrs.get("activation") or "") in ("", "Relu", "Clip")


@dataclass
class Choice:
    size: dict[str, int] = field(default_factory=dict)           # bytes per available format
    code: dict[str, int] = field(default_factory=dict)           # kernel code bytes it adds (size objective)
    time: dict[str, float] = field(default_factory=dict)         # bit-MAC units per available format
    format_size: str = "dense"                                   # least bytes
    format_time: str = "dense"                                   # least predicted time

    def to_json(self) -> dict:
        return asdict(self)


def _best(costs: dict[str, float], margin: float) -> str:
    best = min(costs, key=lambda f: (costs[f], FORMATS.index(f)))
    return best if costs[best] < costs["dense"] * (1.0 - margin) else "dense"


def stored_entries(s: LayerShape, fmt: str) -> int:
    """Weight entries ``fmt`` stores, i.e. multiply-accumulates per output column (block padding
    included)."""
    return {"dense": s.groups * s.n * s.k, "csr": s.nnz, "bsr1x4": 4 * s.nnzb_1x4, "bsr4x1": 4 * s.nnzb_4x1,
            "2:4": s.groups * s.n * (_up(s.k, 4) // 2)}[fmt]


def choose(s: LayerShape, cm: CostModel = CostModel(), shared: bool = False) -> Choice:
    """Per objective, the format of least size and of least predicted time (dense unless a sparse
    format is better by ``cm.margin``; for time, only formats that skip work: module docstring).
    ``shared``: CSR runs the shared kernel (:func:`shares_kernel`), so for size every other format
    also pays its own kernel's code, :data:`KERNEL_CODE_BYTES`."""
    fmts = s.available()
    c = Choice({f: size_bytes(s, f) for f in fmts}, {f: 0 if (f == "csr" or not shared) else KERNEL_CODE_BYTES
                                                     for f in fmts},
               {f: float(time_units(s, f, cm)) for f in fmts})
    c.format_size = _best({f: float(v + c.code[f]) for f, v in c.size.items()}, cm.margin)
    dense = stored_entries(s, "dense")
    c.format_time = _best({f: t for f, t in c.time.items() if f == "dense" or stored_entries(s, f) < dense},
                          cm.margin)
    return c


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0: Lawson and Hanson's active-set algorithm (*Solving Least
    Squares Problems*, 1974, ch. 23), on column-scaled ``a``."""
    scale = np.abs(a).max(axis=0)
    live = scale > 0
    an = a[:, live] / scale[live]
    n = an.shape[1]
    passive = np.zeros(n, bool)
    x = np.zeros(n)
    tol = 10 * np.finfo(float).eps * np.abs(an).sum(axis=0).max() * max(an.shape)
    w = an.T @ (b - an @ x)
    for _ in range(10 * n + 50):
        if passive.all() or not np.any(w[~passive] > tol):
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(an[:, passive], b, rcond=None)[0]
            if np.all(z[passive] > 0):
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
        x = z
        w = an.T @ (b - an @ x)
    out = np.zeros(a.shape[1])
    out[live] = x / scale[live]
    return out


def fit(samples: list[tuple[LayerShape, str, float]], base: CostModel = CostModel()) -> CostModel:
    """Fit every format's coefficients, per weight dtype, to measured kernel times.

    ``samples``: ``(layer, format, seconds)``. Per dtype, one non-negative least-squares problem
    (:func:`_nnls`) over all its samples minimizes the RELATIVE error ``Σ ((pred - t) / t)^2``
    (relative, so that the many small layers count as much as the few large ones). The per-call
    costs ``F`` and ``G`` (conv) are SHARED by the formats - the same VM call, launch and stage
    machinery; each format has its own per-entry, per-row and per-element terms. So a layer too
    small for anything but the call to matter comes out a tie, and stays dense by the margin. The
    dense work coefficient (seconds per dense bit-MAC; its gemv one if the samples have no M > 1
    dense layer) is the unit: every coefficient is divided by it, so ``c_dense = 1`` and ``ns`` is
    nanoseconds per unit. Dtypes and formats without samples keep ``base``'s coefficients; a dtype
    without dense samples cannot be fitted (ValueError)."""
    shared = [TERMS.index("fixed"), TERMS.index("conv_fixed")]
    own = [j for j in range(len(TERMS)) if j not in shared]
    out = base
    for bits, key in ((8, "int8"), (32, "fp32")):
        mine = [(s, f, t) for s, f, t in samples if (s.bits <= 8) == (bits == 8)]
        if not mine:
            continue
        fmts = [f for f in FORMATS if any(f == ff for _, ff, _ in mine)]
        if "dense" not in fmts:
            raise ValueError(f"fit needs dense measurements of {key} layers to set the time unit")
        a = np.zeros((len(mine), len(shared) + len(own) * len(fmts)))
        t = np.array([t for _, _, t in mine])
        for i, (s, f, _) in enumerate(mine):
            x = features(s, f, base.target)
            a[i, :len(shared)] = x[shared]
            j = len(shared) + fmts.index(f) * len(own)
            a[i, j:j + len(own)] = x[own]
        sol = _nnls(a / t[:, None], np.ones(len(t)))
        coefs = {}
        for k, f in enumerate(fmts):
            c = np.zeros(len(TERMS))
            c[shared] = sol[:len(shared)]
            c[own] = sol[len(shared) + k * len(own):len(shared) + (k + 1) * len(own)]
            coefs[f] = c
        unit = coefs["dense"][1] or coefs["dense"][2]
        if unit <= 0:
            raise ValueError(f"fit: the {key} dense times do not grow with the work (no time unit)")
        old = base.dtype(bits)
        fields = {("two_four" if f == "2:4" else f): FormatCost(**dict(zip(TERMS, (c / unit).tolist())))
                  for f, c in coefs.items()}
        out = replace(out, **{key: replace(old, **fields, ns=float(unit * 1e9))})
    return out
