"""The CUDA-only int8 kernels: QLinearConv and QLinearGemm as s8 x s8 -> s32 GEMMs for tensor cores.

The accumulators here are what :func:`..kernels.quant.qconv2d` and :func:`..kernels.quant.qgemm`
take on ``--target cuda`` (group-1 convs and gemms): the uint8 activations shifted to int8 in a
padding stage of their own, so that the reduction block is the ``wmma_sync`` pattern that
:mod:`.wmma` (and dlight's int8 rule) tensorizes. The requantization epilogue is the
target-neutral one of :mod:`..kernels.quant`.
"""
from __future__ import annotations

import os

import numpy as np
from tvm import te, tirx

from ...errors import UserError
from ..kernels.conv import _attrs2d
from ..kernels.tensor import Buf, cast, compute

I32 = "int32"
CUDA_BLOCK = 16         # int8 channels per block of the CUDA convs' activations in the blocked layouts
CUDA_INT8_LAYOUTS = ("nchw", "blocked", "blocked-copy")


def cuda_int8_layout() -> str:
    """The activation layout of the CUDA int8 convs, ``QC_CUDA_INT8_LAYOUT`` (an experiment until
    timed on a GPU; see :func:`_conv_s8s8_blocked`): "nchw" (the default), "blocked" (NCHW16c,
    padding inlined into the GEMM's 4-byte fetch) or "blocked-copy" (NCHW16c, padding a stage of
    its own, the fetch a copy of 16-byte vectors)."""
    v = os.environ.get("QC_CUDA_INT8_LAYOUT") or "nchw"
    if v not in CUDA_INT8_LAYOUTS:
        raise UserError(f"QC_CUDA_INT8_LAYOUT is {v!r}, not a layout of the CUDA int8 convs",
                        "environment", f"set it to one of {', '.join(CUDA_INT8_LAYOUTS)}, or unset it")
    return v



def as_s8(v, dtype: str):
    """A stored uint8/int8 element as int8: uint8 ``x`` becomes ``x - 128`` (= ``x ^ 0x80``, exact
    in [-128, 127]), int8 is unchanged."""
    return cast(cast(v, I32) - tirx.const(128, I32), "int8") if dtype == "uint8" else cast(v, "int8")


def s8_shift(dtype: str) -> int:
    """What :func:`as_s8` subtracts from a stored value of ``dtype``."""
    return 128 if dtype == "uint8" else 0


def conv_s8s8(ctx, a, x, w: np.ndarray, out_shape, zx: int):
    """The int32 accumulator of a group-1 QLinearConv for CUDA, written as the s8 x s8 -> s32
    implicit GEMM that dlight's ``gpu.Matmul`` hands to ``MatmulInt8Tensorization`` (WMMA
    m16n16k16 int8 tensor cores on sm_70+, tvm/s_tir/dlight/gpu/matmul.py) when I = n·oh·ow,
    J = co and K = ci·kh·kw are all > 64::

        P[n, ci, y, x] = int8(x_stored - s)  inside,  int8(z_x - s)  in the padding   (s = 128 for uint8, else 0)
        acc[n, co, y, x] = Σ_{ci, rh, rw} int32(P[n, ci, y·sh + rh·dh, x·sw + rw·dw]) · int32(W[co, ci, rh, rw])

    The reduction block holds nothing but ``C += Cast(int32, A) · Cast(int32, B)`` with A, B int8,
    the pattern of the ``wmma_sync`` intrinsic (tvm/s_tir/tensor_intrin/cuda.py); the shift lives in
    the padding stage P, which dlight inlines into its shared-memory fetch. Exactness:
    ``Σ (x - z_x)·w = Σ (x - s - (z_x - s))·w``, so the accumulator taken with the effective zero
    point ``z_x - s`` and folded by :func:`..kernels.requant.requantized` is the same int32 as the x86 kernels' and
    the reference's (each |(x - s)·w| <= 2^14; the true sum fits int32, wrap-around is harmless).
    Plain NCHW, weight [co, ci, kh, kw] int8 (GPU threads map to elements: vector width 1).
    Returns ``(acc_at, z_eff)``."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)
    oh, ow = out_shape[2:]
    shift = s8_shift(x.dtype)
    z = zx - shift
    zc = tirx.const(z, "int8")
    layout = cuda_int8_layout()
    b = CUDA_BLOCK if layout != "nchw" else 0
    bo = b if b and k % b == 0 else 0
    if b and isinstance(x, Buf) and x.block == b and cg % b == 0:
        return _conv_s8s8_blocked(ctx, a, x, w, out_shape, zc, bo, copy=layout == "blocked-copy"), z

    def padded(i, ci, y, xx):
        v = as_s8(x.at((i, ci, y - pt, xx - pl)), x.dtype)
        if not (pt or pl or pb or pr):
            return v
        return tirx.if_then_else(tirx.all(y >= pt, y < pt + h, xx >= pl, xx < pl + wd), v, zc)
    P = compute((n, c, h + pt + pb, wd + pl + pr), padded, name="pad")
    W = ctx.param(np.ascontiguousarray(w.astype(np.int8)), "qw_s8")
    rc, rh, rw = te.reduce_axis((0, cg), "rc"), te.reduce_axis((0, r), "rh"), te.reduce_axis((0, s), "rw")

    def dot(co, i, y, xx):
        return te.sum(cast(P[i, rc, y * sh + rh * dh, xx * sw + rw * dw], I32) * cast(W[co, rc, rh, rw], I32),
                      axis=[rc, rh, rw])
    ctx.schedule("conv2d", reg_n=1, pad=True, block=bo)   # only the output block matters on CUDA
    return _conv_acc(dot, n, k, oh, ow, bo), z


def _conv_acc(dot, n: int, k: int, oh: int, ow: int, bo: int):
    """``acc_at`` of the accumulator ``dot(co, i, y, x)`` stored NCHW (``bo`` 0) or NCHW{bo}c."""
    if bo:
        acc = compute((n, k // bo, oh, ow, bo), lambda i, kb, y, xx, kc: dot(kb * bo + kc, i, y, xx), name="conv")
    else:
        acc = compute((n, k, oh, ow), lambda i, co, y, xx: dot(co, i, y, xx), name="conv")
    return Buf(acc, (n, k, oh, ow), I32, bo).at


def _conv_s8s8_blocked(ctx, a, x: Buf, w: np.ndarray, out_shape, zc, bo: int, copy: bool):
    """:func:`conv_s8s8` over an input stored NCHW{b}c: the reduction runs over
    K = (ci/b, kh, kw, ci%b), so that along K each run of b int8 values is contiguous in memory
    (one vector load) -- the plain NCHW form gathers K = (ci, kh, kw) byte by byte, with the
    division and modulo of the im2col index per byte. The weight is re-laid out to match,
    [co, ci/b, kh, kw, b]; the accumulator is stored NCHW{bo}c (bo: 0 for plain)."""
    n, c, h, wd = x.shape
    b = x.block
    k, cg, r, s = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)

    padding = bool(pt or pl or pb or pr)
    # copy: "pad_mat" is a stage of its own where it computes anything (the WMMA schedule launches
    # it before the GEMM), so that the GEMM's fetch is a plain copy of 16-byte vectors (CUDA codegen
    # has no 16-lane vectors of int32, nor 16-lane 8-bit broadcasts); else "pad", inlined into the
    # fetch (4-byte vectors)
    mat = copy and (padding or x.dtype == "uint8")

    def padded(i, cb, y, xx, ci):
        if not padding:
            return as_s8(x.tensor[i, cb, y, xx, ci], x.dtype)
        inside = tirx.all(y >= pt, y < pt + h, xx >= pl, xx < pl + wd)
        if mat:
            return tirx.if_then_else(inside, as_s8(x.tensor[i, cb, y - pt, xx - pl, ci], x.dtype), zc)
        # inlined into the vectorized fetch: a load from the clamped (always valid) position, masked
        # arithmetically. TVM 0.27's vectorizer scalarizes an if_then_else whose condition it cannot
        # prove lane-invariant (one byte per load), a Select lets the simplifier drop the clamp under
        # its condition, and CUDA codegen has no 8-bit vector broadcast of a non-constant
        yc = tirx.max(tirx.min(y - pt, h - 1), 0)
        xc = tirx.max(tirx.min(xx - pl, wd - 1), 0)
        v = cast(as_s8(x.tensor[i, cb, yc, xc, ci], x.dtype), I32)
        zi = cast(zc, I32)
        return cast(zi + (v - zi) * cast(inside, I32), "int8")
    P = compute((n, c // b, h + pt + pb, wd + pl + pr, b), padded, name="pad_mat" if mat else "pad")
    wb = w.astype(np.int8).reshape(k, cg // b, b, r, s).transpose(0, 1, 3, 4, 2)
    W = ctx.param(np.ascontiguousarray(wb), "qw_s8")
    rcb, rh, rw, rc = (te.reduce_axis((0, cg // b), "rcb"), te.reduce_axis((0, r), "rh"),
                       te.reduce_axis((0, s), "rw"), te.reduce_axis((0, b), "rc"))

    def dot(co, i, y, xx):
        return te.sum(cast(P[i, rcb, y * sh + rh * dh, xx * sw + rw * dw, rc], I32) * cast(W[co, rcb, rh, rw, rc], I32),
                      axis=[rcb, rh, rw, rc])
    ctx.schedule("conv2d", reg_n=1, pad=True, block=bo, fetch_vector=16 if copy else 4)
    return _conv_acc(dot, n, k, *out_shape[2:], bo)


def dense_s8s8(ctx, A, w: np.ndarray, za: int, m: int, kk: int):
    """QLinearGemm's int32 accumulator for CUDA as ``Σ_k int32(A'[i, k]) · int32(W[j, k])`` over
    int8 operands (A' = A shifted to int8 in its own stage, as in :func:`conv_s8s8`), the
    form dlight's int8 WMMA rule takes when M, N, K > 64. Returns ``(acc_at(i, j), z_eff)``."""
    A8 = compute((m, kk), lambda i, j: as_s8(A.at((i, j)), A.dtype), name="pad")
    W = ctx.param(np.ascontiguousarray(w.astype(np.int8)), "qw_s8")
    rk = te.reduce_axis((0, kk), "rk")
    d = compute((m, w.shape[0]), lambda i, j: te.sum(cast(A8[i, rk], I32) * cast(W[j, rk], I32), axis=[rk]),
                name="dense")
    ctx.schedule("dense", mb=1)                      # ignored on CUDA: dlight schedules the function
    return (lambda i, j: d[i, j]), za - s8_shift(A.dtype)
