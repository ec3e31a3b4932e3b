"""The requantization epilogue of the integer kernels: the int32 accumulator of a QLinearConv /
QLinearGemm (dense or sparse) plus its folded bias, scaled back to the output's storage by the
fixed-point multiply and shift of :mod:`qcompiler.quant.requant` (or the float32 HardSwish epilogue
of :mod:`qcompiler.quant.hardswish`), clamped, bit for bit as :mod:`qcompiler.quant.reference`.
The per-channel constants are stored in their narrowest integer type and widened at use.
"""
from __future__ import annotations

import numpy as np
from tvm import tirx

from ...ir.types import INT_RANGES
from ...quant.requant import activation_clamp, dequant_scales, float_clamp
from ..target import Family
from . import qdot
from .tensor import Lazy, cast, dtype_of

I32, I64, F32 = "int32", "int64", "float32"


def is_x86(ctx) -> bool:
    return ctx.spec.family is Family.X86


def is_cpu(ctx) -> bool:
    return ctx.spec.family in (Family.X86, Family.ARM)


def channel_vec(ctx, vals, dtype, name):
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


def requant_fn(ctx, a, out_type, channels: int | None, ties_even: bool = False):
    """``rq(acc, ch)``: the fixed-point requantization of an int32/int64 expression, clamped to
    [lo, hi] of the output (fused Relu/Clip included; a fused HardSwish is the integer epilogue of
    :func:`hardswish_fn`): int64, or on x86 for an int32 ``acc`` and shifts in [33, 62] the high
    word form of :func:`narrow_shift_ok` in int32. An int32 ``acc`` is sign-extended and
    multiplied by the int32 multiplier, which LLVM lowers to ``vpmuldq`` (a product of two int64
    values of 33+ significant bits would be a 3-uop ``vpmullq``; see :func:`requantized` for the
    bias add).

    The int32 shift amounts are written ``(s - 32) & 31`` and ``(s - 33) & 31`` (the same values
    for s in [33, 62]): TVM's bound analysis of ``x >> t`` with a shift ``t`` that may be negative
    or >= 32 (a per-channel shift loaded from an int8 constant) returned [-2, 1], and the simplifier
    then dropped the clamp as always true; the mask gives ``t`` the bound [0, 31].

    ``ties_even``: an exact half rounds to even (:func:`qcompiler.quant.requant.requantize`), in
    int64 (the high-word form drops the low word that tells a tie apart)."""
    if (a.get("activation") or "") == "HardSwish":
        return hardswish_fn(ctx, a, out_type, channels)
    qp = out_type.quant
    lo, hi = activation_clamp(a.get("activation", "") or "", a.get("activation_params") or [], qp)
    fm, fs, fr = _multiply_terms(ctx, a, channels or 1, "rq")
    zo = tirx.const(int(qp.zero_point[0]), I64)
    lo_c, hi_c = tirx.const(lo, I64), tirx.const(hi, I64)
    narrow = is_x86(ctx) and narrow_shift_ok(a, channels or 1) and not ties_even
    one, zero = tirx.const(1, I64), tirx.const(0, I64)
    zo32, lo32, hi32 = (tirx.const(v, I32) for v in (int(qp.zero_point[0]), lo, hi))
    b31 = tirx.const(31, I32)

    def rq(acc, ch=None):
        ch = ch if ch is not None else tirx.const(0, I32)
        if narrow and dtype_of(acc) == I32:      # see narrow_shift_ok: the high word, then int32
            hi_w = cast(tirx.shift_right(cast(acc, I64) * cast(fm(ch), I64), tirx.const(32, I64)), I32)
            s32 = tirx.bitwise_and(cast(fs(ch), I32) - tirx.const(32, I32), b31)
            r32 = tirx.shift_left(tirx.const(1, I32), tirx.bitwise_and(s32 - tirx.const(1, I32), b31))
            y = tirx.shift_right(hi_w + r32, s32) + zo32
            return tirx.max(tirx.min(y, hi32), lo32)
        p = cast(acc, I64) * cast(fm(ch), I64)
        r = fr(ch)
        if ties_even:                            # r - 1 + (bit s of the product), for s > 0
            r = r + tirx.Select(fs(ch) > zero, tirx.bitwise_and(tirx.shift_right(p, fs(ch)), one) - one, zero)
        v = tirx.shift_right(p + r, fs(ch)) + zo
        return tirx.max(tirx.min(v, hi_c), lo_c)
    return rq


def narrow_shift_ok(a, n: int) -> bool:
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
    m, s = per_channel(a["multiplier"], n), per_channel(a["shift"], n)
    return all(33 <= v <= 62 for v in s) and all(0 <= v < 2 ** 31 for v in m)


def per_channel(vals, n: int, kind=int) -> list:
    """A per-channel list of ``n`` ints (``kind`` float: floats) (one value given: repeated)."""
    vals = [kind(v) for v in vals]
    return vals * n if len(vals) == 1 else vals


def _multiply_terms(ctx, a, n: int, prefix: str):
    """``(m_c, s_c, r_c)`` of ``rrs(acc·m, s) = (acc·m_c + r_c) >> s_c`` as channel functions: m < 2^31
    stored as int32 (half the constant) and widened at use, r_c the rounding term from the shift."""
    m, s = per_channel(a["multiplier"], n), per_channel(a["shift"], n)
    fm = channel_vec(ctx, m, I32, f"{prefix}_m")
    fs = channel_vec(ctx, s, I64, f"{prefix}_s")
    return fm, fs, _rounding(fs)


def hardswish_fn(ctx, a, out_type, channels: int | None):
    """The float32 HardSwish epilogue of :mod:`qcompiler.quant.hardswish` (the same operations as
    its ``requantize``, none a product feeding an addition, so nothing for FMA contraction)::

        w = f32(acc)·σ;  t = min(max(w·g, -b), 1 - b) + b;  y = z + rint(clamp(w·t, lo - z, hi - z))

    Returns int32 (the callers narrow it to the output storage)."""
    from ...quant.hardswish import gate_constants
    qp = out_type.quant
    lo, hi = INT_RANGES[qp.storage]
    n = channels or 1
    sig, g, (b,) = a["hardswish"]
    fsig = float_channel_vec(ctx, per_channel(sig, n, float), "hs_sigma")
    fg = float_channel_vec(ctx, per_channel(g, n, float), "hs_g")
    nb, pb, bb = (tirx.const(float(v), F32) for v in gate_constants(b))
    z = int(qp.zero_point[0])
    vlo, vhi = tirx.const(float(lo - z), F32), tirx.const(float(hi - z), F32)
    zo = tirx.const(z, I32)
    cpu = is_cpu(ctx)

    def rq(acc, ch=None):
        ch = ch if ch is not None else tirx.const(0, I32)
        w = cast(acc, F32) * fsig(ch)
        t = tirx.min(tirx.max(w * fg(ch), nb), pb) + bb
        v = tirx.min(tirx.max(w * t, vlo), vhi)
        return cast(round_half_even(v, cpu), I32) + zo
    return rq


def float_channel_vec(ctx, vals: list[float], name: str):
    """``f(c)``: element c of a per-channel float32 list (an immediate when all entries are equal)."""
    if len(set(vals)) == 1:
        c = tirx.const(vals[0], F32)
        return lambda ch: c
    p = ctx.param(np.asarray(vals, np.float32), name)
    return lambda ch: p[ch]


def requantized(ctx, a, out, w: np.ndarray, bias, z: int, acc_at) -> Lazy:
    """The output of a QLinearConv/QLinearGemm kernel (dense or sparse) over its int32 accumulator
    ``acc_at(idx)`` = Σ x·w at the logical output index (channel ``idx[1]``): plus the folded bias
    ``fold_c = bias_c - z·Σ w_c`` (z: the activation zero point the accumulator was taken with),
    requantized with :func:`requant_fn`.

    The sum ``acc + fold_c`` is exact in wrapping int32 arithmetic (the true accumulator fits
    int32; the reference checks it), and it is formed by :func:`wrapping_add` (an int64 add
    truncated to 32 bits, which LLVM turns into a flagless 32-bit add) so that the product with m
    stays one ``vpmuldq``. fold_c is stored in its narrowest integer type (int16 or int32). An
    earlier form folded the bias into a per-channel int64 ``k_c = fold_c·m_c + r_c``: the same
    speed, 4-6 more bytes of constant per channel (60 KB of rapidocr-det's int8 library)."""
    k = w.shape[0]
    fb = channel_vec(ctx, qdot.wrap_int32(folded_bias(w, bias, z)), I32, "qbias")
    if out.quant is None:                   # QLinearGemm's float32 result: f32(acc) * f32(s_x s_w[c]), clamped
        ops = ctx.op.operands
        f = float_channel_vec(ctx, [float(v) for v in dequant_scales(ops[0].type.quant.scale[0],
                                                                     ops[1].type.quant.scale)], "qdeq")
        clamp = float_clamp_fn(a)
        return Lazy(out.shape, F32, lambda idx: clamp(cast(wrapping_add(acc_at(idx), fb(idx[1])), F32) * f(idx[1])))
    rq = requant_fn(ctx, a, out, k)
    return Lazy(out.shape, out.dtype, lambda idx: rq(wrapping_add(acc_at(idx), fb(idx[1])), idx[1]))


def float_clamp_fn(a: dict):
    """``y -> clamp(y)`` for a float32 epilogue's fused Relu/Clip (``a``'s activation attributes:
    :func:`qcompiler.quant.requant.float_clamp`); the identity without one."""
    lo, hi = float_clamp(a.get("activation", "") or "", a.get("activation_params") or [])

    def clamp(y):
        if lo != -np.inf:
            y = tirx.max(y, tirx.const(lo, F32))
        if hi != np.inf:
            y = tirx.min(y, tirx.const(hi, F32))
        return y
    return clamp


def folded_bias(w: np.ndarray, bias, z: int) -> np.ndarray:
    """``fold_c = bias_c - z·Σ w_c`` (int64): the bias with the activation zero point folded in."""
    k = w.shape[0]
    return (bias.astype(np.int64) if bias is not None else np.zeros(k, np.int64)) \
        - z * w.astype(np.int64).reshape(k, -1).sum(axis=1)


def wrapping_add(x, y):
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


def round_half_even(v, cpu: bool):
    """``nearbyint(v)`` (round half to even in the default rounding mode). On CPU targets as the
    LLVM intrinsic itself: TVM's loop vectorizer has no rule for ``tirx.nearbyint`` and
    scalarizes the whole loop around it (LLVM then vectorized the *outer* loop with gathers and
    byte scatters: rapidocr-cls's 1x3x48x192 input QuantizeLinear took 65 us, 8 us vectorized);
    the intrinsic is the same ``llvm.nearbyint`` the scalar code calls (vrndscaleps imm 12)."""
    if cpu:
        return tirx.call_llvm_pure_intrin(F32, "llvm.nearbyint", v)
    return tirx.nearbyint(v)
