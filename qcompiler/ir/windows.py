"""Sliding windows of convolution and pooling, and exact integer convolution sums in numpy.

``windows`` yields, per kernel offset, the strided slice of the padded input that the offset
multiplies (the im2col columns, one offset at a time); ``conv_sum`` forms Σ x * w over each window
as float GEMMs of integers held in floats, exact while every partial sum is (float64 below 2^53,
or float32 GEMMs bounded per output position, :func:`chunked_matmul`). The IR's ``ConvInteger``
kernel (:mod:`.interp`) and the reference interpreter's integer and float convolutions and pooling
(:mod:`qcompiler.quant.reference`) use them.

    y = conv_sum(x, w, {"strides": [1, 1], "pads": [1, 1, 1, 1], "group": 1}, (28, 28))
"""
from __future__ import annotations

import numpy as np


def geometry(x_shape, kernel, a):
    nsp = len(x_shape) - 2
    s = a.get("strides") or [1] * nsp
    d = a.get("dilations") or [1] * nsp
    p = a.get("pads") or [0] * (2 * nsp)
    return nsp, list(kernel), list(s), list(d), list(p)


def windows(x, kernel, a, out_spatial, pad_value):
    """Yield, for each kernel offset, the (N, C, *out_spatial) slice of the padded input."""
    nsp, k, s, d, p = geometry(x.shape, kernel, a)
    widths = [(0, 0), (0, 0)]
    for i in range(nsp):
        need = (out_spatial[i] - 1) * s[i] + d[i] * (k[i] - 1) + 1    # ceil_mode may need more at the end
        end = max(p[nsp + i], need - x.shape[2 + i] - p[i])
        widths.append((p[i], end))
    xp = np.pad(x, widths, constant_values=pad_value) if any(w != (0, 0) for w in widths) else x
    for offs in np.ndindex(*k):
        idx = [slice(None), slice(None)]
        for i, o in enumerate(offs):
            st = o * d[i]
            idx.append(slice(st, st + s[i] * (out_spatial[i] - 1) + 1, s[i]))
        yield offs, xp[tuple(idx)]


def chunked_matmul(a: np.ndarray, b: np.ndarray, chunk: int | None, bound: np.ndarray | None = None) -> np.ndarray:
    """a @ b over the last axis of ``a`` (a: (..., M, K), b: (..., K, N)), for integer operands
    held in floats; with ``chunk``, exact in float32 GEMMs although the sums may be too long for
    float32 in the worst case (``chunk``: how many worst-case products float32 sums exactly).

    Float32 sums integers exactly while every partial sum stays below 2^24, whatever the order
    (BLAS blocking, FMA): each partial sum is bounded by Σ |a_k| |b_k|. So each row of ``a`` is
    bounded by ``|a| @ max_n |b[:, n]|`` (one matrix-vector product) and the rows below 2^24 (less
    the float32 rounding of that bound, K 2^-23 relative) come from ONE float32 GEMM; the others
    (rare: activations far from the zero point on many taps) as float32 products of slices of at
    most ``chunk`` terms added in float64. Exact either way, at float32 GEMM speed (about 3x
    float64's on x86; resnet18's reference run: 5 slices per 3x3x256 conv before this bound).
    ``bound``: that row bound (..., M) computed exactly by the caller (:func:`conv_sum`: cheaper
    on the input than on the im2col matrix)."""
    k = a.shape[-1]
    if chunk is None or chunk >= k:
        return np.matmul(a, b)
    a32, b32 = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
    limit = 2.0 ** 24 * (1 - k * 2.0 ** -23) if bound is None else 2.0 ** 24
    if limit > 0:
        if bound is None:
            bound = np.matmul(np.abs(a32), np.abs(b32).max(axis=-1, keepdims=True))[..., 0]    # (..., M)
        bad = bound >= limit
        if not bad.any():
            return np.matmul(a32, b32)
        if bad.mean() < 0.5:                       # redo only the rows over the bound
            out = np.matmul(a32, b32).astype(np.float64)
            for idx in np.ndindex(*a32.shape[:-2]):
                rows = bad[idx]
                if rows.any():
                    out[idx][rows] = _sliced_matmul(a32[idx][rows], b32[idx] if b32.ndim > 2 else b32, chunk)
            return out
    return _sliced_matmul(a32, b32, chunk)


def _sliced_matmul(a32: np.ndarray, b32: np.ndarray, chunk: int) -> np.ndarray:
    """a32 @ b32 as float32 products of ``chunk``-term slices of the last axis, added in float64."""
    out = None
    for s in range(0, a32.shape[-1], chunk):
        part = np.matmul(a32[..., s:s + chunk], b32[..., s:s + chunk, :]).astype(np.float64)
        out = part if out is None else out + part
    return out


def conv_sum(x: np.ndarray, w: np.ndarray, a: dict, out_spatial, dtype=np.float64,
             chunk: int | None = None) -> np.ndarray:
    """Σ x * w over each window (N, O, *out_spatial) in ``dtype``; ``x`` already shifted so that
    padding is 0. Exact for integer operands when every partial sum is exact in ``dtype``, or,
    with ``chunk`` (``chunk`` worst-case products sum exactly in float32), in float32 GEMMs
    bounded per output position by :func:`_window_bound` (:func:`chunked_matmul`)."""
    if chunk is not None:                        # integers: exact in float32 (see chunked_matmul)
        dtype = np.float32
    x = x.astype(dtype, copy=False)
    w = w.astype(dtype, copy=False)
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    g = a.get("group", 1) or 1
    ksp = w.shape[2:]
    if cg == 1 and o == g == c:                           # depthwise: accumulate offset by offset
        out = np.zeros((n, o, *out_spatial), np.float64 if chunk is not None else dtype)
        tmp = np.empty((n, o, *out_spatial), dtype)          # the products, in place (no temporaries)
        for offs, win in windows(x, ksp, a, out_spatial, 0.0):
            np.multiply(win, w[(slice(None), 0) + offs].reshape((1, o) + (1,) * len(ksp)), out=tmp)
            out += tmp
        return out
    bound = None
    if chunk is not None:
        bound = _window_bound(x, w, a, out_spatial, g)
    cols = np.stack([win for _, win in windows(x, ksp, a, out_spatial, 0.0)], axis=2)  # N, C, K, *sp
    kk = cols.shape[2]
    p = int(np.prod(out_spatial))
    cols = cols.reshape(n, g, cg * kk, p).transpose(1, 0, 3, 2).reshape(g, n * p, cg * kk)
    wm = w.reshape(g, o // g, cg * kk).transpose(0, 2, 1)
    out = chunked_matmul(cols, wm, chunk, bound)                                # g, N*P, O/g
    return out.reshape(g, n, p, o // g).transpose(1, 0, 3, 2).reshape(n, o, *out_spatial)


def _window_bound(x: np.ndarray, w: np.ndarray, a: dict, out_spatial, g: int) -> np.ndarray:
    """Per group and output position (g, N*P): Σ over the window of |x_c| max |w[., c, .]| (the max
    over the group's output channels and the kernel taps), a bound of every partial sum of the
    conv there (for :func:`chunked_matmul`), exact in float64 and computed on the input (one
    pass) rather than on the im2col matrix (kernel-size times larger)."""
    n, c = x.shape[:2]
    o, cg = w.shape[:2]
    wmax = np.abs(w).reshape(o, cg, -1).max(axis=2).reshape(g, o // g, cg).max(axis=1).astype(np.float64)
    absx = np.abs(x).astype(np.float64).reshape(n, g, cg, -1)
    s = np.matmul(wmax[:, None, :], absx).reshape(n, g, *x.shape[2:])                    # N, g, *in
    total = sum(win for _, win in windows(s, w.shape[2:], a, out_spatial, 0.0))        # N, g, *sp
    return total.reshape(n, g, -1).transpose(1, 0, 2).reshape(g, -1)
