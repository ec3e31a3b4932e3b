"""Dynamic quantization: activations quantized at run time (ONNX Runtime's ``quantize_dynamic`` mode).

The ``DynamicQLinearGemm`` op (:mod:`qcompiler.ir.quant_ops`) multiplies a float32 activation
``A`` (M x K) by an int8 weight ``W`` (N x K, symmetric, per output channel or per tensor) in
integers. The activation's parameters are computed from ``A`` itself by ``DynamicQuantParams``
(one op per activation: the Q, K and V projections share it), per row (``granularity`` "token":
one scale per token of a transformer) or over the whole tensor ("tensor"), as ONNX Runtime's
``DynamicQuantizeLinear`` does (asymmetric uint8, the range widened to include 0)::

    lo = min(0, min A_r)   hi = max(0, max A_r)            (A_r: the row, or all of A)
    s  = f32((hi - lo) / 255), or 1 when hi == lo           r = f32(1 / s)
    z  = clamp(round_half_even(-lo * r), 0, 255)
    q  = clamp(round_half_even(A * r) + z, 0, 255)          (uint8)
    acc[m, n] = Σ_k q[m, k] W[n, k] - z[m] Σ_k W[n, k]      (exact in int32)
    y[m, n]   = f32(acc) * f32(s[m] s_W[n]) + bias[n]       (then a fused Relu/Clip clamp)

Quantizing by the reciprocal ``r`` (one division per row, a multiply per element) is what the
kernels do; the reference does the same float32 operations, so the integers agree exactly. Only
the last line may differ by an ulp: LLVM may contract its multiply-add into one FMA.

No calibration data: the weights are quantized at compile time, the activations at run time, so
an outlier token costs only its own row's precision (Dettmers et al., *LLM.int8()*, 2022, and
Yao et al., *ZeroQuant*, 2022: per-token activation scales).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ir.quant_ops import DYNAMIC_GRANULARITIES
from .requant import float_clamp


def row_params(a: np.ndarray, granularity: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(s, r, z)`` of the 2-D activation ``a``, each of shape (M, 1) for "token", (1, 1) for
    "tensor": the float32 scale, its float32 reciprocal and the zero point (float32, integral)."""
    if granularity not in DYNAMIC_GRANULARITIES:
        raise ValueError(f"granularity must be one of {DYNAMIC_GRANULARITIES}, got {granularity!r}")
    a = np.asarray(a, np.float32)
    axis = 1 if granularity == "token" else None
    f0 = np.float32(0)
    lo = np.minimum(np.min(a, axis=axis, keepdims=True), f0) if a.size else np.zeros((1, 1), np.float32)
    hi = np.maximum(np.max(a, axis=axis, keepdims=True), f0) if a.size else np.zeros((1, 1), np.float32)
    s = ((hi - lo) / np.float32(255)).astype(np.float32)
    s = np.where(s == 0, np.float32(1), s).astype(np.float32)
    r = (np.float32(1) / s).astype(np.float32)
    z = np.clip(np.rint(-lo * r), 0, 255).astype(np.float32)
    return s, r, z


def quantize_rows(a: np.ndarray, r: np.ndarray, z: np.ndarray) -> np.ndarray:
    """``clamp(round_half_even(a * r) + z, 0, 255)`` as uint8 (NaN: 0)."""
    with np.errstate(over="ignore", invalid="ignore"):
        q = np.rint(np.asarray(a, np.float32) * r) + z
    return np.clip(np.nan_to_num(q, nan=0.0), 0, 255).astype(np.uint8)


def dynamic_gemm(a: np.ndarray, p: np.ndarray, w: np.ndarray, s_w: Sequence[float], bias: np.ndarray | None,
                 activation: str = "", params: Sequence[float] = ()) -> np.ndarray:
    """``DynamicQLinearGemm`` on numpy arrays: ``a`` float32 (M x K), ``p`` its ``[s, 1/s, z]``
    rows (M or 1 of them: :func:`quant_params`), ``w`` int8 (N x K) with scales ``s_w`` (one, or
    one per row of w), ``bias`` float32 (N,) or None."""
    p = np.asarray(p, np.float32)
    s, r, z = p[:, 0:1], p[:, 1:2], p[:, 2:3]
    q = quantize_rows(a, r, z)
    w64 = np.asarray(w, np.int64)
    # int64 sums of integers: exact; the kernels' int32 accumulators hold them (K * 255 * 127 < 2^31)
    acc = q.astype(np.int64) @ w64.T - z.astype(np.int64) * w64.sum(axis=1)[None, :]
    f = (s * np.asarray(s_w, np.float32).reshape(1, -1)).astype(np.float32)
    y = acc.astype(np.int32).astype(np.float32) * f
    if bias is not None:
        y = y + np.asarray(bias, np.float32).reshape(1, -1)
    lo, hi = float_clamp(activation, params)
    return np.clip(y, np.float32(lo), np.float32(hi)).astype(np.float32)


def quant_params(a: np.ndarray, granularity: str = "token") -> np.ndarray:
    """``DynamicQuantParams``: the rows ``[s, 1/s, z]`` (float32, M x 3 or 1 x 3) of :func:`row_params`."""
    return np.concatenate(row_params(a, granularity), axis=1)
