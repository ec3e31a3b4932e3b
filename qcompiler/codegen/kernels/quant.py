"""Integer (quantized) kernels: QLinearConv/Gemm/Add/Mul/pools, Requantize, Quantize/DequantizeLinear,
and the quantization-aware variants of plain ops (MaxPool, Relu/Clip, Pad) on stored integers.

Every kernel computes exactly the formulas of :mod:`qcompiler.ir.ops` / :mod:`qcompiler.quant.reference`
(the oracle), bit for bit:

* the int32 accumulator of QLinearConv/QLinearGemm is ``Σ xq * wq`` on the *stored* integers
  (uint8/int8 widened to int32), the zero point folded at compile time into a per-channel int32
  constant ``bias_c - z_x * Σ_k w[c, k]``; padding stores ``z_x`` so that it contributes exactly
  ``z_x * w`` and cancels. ``Σ (x - z_x) w == Σ x w - z_x Σ w`` holds in modular int32 arithmetic,
  and the true accumulator fits int32 (the reference checks it), so wrap-around cannot change it.
* the requantization epilogue ``clamp(z_out + ((acc * m + 2^(s-1)) >> s), lo, hi)`` is computed in
  int64 (exact, arithmetic shift), or on x86 from the product's high word in int32 (exact, see
  :func:`.requant.narrow_shift_ok`), with per-channel ``m``/``s`` as compile-time arrays (or immediates
  when they are uniform), fused into the kernel's write-back.
* QuantizeLinear divides in float32 (like ONNX Runtime), rounds half to even (``nearbyint``),
  adds the zero point and saturates; NaN becomes 0 as in the reference (both written so that
  TVM vectorizes them: :func:`.requant.round_half_even`, :func:`_is_nan`).

Layouts are those of the float kernels (:mod:`.conv`): uint8/int8 activations NCHW{b}c, so the
same hand schedules (``conv2d``, ``depthwise``, ``pool``, ``dense``) register-block and vectorize
the int32 accumulators over output channels. On x86 with AVX2 or VNNI, QLinearConv (depthwise
excepted) and QLinearGemm accumulate on dot-product instructions instead (:mod:`.qdot`); the
zero-point fold then uses the zero point of the operand as that kernel stores it. The
target-only accumulators live with their target: CUDA's s8 x s8 GEMMs in :mod:`..cuda.int8` (and
float8 GEMMs in :mod:`..cuda.fp8`), x86's
int32 squeeze-excite multiply in :mod:`..x86.se_mul`.
"""
from __future__ import annotations

import numpy as np
from tvm import te, tirx

from ...ir.ops import REGISTRY
from ...ir.types import INT_RANGES, TensorType, is_fp8
from ...ir.types import quantize as np_quantize
from ...quant.requant import activation_clamp
from ..cuda import fp8 as cuda_fp8
from ..cuda import int8 as cuda_int8
from ..x86 import qwinograd, se_mul
from . import elementwise as kelem
from . import fp8 as kfp8
from . import qdot
from .conv import _attrs2d, _is_cuda, conv2d_accumulate, depthwise_int_exact_f32, pick_block
from .requant import (channel_vec, float_channel_vec, float_clamp_fn, folded_bias, hardswish_fn, is_cpu, is_x86,
                      requant_fn, requantized, round_half_even, wrapping_add)
from .tensor import (Buf, Lazy, LTensor, broadcast_index, cast, compute, const, divisor_at_most, linearize,
                     padded_extent, repeat_last)

I32, I64, F32 = "int32", "int64", "float32"
I16 = "int16"


def _mul(x, w):
    """x (uint8/int8) times w (int8) as int32: the product is formed in int16 (|x w| <= 255*128
    fits exactly), which LLVM vectorizes as 16-bit multiplies (vpmullw / vpmaddwd) instead of
    32-bit ones (vpmulld: half the throughput)."""
    return cast(cast(x, I16) * cast(w, I16), I32)


def _qp(ctx, i):
    return ctx.op.operands[i].type.quant


def _zp(ctx, i) -> int:
    return int(_qp(ctx, i).zero_point[0])


# ---- QLinearConv ----------------------------------------------------------------------------------
def qconv2d(ctx, a, ins, outs):
    """QLinearConv: the dot-product kernel of :mod:`.qdot` on x86 with AVX2/VNNI (3x3 stride-1 convs on
    ``vpmaddwd``: Winograd F(2x2, 3x3), :mod:`..x86.qwinograd`, bit-identical); depthwise convs
    on x86 the float32 kernel, exact while max|x|·Σ|w| < 2^24 (:func:`.conv.depthwise_int_exact_f32`);
    else the blocked conv with int16 products."""
    if is_fp8(ctx.op.operands[0].dtype):
        return (_is_cuda(ctx) and cuda_fp8.qconv2d(ctx, a, ins, outs)) or kfp8.qconv2d(ctx, a, ins, outs)
    x = ins[0]
    w = ctx.const_data(1)
    if w is None or x.rank != 4:
        raise NotImplementedError("QLinearConv needs a constant weight and a 2-D image input")
    zx = _zp(ctx, 0)
    bias = ctx.const_data(2)
    out_shape = outs[0].shape
    k, cg = w.shape[:2]
    isa = qdot.isa_of(ctx)
    depthwise = cg == 1 and k == a["group"] and k > 1
    hswish = (a.get("activation") or "") == "HardSwish"
    exact = depthwise_int_exact_f32(ctx, a, x, w, out_shape, zx, as_float=hswish) \
        if depthwise and is_x86(ctx) else None
    if _is_cuda(ctx) and a["group"] == 1:
        acc_at, zx = cuda_int8.conv_s8s8(ctx, a, x, w, out_shape, zx)
    elif exact is not None:
        acc_at = exact                      # float32 FMAs, exact: see :mod:`.conv`
    elif not depthwise and qdot.applicable(isa, x, w):
        kernel = qwinograd if qwinograd.applicable(isa, a, x, w) else qdot
        acc_at, zx = kernel.conv2d(ctx, a, x, w, out_shape, zx, isa)
    else:
        acc, bo = conv2d_accumulate(ctx, a, x, w, out_shape, _mul, fill=zx, name="qw")
        acc_at = Buf(acc, out_shape, I32, bo).at
    if exact is not None and hswish:
        return [_hardswish_on_float_acc(ctx, a, outs[0], w, bias, zx, exact)]
    return [requantized(ctx, a, outs[0], w, bias, zx, acc_at)]


def _hardswish_on_float_acc(ctx, a, out, w: np.ndarray, bias, z: int, acc_f) -> Lazy:
    """The HardSwish epilogue over the float32 accumulator of the exact depthwise kernel, without the
    round trip through int32: ``f32(acc + fold_c)`` is the float add ``acc_f + f32(fold_c)`` when
    fold_c is a float32 integer (|fold_c| <= 2^24): both operands exact, the add is rounded once,
    as the reference's conversion of the exact sum. Otherwise the int32 path of :func:`.requant.requantized`."""
    k = w.shape[0]
    fold = folded_bias(w, bias, z)
    if np.abs(fold).max(initial=0) > 2 ** 24:
        return requantized(ctx, a, out, w, bias, z, lambda idx: cast(acc_f(idx), I32))
    ff = float_channel_vec(ctx, [float(v) for v in fold], "qbias_f")
    rq = hardswish_fn(ctx, a, out, k)
    return Lazy(out.shape, out.dtype, lambda idx: rq(acc_f(idx) + ff(idx[1]), idx[1]))


# ---- QLinearGemm ----------------------------------------------------------------------------------
def qgemm(ctx, a, ins, outs):
    if is_fp8(ctx.op.operands[0].dtype):
        return (_is_cuda(ctx) and cuda_fp8.qgemm(ctx, a, ins, outs)) or kfp8.qgemm(ctx, a, ins, outs)
    A = ins[0]
    w = ctx.const_data(1)                       # N x K
    if w is None:
        raise NotImplementedError("QLinearGemm needs a constant weight")
    za = _zp(ctx, 0)
    bias = ctx.const_data(2)
    m, n = outs[0].shape
    kk = w.shape[1]
    isa = qdot.isa_of(ctx)
    if _is_cuda(ctx):
        acc_at, za = cuda_int8.dense_s8s8(ctx, A, w, za, m, kk)
    elif qdot.applicable(isa, A, w):
        acc_at, za = qdot.dense(ctx, A, w, za, isa)
    else:
        acc_at = _dense_int16(ctx, A, w, m, n, kk)
    return [requantized(ctx, a, outs[0], w, bias, za, lambda idx: acc_at(idx[0], idx[1]))]


# ---- dynamic int8: the activation quantized at run time ------------------------------------------
def dynamic_quant_params(ctx, a, ins, outs):
    """``DynamicQuantParams`` (:func:`qcompiler.quant.dynamic.row_params`): the activation's range per
    row (or over the tensor) in two reductions, over vectors of ``L`` lanes ("xpmin"/"xpmax",
    rows x L) and then across the lanes ("xmin"/"xmax"); the result row ``[s, 1/s, z]`` per row."""
    if _is_cuda(ctx):
        raise NotImplementedError("run-time activation quantization is built for x86 and arm; CUDA int8 is static")
    A = ins[0]
    m, kk = A.shape
    rows = outs[0].shape[0]
    L = divisor_at_most(kk, ctx.vw)

    def x_at(i, k):
        return cast(A.at((i, k)), F32)
    ko, ko2 = te.reduce_axis((0, kk // L), "ko"), te.reduce_axis((0, kk // L), "ko")
    if rows > 1:
        pmin = compute((rows, L), lambda i, l: te.min(x_at(i, ko * L + l), axis=[ko]), name="xpmin")
        pmax = compute((rows, L), lambda i, l: te.max(x_at(i, ko2 * L + l), axis=[ko2]), name="xpmax")
    else:
        ri, ri2 = te.reduce_axis((0, m), "ri"), te.reduce_axis((0, m), "ri")
        pmin = compute((1, L), lambda i, l: te.min(x_at(ri, ko * L + l), axis=[ri, ko]), name="xpmin")
        pmax = compute((1, L), lambda i, l: te.max(x_at(ri2, ko2 * L + l), axis=[ri2, ko2]), name="xpmax")
    rl, rl2 = te.reduce_axis((0, L), "rl"), te.reduce_axis((0, L), "rl")
    lo = compute((rows,), lambda i: te.min(pmin[i, rl], axis=[rl]), name="xmin")
    hi = compute((rows,), lambda i: te.max(pmax[i, rl2], axis=[rl2]), name="xmax")
    f0, f1 = tirx.const(0.0, F32), tirx.const(1.0, F32)
    cpu = is_cpu(ctx)

    def param(idx):
        i, c = idx
        lo0 = tirx.min(lo[i], f0)
        d = tirx.max(hi[i], f0) - lo0
        sc = tirx.Select(d == f0, f1, d / tirx.const(255.0, F32))
        r = f1 / sc
        z = tirx.max(tirx.min(round_half_even(-lo0 * r, cpu), tirx.const(255.0, F32)), f0)
        return tirx.Select(c == 0, sc, tirx.Select(c == 1, r, z))
    ctx.schedule("row_stats")
    return [Lazy(outs[0].shape, F32, param)]


def dynamic_qgemm(ctx, a, ins, outs):
    """``DynamicQLinearGemm(a, p, w[, bias])`` (:mod:`qcompiler.quant.dynamic`): ``a`` quantized to
    uint8 with its rows' ``p = [s, 1/s, z]`` inside the gemm's packing stage, the accumulator on the
    dot-product instructions of :func:`qgemm`, and the epilogue
    ``f32(acc - (z[m] + z_eff) Σ_k w[n, k]) * f32(s[m] s_w[n]) + bias[n]``."""
    A, P = ins[0], ins[1]
    w = ctx.const_data(2)                       # N x K int8
    if w is None:
        raise NotImplementedError("DynamicQLinearGemm needs a constant weight")
    if _is_cuda(ctx):
        raise NotImplementedError("run-time activation quantization is built for x86 and arm; CUDA int8 is static")
    m, n = outs[0].shape
    kk = w.shape[1]
    per_row = P.shape[0] > 1

    def p_at(i, c):
        return P.at((i if per_row else 0, c))
    cpu = is_cpu(ctx)

    def q_at(idx):
        v = round_half_even(cast(A.at(idx), F32) * p_at(idx[0], 1), cpu) + p_at(idx[0], 2)
        return cast(cast(tirx.max(tirx.min(v, tirx.const(255.0, F32)), tirx.const(0.0, F32)), I32), "uint8")
    Q = Lazy((m, kk), "uint8", q_at)
    isa = qdot.isa_of(ctx)
    if qdot.applicable(isa, Q, w):
        acc_at, zeff = qdot.dense(ctx, Q, w, 0, isa)
    else:
        acc_at, zeff = _dense_int16(ctx, Q, w, m, n, kk), 0
    colsum = channel_vec(ctx, qdot.wrap_int32(w.astype(np.int64).sum(axis=1)), I32, "qcolsum")
    sw = float_channel_vec(ctx, [float(v) for v in np.broadcast_to(
        np.asarray(ctx.op.operands[2].type.quant.scale, np.float32), (n,))], "qsw")
    bias = ctx.const_data(3)
    bv = float_channel_vec(ctx, [float(v) for v in bias.astype(np.float32)], "qb") if bias is not None else None
    clamp = float_clamp_fn(a)

    def out(idx):
        i, j = idx
        zi = cast(p_at(i, 2), I32) + tirx.const(zeff, I32)
        acc = wrapping_add(acc_at(i, j), -(zi * colsum(j)))
        y = cast(acc, F32) * (p_at(i, 0) * sw(j))
        return clamp(y + bv(j) if bv is not None else y)
    return [Lazy(outs[0].shape, F32, out)]


def _dense_int16(ctx, A, w, m, n, kk):
    """The plain int32 accumulator of A · w^T (int16 products, columns blocked by a vector)."""
    bn = pick_block(n, ctx.vw)
    if bn < ctx.vw and n > ctx.vw:
        bn = ctx.vw
    npad = -(-n // bn) * bn
    wmat = w.T                                   # K x N
    if npad != n:
        wmat = np.concatenate([wmat, np.zeros((kk, npad - n), w.dtype)], axis=1)
    wp = ctx.param(np.ascontiguousarray(wmat.reshape(kk, npad // bn, bn).transpose(1, 0, 2)), "qw_dense")
    rk = te.reduce_axis((0, kk), "rk")
    mpad = padded_extent(m, 8)      # whole register tiles (see linalg._dense); CUDA never comes here
    row = repeat_last(m, mpad)
    d = compute((mpad, npad // bn, bn), lambda i, no, ni: te.sum(
        _mul(A.at((row(i), rk)), wp[no, rk, ni]), axis=[rk]), name="dense")
    ctx.schedule("dense", mb=divisor_at_most(mpad, 8))
    return lambda i, j: d[i, j // bn, j % bn]


# ---- pools ----------------------------------------------------------------------------------------
def qglobal_avgpool(ctx, a, ins, outs):
    x = ins[0]
    if x.rank != 4:
        raise NotImplementedError(f"QLinearGlobalAveragePool of rank {x.rank}")
    n, c, h, w = x.shape
    b = x.block or 1
    zx = _zp(ctx, 0)
    rh, rw = te.reduce_axis((0, h), "rh"), te.reduce_axis((0, w), "rw")
    acc = compute((n, c // b, 1, 1, b), lambda i, co, y, xx, ci: te.sum(
        cast(x.at((i, co * b + ci, rh, rw)), I32), axis=[rh, rw]), name="pool")
    ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
    accb = Buf(acc, outs[0].shape, I32, b) if x.block else Buf(acc, outs[0].shape, I32, 0)
    rq = requant_fn(ctx, a, outs[0], None, ties_even=True)
    off = tirx.const(h * w * zx, I32)
    return [Lazy(outs[0].shape, outs[0].dtype, lambda idx: rq(accb.at(idx) - off))]


def qavgpool(ctx, a, ins, outs):
    x = ins[0]
    if x.rank != 4:
        raise NotImplementedError(f"QLinearAveragePool of rank {x.rank}")
    n, c, h, w = x.shape
    oh, ow = outs[0].shape[2:]
    kh, kw = a["kernel_shape"]
    (sh, sw), (dh, dw), (pt, pl, _, _) = _attrs2d(a)
    b = x.block or 1
    zx = tirx.const(_zp(ctx, 0), I32)
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")

    def body(i, co, y, xx, ci):
        iy, ix = y * sh - pt + rh * dh, xx * sw - pl + rw * dw
        ok = tirx.all(iy >= 0, iy < h, ix >= 0, ix < w)
        return te.sum(tirx.if_then_else(ok, cast(x.at((i, co * b + ci, iy, ix)), I32) - zx,
                                        tirx.const(0, I32)), axis=[rh, rw])
    acc = compute((n, c // b, oh, ow, b), body, name="pool")
    ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
    accb = Buf(acc, outs[0].shape, I32, b) if x.block else Buf(acc, outs[0].shape, I32, 0)
    rq = requant_fn(ctx, a, outs[0], None, ties_even=True)
    return [Lazy(outs[0].shape, outs[0].dtype, lambda idx: rq(accb.at(idx)))]


def maxpool(ctx, a, ins, outs, float_builder):
    """MaxPool: the float kernel, or on stored integers (padding with the storage minimum)."""
    x = ins[0]
    _no_fp8(ctx)
    if x.dtype not in INT_RANGES:
        return float_builder(ctx, a, ins, outs)
    if x.rank != 4:
        raise NotImplementedError(f"MaxPool of rank {x.rank}")
    n, c, h, w = x.shape
    oh, ow = outs[0].shape[2:]
    kh, kw = a["kernel_shape"]
    (sh, sw), (dh, dw), (pt, pl, _, _) = _attrs2d(a)
    b = x.block or 1
    low = const(INT_RANGES[x.dtype][0], x.dtype)
    rh, rw = te.reduce_axis((0, kh), "rh"), te.reduce_axis((0, kw), "rw")

    def body(i, co, y, xx, ci):
        iy, ix = y * sh - pt + rh * dh, xx * sw - pl + rw * dw
        ok = tirx.all(iy >= 0, iy < h, ix >= 0, ix < w)
        return te.max(tirx.if_then_else(ok, x.at((i, co * b + ci, iy, ix)), low), axis=[rh, rw])
    acc = compute((n, c // b, oh, ow, b), body, name="pool")
    ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
    return [Buf(acc, outs[0].shape, x.dtype, b if x.block else 0)]


def global_maxpool(ctx, a, ins, outs, float_builder):
    x = ins[0]
    _no_fp8(ctx)
    if x.dtype not in INT_RANGES:
        return float_builder(ctx, a, ins, outs)
    n, c, h, w = x.shape
    b = x.block or 1
    rh, rw = te.reduce_axis((0, h), "rh"), te.reduce_axis((0, w), "rw")
    acc = compute((n, c // b, 1, 1, b), lambda i, co, y, xx, ci: te.max(
        x.at((i, co * b + ci, rh, rw)), axis=[rh, rw]), name="pool")
    ctx.schedule("pool", reg_n=1, pad=False, block=x.block)
    return [Buf(acc, outs[0].shape, x.dtype, b if x.block else 0)]


# ---- elementwise ------------------------------------------------------------------------------------
def _per_axis(ctx, qp, rank):
    """(scale(idx), zero_point(idx)) accessors for per-tensor or per-channel params."""
    if qp.axis is None or len(qp.scale) == 1:
        sc, zp = float(qp.scale[0]), int(qp.zero_point[0])
        return (lambda idx: tirx.const(sc, F32)), (lambda idx: tirx.const(zp, I32))
    ax = qp.axis % rank
    sp = ctx.param(np.asarray(qp.scale, np.float32), "qscale", keep_dtype=True)
    zp = ctx.param(np.asarray(qp.zero_point, np.int32), "qzp")
    return (lambda idx: sp[idx[ax]]), (lambda idx: zp[idx[ax]])


def quantize_linear(ctx, a, ins, outs):
    (x,) = ins
    qp = outs[0].quant
    if is_fp8(qp.storage):
        return [kfp8.quantize_linear(ctx, x, qp, outs[0].dtype)]
    lut = _lookup_chain(ctx, qp)
    if lut is not None:
        return [lut]
    lo, hi = INT_RANGES[qp.storage]
    fsc, fzp = _per_axis(ctx, qp, x.rank)
    cpu = is_cpu(ctx)

    def fn(idx):
        v = cast(x.at(idx), F32)
        y = round_half_even(v / fsc(idx), cpu) + cast(fzp(idx), F32)
        y = tirx.max(tirx.min(y, const(hi, F32)), const(lo, F32))
        return tirx.Select(_is_nan(v), tirx.const(0, I32), cast(y, I32))
    return [Lazy(x.shape, outs[0].dtype, fn)]


def _is_nan(v):
    """``isnan(v)`` for float32 on the bits, ``|bits| > 0x7f800000`` (exponent all ones, mantissa
    not 0): integer compares vectorize, ``tirx.isnan`` does not (see :func:`.requant.round_half_even`),
    and TVM's simplifier folds ``v != v`` to false."""
    bits = tirx.bitwise_and(tirx.reinterpret(I32, v), tirx.const(0x7FFFFFFF, I32))
    return bits > tirx.const(0x7F800000, I32)


# float islands between integers: DequantizeLinear -> unary float ops -> QuantizeLinear
_LUT_KINDS = frozenset(kelem.UNARY) | {"Add", "Sub", "Mul", "Div"}


def _lookup_chain(ctx, qp):
    """QuantizeLinear(f(DequantizeLinear(q))) with f a chain of element-wise float ops (HardSwish,
    Sigmoid, ...; other operands scalar constants) and q a per-tensor 8-bit value built in this
    kernel: the stored output depends only on q's 256 values, so it is a table lookup. The table is
    computed at compile time by the oracle itself (:func:`qcompiler.quant.reference.evaluate_op`
    on all 256 values), as TFLite and ONNX Runtime do for int8 activations. Pure index maps in the
    chain (nearest Resize, reshapes, Transpose, Slice, Expand: each output element is one input
    element) commute with the element-wise ops and are applied to the stored integers, so
    Q(Resize(DQ(q))) feeding an int8 Concat (the FPN of rapidocr-det) is an integer gather plus a
    table (none when the table is the identity: equal params). Returns the Lazy result, or None
    when the pattern does not apply."""
    chain, moves, v = [], [], ctx.op.operands[0]
    while v.producer is not None and v.producer.kind != "DequantizeLinear":
        p = v.producer
        if _is_move(p):
            moves.append(p)
            v = p.operands[0]
            continue
        if (p.kind not in _LUT_KINDS or len(p.results) != 1 or p.operands[0] is None
                or any(not (o.is_const and o.data.size == 1) for o in p.operands[1:])):
            return None
        chain.append(p)
        v = p.operands[0]
    dq = v.producer
    src = getattr(ctx, "qsources", {}).get(id(v))
    qin = dq.operands[0].type.quant if dq is not None else None
    if (src is None or qin is None or len(qin.scale) != 1 or qin.storage not in ("uint8", "int8")
            or len(qp.scale) != 1 or qp.storage not in ("uint8", "int8")):
        return None
    from ...quant import reference
    lo, hi = INT_RANGES[qin.storage]
    vals = np.arange(lo, hi + 1).astype(qin.storage)
    shape = tuple(v.shape) or (1,)
    size = int(np.prod(shape))
    table = []
    for start in range(0, vals.size, size):           # a value smaller than 256 elements: in rounds
        chunk = vals[start:start + size]
        y = reference.evaluate_op(dq, [np.resize(chunk, shape)])[0]
        for op in reversed(chain):
            y = reference.evaluate_op(op, [y] + [o.data for o in op.operands[1:]])[0]
        y = reference.evaluate_op(_as_elementwise(ctx.op, y.shape), [y])[0]
        table.append(np.asarray(y).reshape(-1)[:chunk.size])
    table = np.concatenate(table)
    for p in reversed(moves):                          # the data movement, on the stored integers
        from .shape import BUILDERS as MOVE_BUILDERS
        attrs = {**REGISTRY[p.kind].defaults, **p.attrs}
        src = MOVE_BUILDERS[p.kind](ctx, attrs, [src], [TensorType(p.result.shape, src.dtype)])[0]
    if np.array_equal(table, vals.astype(np.int64)) and qin.storage == qp.storage:
        return src                                      # the identity: a pure index map
    tab = ctx.param(table.astype(qp.storage), "lut")    # the stored values: 1 byte an entry
    off = tirx.const(-lo, I32)
    return Lazy(src.shape, ctx.op.result.type.dtype, lambda idx: tab[cast(src.at(idx), I32) + off])


_MOVES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose", "Slice", "Expand", "Resize"})


def _is_move(op) -> bool:
    """A pure index map (each output element is one input element), which commutes with the
    element-wise chain: nearest Resize, reshapes, Transpose, Slice, Expand."""
    if op.kind not in _MOVES or len(op.results) != 1 or op.operands[0] is None:
        return False
    if op.kind == "Resize":
        return op.attrs.get("mode", "nearest") == "nearest"
    return all(o.is_const for o in op.operands[1:])


def _as_elementwise(q_op, shape):
    """The QuantizeLinear op evaluated on a table-shaped operand (its params are per tensor)."""
    if tuple(q_op.operands[0].shape) == tuple(shape):
        return q_op
    from ...ir.graph import Graph
    g = Graph("lut")
    x = g.add_input("x", TensorType(tuple(shape), q_op.operands[0].dtype))
    return g.create_op(q_op.kind, [x], dict(q_op.attrs),
                       result_types=[TensorType(tuple(shape), q_op.result.dtype, q_op.result.type.quant)])


def dequantize_linear(ctx, a, ins, outs):
    (x,) = ins
    qp = ctx.op.operands[0].type.quant
    if not hasattr(ctx, "qsources"):
        ctx.qsources = {}
    ctx.qsources[id(ctx.op.result)] = x
    if is_fp8(qp.storage):
        return [kfp8.dequantize_linear(ctx, x, qp, outs[0].dtype)]
    fsc, fzp = _per_axis(ctx, qp, x.rank)
    return [Lazy(x.shape, outs[0].dtype,
                 lambda idx: cast(cast(x.at(idx), I32) - fzp(idx), F32) * fsc(idx))]


def qadd(ctx, a, ins, outs):
    A, B = ins
    za, zb = tirx.const(_zp(ctx, 0), I64), tirx.const(_zp(ctx, 1), I64)
    ma, mb = (tirx.const(int(m), I64) for m in a["multiplier"])
    rq = requant_fn(ctx, dict(a, multiplier=[1]), outs[0], None)
    shape = outs[0].shape

    def fn(idx):
        va = (cast(A.at(broadcast_index(idx, A.shape)), I64) - za) * ma
        vb = (cast(B.at(broadcast_index(idx, B.shape)), I64) - zb) * mb
        return rq(va + vb)
    return [Lazy(shape, outs[0].dtype, fn)]


def qmul(ctx, a, ins, outs):
    """QLinearMul: ``rq((aq - z_a) * (bq - z_b))`` with numpy broadcasting (the squeeze-excite
    gate N x C x 1 x 1 against N x C x H x W). The product is formed in int32 (|p| <= 255^2 < 2^17),
    so the int64 requantization multiplies a sign-extended int32 by an int32 multiplier."""
    A, B = ins
    shape = outs[0].shape
    fast = se_mul.se_mul(ctx, a, ins, outs[0]) if is_x86(ctx) else None
    if fast is not None:
        return [fast]
    za, zb = tirx.const(_zp(ctx, 0), I32), tirx.const(_zp(ctx, 1), I32)
    rq = requant_fn(ctx, a, outs[0], None)
    A, B = _hoisted(A, shape, "hoist_a"), _hoisted(B, shape, "hoist_b")

    def fn(idx):
        va = cast(A.at(broadcast_index(idx, A.shape)), I32) - za
        vb = cast(B.at(broadcast_index(idx, B.shape)), I32) - zb
        return rq(va * vb)
    return [Lazy(shape, outs[0].dtype, fn)]


def _hoisted(x: LTensor, out_shape, name: str) -> LTensor:
    """A broadcast operand computed in this kernel (a :class:`Lazy`, e.g. the squeeze-excite gate
    Q(HardSigmoid(DQ(s))) of N x C x 1 x 1, a table lookup) as a stage of its own, computed once
    per element of *its* shape and read by the main loop as a plain array: inlined, the lookup is
    recomputed for every element of the output, and its table index vectorizes to a scalarized
    gather (rapidocr-cls's 1x200x2x96 gate multiply, 1 thread: 81 us inlined, 26 us hoisted). The stage's name
    starts with "hoist", which the x86 ``generic`` schedule keeps instead of inlining."""
    size, full = int(np.prod(x.shape or (1,))), int(np.prod(out_shape or (1,)))
    if isinstance(x, Buf) or size >= full:
        return x
    t = compute(x.shape, lambda *i: x.at(i), name=name)
    return Buf(t, x.shape, x.dtype)


def requantize(ctx, a, ins, outs):
    (x,) = ins
    z = tirx.const(_zp(ctx, 0), I32)
    rq = requant_fn(ctx, a, outs[0], None)
    return [Lazy(x.shape, outs[0].dtype, lambda idx: rq(cast(x.at(idx), I32) - z))]


def relu_clip(ctx, a, ins, outs, float_builder):
    """Relu/Clip on quantized values clamp at Q(0) / [Q(min), Q(max)] of the operand's params."""
    qp = ctx.op.operands[0].type.quant
    _no_fp8(ctx)
    if qp is None:
        return float_builder(ctx, a, ins, outs)
    (x,) = ins
    kind = ctx.op.kind
    lo, hi = activation_clamp(kind, [a["min"], a["max"]] if kind == "Clip" else [], qp)
    lo_c, hi_c = tirx.const(lo, I32), tirx.const(hi, I32)
    return [Lazy(x.shape, outs[0].dtype,
                 lambda idx: tirx.max(tirx.min(cast(x.at(idx), I32), hi_c), lo_c))]


def _no_fp8(ctx) -> None:
    """Plain ops on float8 values (the stored bits) are not lowered: the quantize pass and fold-qdq
    leave them float (a QDQ model's MaxPool between float8 Q and DQ would come here)."""
    if any(is_fp8(v.dtype) for v in ctx.op.operands):
        raise NotImplementedError(f"{ctx.op.kind} on float8 values (only float8 Conv/Gemm/MatMul, "
                                  "QuantizeLinear and DequantizeLinear are lowered)")


def pad(ctx, a, ins, outs, float_builder):
    _no_fp8(ctx)
    qp = ctx.op.operands[0].type.quant
    if qp is not None and a["mode"] == "constant":
        a = dict(a, value=int(np_quantize(np.float32(a.get("value", 0.0) or 0.0), qp).item()))
    return float_builder(ctx, a, ins, outs)


ANCHOR_BUILDERS = {
    "QLinearConv": qconv2d, "QLinearGemm": qgemm, "DynamicQLinearGemm": dynamic_qgemm,
    "DynamicQuantParams": dynamic_quant_params,
    "QLinearGlobalAveragePool": qglobal_avgpool, "QLinearAveragePool": qavgpool,
}
LAZY_BUILDERS = {
    "QuantizeLinear": quantize_linear, "DequantizeLinear": dequantize_linear,
    "QLinearAdd": qadd, "QLinearMul": qmul, "Requantize": requantize,
}
ANCHORS = frozenset(ANCHOR_BUILDERS)
ELEMENTWISE = frozenset(LAZY_BUILDERS)
