"""Block-wise 4-bit weight quantization (``--weights int4``): the parameters of a weight's blocks,
and the two-per-byte packing ONNX and ONNX Runtime's ``MatMulNBits`` store.

A weight ``w [N, K]`` (output channels first: a MatMul's ``Bᵀ``) is cut along K into blocks of ``B``
(32, 64 or 128; the last block may be short); each block (row n, block j) gets a scale ``s`` and,
asymmetric, a zero point ``z``, exactly as ONNX Runtime's ``MatMulNBitsQuantizer`` computes them
(MLAS ``MlasQuantizeBlockwise``, float32)::

    asymmetric (uint4 0..15):  lo = min(min w, 0)   hi = max(max w, 0)
                               s = (hi − lo) / 15    z = round(−lo / s) clipped to 0..15
    symmetric  (int4 −8..7):   m = the block's value of largest magnitude (its sign kept)
                               s = m / −8            z = 0 (ORT: uint4 with z = 8)

so the extreme value is a grid point (symmetric: −8 · s = m exactly, the scale negative where m is
positive; the range [−8, 7] is used whole). A block of zeros gets s = 1. With float16 scales
(``scale_dtype``) s is rounded to float16 first (a zero result becomes the smallest float16
subnormal), and z is computed from the rounded s. The stored integers are then ONNX's
QuantizeLinear of w with these parameters (:func:`qcompiler.ir.types.quantize`: round half to
even of ``w / s``, plus z, saturated) -- round-to-nearest -- or GPTQ's choice on the same grid
(:mod:`.gptq`). ONNX Runtime quantizes with ``roundf(w · (1/s)) + z``: the integers differ only
where ``w / s`` lies within float32 rounding of a half step (tests/quant/test_int4_weights.py).

The two-per-byte packing of ONNX and ``MatMulNBits`` is :func:`qcompiler.ir.nbits_ops.pack` (with
the ops, below the frontend that reads and writes it).
"""
from __future__ import annotations

import numpy as np

from ..ir.types import INT_RANGES, QuantParams, np_dtype, quantize

BLOCK_SIZES = (16, 32, 64, 128, 256)
"""Block sizes the pass and the importer take (ONNX Runtime's MatMulNBits: a power of two >= 16)."""


def block_params(w: np.ndarray, block: int, symmetric: bool, scale_dtype: str = "float32") -> QuantParams:
    """The parameters (ONNX Runtime's rule, above) of ``w [N, K]`` in blocks of ``block`` along
    axis 1: int4 symmetric, else uint4 with zero points. A conv weight ``[O, C, kh, kw]`` is blocked
    along axis 1 too (the input channels of each tap: scales ``[O, ceil(C/B), kh, kw]``)."""
    w = np.asarray(w, np.float32)
    if w.ndim > 2:
        flat = np.moveaxis(w, 1, -1)                      # [O, kh, kw, C]: blocks along the last axis
        qp = block_params(flat.reshape(-1, w.shape[1]), block, symmetric, scale_dtype)
        sh = flat.shape[:-1] + (-1,)

        def back(v):
            return np.moveaxis(np.asarray(v).reshape(sh), -1, 1).reshape(-1)
        return QuantParams(qp.storage, back(qp.scale), back(qp.zero_point), axis=1, block_size=block,
                           scale_dtype=scale_dtype)
    n, k = w.shape
    nb = -(-k // block)
    pad = np.zeros((n, nb * block), np.float32)
    pad[:, :k] = w
    blocks = pad.reshape(n, nb, block)
    lo = np.minimum(blocks.min(axis=2), np.float32(0))
    hi = np.maximum(blocks.max(axis=2), np.float32(0))
    if symmetric:
        m = np.where(np.abs(hi) > np.abs(lo), hi, lo)
        s = (m / np.float32(-8)).astype(np.float32)
    else:
        s = ((hi - lo) / np.float32(15)).astype(np.float32)
    s = np.where(s == 0, np.float32(1), s)
    if scale_dtype == "float16":
        h = s.astype(np.float16)
        tiny = np.float16(2.0 ** -24)
        h = np.where(h == 0, np.where(s < 0, -tiny, tiny), h)
        s = h.astype(np.float32)
    if symmetric:
        z = np.zeros_like(s, np.int64)
    else:
        z = np.clip(np.rint(-lo / s), 0, 15).astype(np.int64)
    return QuantParams("int4" if symmetric else "uint4", s.reshape(-1), z.reshape(-1), axis=1,
                       block_size=block, scale_dtype=scale_dtype)


def nearest_integers(w: np.ndarray, qp: QuantParams) -> np.ndarray:
    """Round-to-nearest: the stored integers of ``w`` (ONNX QuantizeLinear with ``qp``)."""
    return quantize(np.asarray(w, np.float32), qp)


def grid_integers(w_hat: np.ndarray, qp: QuantParams) -> np.ndarray:
    """The stored integers of ``w_hat``, values already on the grid of ``qp`` (GPTQ's ``s (q - z)``,
    float64): ``round((w_hat / s) + z)`` exactly, not through float32."""
    s, z = qp.element_params(w_hat.shape)
    lo, hi = INT_RANGES[qp.storage]
    q = np.clip(np.rint(np.asarray(w_hat, np.float64) / s.astype(np.float64)) + z, lo, hi)
    return q.astype(np_dtype(qp.storage))
