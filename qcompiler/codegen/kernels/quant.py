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
  :func:`_narrow_shift_ok`), with per-channel ``m``/``s`` as compile-time arrays (or immediates
  when they are uniform), fused into the kernel's write-back.
* QuantizeLinear divides in float32 (like ONNX Runtime), rounds half to even (``nearbyint``),
  adds the zero point and saturates; NaN becomes 0 as in the reference (both written so that
  TVM vectorizes them: :func:`_round_half_even`, :func:`_is_nan`).

Layouts are those of the float kernels (:mod:`.conv`): uint8/int8 activations NCHW{b}c, so the
same hand schedules (``conv2d``, ``depthwise``, ``pool``, ``dense``) register-block and vectorize
the int32 accumulators over output channels. On x86 with AVX2 or VNNI, QLinearConv (depthwise
excepted) and QLinearGemm accumulate on dot-product instructions instead (:mod:`.qdot`); the
zero-point fold then uses the zero point of the operand as that kernel stores it.
"""
from __future__ import annotations

import os

import numpy as np
from tvm import te, tirx

from ...errors import UserError
from ...ir.ops import REGISTRY
from ...ir.types import INT_RANGES, TensorType
from ...ir.types import quantize as np_quantize
from ...quant.requant import activation_clamp
from . import elementwise as kelem
from . import qdot, qwinograd
from .conv import _attrs2d, _is_cuda, conv2d_accumulate, depthwise_int_exact_f32, pick_block
from .tensor import Buf, Lazy, LTensor, broadcast_index, cast, compute, const, divisor_at_most, dtype_of, linearize

I32, I64, F32 = "int32", "int64", "float32"
I16 = "int16"
CUDA_BLOCK = 16         # int8 channels per block of the CUDA convs' activations in the blocked layouts
CUDA_INT8_LAYOUTS = ("nchw", "blocked", "blocked-copy")


def cuda_int8_layout() -> str:
    """The activation layout of the CUDA int8 convs, ``QC_CUDA_INT8_LAYOUT`` (an experiment until
    timed on a GPU; see :func:`_cuda_conv_s8s8_blocked`): "nchw" (the default), "blocked" (NCHW16c,
    padding inlined into the GEMM's 4-byte fetch) or "blocked-copy" (NCHW16c, padding a stage of
    its own, the fetch a copy of 16-byte vectors)."""
    v = os.environ.get("QC_CUDA_INT8_LAYOUT") or "nchw"
    if v not in CUDA_INT8_LAYOUTS:
        raise UserError(f"QC_CUDA_INT8_LAYOUT is {v!r}, not a layout of the CUDA int8 convs",
                        "environment", f"set it to one of {', '.join(CUDA_INT8_LAYOUTS)}, or unset it")
    return v


def _mul(x, w):
    """x (uint8/int8) times w (int8) as int32: the product is formed in int16 (|x w| <= 255*128
    fits exactly), which LLVM vectorizes as 16-bit multiplies (vpmullw / vpmaddwd) instead of
    32-bit ones (vpmulld: half the throughput)."""
    return cast(cast(x, I16) * cast(w, I16), I32)


def _is_x86(ctx) -> bool:
    spec = getattr(getattr(ctx, "low", None), "spec", None)
    return getattr(spec, "family", None) == "x86"


def _is_cpu(ctx) -> bool:
    return getattr(getattr(ctx.low, "spec", None), "family", None) in ("x86", "arm")


def _qp(ctx, i):
    return ctx.op.operands[i].type.quant


def _zp(ctx, i) -> int:
    return int(_qp(ctx, i).zero_point[0])


def _channel_vec(ctx, vals, dtype, name):
    """``f(c)``: element c of a per-channel list as ``dtype`` (an immediate when all entries are
    equal). The constant is stored in the narrowest of int8/16/32/64 that holds every entry and
    widened at use: shifts fit int8, most folded biases int16 (an int64 multiplier/shift/rounding
    triple per channel was 20 of the 24 constant bytes per channel)."""
    vals = [int(v) for v in vals]
    if len(set(vals)) == 1:
        c = tirx.const(vals[0], dtype)
        return lambda ch: c
    lo, hi = min(vals), max(vals)
    store = next(d for d in ("int8", "int16", "int32", "int64")
                 if np.iinfo(d).min <= lo and hi <= np.iinfo(d).max and np.dtype(d).itemsize <= np.dtype(dtype).itemsize)
    p = ctx.param(np.asarray(vals, store), name)
    return (lambda ch: p[ch]) if store == dtype else (lambda ch: cast(p[ch], dtype))


def _rounding(fs):
    """``r(c) = 2^(s_c - 1)`` (0 for s_c = 0), the round-half-up term of ``(v + r) >> s``, from the
    shift itself instead of a stored int64 per channel."""
    one, zero = tirx.const(1, I64), tirx.const(0, I64)
    return lambda ch: tirx.Select(fs(ch) > zero, tirx.shift_left(one, fs(ch) - one), zero)


def requant_fn(ctx, a, out_type, channels: int | None):
    """``rq(acc, ch)``: the fixed-point requantization of an int32/int64 expression, clamped to
    [lo, hi] of the output (fused Relu/Clip included; a fused HardSwish is the integer epilogue of
    :func:`_hardswish_fn`): int64, or on x86 for an int32 ``acc`` and shifts in [33, 62] the high
    word form of :func:`_narrow_shift_ok` in int32. An int32 ``acc`` is sign-extended and
    multiplied by the int32 multiplier, which LLVM lowers to ``vpmuldq`` (a product of two int64
    values of 33+ significant bits would be a 3-uop ``vpmullq``; see :func:`requantized` for the
    bias add).

    The int32 shift amounts are written ``(s - 32) & 31`` and ``(s - 33) & 31`` (the same values
    for s in [33, 62]): TVM's bound analysis of ``x >> t`` with a shift ``t`` that may be negative
    or >= 32 (a per-channel shift loaded from an int8 constant) returned [-2, 1], and the simplifier
    then dropped the clamp as always true; the mask gives ``t`` the bound [0, 31]."""
    if (a.get("activation") or "") == "HardSwish":
        return _hardswish_fn(ctx, a, out_type, channels)
    qp = out_type.quant
    lo, hi = activation_clamp(a.get("activation", "") or "", a.get("activation_params") or [], qp)
    fm, fs, fr = _multiply_terms(ctx, a, channels or 1, "rq")
    zo = tirx.const(int(qp.zero_point[0]), I64)
    lo_c, hi_c = tirx.const(lo, I64), tirx.const(hi, I64)
    narrow = _is_x86(ctx) and _narrow_shift_ok(a, channels or 1)
    zo32, lo32, hi32 = (tirx.const(v, I32) for v in (int(qp.zero_point[0]), lo, hi))
    b31 = tirx.const(31, I32)

    def rq(acc, ch=None):
        ch = ch if ch is not None else tirx.const(0, I32)
        if narrow and dtype_of(acc) == I32:      # see _narrow_shift_ok: the high word, then int32
            hi_w = cast(tirx.shift_right(cast(acc, I64) * cast(fm(ch), I64), tirx.const(32, I64)), I32)
            s32 = tirx.bitwise_and(cast(fs(ch), I32) - tirx.const(32, I32), b31)
            r32 = tirx.shift_left(tirx.const(1, I32), tirx.bitwise_and(s32 - tirx.const(1, I32), b31))
            y = tirx.shift_right(hi_w + r32, s32) + zo32
            return tirx.max(tirx.min(y, hi32), lo32)
        v = cast(acc, I64) * cast(fm(ch), I64) + fr(ch)
        v = tirx.shift_right(v, fs(ch)) + zo
        return tirx.max(tirx.min(v, hi_c), lo_c)
    return rq


def _narrow_shift_ok(a, n: int) -> bool:
    """Whether every channel has 33 <= s <= 62 and 0 <= m < 2^31, so that for an int32 ``acc``
    the requantization needs 64 bits only for the high word of the product::

        (acc·m + 2^(s-1)) >> s  ==  (hi + 2^(s-33)) >> (s - 32),   hi = (acc·m) >> 32   (all ">>" floor)

    with ``hi`` and everything after it int32. Proof: write acc·m = hi·2^32 + lo, 0 <= lo < 2^32.
    As s - 1 >= 32, acc·m + 2^(s-1) = (hi + 2^(s-33))·2^32 + lo, and floor(floor(v / 2^32) /
    2^(s-32)) = floor(v / 2^s), so the low word drops out exactly. Ranges: |acc·m| < 2^31·2^31, so
    -2^30 <= hi < 2^30, and hi + 2^(s-33) <= 2^30 + 2^29 < 2^31; shifts s - 32 in [1, 30].
    Why: ``trunc((sext(acc)·sext(m)) >> 32)`` is LLVM's ``mulhs``, which x86 lowers per 8 lanes to
    two ``vpmuldq`` (even and odd lanes), a ``vpshufd`` and a ``vpblendd``, all within 128-bit
    lanes; the shift (``vpsravd``), clamp and narrowing to 8 bits are then int32 instructions. The
    int64 form (sign-extend each half, ``vpmuldq``, a 64-bit shift AVX2 lacks as arithmetic, and a
    cross-lane ``vshufps`` + ``vpermpd`` to gather the low words back) was ~40 % of a 1x1 conv's
    samples on a Zen 1 core (``perf annotate``); this form took fashion_mobilenet's int8 build
    from 250 to 224 us there (2 threads, interleaved A/B, same integers)."""
    m, s = _per_channel(a["multiplier"], n), _per_channel(a["shift"], n)
    return all(33 <= v <= 62 for v in s) and all(0 <= v < 2 ** 31 for v in m)


def _per_channel(vals, n: int, kind=int) -> list:
    """A per-channel list of ``n`` ints (``kind`` float: floats) (one value given: repeated)."""
    vals = [kind(v) for v in vals]
    return vals * n if len(vals) == 1 else vals


def _multiply_terms(ctx, a, n: int, prefix: str):
    """``(m_c, s_c, r_c)`` of ``rrs(acc·m, s) = (acc·m_c + r_c) >> s_c`` as channel functions: m < 2^31
    stored as int32 (half the constant) and widened at use, r_c the rounding term from the shift."""
    m, s = _per_channel(a["multiplier"], n), _per_channel(a["shift"], n)
    fm = _channel_vec(ctx, m, I32, f"{prefix}_m")
    fs = _channel_vec(ctx, s, I64, f"{prefix}_s")
    return fm, fs, _rounding(fs)


def _hardswish_fn(ctx, a, out_type, channels: int | None):
    """The float32 HardSwish epilogue of :mod:`qcompiler.quant.hardswish` (the same operations as
    its ``requantize``, none a product feeding an addition, so nothing for FMA contraction)::

        w = f32(acc)·σ;  t = min(max(w·g, -b), 1 - b) + b;  y = z + rint(clamp(w·t, lo - z, hi - z))

    Returns int32 (the callers narrow it to the output storage)."""
    from ...quant.hardswish import gate_constants
    qp = out_type.quant
    lo, hi = INT_RANGES[qp.storage]
    n = channels or 1
    sig, g, (b,) = a["hardswish"]
    fsig = _float_channel_vec(ctx, _per_channel(sig, n, float), "hs_sigma")
    fg = _float_channel_vec(ctx, _per_channel(g, n, float), "hs_g")
    nb, pb, bb = (tirx.const(float(v), F32) for v in gate_constants(b))
    z = int(qp.zero_point[0])
    vlo, vhi = tirx.const(float(lo - z), F32), tirx.const(float(hi - z), F32)
    zo = tirx.const(z, I32)
    cpu = _is_cpu(ctx)

    def rq(acc, ch=None):
        ch = ch if ch is not None else tirx.const(0, I32)
        w = cast(acc, F32) * fsig(ch)
        t = tirx.min(tirx.max(w * fg(ch), nb), pb) + bb
        v = tirx.min(tirx.max(w * t, vlo), vhi)
        return cast(_round_half_even(v, cpu), I32) + zo
    return rq


def _float_channel_vec(ctx, vals: list[float], name: str):
    """``f(c)``: element c of a per-channel float32 list (an immediate when all entries are equal)."""
    if len(set(vals)) == 1:
        c = tirx.const(vals[0], F32)
        return lambda ch: c
    p = ctx.param(np.asarray(vals, np.float32), name)
    return lambda ch: p[ch]


# ---- QLinearConv ----------------------------------------------------------------------------------
def qconv2d(ctx, a, ins, outs):
    """QLinearConv: the dot-product kernel of :mod:`.qdot` on x86 with AVX2/VNNI (3x3 stride-1 convs on
    ``vpmaddwd``: Winograd F(2x2, 3x3), :mod:`.qwinograd`, bit-identical); depthwise convs
    on x86 the float32 kernel, exact while max|x|·Σ|w| < 2^24 (:func:`.conv.depthwise_int_exact_f32`);
    else the blocked conv with int16 products."""
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
        if depthwise and _is_x86(ctx) else None
    if _is_cuda(ctx) and a["group"] == 1:
        acc_at, zx = _cuda_conv_s8s8(ctx, a, x, w, out_shape, zx)
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
    as the reference's conversion of the exact sum. Otherwise the int32 path of :func:`requantized`."""
    k = w.shape[0]
    fold = _folded_bias(w, bias, z)
    if np.abs(fold).max(initial=0) > 2 ** 24:
        return requantized(ctx, a, out, w, bias, z, lambda idx: cast(acc_f(idx), I32))
    ff = _float_channel_vec(ctx, [float(v) for v in fold], "qbias_f")
    rq = _hardswish_fn(ctx, a, out, k)
    return Lazy(out.shape, out.dtype, lambda idx: rq(acc_f(idx) + ff(idx[1]), idx[1]))


def _as_s8(v, dtype: str):
    """A stored uint8/int8 element as int8: uint8 ``x`` becomes ``x - 128`` (= ``x ^ 0x80``, exact
    in [-128, 127]), int8 is unchanged."""
    return cast(cast(v, I32) - tirx.const(128, I32), "int8") if dtype == "uint8" else cast(v, "int8")


def _s8_shift(dtype: str) -> int:
    """What :func:`_as_s8` subtracts from a stored value of ``dtype``."""
    return 128 if dtype == "uint8" else 0


def _cuda_conv_s8s8(ctx, a, x, w: np.ndarray, out_shape, zx: int):
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
    point ``z_x - s`` and folded by :func:`requantized` is the same int32 as the x86 kernels' and
    the reference's (each |(x - s)·w| <= 2^14; the true sum fits int32, wrap-around is harmless).
    Plain NCHW, weight [co, ci, kh, kw] int8 (GPU threads map to elements: vector width 1).
    Returns ``(acc_at, z_eff)``."""
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (dh, dw), (pt, pl, pb, pr) = _attrs2d(a)
    oh, ow = out_shape[2:]
    shift = _s8_shift(x.dtype)
    z = zx - shift
    zc = tirx.const(z, "int8")
    layout = cuda_int8_layout()
    b = CUDA_BLOCK if layout != "nchw" else 0
    bo = b if b and k % b == 0 else 0
    if b and isinstance(x, Buf) and x.block == b and cg % b == 0:
        return _cuda_conv_s8s8_blocked(ctx, a, x, w, out_shape, zc, bo, copy=layout == "blocked-copy"), z

    def padded(i, ci, y, xx):
        v = _as_s8(x.at((i, ci, y - pt, xx - pl)), x.dtype)
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


def _cuda_conv_s8s8_blocked(ctx, a, x: Buf, w: np.ndarray, out_shape, zc, bo: int, copy: bool):
    """:func:`_cuda_conv_s8s8` over an input stored NCHW{b}c: the reduction runs over
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
            return _as_s8(x.tensor[i, cb, y, xx, ci], x.dtype)
        inside = tirx.all(y >= pt, y < pt + h, xx >= pl, xx < pl + wd)
        if mat:
            return tirx.if_then_else(inside, _as_s8(x.tensor[i, cb, y - pt, xx - pl, ci], x.dtype), zc)
        # inlined into the vectorized fetch: a load from the clamped (always valid) position, masked
        # arithmetically. TVM 0.27's vectorizer scalarizes an if_then_else whose condition it cannot
        # prove lane-invariant (one byte per load), a Select lets the simplifier drop the clamp under
        # its condition, and CUDA codegen has no 8-bit vector broadcast of a non-constant
        yc = tirx.max(tirx.min(y - pt, h - 1), 0)
        xc = tirx.max(tirx.min(xx - pl, wd - 1), 0)
        v = cast(_as_s8(x.tensor[i, cb, yc, xc, ci], x.dtype), I32)
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


def requantized(ctx, a, out, w: np.ndarray, bias, z: int, acc_at) -> Lazy:
    """The output of a QLinearConv/QLinearGemm kernel (dense or sparse) over its int32 accumulator
    ``acc_at(idx)`` = Σ x·w at the logical output index (channel ``idx[1]``): plus the folded bias
    ``fold_c = bias_c - z·Σ w_c`` (z: the activation zero point the accumulator was taken with),
    requantized with :func:`requant_fn`.

    The sum ``acc + fold_c`` is exact in wrapping int32 arithmetic (the true accumulator fits
    int32; the reference checks it), and it is formed by :func:`_wrapping_add` (an int64 add
    truncated to 32 bits, which LLVM turns into a flagless 32-bit add) so that the product with m
    stays one ``vpmuldq``. fold_c is stored in its narrowest integer type (int16 or int32). An
    earlier form folded the bias into a per-channel int64 ``k_c = fold_c·m_c + r_c``: the same
    speed, 4-6 more bytes of constant per channel (60 KB of rapidocr-det's int8 library)."""
    k = w.shape[0]
    fb = _channel_vec(ctx, qdot.wrap_int32(_folded_bias(w, bias, z)), I32, "qbias")
    rq = requant_fn(ctx, a, out, k)
    return Lazy(out.shape, out.dtype, lambda idx: rq(_wrapping_add(acc_at(idx), fb(idx[1])), idx[1]))


def _folded_bias(w: np.ndarray, bias, z: int) -> np.ndarray:
    """``fold_c = bias_c - z·Σ w_c`` (int64): the bias with the activation zero point folded in."""
    k = w.shape[0]
    return (bias.astype(np.int64) if bias is not None else np.zeros(k, np.int64)) \
        - z * w.astype(np.int64).reshape(k, -1).sum(axis=1)


def _wrapping_add(x, y):
    """int32 ``x + y`` modulo 2^32, written ``reinterpret(int32, uint32(int64(x) + int64(y)))``:
    the int64 add cannot overflow and the narrowing cast is a plain ``trunc``, so the wrap-around
    is defined; LLVM shrinks ``trunc(add nsw (sext x, sext y))`` to a 32-bit ``add`` with no flags,
    and the sign-extended product with the multiplier stays one ``vpmuldq``. The cast goes to
    uint32 and is reinterpreted because TVM's bound analysis takes ``Cast(int32, v)`` as
    ``bound(v) ∩ int32`` (as if it could not wrap): a plain ``int32(int64(x) + int64(y))`` with
    y = -2^31 was bounded to [-2^31, -1] and the simplifier dropped the requantization's upper
    clamp; a ``reinterpret`` is bounded by its whole type.

    Neither a signed nor an unsigned int32 add would do. TVM 0.27's LLVM codegen emits a signed
    add of >= 32 bits as ``add nsw`` (poison on overflow; LLVM also widens ``sext(add nsw)`` to an
    int64 add, whose product with m becomes the 3-uop ``vpmullq``) and an *unsigned* one as
    ``add nuw``: poison whenever the uint32 sum carries, which for a negative fold (a large
    uint32) is whenever ``x + y >= 0``. The earlier form, ``reinterpret(int32, uint32(x) +
    uint32(y))``, was therefore undefined exactly where the requantized result is positive; with
    an immediate fold (every channel's fold equal: a one-output-channel conv) LLVM used it: from
    ``add nuw x, 0xFFFFFE54`` it knew the sum negative, sign-extended it as ``sum - 2^32``, and the
    conv head returned its clamp floor where the reference gave 127."""
    return tirx.reinterpret(I32, cast(cast(x, I64) + cast(y, I64), "uint32"))


# ---- QLinearGemm ----------------------------------------------------------------------------------
def qgemm(ctx, a, ins, outs):
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
        acc_at, za = _cuda_dense_s8s8(ctx, A, w, za, m, kk)
    elif qdot.applicable(isa, A, w):
        acc_at, za = qdot.dense(ctx, A, w, za, isa)
    else:
        acc_at = _dense_int16(ctx, A, w, m, n, kk)
    return [requantized(ctx, a, outs[0], w, bias, za, lambda idx: acc_at(idx[0], idx[1]))]


def _cuda_dense_s8s8(ctx, A, w: np.ndarray, za: int, m: int, kk: int):
    """QLinearGemm's int32 accumulator for CUDA as ``Σ_k int32(A'[i, k]) · int32(W[j, k])`` over
    int8 operands (A' = A shifted to int8 in its own stage, as in :func:`_cuda_conv_s8s8`), the
    form dlight's int8 WMMA rule takes when M, N, K > 64. Returns ``(acc_at(i, j), z_eff)``."""
    A8 = compute((m, kk), lambda i, j: _as_s8(A.at((i, j)), A.dtype), name="pad")
    W = ctx.param(np.ascontiguousarray(w.astype(np.int8)), "qw_s8")
    rk = te.reduce_axis((0, kk), "rk")
    d = compute((m, w.shape[0]), lambda i, j: te.sum(cast(A8[i, rk], I32) * cast(W[j, rk], I32), axis=[rk]),
                name="dense")
    ctx.schedule("dense", mb=1)                      # ignored on CUDA: dlight schedules the function
    return (lambda i, j: d[i, j]), za - _s8_shift(A.dtype)


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
    d = compute((m, npad // bn, bn), lambda i, no, ni: te.sum(
        _mul(A.at((i, rk)), wp[no, rk, ni]), axis=[rk]), name="dense")
    ctx.schedule("dense", mb=divisor_at_most(m, 8))
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
    rq = requant_fn(ctx, a, outs[0], None)
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
    rq = requant_fn(ctx, a, outs[0], None)
    return [Lazy(outs[0].shape, outs[0].dtype, lambda idx: rq(accb.at(idx)))]


def maxpool(ctx, a, ins, outs, float_builder):
    """MaxPool: the float kernel, or on stored integers (padding with the storage minimum)."""
    x = ins[0]
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
    lut = _lookup_chain(ctx, qp)
    if lut is not None:
        return [lut]
    lo, hi = INT_RANGES[qp.storage]
    fsc, fzp = _per_axis(ctx, qp, x.rank)
    cpu = _is_cpu(ctx)

    def fn(idx):
        v = cast(x.at(idx), F32)
        y = _round_half_even(v / fsc(idx), cpu) + cast(fzp(idx), F32)
        y = tirx.max(tirx.min(y, const(hi, F32)), const(lo, F32))
        return tirx.Select(_is_nan(v), tirx.const(0, I32), cast(y, I32))
    return [Lazy(x.shape, outs[0].dtype, fn)]


def _round_half_even(v, cpu: bool):
    """``nearbyint(v)`` (round half to even in the default rounding mode). On CPU targets as the
    LLVM intrinsic itself: TVM's loop vectorizer has no rule for ``tirx.nearbyint`` and
    scalarizes the whole loop around it (LLVM then vectorized the *outer* loop with gathers and
    byte scatters: rapidocr-cls's 1x3x48x192 input QuantizeLinear took 65 us, 8 us vectorized);
    the intrinsic is the same ``llvm.nearbyint`` the scalar code calls (vrndscaleps imm 12)."""
    if cpu:
        return tirx.call_llvm_pure_intrin(F32, "llvm.nearbyint", v)
    return tirx.nearbyint(v)


def _is_nan(v):
    """``isnan(v)`` for float32 on the bits, ``|bits| > 0x7f800000`` (exponent all ones, mantissa
    not 0): integer compares vectorize, ``tirx.isnan`` does not (see :func:`_round_half_even`),
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
    fast = _se_mul_x86(ctx, a, ins, outs[0]) if _is_x86(ctx) else None
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


SE_LANES = 16          # output bytes per vector iteration of the squeeze-excite multiply (one zmm of int32)
# x in blocks wider than this keeps the generic kernel: rapidocr-det's only SE multiply (1x192x10x10,
# NCHW32c, 19 K elements) cost 8 KB of model.so in the int32 form (32-lane loop and gate gather),
# past the int8 <= 0.3 x fp32 size bound (tests/quant/test_report.py), for ~3 us
SE_MAX_BLOCK = 16


def _split_multiplier(m: int) -> tuple[int, int]:
    """``m = mh·2^16 + ml`` with ``ml`` in [-2^15, 2^15)."""
    ml = ((m + (1 << 15)) & 0xFFFF) - (1 << 15)
    return (m - ml) >> 16, ml


def _se_mul_x86(ctx, a, ins, out_type):
    """The squeeze-excite QLinearMul ``x (N x C x H x W, blocked NCHW{b}c) * gate (N x C x 1 x 1)``
    on x86 in int32 arithmetic, SE_LANES output bytes per vector iteration; None where it does not apply
    (the generic :func:`qmul` then runs).

    The reference is ``y = clamp(z_o + ((p·M + 2^(S-1)) >> S), lo, hi)`` with
    ``p = (x - z_x)(g - z_g)`` and a per-tensor multiplier ``M`` (int64 in the generic kernel: 8
    lanes of a zmm register). With ``M = Mh·2^16 + Ml``, ``Ml`` in [-2^15, 2^15), and ``S >= 17``::

        p·M + 2^(S-1) = (p·Mh + 2^(S-17))·2^16 + p·Ml
        floor(Z / 2^S) = floor(floor(Z / 2^16) / 2^(S-16))          (nested floor division)
        floor(Z / 2^16) = p·Mh + 2^(S-17) + floor(p·Ml / 2^16)      (the first term is an integer)

    so ``y = clamp(z_o + ((d·Gh + 2^(S-17) + ((d·Gl) >> 16)) >> (S-16)), lo, hi)`` with
    ``d = x - z_x`` and the per-channel ``Gh = (g - z_g)·Mh``, ``Gl = (g - z_g)·Ml`` computed once
    per channel. Every term is an exact int32 when ``P·2^15 < 2^31`` and
    ``P·|Mh| + 2^(S-17) + 2^15 < 2^31`` for ``P = max|x - z_x|·max|g - z_g|`` (checked here at
    compile time from the zero points and storage ranges; 255·255·2^15 < 2^31 always holds). The
    per-channel ``Gh``/``Gl`` are one stage [N, C/b, 2, R, b], replicated over R = SE_LANES/b
    columns, so that one vector iteration over R output columns of a channel block (the ``se_mul`` schedule) reads
    them with plain vector loads instead of a byte gather."""
    if (a.get("activation") or "") == "HardSwish" or ctx.sched[0] != "generic":
        return None
    if len(a["multiplier"]) != 1 or len(a["shift"]) != 1:
        return None
    shape = tuple(out_type.shape)
    if len(shape) != 4:
        return None
    full = [i for i, v in enumerate(ins) if tuple(v.shape) == shape]
    gate = [i for i, v in enumerate(ins) if tuple(v.shape) == (shape[0], shape[1], 1, 1)]
    if len(full) != 1 or len(gate) != 1:
        return None
    ix, ig = full[0], gate[0]
    X = ins[ix]
    b = getattr(X, "block", 0) if isinstance(X, Buf) else 0
    n, c, h, w = shape
    if not b or b > SE_MAX_BLOCK or c % b:
        return None
    m, s = int(a["multiplier"][0]), int(a["shift"][0])
    if s < 17 or s > 47:
        return None
    zx, zg = _zp(ctx, ix), _zp(ctx, ig)
    lx, hx = INT_RANGES[ctx.op.operands[ix].type.quant.storage]
    lg, hg = INT_RANGES[ctx.op.operands[ig].type.quant.storage]
    big = max(abs(lx - zx), abs(hx - zx)) * max(abs(lg - zg), abs(hg - zg))
    mh, ml = _split_multiplier(m)
    if big * (1 << 15) >= 1 << 31 or big * abs(mh) + (1 << (s - 17)) + (1 << 15) >= 1 << 31:
        return None
    r = max(1, SE_LANES // b)
    while w % r:
        r //= 2
    qp = out_type.quant
    lo, hi = activation_clamp(a.get("activation", "") or "", a.get("activation_params") or [], qp)
    G = ins[ig]            # read (a table lookup, possibly) only by the small stage below
    zgc = tirx.const(zg, I32)

    mhc, mlc = tirx.const(mh, I32), tirx.const(ml, I32)
    ghl = compute((n, c // b, 2, r, b), lambda i, co, k, _ri, ci: (cast(G.at((i, co * b + ci, 0, 0)), I32) - zgc)
                  * tirx.Select(k == 0, mhc, mlc), name="hoist_ghl")
    zxc, zo = tirx.const(zx, I32), tirx.const(int(qp.zero_point[0]), I32)
    rnd = tirx.const(1 << (s - 17), I32)
    lo_c, hi_c = tirx.const(lo, I32), tirx.const(hi, I32)
    ctx.schedule("se_mul", r=r)

    def fn(idx):
        i, ch, y, x = idx
        gh, gl = ghl[i, ch // b, 0, x % r, ch % b], ghl[i, ch // b, 1, x % r, ch % b]
        d = cast(X.at(idx), I32) - zxc
        t = tirx.shift_right(d * gl, tirx.const(16, I32))
        v = tirx.shift_right(d * gh + rnd + t, tirx.const(s - 16, I32)) + zo
        return tirx.max(tirx.min(v, hi_c), lo_c)
    return Lazy(shape, out_type.dtype, fn)


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
    if qp is None:
        return float_builder(ctx, a, ins, outs)
    (x,) = ins
    kind = ctx.op.kind
    lo, hi = activation_clamp(kind, [a["min"], a["max"]] if kind == "Clip" else [], qp)
    lo_c, hi_c = tirx.const(lo, I32), tirx.const(hi, I32)
    return [Lazy(x.shape, outs[0].dtype,
                 lambda idx: tirx.max(tirx.min(cast(x.at(idx), I32), hi_c), lo_c))]


def pad(ctx, a, ins, outs, float_builder):
    qp = ctx.op.operands[0].type.quant
    if qp is not None and a["mode"] == "constant":
        a = dict(a, value=int(np_quantize(np.float32(a.get("value", 0.0) or 0.0), qp).item()))
    return float_builder(ctx, a, ins, outs)


ANCHOR_BUILDERS = {
    "QLinearConv": qconv2d, "QLinearGemm": qgemm,
    "QLinearGlobalAveragePool": qglobal_avgpool, "QLinearAveragePool": qavgpool,
}
LAZY_BUILDERS = {
    "QuantizeLinear": quantize_linear, "DequantizeLinear": dequantize_linear,
    "QLinearAdd": qadd, "QLinearMul": qmul, "Requantize": requantize,
}
ANCHORS = frozenset(ANCHOR_BUILDERS)
ELEMENTWISE = frozenset(LAZY_BUILDERS)
