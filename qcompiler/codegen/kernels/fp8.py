"""Float8 kernels on CPUs: float8 storage, float32 arithmetic (:mod:`qcompiler.quant.fp8`).

Float8 values are stored and carried as their uint8 bits (:func:`.tensor.compute_dtype`), and
converted in TIR by integer operations that vectorize, not by TVM's own float8 casts: TVM 0.27's
LLVM lowering of ``float8_e4m3fn``/``float8_e5m2`` <-> ``float32`` (its FP8 compute/storage
legalization, src/tir/transforms/unsupported_dtype_legalize.cc) rebiases the exponent without
handling subnormals or NaN: on x86 it decoded codes 0..7 of E4M3 (zero among them) and 0..3 of E5M2
wrongly, and encoded 1176 of 4096 random float32 values wrongly (measured, 2026-12).

* decode (E4M3; E5M2 alike with 2 mantissa bits and bias 15)::

      |q| = f32_bits(((b & 0x7F) << 20) + (120 << 23))   exponent field e > 0 (normal: 2^(e-7) (1 + m/8))
      |q| = f32(b & 7) * 2^-9                              e = 0 (subnormal: m 2^-9)
      q = |q| with b's sign bit (bit 31 of the float's bits);  NaN where b & 0x7F == 0x7F (E4M3;
      E5M2: inf/NaN from 0x7C)

  no float operation on a subnormal float32 (denormals-are-zero CPU modes would change none of it).
* encode (the reference's clip-then-round-to-nearest-even, :func:`qcompiler.ir.types.round_fp8`),
  with a = |bits(v)|::

      NaN                  -> 0x7F (E5M2: 0x7E, as ml_dtypes)
      a >= bits(448)       -> 0x7E                                saturate (inf included)
      a >= bits(2^-6)      -> ((a + 0x7FFFF + ((a >> 20) & 1)) >> 20) - (120 << 3)     mantissa RNE
      else                 -> nearbyint(|v| * 2^9)                 subnormal steps (0..8; 8 = 2^-6)

  then the sign bit. The float multiply is exact (a power of two) and nearbyint rounds half to even.

The conv and gemm kernels are the float32 ones (:func:`.conv.conv2d_accumulate`, :func:`.linalg._dense`)
with float8 operands: the weights stay float8 bytes in the library (a quarter of float32) and are
decoded where the inner loop loads them, one vector of output channels at a time (per register
tile, never as a float32 copy); a conv's activation is decoded once per element in its packing
stage (a float32 NCHW{b}c buffer the kernel allocates per call), a gemm's where it is loaded. The
sum is a float32 sum in the schedule's order; the epilogue ``acc * f32(s_x s_w[c]) + b[c]`` and its
clamp follow the reference, which forms the sum exactly (float64) and rounds it once: the artifact
is within the float32 rounding of its summation order of it (tests/codegen/test_x86_fp8.py bounds
it by K 2^-24 Σ|x w| per output, and checks the float8 codes of every QuantizeLinear within one
step).
"""
from __future__ import annotations

import numpy as np
from tvm import tirx

from ...ir.types import FP8_MAX, is_fp8
from .requant import float_channel_vec, float_clamp_fn, is_cpu, round_half_even
from .tensor import Lazy, LTensor, cast

I32, F32, U8 = "int32", "float32", "uint8"

# per format: mantissa bits, exponent bias, the code of +max, the code of NaN
_FORMAT = {"float8_e4m3fn": (3, 7, 0x7E, 0x7F), "float8_e5m2": (2, 15, 0x7B, 0x7E)}


def _c(v, dtype=I32):
    return tirx.const(v, dtype)


def _and(x, m: int):
    return tirx.bitwise_and(x, _c(m))


def decode(b, storage: str, nan: bool = True):
    """The float32 value of float8 bits ``b`` (a uint8 or int32 expression); ``nan``: NaN (and E5M2's
    inf) codes decoded as such (weights, checked at compile time, skip the two selects)."""
    mbits, bias, _, _ = _FORMAT[storage]
    b = cast(b, I32)
    mag = _and(b, 0x7F)
    normal = tirx.reinterpret(F32, tirx.shift_left(mag, _c(23 - mbits)) + _c((127 - bias) << 23))
    sub = cast(_and(b, (1 << mbits) - 1), F32) * tirx.const(2.0 ** (1 - bias - mbits), F32)
    v = tirx.Select(_and(b, 0x7F & ~((1 << mbits) - 1)) == _c(0), sub, normal)
    if nan:
        if storage == "float8_e4m3fn":
            v = tirx.Select(mag == _c(0x7F), tirx.const(float("nan"), F32), v)
        else:
            special = tirx.Select(mag == _c(0x7C), tirx.const(float("inf"), F32), tirx.const(float("nan"), F32))
            v = tirx.Select(mag >= _c(0x7C), special, v)
    sign = tirx.shift_left(_and(b, 0x80), _c(24))            # the sign bit, or'ed into the float's bits
    return tirx.reinterpret(F32, tirx.bitwise_or(tirx.reinterpret(I32, v), sign))


def encode(v, storage: str, cpu: bool):
    """The float8 bits (uint8) of float32 ``v`` rounded to nearest even, saturating (see the module
    docstring)."""
    mbits, bias, max_code, nan_code = _FORMAT[storage]
    bits = tirx.reinterpret(I32, v)
    sign = _and(tirx.shift_right(bits, _c(24)), 0x80)
    a = _and(bits, 0x7FFFFFFF)
    max_bits = int(np.float32(FP8_MAX[storage]).view(np.int32))
    min_normal = int(np.float32(2.0 ** (1 - bias)).view(np.int32))
    shift = 23 - mbits
    ac = tirx.min(a, _c(max_bits))                      # no int32 overflow in the rounding add
    normal = tirx.shift_right(ac + _c((1 << (shift - 1)) - 1) + _and(tirx.shift_right(ac, _c(shift)), 1),
                              _c(shift)) - _c((127 - bias) << mbits)
    sub = cast(round_half_even(tirx.reinterpret(F32, a) * tirx.const(2.0 ** (bias - 1 + mbits), F32), cpu), I32)
    code = tirx.Select(a >= _c(min_normal), normal, sub)
    code = tirx.Select(a >= _c(max_bits), _c(max_code), code)
    code = tirx.Select(a > _c(0x7F800000), _c(nan_code), code)
    return cast(tirx.bitwise_or(code, sign), U8)


class Decoded(LTensor):
    """A float8 tensor (its stored bits) read as float32 values; keeps the producer's channel block."""

    def __init__(self, x: LTensor, storage: str):
        self.x, self.storage, self.shape, self.dtype = x, storage, x.shape, F32

    @property
    def block(self) -> int:
        return self.x.block

    def at(self, idx):
        return decode(self.x.at(idx), self.storage)


def weight_bits(ctx, i: int) -> tuple[np.ndarray, str]:
    """Operand ``i`` (a constant float8 weight) as its uint8 bits, and its storage dtype."""
    v = ctx.op.operands[i]
    if not v.is_const:
        raise NotImplementedError("a float8 conv/gemm needs a constant weight")
    data = np.ascontiguousarray(v.data)
    if np.isnan(data.astype(np.float32)).any():
        raise NotImplementedError(f"the float8 weight %{v.name} holds NaN codes")
    return data.view(np.uint8), v.dtype


def epilogue(ctx, a, out, acc_at, channels: int) -> Lazy:
    """``clamp(acc * f32(s_x s_w[c]) + b[c])`` over the float32 accumulator (channel on axis 1)."""
    ops = ctx.op.operands
    sx = np.float32(ops[0].type.quant.scale[0])
    f = float_channel_vec(ctx, [float(v) for v in np.broadcast_to(
        (sx * np.asarray(ops[1].type.quant.scale, np.float32)).astype(np.float32), (channels,))], "f8scale")
    bias = ctx.const_data(2)
    bv = float_channel_vec(ctx, [float(v) for v in bias.astype(np.float32).reshape(-1)], "f8bias") \
        if bias is not None else None
    clamp = float_clamp_fn(a)

    def fn(idx):
        y = acc_at(idx) * f(idx[1])
        return clamp(y + bv(idx[1]) if bv is not None else y)
    return Lazy(out.shape, F32, fn)


def qconv2d(ctx, a, ins, outs):
    """QLinearConv of float8 operands: the float32 blocked conv on the decoded input (its packing
    stage) and weights decoded at load."""
    from .conv import conv2d_accumulate
    from .tensor import Buf
    x = ins[0]
    if x.rank != 4:
        raise NotImplementedError("QLinearConv needs a 2-D image input")
    wbits, wdt = weight_bits(ctx, 1)
    out_shape = outs[0].shape
    acc, bo = conv2d_accumulate(ctx, a, Decoded(x, ctx.op.operands[0].dtype), wbits, out_shape,
                                lambda p, q: p * decode(q, wdt, nan=False), fill=0.0, name="f8w")
    accb = Buf(acc, out_shape, F32, bo)
    return [epilogue(ctx, a, outs[0], accb.at, wbits.shape[0])]


def qgemm(ctx, a, ins, outs):
    """QLinearGemm of float8 operands (W stored N x K): the float32 dense kernel, both operands
    decoded at load."""
    from .linalg import _dense
    A = ins[0]
    wbits, wdt = weight_bits(ctx, 1)
    m, n = outs[0].shape
    acc = _dense(ctx, Decoded(A, ctx.op.operands[0].dtype), wbits.shape[1], np.ascontiguousarray(wbits.T),
                 outs[0].shape, load=lambda q: decode(q, wdt, nan=False))
    return [epilogue(ctx, a, outs[0], acc.at, n)]


def _scales(ctx, qp, rank: int):
    """``s(idx)``: the float32 scale of element ``idx`` (per tensor, or per channel of ``qp.axis``)."""
    if qp.axis is None or len(qp.scale) == 1:
        s = tirx.const(float(qp.scale[0]), F32)
        return lambda idx: s
    ax = qp.axis % rank
    p = ctx.param(np.asarray(qp.scale, np.float32), "f8qscale", keep_dtype=True)
    return lambda idx: p[idx[ax]]


def quantize_linear(ctx, x: LTensor, qp, out_dtype: str) -> Lazy:
    """QuantizeLinear to float8: ``encode(x / s)`` (the division in float32, as ONNX Runtime)."""
    s = _scales(ctx, qp, x.rank)
    cpu = is_cpu(ctx)
    return Lazy(x.shape, out_dtype, lambda idx: encode(cast(x.at(idx), F32) / s(idx), qp.storage, cpu))


def dequantize_linear(ctx, x: LTensor, qp, out_dtype: str) -> Lazy:
    """DequantizeLinear of float8: ``f32(q) * s``."""
    s = _scales(ctx, qp, x.rank)
    return Lazy(x.shape, out_dtype, lambda idx: decode(x.at(idx), qp.storage) * s(idx))


__all__ = ["decode", "encode", "Decoded", "qconv2d", "qgemm", "quantize_linear", "dequantize_linear", "is_fp8"]
