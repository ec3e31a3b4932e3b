"""The CUDA-only float8 kernels: QLinearConv (group 1) and QLinearGemm of ``--dtype fp8`` as float8
GEMMs for the mma tensor cores (:mod:`.mma`).

:func:`..kernels.quant.qconv2d` and :func:`..kernels.quant.qgemm` take these kernels on
``--target cuda`` where the implicit GEMM (I = n·oh·ow or m, J = c_out, K = c_in·kh·kw) is
:func:`.mma.mma_sized` and both operands are of one float8 format; everything else (depthwise convs,
K < 32, a gemm of fewer than 16 rows) keeps the direct kernel of :mod:`..kernels.fp8`, float8 storage and
float32 arithmetic, which dlight or :mod:`.direct` schedule. The float8 values arrive and stay
stored as their uint8 bits; here they are reinterpreted (not converted) as TVM's float8 types in
the operand stages, so that the reduction block is the pattern of TVM's float8 mma intrinsic::

    P[n, ci, y, x] = f8(x_bits)  inside,  f8(0x00) = +0  in the padding
    W8[co, ci, rh, rw] = f8(w_bits)                   (the weight: float8 bytes in the library)
    acc[n, co, y, x] = Σ_{ci, rh, rw} f32(P[n, ci, y·sh + rh·dh, x·sw + rw·dw]) · f32(W8[co, ci, rh, rw])

``f8`` = ``reinterpret`` as float8_e4m3fn / float8_e5m2 (the bits unchanged); the mma reads those
bytes as its .e4m3 / .e5m2 operands. Each product of two float8 values is exact in float32 (at
most 4 x 4 significant bits, exponents within float32's range), so the accumulator differs from
the exact sum only by the rounding of its additions. The epilogue ``clamp(acc · f32(s_x s_w[c]) +
b[c])`` is :mod:`..kernels.fp8`'s.

For a lowering without GPU schedules (``lower(..., gpu_schedules=False)``: the module also compiles
for a CPU, where tests run it) the same computes are built with the bits kept as uint8 and
``f32(v)`` the exact integer decode of :func:`..kernels.fp8.decode`: TVM 0.27's LLVM lowering of
float8 -> float32 casts is wrong for zero and the subnormals (kernels/fp8.py), and the mma never
converts anyway. Shapes, index expressions, padding, reduction order and epilogue are the same.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ...ir.types import is_fp8
from ..kernels import fp8 as kfp8
from ..kernels.conv import _attrs2d
from ..kernels.tensor import Buf, cast, compute
from .mma import mma_sized

F32 = "float32"


def qconv2d(ctx, a, ins, outs) -> list | None:
    """A float8 QLinearConv as the float8 GEMM above with :mod:`..kernels.fp8`'s epilogue, or None
    where it does not apply (then the direct kernel of :func:`..kernels.fp8.qconv2d`)."""
    x = ins[0]
    wbits, wdt = kfp8.weight_bits(ctx, 1)
    n, k, oh, ow = outs[0].shape
    if x.rank != 4 or a["group"] != 1 or not _takes_mma(ctx, wdt, n * oh * ow, k, int(np.prod(wbits.shape[1:]))):
        return None
    return [kfp8.epilogue(ctx, a, outs[0], _conv_acc(ctx, a, x, wbits, wdt, outs[0].shape), k)]


def qgemm(ctx, a, ins, outs) -> list | None:
    """A float8 QLinearGemm (W stored N x K) as the float8 GEMM above, or None (then
    :func:`..kernels.fp8.qgemm`)."""
    wbits, wdt = kfp8.weight_bits(ctx, 1)
    m, n = outs[0].shape
    if not _takes_mma(ctx, wdt, m, n, wbits.shape[1]):
        return None
    acc_at = _dense_acc(ctx, ins[0], wbits, wdt, m)
    return [kfp8.epilogue(ctx, a, outs[0], lambda idx: acc_at(idx[0], idx[1]), n)]


def _takes_mma(ctx, w_dtype: str, i: int, j: int, k: int) -> bool:
    """Both operands of one float8 format (TVM has no e4m3 x e5m2 intrinsic) and a GEMM of
    I x J x K that :func:`.mma.mma_sized`."""
    return ctx.op.operands[0].dtype == w_dtype and is_fp8(w_dtype) and mma_sized(i, j, k)


def _operands(ctx, storage: str):
    """(bits -> operand-stage value, operand-stage value -> float32) for ``storage``: float8
    reinterpretation and a cast on the GPU, uint8 bits and the integer decode for the CPU check."""
    if ctx.low.gpu_schedules:
        return (lambda v: tirx.reinterpret(storage, cast(v, "uint8"))), (lambda v: cast(v, F32))
    return (lambda v: cast(v, "uint8")), (lambda v: kfp8.decode(v, storage))


def _conv_acc(ctx, a, x, wbits: np.ndarray, storage: str, out_shape):
    """``acc_at`` (float32, plain NCHW) of a group-1 float8 QLinearConv as the implicit GEMM above."""
    n, c, h, wd = x.shape
    k, cg, r, s = wbits.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)
    oh, ow = out_shape[2:]
    as_f8, f32 = _operands(ctx, storage)
    zero = as_f8(tirx.const(0, "uint8"))

    def padded(i, ci, y, xx):
        v = as_f8(x.at((i, ci, y - pt, xx - pl)))
        if not (pt or pl or pb or pr):
            return v
        return tirx.if_then_else(tirx.all(y >= pt, y < pt + h, xx >= pl, xx < pl + wd), v, zero)
    P = compute((n, c, h + pt + pb, wd + pl + pr), padded, name="pad")
    wp = ctx.param(np.ascontiguousarray(wbits), "qw_f8")
    W = compute(wbits.shape, lambda *i: as_f8(wp[i]), name="w_f8")
    rc, rh, rw = te.reduce_axis((0, cg), "rc"), te.reduce_axis((0, r), "rh"), te.reduce_axis((0, s), "rw")
    acc = compute((n, k, oh, ow), lambda i, co, y, xx: te.sum(
        f32(P[i, rc, y * sh + rh * dh, xx * sw + rw * dw]) * f32(W[co, rc, rh, rw]), axis=[rc, rh, rw]), name="conv")
    ctx.schedule("conv2d", reg_n=1, pad=True, fetch=(4, 16))    # im2col gathers; weight rows contiguous
    return Buf(acc, (n, k, oh, ow), F32, 0).at


def _dense_acc(ctx, A, wbits: np.ndarray, storage: str, m: int):
    """``acc_at(i, j)`` (float32) of a float8 QLinearGemm as ``Σ_k f32(A8[i, k]) · f32(W8[j, k])``."""
    kk = wbits.shape[1]
    as_f8, f32 = _operands(ctx, storage)
    A8 = compute((m, kk), lambda i, j: as_f8(A.at((i, j))), name="pad")
    wp = ctx.param(np.ascontiguousarray(wbits), "qw_f8")
    W = compute(wbits.shape, lambda *i: as_f8(wp[i]), name="w_f8")
    rk = te.reduce_axis((0, kk), "rk")
    d = compute((m, wbits.shape[0]), lambda i, j: te.sum(f32(A8[i, rk]) * f32(W[j, rk]), axis=[rk]), name="dense")
    ctx.schedule("dense", mb=1, fetch=(16, 16))      # both operands contiguous along K (mma.py)
    return lambda i, j: d[i, j]
