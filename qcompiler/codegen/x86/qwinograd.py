"""Exact int8 3x3 convolution by Winograd's minimal filtering F(2x2, 3x3), for x86 CPUs whose
integer dot product is ``vpmaddwd`` (AVX2 or AVX-512BW without VNNI).

Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks" (CVPR 2016): a 2x2 output
tile Y of a 3x3 filter g over a 4x4 input tile d is

    Y = A^T [ (G g G^T) ⊙ (B^T d B) ] A

    B^T = [1  0 -1  0]    G = [ 1    0    0 ]    A^T = [1 1  1  0]
          [0  1  1  0]        [1/2  1/2  1/2]          [0 1 -1 -1]
          [0 -1  1  0]        [1/2 -1/2  1/2]
          [0  1  0 -1]        [ 0    0    1 ]

summed over input channels inside the ⊙: 16 multiplies per tile and channel pair instead of the
direct conv's 36 (2.25x fewer). With G' = 2G (integer) the sum is taken over integers only:

    U[ε, k, c] = (G' g_kc G'^T)[ε]          |U| <= 9·128 = 1152      (int16, from the int8 weights)
    V[ε, t, c] = (B^T d_tc B)[ε]             |V| <= 4·255 = 1020      (int16, from the stored uint8/int8
                                                                        x; padding holds z_x as in qdot)
    M[ε, t, k] = Σ_c V[ε, t, c] · U[ε, k, c]                         (int32: 16 gemms on ``vpmaddwd``)
    acc[k, 2t_y + a, 2t_x + b] = (A^T M A)[a, b] / 4                  (exact: the sum is 4x the conv's)

``vpmaddwd`` multiplies int16 pairs into int32 exactly (|2·1020·1152| < 2^31); the accumulator is
the same integer Σ x·w as the direct kernel's, so the requantized output is bit-identical. The
kernel is used only where no partial sum can leave int32 (:func:`applicable` bounds ``9·max Σ_c |U|
·max |V|`` with the actual weights), so nothing relies on wrap-around. F(4x4, 3x3) would cut the
multiplies 4x but its transforms (entries up to 5, 1/24 in G) overflow int16.

The artifact keeps the int8 weights (9 bytes per filter, as the direct kernel) and the kernel
transforms them at each call (stage "wino_w", K·C·16 int16 values): stored transformed weights
would be 16 int16 = 32 bytes per filter, 3.6x, which put rapidocr-det's int8 library at 0.354x its
fp32 one (the promise is <= 0.3x: 0.299 without) and ResNet-50's at 0.46x.

On VNNI CPUs (``vpdpbusd``: 32 u8·s8 products per instruction, twice ``vpmaddwd``'s 16) the gain
would shrink to 1.125x before the transforms; they keep the direct kernel, as does ARM ``sdot``.
"""
from __future__ import annotations

import os

import numpy as np
from tvm import te, tirx

from ..intrin import DotIsa
from ..kernels.tensor import cast, compute, dtype_of
from .intrin import wide_intrin

I32, I16 = "int32", "int16"
ENABLED = os.environ.get("QC_WINOGRAD", "1") != "0"    # QC_WINOGRAD=0: the direct kernel (A/B runs)
MIN_CHANNELS = 16        # below, the transforms cost about what the multiplies save

BT = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]])
G2 = np.array([[2, 0, 0], [1, 1, 1], [1, -1, 1], [0, 0, 2]])
AT = np.array([[1, 1, 1, 0], [0, 1, -1, -1]])


def transformed_weights(w: np.ndarray) -> np.ndarray:
    """U[ε = 4e + n, k, c] = (G' w[k, c] G'^T)[e, n] (int64), w: (K, C, 3, 3)."""
    u = np.einsum("ea,nb,kcab->enkc", G2, G2, w.astype(np.int64))
    return u.reshape(16, *w.shape[:2])


def applicable(isa: DotIsa | None, a, x, w: np.ndarray) -> bool:
    """A group-1, stride-1, undilated 3x3 conv of >= MIN_CHANNELS even input channels and
    output channels a multiple of 8, on ``vpmaddwd``, whose partial sums stay inside int32."""
    from ..kernels.conv import _attrs2d
    if not ENABLED or isa is None or isa.kind != "pmaddwd" or a["group"] != 1:
        return False
    k, c, r, s = w.shape
    strides, dil, _ = _attrs2d(a)
    if (r, s) != (3, 3) or list(strides) != [1, 1] or list(dil) != [1, 1]:
        return False
    if c < MIN_CHANNELS or c % 2 or k % 8 or x.dtype not in ("uint8", "int8"):
        return False
    vmax = 4 * (255 if x.dtype == "uint8" else 128)
    bound = 9 * int(np.abs(transformed_weights(w)).sum(axis=2).max()) * vmax
    return bound < 2 ** 31


def _pick(i, exprs):
    """``exprs[i]`` for a loop variable i (a select chain the unrolled loop folds)."""
    v = exprs[-1]
    for j in range(len(exprs) - 2, -1, -1):
        v = tirx.Select(i == j, exprs[j], v)
    return v


def _combine(coefs, terms):
    """Σ_j coefs[j] · terms[j] for one transform row (small integer coefficients, one at least > 0)."""
    def scaled(co, t):
        return t if abs(co) == 1 else t * tirx.const(abs(co), dtype_of(t))
    pos = [scaled(co, t) for co, t in zip(coefs, terms) if co > 0]
    v = pos[0]
    for t in pos[1:]:
        v = v + t
    for co, t in zip(coefs, terms):
        if co < 0:
            v = v - scaled(co, t)
    return v


def _sandwich(mat, tile):
    """``mat · tile · mat^T`` as nested lists of expressions (the three transforms: B^T d B,
    G' g G'^T, A^T M A); each row combination is built once and shared by the row's entries."""
    rows = [[_combine(r, [tile[a][b] for a in range(len(tile))]) for b in range(len(tile[0]))] for r in mat]
    return [[_combine(r, row) for r in mat] for row in rows]


def conv2d(ctx, a, x, w: np.ndarray, out_shape, zx: int, isa: DotIsa):
    """The int32 accumulator ``acc(idx)`` (logical NCHW) of a conv :func:`applicable` allows,
    taken with zero point z_x (padding stores z_x, the caller folds ``- z_x Σ w``)."""
    from ..kernels.conv import _attrs2d, register_tile
    n, c, h, wd = x.shape
    k = w.shape[0]
    _, _, (pt, pl, _, _) = _attrs2d(a)
    oh, ow = out_shape[2:]
    th, tw = -(-oh // 2), -(-ow // 2)
    lanes = isa.lanes_for(k)
    bo, reg_n = register_tile(tw, ctx, lanes, k % (2 * lanes) == 0)
    fill = tirx.const(zx, I16)

    def d(i, ci, y, xx):
        ok = tirx.all(y >= 0, y < h, xx >= 0, xx < wd)
        return tirx.Select(ok, cast(x.at((i, ci, tirx.max(tirx.min(y, h - 1), 0),
                                          tirx.max(tirx.min(xx, wd - 1), 0))), I16), fill)

    def vin(i, ty, eps, tx, ci):
        y0, x0 = ty * 2 - pt, tx * 2 - pl
        tile = [[d(i, ci, y0 + r_, x0 + s_) for s_ in range(4)] for r_ in range(4)]
        return _pick(eps, sum(_sandwich(BT, tile), []))
    V = compute((n, th, 16, tw, c), vin, name="wino_in")

    # the weights ship as int8 (as the direct kernel's), laid out (K/bo, C/2, 3, 3, bo, 2), and are
    # transformed at each call: stored int16 transformed weights are 32/9 = 3.6x the bytes
    w8 = w.reshape(k // bo, bo, c // 2, 2, 3, 3).transpose(0, 2, 4, 5, 1, 3)
    W8 = ctx.param(np.ascontiguousarray(w8).astype(np.int8), "qw_wino")

    def uin(eps, ko, c2, ki, iq):
        g = [[cast(W8[ko, c2, a_, b_, ki, iq], I16) for b_ in range(3)] for a_ in range(3)]
        return _pick(eps, sum(_sandwich(G2, g), []))
    U = compute((16, k // bo, c // 2, bo, 2), uin, name="wino_w")
    c2, iq = te.reduce_axis((0, c // 2), "c2"), te.reduce_axis((0, 2), "iq")
    M = compute((n, th, 16, k // bo, tw, bo), lambda i, ty, eps, ko, tx, ki: te.sum(
        cast(V[i, ty, eps, tx, c2 * 2 + iq], I32) * cast(U[eps, ko, c2, ki, iq], I32), axis=[c2, iq]),
        name="wgemm")
    ctx.schedule("conv2d_winograd", reg_n=reg_n, block=bo, lanes=lanes, intrin=wide_intrin(lanes),
                 by_channel=k > n * th * tw)

    def acc(idx):
        i, ch, y, xx = idx
        ty, ya, tx, xb = y // 2, y % 2, xx // 2, xx % 2
        ko, ki = ch // bo, ch % bo
        m = [[M[i, ty, 4 * e + nn, ko, tx, ki] for nn in range(4)] for e in range(4)]
        out = _sandwich(AT, m)
        four = _pick(ya, [_pick(xb, out[0]), _pick(xb, out[1])])
        return tirx.shift_right(four, tirx.const(2, I32))
    return acc, zx
