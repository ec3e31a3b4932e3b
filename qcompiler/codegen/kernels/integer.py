"""ConvInteger and MatMulInteger (pre-quantized ONNX models): int32 results in integer arithmetic.

Formulas of :mod:`qcompiler.ir.ops` (and the numpy kernels of :mod:`qcompiler.ir.interp`), exact:

* ``ConvInteger``  y = Σ (x - z_x)(w - z_w[c]). The weight is a compile-time constant. On CPUs with
  an int8 dot product (:mod:`.qdot`: VNNI, vpmaddwd, sdot) a non-depthwise conv runs there, its
  weight split as for MatMulInteger below (per output channel; the ``Σ (x - z_x)`` term, group 1
  only, from one more output channel of ones), padding storing z_x, a constant or the run-time
  scalar DynamicQuantizeLinear computes. Elsewhere ``w' = w - z_w`` is packed as int16
  (|w'| <= 255): with a constant ``z_x`` QLinearConv's accumulator, ``Σ x w'`` on the stored x
  (padding stores z_x) plus the folded per-channel int32 ``-z_x Σ w'_c``, exact in wrapping int32
  arithmetic; with a run-time ``z_x`` the shifted ``x - z_x`` (int16) is packed, padding with 0.
  Products are formed in int16 where |x|·max|w'| < 2^15 (as QLinearConv's), else in int32.
* ``MatMulInteger``  y = (a - z_a) @ (b - z_b). With a constant 2-D b the rows of ``a`` (the leading
  dimensions flattened) go to the int8 gemm of :func:`.qdot.dense` (VNNI/sdot dot products). Its
  weight must be int8: ``b - z_b`` where that fits (ONNX Runtime's int8 weights with z_b = 0),
  else ``b - 128`` for uint8 b (any z_b: ``b - z_b = (b - 128) + (128 - z_b)``), whose second
  term is ``(128 - z_b[n]) Σ_k (a - z_a)``, the row sum coming from one more weight column of ones.
  The gemm sums ``a' = a + shift``, the stored operand (:func:`.qdot.effective_zp`), and the zero
  point is taken off in the epilogue, ``- (z_a + shift) Σ_k (b - z_b)[k, n]``: the same int32 sums
  modulo 2^32 with a run-time z_a (DynamicQuantizeLinear's). Otherwise the differences and
  products in int32, summed in int32.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from . import qdot
from .conv import _is_cuda, conv2d_accumulate
from .quant import _mul
from .requant import channel_vec, wrapping_add
from .tensor import Buf, Lazy, broadcast_index, cast, compute

I16, I32 = "int16", "int32"
_XMAX = {"uint8": 255, "int8": 128}


def _scalar_at(t):
    return t.at((0,) * t.rank)


def _mul32(p, q):
    return cast(p, I32) * cast(q, I32)


def _conv_integer_dot(ctx, a, x, s: np.ndarray, d: np.ndarray, zx, out_shape, isa) -> Lazy:
    """``Σ (x - z_x)(s + d[c])`` (s: K x C/g x R x S int8, d one integer per output channel; z_x an
    int or a run-time int32 scalar) on the dot-product conv of :func:`.qdot.conv2d`, padding
    storing z_x. Where d != 0 (group 1) one more output channel of ones gives the window sum
    ``Σ x'`` of the stored operand ``x' = x + shift``; with ``z = z_x + shift`` and n = C·R·S taps:
    ``y = acc + d[c] Σ x' - z (Σ s[c] + n d[c])``, exact modulo 2^32."""
    k = s.shape[0]
    taps = int(np.prod(s.shape[1:]))
    w = s
    if d.any():
        w = np.concatenate([s, np.ones((1, *s.shape[1:]), np.int64)])
    n, _, oh, ow = out_shape
    acc_at, zeff = qdot.conv2d(ctx, a, x, w.astype(np.int8), (n, w.shape[0], oh, ow), zx, isa)
    colsum = channel_vec(ctx, qdot.wrap_int32(s.reshape(k, -1).sum(axis=1) + taps * d), I32, "qcolsum")
    dv = channel_vec(ctx, qdot.wrap_int32(d), I32, "qzw") if d.any() else None
    zv = tirx.const(zeff, I32) if isinstance(zeff, int) else zeff

    def out(idx):
        acc = acc_at(idx)
        if dv is not None:
            acc = wrapping_add(acc, dv(idx[1]) * acc_at((idx[0], tirx.const(k, I32), idx[2], idx[3])))
        return wrapping_add(acc, -(zv * colsum(idx[1])))
    return Lazy(out_shape, I32, out)


def conv_integer(ctx, a, ins, outs):
    x, zx = ins[0], ins[2]
    w, zw = ctx.const_data(1), ctx.const_data(3)
    if w is None or zw is None:
        raise NotImplementedError("ConvInteger needs a constant weight and weight zero point")
    if x.rank != 4:
        raise NotImplementedError(f"ConvInteger of rank {x.rank} (only 2-D convolution is lowered)")
    out_shape = outs[0].shape
    k = w.shape[0]
    z = ctx.scalar_value(2)
    isa = None if _is_cuda(ctx) else qdot.isa_of(ctx)
    s, d = _int8_weight(w, zw, 0)
    depthwise = w.shape[1] == 1 and k == a["group"] and k > 1
    if not depthwise and (a["group"] == 1 or not d.any()) and qdot.applicable(isa, x, s.astype(np.int8)):
        return [_conv_integer_dot(ctx, a, x, s, d, int(z) if z is not None else cast(_scalar_at(zx), I32),
                                  out_shape, isa)]
    zw64 = zw.astype(np.int64).reshape(-1, *([1] * (w.ndim - 1))) if zw.size > 1 else np.int64(zw.reshape(-1)[0])
    ws = (w.astype(np.int64) - zw64).astype(np.int16)
    wmax = int(np.abs(ws.astype(np.int64)).max(initial=0))
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


def _rows(A):
    """``A`` (..., M, K) as its (rows, K) matrix, the leading dimensions flattened (row-major)."""
    lead = A.shape[:-1]
    if len(lead) == 1:
        return A

    def at(idx):
        i, k, rest = idx[0], idx[1], []
        for d in reversed(lead):
            rest.append(i % d)
            i = i // d
        return A.at(tuple(reversed(rest)) + (k,))
    return Lazy((int(np.prod(lead)), A.shape[-1]), A.dtype, at)


def _int8_weight(b: np.ndarray, zb: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """``b - z_b`` (z_b a scalar or one per index of ``axis``) as ``s + d`` with ``s`` int8 and ``d``
    one integer per index of ``axis``: ``s = b - z_b`` where that fits int8 (d = 0), else ``s = b - c``
    with c = 128 for uint8 b, 0 for int8 b (always int8) and ``d = c - z_b``. int64 arrays."""
    n = b.shape[axis]
    z = np.broadcast_to(zb.astype(np.int64).reshape(-1), (n,))
    at = [1] * b.ndim
    at[axis] = n
    bs = b.astype(np.int64) - z.reshape(at)
    if bs.size == 0 or (bs.min() >= -128 and bs.max() <= 127):
        return bs, np.zeros(n, np.int64)
    c = 128 if b.dtype == np.uint8 else 0
    return b.astype(np.int64) - c, c - z


def _matmul_integer_dot(ctx, A, s: np.ndarray, d: np.ndarray, za, out_shape, isa):
    """``(A - z_a) @ (s + d)`` (s: K x N int8, d: one integer per column, constants) on the int8 gemm
    of :func:`.qdot.dense`. The gemm gives ``acc = Σ_k a' s`` on the stored ``a' = a + shift``, and,
    where d != 0, ``Σ_k a'`` from one more weight column of ones; with z = z_a + shift:
    ``y = acc + d[n] Σ_k a' - z Σ_k (s + d)[k, n]``, exact modulo 2^32."""
    kk, nn = s.shape
    w = s.T
    if d.any():
        w = np.concatenate([w, np.ones((1, kk), np.int64)])
    acc_at, shift = qdot.dense(ctx, _rows(A), np.ascontiguousarray(w.astype(np.int8)), 0, isa)
    colsum = channel_vec(ctx, qdot.wrap_int32(s.sum(axis=0) + kk * d), I32, "qcolsum")
    dv = channel_vec(ctx, qdot.wrap_int32(d), I32, "qzb") if d.any() else None
    per_row = int(np.prod(za.shape)) > 1
    lead = out_shape[:-1]

    def out(idx):
        r, j = idx[0], idx[-1]
        for e, i in zip(lead[1:], idx[1:-1]):
            r = r * e + i
        z = cast(za.at((idx[-2],) if per_row else (0,) * za.rank), I32) + tirx.const(shift, I32)
        acc = acc_at(r, j)
        if dv is not None:
            acc = wrapping_add(acc, dv(j) * acc_at(r, tirx.const(nn, I32)))
        return wrapping_add(acc, -(z * colsum(j)))
    return [Lazy(tuple(out_shape), I32, out)]


def matmul_integer(ctx, a, ins, outs):
    A, B, za, zb = ins
    out_shape = outs[0].shape
    bdata, zbd = ctx.const_data(1), ctx.const_data(3)
    if bdata is not None and zbd is not None and bdata.ndim == 2:
        isa = None if _is_cuda(ctx) else qdot.isa_of(ctx)
        s, d = _int8_weight(bdata, zbd, 1)
        if qdot.applicable(isa, A, s.astype(np.int8)):
            return _matmul_integer_dot(ctx, A, s, d, za, out_shape, isa)
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
