"""ConvInteger and MatMulInteger (pre-quantized ONNX models): int32 results in integer arithmetic.

Formulas of :mod:`qcompiler.ir.ops` (and the numpy kernels of :mod:`qcompiler.ir.interp`), exact:

* ``ConvInteger``  y = Σ (x - z_x)(w - z_w[c]). The weight is a compile-time constant, so
  ``w' = w - z_w`` is packed as int16 (|w'| <= 255). With a constant ``z_x`` this is QLinearConv's
  accumulator: ``Σ x w'`` on the stored x (padding stores z_x) plus the folded per-channel int32
  ``-z_x Σ w'_c``, exact in wrapping int32 arithmetic; with a run-time ``z_x`` (the one
  DynamicQuantizeLinear computes) the shifted ``x - z_x`` (int16) is packed, padding with 0.
  Products are formed in int16 where |x|·max|w'| < 2^15 (as QLinearConv's), else in int32.
* ``MatMulInteger``  y = (a - z_a) @ (b - z_b), the differences and products in int32, summed in int32.
"""
from __future__ import annotations

import numpy as np
from tvm import te

from . import qdot
from .conv import conv2d_accumulate
from .quant import _mul
from .requant import channel_vec, wrapping_add
from .tensor import Buf, Lazy, broadcast_index, cast, compute

I16, I32 = "int16", "int32"
_XMAX = {"uint8": 255, "int8": 128}


def _scalar_at(t):
    return t.at((0,) * t.rank)


def _mul32(p, q):
    return cast(p, I32) * cast(q, I32)


def conv_integer(ctx, a, ins, outs):
    x, zx = ins[0], ins[2]
    w, zw = ctx.const_data(1), ctx.const_data(3)
    if w is None or zw is None:
        raise NotImplementedError("ConvInteger needs a constant weight and weight zero point")
    if x.rank != 4:
        raise NotImplementedError(f"ConvInteger of rank {x.rank} (only 2-D convolution is lowered)")
    out_shape = outs[0].shape
    k = w.shape[0]
    zw64 = zw.astype(np.int64).reshape(-1, *([1] * (w.ndim - 1))) if zw.size > 1 else np.int64(zw.reshape(-1)[0])
    ws = (w.astype(np.int64) - zw64).astype(np.int16)
    wmax = int(np.abs(ws.astype(np.int64)).max(initial=0))
    z = ctx.scalar_value(2)
    if z is not None:                                # the zero point folded into a per-channel bias
        mul = _mul if _XMAX[x.dtype] * wmax < 2 ** 15 else _mul32
        acc, bo = conv2d_accumulate(ctx, a, x, ws, out_shape, mul, fill=int(z), name="qw")
        fold = -int(z) * ws.astype(np.int64).reshape(k, -1).sum(axis=1)
        fb = channel_vec(ctx, qdot.wrap_int32(fold), I32, "qbias")
        accb = Buf(acc, out_shape, I32, bo)
        return [Lazy(out_shape, I32, lambda idx: wrapping_add(accb.at(idx), fb(idx[1])))]
    shifted = Lazy(x.shape, I16, lambda idx: cast(x.at(idx), I16) - cast(_scalar_at(zx), I16))
    acc, bo = conv2d_accumulate(ctx, a, shifted, ws, out_shape, _mul32, fill=0, name="qw")
    return [Buf(acc, out_shape, I32, bo)]


def matmul_integer(ctx, a, ins, outs):
    A, B, za, zb = ins
    out_shape = outs[0].shape
    bdata, zbd = ctx.const_data(1), ctx.const_data(3)
    if bdata is not None and zbd is not None:         # b - z_b at compile time
        bs = bdata.astype(np.int64) - (zbd.astype(np.int64).reshape(-1) if zbd.size > 1 else zbd.reshape(-1)[0])
        dt = I16 if np.abs(bs).max(initial=0) < 2 ** 15 else I32
        B = Buf(ctx.param(bs.astype(dt), "qw_mm"), bdata.shape, dt)

        def b_at(bi):
            return cast(B.at(bi), I32)
    else:
        def b_at(bi):
            zero = _scalar_at(zb) if zb.shape == () or int(np.prod(zb.shape)) == 1 else zb.at((bi[-1],))
            return cast(B.at(bi), I32) - cast(zero, I32)
    a_sh, b_sh = A.shape, B.shape
    k = a_sh[-1]
    rk = te.reduce_axis((0, k), "rk")
    per_row = int(np.prod(za.shape)) > 1

    def body(*idx):
        batch, i, j = idx[:-2], idx[-2], idx[-1]
        ai = broadcast_index(batch, a_sh[:-2]) + (i, rk)
        bi = broadcast_index(batch, b_sh[:-2]) + (rk, j)
        zero = za.at((i,)) if per_row else _scalar_at(za)
        return te.sum((cast(A.at(ai), I32) - cast(zero, I32)) * b_at(bi), axis=[rk])
    d = compute(tuple(out_shape), body, name="matmul_integer")
    ctx.schedule("matmul")
    return [Buf(d, out_shape, I32)]


ANCHOR_BUILDERS = {"ConvInteger": conv_integer, "MatMulInteger": matmul_integer}
