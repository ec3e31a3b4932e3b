"""Gemm, FusedGemm and MatMul.

With a constant right-hand side (a dense layer) the weight is packed at compile time to
``(N/bn, K, bn)`` and the accumulator is stored as ``(M, N/bn, bn)`` (the same memory order as
``(M, N)``), so that the x86 schedule vectorizes over ``bn`` output columns and register-blocks
rows. A non-constant right-hand side (attention) takes the batched-matmul path.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ..target import Family
from .conv import pick_block
from .elementwise import activation
from .tensor import (Buf, Lazy, broadcast_index, cast, compute, const, divisor_at_most, linearize, padded_extent,
                     repeat_last, unravel)

F32 = "float32"
ROW_TILE = 8               # rows of a dense layer's register tile (x86/ARM)


def _padded(ctx, n: int, tile: int) -> int:
    """:func:`.tensor.padded_extent` on x86/ARM; CUDA (dlight) keeps ``n``."""
    return n if ctx.spec.family is Family.CUDA else padded_extent(n, tile)


def _dense(ctx, a2, k: int, wmat: np.ndarray, out_shape, name="dense", load=None):
    """a2 @ wmat for a logical (M, K) tensor ``a2`` and a constant (K, N) array, viewed with
    ``out_shape``. N is padded up to a multiple of the vector width (zero weight columns) when it
    has no power-of-two factor that large; the padding is cut off by the view. ``load``: the float32
    value of a stored weight element (default: its cast; float8 bits: :func:`.fp8.decode`)."""
    load = load or (lambda v: cast(v, F32))
    m = a2.shape[0]
    mpad = _padded(ctx, m, ROW_TILE)
    n = wmat.shape[1]
    bn = pick_block(n, ctx.vw)
    if bn < ctx.vw and n > ctx.vw:
        bn = ctx.vw
    if bn == ctx.vw and n % (2 * bn) == 0 and m <= 2:
        bn *= 2                    # two vectors per row when there are few rows (more FMA chains)
    npad = -(-n // bn) * bn
    if npad != n:
        wmat = np.concatenate([wmat, np.zeros((k, npad - n), wmat.dtype)], axis=1)
    wp = ctx.param(np.ascontiguousarray(wmat.reshape(k, npad // bn, bn).transpose(1, 0, 2)), "w_dense")
    rk = te.reduce_axis((0, k), "rk")
    row = repeat_last(m, mpad)
    d = compute((mpad, npad // bn, bn), lambda i, no, ni: te.sum(
        a2.at((row(i), rk)) * load(wp[no, rk, ni]), axis=[rk]), name=name)
    ctx.schedule("dense", mb=divisor_at_most(mpad, ROW_TILE))
    if npad == n and mpad == m:
        return Buf(d, out_shape, F32)
    rows = int(np.prod(out_shape[:-1]))
    return Lazy(out_shape, F32, lambda idx: d[linearize(idx[:-1], out_shape[:-1]) if rows > 1 else 0,
                                              idx[-1] // bn, idx[-1] % bn])


def gemm(ctx, a, ins, outs):
    A, B = ins[0], ins[1]
    C = ins[2] if len(ins) > 2 else None
    out_shape = outs[0].shape
    m, n = out_shape
    if a["transA"]:
        A = _transposed(A)
    k = A.shape[1]
    bdata = ctx.const_data(1)
    if bdata is not None:
        wmat = bdata.T if a["transB"] else bdata
        acc = _dense(ctx, A, k, np.ascontiguousarray(wmat), out_shape)
    else:
        Bt = _transposed(B) if a["transB"] else B
        rk = te.reduce_axis((0, k), "rk")
        d = compute((m, n), lambda i, j: te.sum(A.at((i, rk)) * Bt.at((rk, j)), axis=[rk]), name="matmul")
        ctx.schedule("matmul")
        acc = Buf(d, out_shape, F32)
    if C is None and float(a["alpha"]) == 1.0 and not a.get("activation", ""):
        return [acc]
    return [gemm_epilogue(a, C, acc.at, out_shape, outs[0].dtype)]


def gemm_epilogue(a: dict, C, acc_at, out_shape, dtype) -> Lazy:
    """Gemm's y = act(alpha · acc + beta · C) over an accumulator read by ``acc_at(idx)``
    (C broadcast; None: no C), shared by the dense and the sparse kernels."""
    alpha, beta = float(a.get("alpha", 1.0)), float(a.get("beta", 1.0))
    act, params = a.get("activation", ""), a.get("activation_params", [])

    def fn(idx):
        v = acc_at(idx)
        if alpha != 1.0:
            v = v * const(alpha, F32)
        if C is not None:
            cv = C.at(broadcast_index(idx, C.shape))
            v = v + (cv * const(beta, F32) if beta != 1.0 else cv)
        return activation(act, params, v)
    return Lazy(out_shape, dtype, fn)


def _transposed(x):
    return Lazy((x.shape[1], x.shape[0]), x.dtype, lambda idx: x.at((idx[1], idx[0])))


def matmul(ctx, a, ins, outs):
    A, B = ins
    out_shape = outs[0].shape
    bdata = ctx.const_data(1)
    if bdata is not None and bdata.ndim == 2 and A.rank >= 2:
        k = A.shape[-1]
        mm = int(np.prod(A.shape[:-1]))
        a2 = A if A.rank == 2 else Lazy((mm, k), A.dtype, lambda idx: A.at(unravel(linearize(idx, (mm, k)), A.shape)))
        return [_dense(ctx, a2, k, bdata, out_shape)]
    # batched: promote 1-D operands, broadcast the batch dimensions
    a_sh = (1,) + A.shape if A.rank == 1 else A.shape
    b_sh = B.shape + (1,) if B.rank == 1 else B.shape
    A2 = A if A.rank > 1 else Lazy(a_sh, A.dtype, lambda idx: A.at((idx[-1],)))
    B2 = B if B.rank > 1 else Lazy(b_sh, B.dtype, lambda idx: B.at((idx[-2],)))
    full = tuple(np.broadcast_shapes(a_sh[:-2], b_sh[:-2])) + (a_sh[-2], b_sh[-1])
    k, m, n = a_sh[-1], full[-2], full[-1]
    vw, cpu = ctx.vw, ctx.spec.family is not Family.CUDA and tuple(out_shape) == full
    # x86/ARM: a register tile of ROW_TILE rows x whole vectors. Columns that are more than a
    # vector and not whole vectors (attention's 197 keys) read B from a zero-padded copy, which
    # keeps the vector loads contiguous (the schedule would otherwise fall back to scalar code);
    # rows without a divisor near the tile repeat the last row. The view cuts both off.
    npad = -(-n // vw) * vw if cpu and n > vw and n % vw else n
    mpad = _padded(ctx, m, ROW_TILE) if cpu and (npad % vw == 0 or npad <= vw) else m
    if npad != n:
        bshape = b_sh[:-1] + (npad,)
        B2 = Buf(compute(bshape, lambda *idx: tirx.if_then_else(
            idx[-1] < n, B2.at(idx[:-1] + (tirx.min(idx[-1], n - 1),)), const(0.0, F32)), name="bpad"), bshape, F32)
    row = repeat_last(m, mpad)
    rk = te.reduce_axis((0, k), "rk")

    def body(*idx):
        batch, i, j = idx[:-2], idx[-2], idx[-1]
        ai = broadcast_index(batch, a_sh[:-2]) + (row(i), rk)
        bi = broadcast_index(batch, b_sh[:-2]) + (rk, j)
        return te.sum(A2.at(ai) * B2.at(bi), axis=[rk])
    d = compute(full[:-2] + (mpad, npad), body, name="matmul")
    ctx.schedule("matmul", mb=divisor_at_most(mpad, ROW_TILE) if cpu else 1)
    if npad == n and mpad == m:
        return [Buf(d, out_shape, F32)]
    return [Lazy(out_shape, F32, lambda idx: d[tuple(idx)])]
