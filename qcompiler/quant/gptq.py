"""Error-compensating weight rounding: GPTQ (Frantar, Ashkboos, Hoefler & Alistarh 2022, *GPTQ:
Accurate Post-Training Quantization for Generative Pre-trained Transformers*, ICLR 2023,
Algorithm 1; the per-weight form is Optimal Brain Quantization, Frantar & Alistarh 2022).

A layer ``y = W x`` (a conv as its im2col gemm, ``W [g, N, K]`` per group as
:mod:`qcompiler.sparse.format` stores it) with per-row scales ``s_r`` rounded to ``Ŵ = s·q``
costs, per output row ``w``, on the calibration inputs ``X [R, K]``::

    E(ŵ) = ||X wᵀ − X ŵᵀ||² = (w − ŵ) H (w − ŵ)ᵀ,      H = XᵀX + λI,  λ = 0.01 · mean diag(XᵀX)

Round-to-nearest minimises each ``|w_j − ŵ_j|`` alone. GPTQ rounds the columns one at a time, in
a fixed order, and after rounding column ``j`` moves the columns not yet rounded ``F`` to cancel
its error as far as they can (the OBS update, restricted to ``F``)::

    q_j = clip(round(w_j / s), lo, hi)        δ_j = w_j − s·q_j
    w_F −= δ_j / [H_F⁻¹]_jj · [H_F⁻¹]_{F, j}       F ← F \\ {j}

With the columns visited left to right, ``F = {j+1..K−1}`` for every row alike, and the row of
``[H_F⁻¹]`` it needs is row ``j`` of the upper Cholesky factor ``U`` of ``H⁻¹ = UᵀU``, divided by
``U_jj`` (:func:`qcompiler.quant.gram.inverse_upper_factor`, the factor SparseGPT uses
too)::

    for j in 0..K−1:   err = (w_j − s·q_j) / U_jj;   w_{j:} −= err · U_{j,j:}

and ``Σ_j err_j² = (w − ŵ) H (w − ŵ)ᵀ`` (the loss returned). Lazy batching as in SparseGPT:
inside blocks of ``B = 128`` columns, the columns after a block updated once per block (a GEMM).
Columns are visited in descending ``H_jj`` (GPTQ's "act order": the inputs with the most energy are
rounded first, while the most columns are left to absorb their error); the scale of a row is
chosen before, from the original weights, as round-to-nearest chooses it, so that both roundings
share the parameters and differ only in the integers. Where ``H`` is diagonal no column can
compensate another and GPTQ is round-to-nearest exactly (``tests/quant/test_gptq.py``).

The grid is the rounder's (:data:`Rounder`): ``round(w_j / s)`` clipped to ``[lo, hi]`` above is
:func:`integer_grid` (int8 per row; int4 with a scale per block of columns, fixed before as GPTQ's
"static groups"), :func:`fp8_grid` rounds to the nearest float8 value ``s·f`` instead; the update
is the same, ``δ_j`` being the distance to the grid point chosen.

The Gram matrices come from the float model's calibration run (:func:`layer_grams`): every layer
sees the float model's inputs, not the quantized model's (the layers are independent; GPTQ's
sequential variant is :mod:`qcompiler.passes.prune_reconstruct`'s frontier).

    grams = layer_grams(graph, calib, layers)                     # {op name: CalibGram}
    w_hat, loss = gptq_round(w, grams[op.name].h, integer_grid(scale, -127, 127))   # w [g, N, K], scale [g, N]
    w_hat, info = choose_rounding(w, grams[op.name], fp8_grid(scale, "float8_e4m3fn"))   # GPTQ or nearest
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from ..ir.graph import Graph, Op
from .gram import BLOCK, DAMP, Gram, conv_rows, damped, damping, gemm_rows, inverse_upper_factor

ROWS_PER_COLUMN = 16
"""A conv's Gram matrix sums at most this many rows per column (``K``) of its im2col gemm, drawn at
random over samples and output positions, but never fewer than :data:`MIN_ROWS` (or all there are):
the estimate of ``H`` converges long before the 800 k rows of a ResNet-50 first-stage conv on 256
samples (GPTQ's own runs: 128 sequences of 2048 tokens for K = 4096-12288, 20-60 rows per column)."""
MIN_ROWS = 16384


Rounder = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""``rounder(v [g, N], j [g])``: the representable values nearest ``v``, the (original) column ``j``
of each group's rows, in real units (``s·q``: the scale may depend on the column, as int4 blocks'
does)."""


def integer_grid(scale: np.ndarray, lo: int, hi: int, zero_point: np.ndarray | float = 0.0) -> Rounder:
    """Integers ``q`` in ``[lo, hi]`` at ``s (q − z)``: ``scale`` and ``zero_point`` per row
    ``[g, N]`` or per row and column ``[g, N, K]`` (a block's scale repeated over its columns)."""
    s = np.asarray(scale, np.float64)
    z = np.broadcast_to(np.asarray(zero_point, np.float64), s.shape)
    rows = np.arange(s.shape[0])

    def rounder(v: np.ndarray, j: np.ndarray) -> np.ndarray:
        sj, zj = (s, z) if s.ndim == 2 else (s[rows, :, j], z[rows, :, j])
        return (np.clip(np.rint(v / sj) + zj, lo, hi) - zj) * sj
    return rounder


def fp8_grid(scale: np.ndarray, storage: str) -> Rounder:
    """Float8 values ``s·f`` (saturating, nearest, ties to even: :func:`qcompiler.ir.types.round_fp8`)
    with per-row scales ``[g, N]``."""
    from ..ir.types import round_fp8
    s = np.asarray(scale, np.float64)

    def rounder(v: np.ndarray, j: np.ndarray) -> np.ndarray:
        return round_fp8((v / s).astype(np.float32), storage).astype(np.float64) * s
    return rounder


def gptq_round(w: np.ndarray, h: np.ndarray, rounder: Rounder, *, block: int = BLOCK, damp: float = DAMP,
               act_order: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Round ``w [g, N, K]`` to the grid of ``rounder`` (:func:`integer_grid`, :func:`fp8_grid`),
    compensating each column's error in the columns after it through the Gram matrices
    ``h [g, K, K]`` (undamped); returns ``(ŵ [g, N, K], loss [g, N])``, ``ŵ`` on the grid in real
    units and ``loss = (w − ŵ)(H + λI)(w − ŵ)ᵀ`` per row."""
    w = np.asarray(w, np.float64)
    g, n, k = w.shape
    order = np.argsort(-np.einsum("gii->gi", h), axis=1, kind="stable") if act_order else \
        np.broadcast_to(np.arange(k), (g, k))
    hp = np.take_along_axis(np.take_along_axis(h, order[:, :, None], 1), order[:, None, :], 2)
    wt = np.ascontiguousarray(np.take_along_axis(w, order[:, None, :], 2).transpose(0, 2, 1))   # g, K, N
    u = inverse_upper_factor(damped(hp, damping(hp, damp)))
    d = np.diagonal(u, axis1=1, axis2=2)[:, :, None]                  # g, K, 1
    q = np.zeros(wt.shape)
    loss = np.zeros((g, n))
    for i1 in range(0, k, block):
        i2 = min(i1 + block, k)
        w1, u1, d1 = wt[:, i1:i2], u[:, i1:i2, i1:i2], d[:, i1:i2]     # w1: a view, updated in place
        err1 = np.zeros(w1.shape)
        for i in range(i2 - i1):
            qi = rounder(w1[:, i], order[:, i1 + i])
            err = (w1[:, i] - qi) / d1[:, i]
            w1[:, i:] -= u1[:, i, i:, None] * err[:, None, :]
            q[:, i1 + i] = qi
            err1[:, i] = err
        loss += (err1 ** 2).sum(axis=1)
        if i2 < k:
            wt[:, i2:] -= u[:, i1:i2, i2:].transpose(0, 2, 1) @ err1
    out = np.empty((g, n, k))
    np.put_along_axis(out, order[:, None, :], q.transpose(0, 2, 1), 2)
    return out, loss


def nearest(w: np.ndarray, rounder: Rounder) -> np.ndarray:
    """Round-to-nearest on the same grid: every column of ``w [g, N, K]`` rounded alone."""
    w = np.asarray(w, np.float64)
    g, _, k = w.shape
    return np.stack([rounder(w[:, :, j], np.full(g, j)) for j in range(k)], axis=2)


def rounding_loss(w: np.ndarray, w_hat: np.ndarray, h: np.ndarray, damp: float = DAMP) -> np.ndarray:
    """``(w − ŵ)(H + λI)(w − ŵ)ᵀ`` per row ``[g, N]``: the output error energy of rounding ``w`` to
    ``ŵ`` on the calibration inputs (plus the damping's share)."""
    e = np.asarray(w, np.float64) - np.asarray(w_hat, np.float64)
    return (np.matmul(e, damped(h, damping(h, damp)) if damp else h) * e).sum(axis=2)   # a GEMM, not einsum's loop


# ---- the Gram matrices of the calibration run -------------------------------------------------------
CONVS = ("Conv", "FusedConv")


@dataclass
class CalibGram:
    """A layer's Gram matrix over the calibration feeds, in two halves: ``parts[0]`` sums the
    even-numbered feeds' rows, ``parts[1]`` the odd ones' (the samples are independent, the rows of
    one sample are not), for :func:`choose_rounding`'s held-out check."""
    parts: tuple[Gram, Gram]
    units: int = 0

    @classmethod
    def empty(cls, groups: int, k: int) -> "CalibGram":
        return cls((Gram(groups, k), Gram(groups, k)))

    @property
    def halves(self) -> tuple[np.ndarray, np.ndarray]:
        return self.parts[0].h, self.parts[1].h

    @property
    def h(self) -> np.ndarray:
        return self.parts[0].h + self.parts[1].h

    @property
    def groups(self) -> int:
        return self.parts[0].h.shape[0]

    @property
    def k(self) -> int:
        return self.parts[0].h.shape[-1]

    @property
    def rows(self) -> int:
        return self.parts[0].rows + self.parts[1].rows

    def add(self, rows: np.ndarray) -> None:
        """One feed's rows ``[g, r, K]``."""
        self.parts[self.units % 2].add(rows)
        self.units += 1


def choose_rounding(w: np.ndarray, gram: CalibGram, rounder: Rounder, halves: list | None = None,
                    **gptq_opts) -> tuple[np.ndarray, dict]:
    """GPTQ's rounding of ``w [g, N, K]`` from the whole Gram matrix, or round-to-nearest's where
    GPTQ does not generalise: two-fold cross-validation on the calibration feeds, GPTQ fitted on one
    half's Gram matrix and its output error measured on the other's (both ways), against
    round-to-nearest's on the same data. GPTQ trades error in the input directions the data shows
    for error in those it does not; where a layer sees fewer independent rows than it has inputs
    (a squeeze-excite or classifier layer: one row per sample) the held-out half shows those
    directions and the choice falls on round-to-nearest. Returns ``(ŵ, info)``: ``ŵ`` on the
    grid in real units, ``info`` the choice and the held-out error relative to round-to-nearest's. ``halves``, a list,
    receives the weights fitted on each half alone (round-to-nearest's where that is the choice),
    for a held-out check of the whole model (:class:`GptqRounding` ``fitted_on``)."""
    w = np.asarray(w, np.float64)
    rtn = nearest(w, rounder)
    info: dict = {"rounding": "nearest", "rows": gram.rows}
    if halves is not None:
        halves[:] = [rtn, rtn]
    if gram.units < 2:
        return rtn, {**info, "reason": "one calibration feed: nothing to check GPTQ on"}
    h0, h1 = gram.halves
    err_rtn = rounding_loss(w, rtn, h0, 0.0).sum() + rounding_loss(w, rtn, h1, 0.0).sum()
    w0, _ = gptq_round(w, h0, rounder, **gptq_opts)
    w1, _ = gptq_round(w, h1, rounder, **gptq_opts)
    err_gptq = rounding_loss(w, w0, h1, 0.0).sum() + rounding_loss(w, w1, h0, 0.0).sum()
    ratio = float(err_gptq / err_rtn) if err_rtn > 0 else 1.0
    info["heldout_error_ratio"] = round(ratio, 4)
    if ratio >= 1.0:
        return rtn, info
    if halves is not None:
        halves[:] = [w0, w1]
    w_hat, _ = gptq_round(w, gram.h, rounder, **gptq_opts)
    return w_hat, {**info, "rounding": "gptq"}


def _layer_matrix_shape(op: Op) -> tuple[int, int]:
    """(groups, K) of a conv/gemm's im2col gemm."""
    w = op.operands[1]
    if op.kind in CONVS:
        return int(op.attrs.get("group", 1) or 1), int(np.prod(w.shape[1:]))
    trans_b = bool(op.attrs.get("transB", 0)) if op.kind in ("Gemm", "FusedGemm") else False
    return 1, int(w.shape[1] if trans_b else w.shape[0])


def layer_grams(graph: Graph, calib: Iterable, layers: list[Op], *, rows_per_column: int | None = ROWS_PER_COLUMN,
                min_rows: int = MIN_ROWS, seed: int = 0) -> dict[str, CalibGram]:
    """Per conv/gemm/matmul of ``layers``, the Gram matrix ``Σ x xᵀ`` of its im2col rows (a gemm: its
    input rows) over the float graph's calibration run, one unit per feed (onnxruntime, as the
    calibration runs it; the reference interpreter where onnxruntime cannot). A conv takes at most
    ``rows_per_column · K`` rows (at least ``min_rows``), drawn uniformly per feed (seeded); None
    takes them all."""
    from ..ir.ops import full_attrs
    from .calibrate import float_runner
    feeds = list(calib)
    want = list(dict.fromkeys(op.operands[0].name for op in layers))
    grams = {op.name: CalibGram.empty(*_layer_matrix_shape(op)) for op in layers}
    rng = np.random.default_rng(seed)

    def add(vals: dict) -> None:
        for op in layers:
            x = np.asarray(vals[op.operands[0].name], np.float32)
            gram = grams[op.name]
            if op.kind not in CONVS:
                gram.add(gemm_rows(x, bool(op.attrs.get("transA", 0))))
                continue
            attrs = full_attrs(op.kind, **op.attrs)
            spatial = tuple(op.result.shape[2:])
            total = len(x) * int(np.prod(spatial))
            cap = total if rows_per_column is None else \
                -(-max(rows_per_column * gram.k, min_rows) // max(len(feeds), 1))
            pick = np.sort(rng.choice(total, cap, replace=False)) if cap < total else None
            gram.add(conv_rows(x, op.operands[1].shape[2:], attrs, spatial, gram.groups, pick))

    try:
        run = float_runner(graph, want)      # fails here, not at a feed, where onnxruntime cannot run it
    except Exception:  # noqa: BLE001 - a graph ONNX cannot hold or onnxruntime cannot run: the reference
        from . import reference
        run = lambda f: reference.run_values(graph, f)   # noqa: E731
    for f in feeds:
        add(run(f))
    return grams


# ---- the quantize pass's use ---------------------------------------------------------------------------
class WeightRounding(str, enum.Enum):
    """``--weight-rounding``: how the quantized weights are rounded onto their grid."""
    NEAREST = "nearest"            # each weight to its nearest grid value
    GPTQ = "gptq"                  # error-compensating, from the calibration data (this module)


class GptqRounding:
    """The GPTQ rounding of a quantize pass: the calibration Gram matrices of its layers and, per
    (layer, weight params), the weights chosen (:func:`choose_rounding`), computed once however
    many rewrites of the graph ask (the bias correction's check and the mixed-precision variants
    rewrite it again).

        rounding = GptqRounding.collect(graph, calib, layers)
        w_hat, info = rounding.weights(op, w, wqp)      # w [N, ...] output channels first; None: not a layer
    """

    def __init__(self, grams: dict[str, CalibGram], done: dict | None = None, half: int | None = None):
        self.grams = grams
        self._done: dict = {} if done is None else done      # (layer, params) -> (ŵ, info, [ŵ of each half])
        self._half = half

    @classmethod
    def collect(cls, graph: Graph, calib: Iterable, layers: list[Op]) -> "GptqRounding":
        return cls(layer_grams(graph, calib, layers) if layers else {})

    @classmethod
    def asked(cls, rounding: WeightRounding, graph: Graph, calib: Iterable | None, layers: list[Op],
              where: str) -> "GptqRounding | None":
        """:meth:`collect` where ``rounding`` is gptq (None for round-to-nearest); refused without
        calibration data (GPTQ fitted to random inputs would fit their directions, not the
        model's). ``where``: the pass, for the error."""
        if rounding is not WeightRounding.GPTQ:
            return None
        if calib is None:
            from ..errors import UserError
            raise UserError("GPTQ weight rounding fits the weights to calibration data, and none is given",
                            where, "give calibration data (--calib DATA), or --weight-rounding nearest")
        return cls.collect(graph, calib, layers)

    def choices(self) -> dict[str, str]:
        """Layer name -> "gptq" or "nearest": the choice of each layer rounded so far."""
        return {name: info["rounding"] for (name, _), (_, info, _) in self._done.items()}

    def fitted_on(self, half: int) -> "GptqRounding":
        """The same rounding with each layer's weights fitted on the calibration feeds of one half
        alone (even-numbered feeds: 0, odd: 1; round-to-nearest's where that is the layer's choice):
        run on the other half's feeds, the whole model's error with GPTQ as on data it did not see."""
        return GptqRounding(self.grams, self._done, half)

    def weights(self, op: Op, w: np.ndarray, wqp) -> tuple[np.ndarray | None, dict]:
        """``w`` (float32, output channels first: a conv's ``[N, C/g, kh, kw]``, a gemm's ``N x K``)
        rounded onto the grid of ``wqp`` (int8 symmetric or float8, per channel or per tensor; 4-bit
        blocks along K of a gemm's ``[N, K]``, :mod:`.blockwise`), as
        float32 values ``s·q`` that ``quantize(·, wqp)`` stores exactly; ``(None, {})`` for a layer
        without a Gram matrix."""
        gram = self.grams.get(op.name)
        if gram is None:
            return None, {}
        key = (op.name, wqp)
        if key not in self._done:
            wm = np.asarray(w, np.float64).reshape(gram.groups, w.shape[0] // gram.groups, -1)
            halves: list = []
            w_hat, info = choose_rounding(wm, gram, _grid(wqp, w.shape, wm.shape), halves)
            self._done[key] = (w_hat.reshape(w.shape).astype(np.float32), info,
                               [h.reshape(w.shape).astype(np.float32) for h in halves])
        w_hat, info, halves = self._done[key]
        return (w_hat if self._half is None else halves[self._half]), info


def _grid(wqp, shape: tuple, matrix: tuple) -> Rounder:
    """The rounder of weight params ``wqp`` for a weight of ``shape`` seen as ``matrix [g, N/g, K]``."""
    from ..ir.types import INT_RANGES, is_fp8
    if wqp.blocked:                     # 4-bit blocks along K (``w [N, K]``): scale, zero point per column
        se, ze = wqp.element_params(shape)
        return integer_grid(se.astype(np.float64).reshape(matrix), *INT_RANGES[wqp.storage],
                            ze.astype(np.float64).reshape(matrix))
    s = np.broadcast_to(np.asarray(wqp.scale, np.float64).reshape(-1) if wqp.per_channel else
                        np.float64(wqp.scale[0]), (shape[0],)).reshape(matrix[:2])
    if is_fp8(wqp.storage):
        return fp8_grid(s, wqp.storage)
    lo, hi = INT_RANGES[wqp.storage]
    return integer_grid(s, max(lo, -hi), hi)          # symmetric: -127..127
