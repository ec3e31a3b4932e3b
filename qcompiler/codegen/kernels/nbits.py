"""Weight-only 4-bit kernels (CPU): ``MatMulNBits`` and ``GatherBlockQuantized``
(:mod:`qcompiler.ir.nbits_ops`), reading the weights packed two per byte.

MatMulNBits ``y = a · ŵᵀ`` (``a [M, K]`` float, ``w [N, K]`` blocked along K by ``B``) is the dense
kernel of :mod:`.linalg` with the weight decoded where the inner loop loads it: the artifact holds

* ``wp`` uint8 ``[N/bn, K/2, bn]``: byte ``(c, h, j)`` = ``u[c·bn + j, 2h] | u[c·bn + j, 2h + 1] << 4``,
  ``u`` the stored value as unsigned (uint4 ``q``; int4 ``q + 8`` with zero point 8), so one load of
  ``bn`` bytes (a vector of output columns) serves two values of k;
* ``s`` ``[N/bn, K/B, bn]`` float32 (or float16 bits, decoded to float32) and ``zp`` uint8
  ``[N/bn, ceil(K/B/2), bn]`` (two blocks per byte; none for int4: z = 8);

and the reduction runs over (block ``kb``, byte ``kh`` of the block, nibble ``kn``)::

    acc[m, c, j] += a[m, kb·B + 2kh + kn] · f32((wp[c, kb·B/2 + kh, j] >> 4kn) & 15 − z[c, kb, j]) · s[c, kb, j]

in float32, the schedule's register tile of ``mb`` rows by ``bn`` columns (``dense``: the nibble
loop unrolled, the scale and zero point of a block loop-invariant below ``kb``). The weight
value is the reference's exactly (an integer times a float32 scale, rounded once); only the
summation order differs, so the result is within ``K · 2^-24 · Σ_k |a ŵ|`` of the reference's
(float64 sum rounded once). No float copy of the weights exists in the artifact or at run time.
Columns are padded to ``bn`` (u = z: weight 0), rows as the dense kernel pads them; a K that no
block divides (a short last block) reduces over k < K in one loop, the block index ``k // B``.

GatherBlockQuantized reads the table packed along its rows (``[V, D/2]``, the same nibble order),
scales ``[V, D/B]`` and zero points ``[V, ceil(D/B/2)]``, decoding each element of the gathered
rows where its consumer (the embedding's Add and LayerNorm) reads it.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ...ir.nbits_ops import pack
from ..target import Family
from .conv import pick_block
from .linalg import ROW_TILE, _padded
from .tensor import Buf, Lazy, cast, compute, divisor_at_most, linearize, repeat_last, unravel

F32, I32, U8 = "float32", "int32", "uint8"


def _i(v: int):
    return tirx.const(int(v), I32)


def _unsigned(ctx, i: int) -> tuple[np.ndarray, object, int | None]:
    """Operand ``i`` (a constant 4-bit weight): its values as unsigned nibbles, its params, and the
    zero point every block shares (8 for int4; None: per block)."""
    v = ctx.op.operands[i]
    if not v.is_const:
        raise NotImplementedError(f"{ctx.op.kind} needs a constant weight")
    qp = v.type.quant
    if qp.storage not in ("int4", "uint4"):
        raise NotImplementedError(f"{ctx.op.kind} of {qp.storage} weights (only 4-bit ones are lowered)")
    if len(ctx.op.operands) > 2 and not ctx.op.operands[2].is_const:
        raise NotImplementedError(f"{ctx.op.kind} with a bias computed at run time")
    if qp.storage == "int4":
        return (v.data.astype(np.int16) + 8).astype(np.uint8), qp, 8
    return v.data.astype(np.uint8), qp, None


def _scale_param(ctx, s: np.ndarray, qp, name: str):
    """The scales as a kernel argument and a reader giving float32: float16 ones stored as their
    bits (uint16, 2 bytes each: the lowering would otherwise re-type a float array)."""
    if qp.scale_dtype == "float16":
        p = ctx.param(np.ascontiguousarray(s.astype(np.float16).view(np.uint16)), name)
        return lambda *i: cast(tirx.reinterpret("float16", p[i]), F32)
    p = ctx.param(np.ascontiguousarray(s.astype(np.float32)), name, keep_dtype=True)
    return lambda *i: p[i]


def _packed_pairs(z: np.ndarray) -> np.ndarray:
    """Zero points ``[..., nb, bn]`` two blocks per byte along ``nb``: ``[..., ceil(nb/2), bn]``."""
    return np.moveaxis(pack(np.moveaxis(z, -2, -1)), -1, -2)


def _row_tile(ctx) -> int:
    """Rows of the register tile: 16 where there are 32 vector registers (AVX-512, NEON): 16
    accumulators share each decoded weight vector (its decode, ~5 instructions, then costs a third
    of the 16 FMAs; 8 rows: 0.88 ms against 0.75 for 128x384 @ 384x1536 on Zen 4, fp32 dense 0.66),
    else the dense kernel's 8 (AVX2's 16 registers)."""
    return 2 * ROW_TILE if ctx.vw >= 16 or ctx.spec.family is Family.ARM else ROW_TILE


def _nibble(byte, shift):
    return tirx.bitwise_and(tirx.shift_right(cast(byte, I32), shift), _i(15))


def matmul_nbits(ctx, a, ins, outs):
    A = ins[0]
    u, qp, z_all = _unsigned(ctx, 1)
    bias = ctx.const_data(2)
    n, k = u.shape
    blk = qp.block_size
    nb = -(-k // blk)
    out_shape = outs[0].shape
    m = int(np.prod(A.shape[:-1]))
    lead = A.shape[:-1]
    a2 = A if A.rank == 2 else Lazy((m, k), A.dtype, lambda idx: A.at(unravel(idx[0], lead) + (idx[1],)))
    mpad = _padded(ctx, m, ROW_TILE)
    bn = pick_block(n, ctx.vw)
    if bn < ctx.vw and n > ctx.vw:
        bn = ctx.vw
    npad = -(-n // bn) * bn
    kpad = k + (k % 2)
    full = np.full((npad, kpad), z_all or 0, np.uint8)      # padded columns: u = z, weight 0
    full[:n, :k] = u
    sp = np.ones((npad, nb), np.float32)
    sp[:n] = qp.scale_array().reshape(n, nb)
    zp = np.zeros((npad, nb), np.uint8)
    if z_all is None:
        zp[:n] = np.asarray(qp.zero_point, np.uint8).reshape(n, nb)
    wp = ctx.param(np.ascontiguousarray(pack(full).reshape(npad // bn, bn, kpad // 2).transpose(0, 2, 1)), "w_nbits")
    scale = _scale_param(ctx, sp.reshape(npad // bn, bn, nb).transpose(0, 2, 1), qp, "s_nbits")
    if z_all is not None:
        zero = lambda c, kb, j: _i(z_all)        # noqa: E731
    else:
        zt = ctx.param(np.ascontiguousarray(_packed_pairs(zp.reshape(npad // bn, bn, nb).transpose(0, 2, 1))), "z_nbits")
        zero = lambda c, kb, j: _nibble(zt[c, kb // 2, j], (kb % 2) * 4)     # noqa: E731
    row = repeat_last(m, mpad)

    def w(c, j, byte_k, shift, kb):
        q = _nibble(wp[c, byte_k, j], shift) - zero(c, kb, j)
        return cast(q, F32) * scale(c, kb, j)

    if k % blk == 0:                      # blocks whole: (kb, kh, kn), the block's params invariant below kb
        rkb, rkh, rkn = te.reduce_axis((0, nb), "rkb"), te.reduce_axis((0, blk // 2), "rkh"), te.reduce_axis((0, 2), "rkn")
        d = compute((mpad, npad // bn, bn), lambda i, c, j: te.sum(
            a2.at((row(i), rkb * blk + rkh * 2 + rkn)) * w(c, j, rkb * (blk // 2) + rkh, rkn * 4, rkb),
            axis=[rkb, rkh, rkn]), name="dense")
        ctx.schedule("dense", mb=divisor_at_most(mpad, _row_tile(ctx)), unroll_last=True)
    else:
        rk = te.reduce_axis((0, k), "rk")
        d = compute((mpad, npad // bn, bn), lambda i, c, j: te.sum(
            a2.at((row(i), rk)) * w(c, j, rk // 2, (rk % 2) * 4, rk // blk), axis=[rk]), name="dense")
        ctx.schedule("dense", mb=divisor_at_most(mpad, _row_tile(ctx)))
    rows = int(np.prod(out_shape[:-1]))
    acc = Buf(d, out_shape, F32) if npad == n and mpad == m else Lazy(
        out_shape, F32, lambda idx: d[linearize(idx[:-1], out_shape[:-1]) if rows > 1 else 0, idx[-1] // bn, idx[-1] % bn])
    if bias is None:
        return [acc]
    bv = ctx.param(np.asarray(bias, np.float32), "b_nbits", keep_dtype=True)
    return [Lazy(out_shape, F32, lambda idx: acc.at(idx) + bv[idx[-1]])]


def gather_block_quantized(ctx, a, ins, outs):
    ind = ins[1]
    u, qp, z_all = _unsigned(ctx, 0)
    v, dim = u.shape
    blk = qp.block_size
    nb = -(-dim // blk)
    tp = ctx.param(pack(u), "t_nbits")
    scale = _scale_param(ctx, qp.scale_array().reshape(v, nb), qp, "ts_nbits")
    if z_all is None:
        zt = ctx.param(pack(np.asarray(qp.zero_point, np.uint8).reshape(v, nb)), "tz_nbits")
    k = ind.rank

    def fn(idx):
        r = cast(ind.at(tuple(idx[:k])), I32)
        r = tirx.Select(r < 0, r + _i(v), r)
        d = idx[k]
        b = d // blk
        z = _i(z_all) if z_all is not None else _nibble(zt[r, b // 2], (b % 2) * 4)
        q = _nibble(tp[r, d // 2], (d % 2) * 4) - z
        return cast(q, F32) * scale(r, b)
    return [Lazy(outs[0].shape, F32, fn)]


def conv_nbits(ctx, a, ins, outs):
    """ConvNBits: the blocked float32 conv (:func:`.conv.conv2d_accumulate`, the input packed
    NCHW{bi}c as for any conv) with the weight decoded at its load, one vector of ``bo`` output
    channels at a time: bytes ``[K/bo, C/bi, kh, kw, bi/2, bo]`` (two input channels a byte), scales
    and zero points (two blocks a byte) ``[K/bo, ceil(C/B), kh, kw, bo]``, invariant over the input
    channels of a block (B a multiple of bi)."""
    from .conv import conv2d_accumulate
    x = ins[0]
    u, qp, z_all = _unsigned(ctx, 1)
    o, cg, r, sw = u.shape
    blk = qp.block_size
    nbc = -(-cg // blk)
    s4 = qp.scale_array().reshape(o, nbc, r, sw)
    z4 = np.asarray(qp.zero_point, np.uint8).reshape(o, nbc, r, sw)

    def weight_at(w, bo, bi):
        kp = w.shape[0]                                           # output channels padded by the conv
        u6 = w.reshape(kp // bo, bo, cg // bi, bi, r, sw).transpose(0, 2, 4, 5, 3, 1)
        wp = ctx.param(np.ascontiguousarray(np.moveaxis(pack(np.moveaxis(u6, 4, -1)), -1, 4)), "w_cnbits")
        sp = np.zeros((kp, nbc, r, sw), np.float32)              # padded channels: scale 0, weight 0
        sp[:o] = s4
        scale = _scale_param(ctx, np.ascontiguousarray(sp.reshape(kp // bo, bo, nbc, r, sw).transpose(0, 2, 3, 4, 1)),
                             qp, "s_cnbits")
        if z_all is None:
            zp = np.zeros((kp, nbc, r, sw), np.uint8)
            zp[:o] = z4
            zt = ctx.param(np.ascontiguousarray(np.moveaxis(pack(np.moveaxis(
                zp.reshape(kp // bo, bo, nbc, r, sw).transpose(0, 2, 3, 4, 1), 1, -1)), -1, 1)), "z_cnbits")

        def at(ko, ico, rh, rw, ici, ki):
            cb = (ico * bi + ici) // blk
            z = _i(z_all) if z_all is not None else _nibble(zt[ko, cb // 2, rh, rw, ki], (cb % 2) * 4)
            q = _nibble(wp[ko, ico, rh, rw, ici // 2, ki], (ici % 2) * 4) - z
            return cast(q, F32) * scale(ko, cb, rh, rw, ki)
        return at

    out_shape = outs[0].shape
    acc, bo = conv2d_accumulate(ctx, a, x, u, out_shape, lambda p, q: cast(p, F32) * q, name="cnbits",
                                weight_at=weight_at)
    accb = Buf(acc, out_shape, F32, bo)
    bias = ctx.const_data(2)
    if bias is None:
        return [accb]
    bv = ctx.param(np.asarray(bias, np.float32), "cb_nbits", keep_dtype=True)
    return [Lazy(out_shape, F32, lambda idx: accb.at(idx) + bv[idx[1]])]


ANCHOR_BUILDERS = {"MatMulNBits": matmul_nbits, "ConvNBits": conv_nbits}
LAZY_BUILDERS = {"GatherBlockQuantized": gather_block_quantized}
