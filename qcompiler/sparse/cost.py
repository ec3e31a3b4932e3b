"""Dense or sparse, per layer: an analytic size and time model, and the ``encode-sparse`` decision.

The model follows AdaPT's performance model (Kummer et al., *AdaPT: Fast Convergence and Resource
Efficient Training of Deep Neural Networks*, sec. 4.1.2, in ../shared/background): the cost of a
layer is its multiply-adds weighted by the word length ``WL`` of the weights and the fraction of
them that are non-zero, ``ops · sp · WL``; model size is ``Σ params · sp · WL``. AdaPT assumes an
ideal sparse format. We keep its form and add what a real encoding stores and a real kernel does:

* size: exact bytes of the encoding, :func:`qcompiler.sparse.format.predicted_bytes` (values, index
  arrays, row pointers) - no model needed;
* time, for ``M`` output columns (batch x output pixels of the im2col gemm) of a ``[g, N, K]`` weight:

  ===========  ================================================================
  dense        ``g·N·K·M · WL                             · c_dense``
  csr          ``nnz·M · (WL + IB)                         · c_csr``  + ``g·N·M · c_row``
  bsr1x4       ``4·nnzb·M · (WL + IB/4)                    · c_bsr``  + ``g·N·M · c_row``
  bsr4x1       ``4·nnzb·M · (WL + IB/4)                    · c_bsr``  + ``g·N/4·M · c_row``
  2:4          ``g·N·(Kp/2)·M · (WL + 2)                   · c_24``
  ===========  ================================================================

  ``WL`` = weight bits (8 or 32), ``IB`` = index bits of the encoding (8 or 16); the ``(WL + IB)``
  factor is AdaPT's bit weighting applied to everything a stored entry costs to read. The ``c_*``
  factors say how much slower one stored entry is processed than one dense MAC: a dense kernel
  streams contiguous weights with SIMD dot products; a CSR kernel gathers activations by index
  (no reuse along ``k``); 1x4 blocks keep 4-wide contiguous runs; 2:4 is nearly dense. The defaults
  are assumptions until measured (part 2's kernel benchmark fits them with :func:`fit`): with
  ``c_csr = 3`` int8 CSR wins below ~17 % non-zeros (83 % sparsity), fp32 below ~22 %.

The unit of the time model is "bit-MACs"; only ratios between formats of one layer are meaningful
(it is a model for *choosing*, not a latency predictor, until ``fit`` scales it to seconds).

``choose(layer)`` picks, per objective, the format of least predicted size and of least predicted
time; a sparse format must beat dense by ``margin`` (default 5 %), so a tie stays dense.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from .format import FORMATS, count_blocks, index_dtype, is_24, predicted_bytes


@dataclass(frozen=True)
class CostModel:
    c_dense: float = 1.0
    c_csr: float = 3.0
    c_bsr: float = 1.5
    c_24: float = 1.25
    c_row: float = 8.0            # per output row and column: loop and pointer overhead (bit-MAC units)
    margin: float = 0.05          # a sparse format must be this much better than dense


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

    @classmethod
    def of(cls, mats: np.ndarray, m: int) -> "LayerShape":
        """From the gemm matrices ``[g, N, K]`` of a weight (int8 or float) and its output columns."""
        mats = np.asarray(mats)
        g, n, k = mats.shape
        return cls(g, n, k, int(m), 8 * mats.dtype.itemsize, int(np.count_nonzero(mats)),
                   sum(count_blocks(w, (1, 4)) for w in mats), sum(count_blocks(w, (4, 1)) for w in mats),
                   all(is_24(w) for w in mats))

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


def time_units(s: LayerShape, fmt: str, cm: CostModel = CostModel()) -> float:
    """Predicted time of the layer in ``fmt``, in bit-MAC units (see the module docstring)."""
    wl = s.bits
    if fmt == "dense":
        return s.macs * wl * cm.c_dense
    if fmt == "csr":
        ib = 8 * index_dtype(max(s.k - 1, 0)).itemsize
        return s.nnz * s.m * (wl + ib) * cm.c_csr + s.groups * s.n * s.m * cm.c_row
    if fmt in ("bsr1x4", "bsr4x1"):
        nnzb, rows = (s.nnzb_1x4, s.n) if fmt == "bsr1x4" else (s.nnzb_4x1, -(-s.n // 4))
        nbc = -(-s.k // 4) if fmt == "bsr1x4" else s.k
        ib = 8 * index_dtype(max(nbc - 1, 0)).itemsize
        return 4 * nnzb * s.m * (wl + ib / 4) * cm.c_bsr + s.groups * rows * s.m * cm.c_row
    if fmt == "2:4":
        kp = -(-s.k // 4) * 4
        return s.groups * s.n * (kp // 2) * s.m * (wl + 2) * cm.c_24
    raise ValueError(f"unknown format '{fmt}'")


@dataclass
class Choice:
    size: dict[str, int] = field(default_factory=dict)           # bytes per available format
    time: dict[str, float] = field(default_factory=dict)         # bit-MAC units per available format
    format_size: str = "dense"                                   # least bytes
    format_time: str = "dense"                                   # least predicted time

    def to_json(self) -> dict:
        return asdict(self)


def _best(costs: dict[str, float], margin: float) -> str:
    best = min(costs, key=lambda f: (costs[f], FORMATS.index(f)))
    return best if costs[best] < costs["dense"] * (1.0 - margin) else "dense"


def choose(s: LayerShape, cm: CostModel = CostModel()) -> Choice:
    """Per objective, the format of least size and of least predicted time (dense unless a sparse
    format is better by ``cm.margin``)."""
    fmts = s.available()
    c = Choice({f: size_bytes(s, f) for f in fmts}, {f: float(time_units(s, f, cm)) for f in fmts})
    c.format_size = _best({f: float(v) for f, v in c.size.items()}, cm.margin)
    c.format_time = _best(c.time, cm.margin)
    return c


def fit(samples: list[tuple[LayerShape, str, float]], base: CostModel = CostModel()) -> CostModel:
    """Refit the per-format factors to measured kernel times.

    ``samples``: ``(layer, format, seconds)``. Every format's factor becomes the median over its
    samples of ``seconds / (dense seconds-per-unit · units at factor 1)``, where the seconds per
    bit-MAC unit come from the dense samples (their median); so the fitted model predicts the
    measured sparse/dense ratios. Formats without samples keep ``base``'s factor."""
    dense = [t / time_units(s, "dense", CostModel(c_dense=1.0)) for s, f, t in samples if f == "dense"]
    if not dense:
        raise ValueError("fit needs dense measurements to set the time unit")
    unit = float(np.median(dense))
    unit_model = CostModel(c_dense=1.0, c_csr=1.0, c_bsr=1.0, c_24=1.0, c_row=0.0)
    factors: dict[str, list[float]] = {}
    for s, f, t in samples:
        if f != "dense":
            key = {"csr": "c_csr", "bsr1x4": "c_bsr", "bsr4x1": "c_bsr", "2:4": "c_24"}[f]
            factors.setdefault(key, []).append(t / (unit * time_units(s, f, unit_model)))
    return CostModel(**{**asdict(base), "c_dense": 1.0, "c_row": 0.0 if factors else base.c_row,
                        **{k: float(np.median(v)) for k, v in factors.items()}})
