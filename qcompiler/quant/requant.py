"""Fixed-point requantization: the integer arithmetic every int8 kernel ends with.

An integer kernel accumulates ``acc = Σ (x_q - z_x) * w_q + b_q`` in int32; ``acc`` stands for the
real value ``s_x * s_w * acc``. The output wants ``q = z_out + round(M * acc)`` with the *real*
multiplier ``M = s_x * s_w / s_out``. As in gemmlowp / TFLite, M is represented by an int32
``m`` and a right ``shift`` s::

    M ≈ m * 2^-s,   m in [2^30, 2^31)          (quantize_multiplier; |M - m 2^-s| <= 2^-(s+1) <= M 2^-31)

and the requantized output is, in int64 arithmetic (exactly this, bit for bit, in every backend)::

    rrs(v, s)   = (v + r) >> s        r = 2^(s-1) for s >= 1, 0 for s = 0; ">>" arithmetic (floor)
    requantize  = clamp(z_out + rrs(acc * m, s), lo, hi)

so the rounding is *round half up* (toward +inf): ``rrs(v, s) = floor(v / 2^s + 1/2)``, with a single
rounding step. No overflow: |acc| < 2^31 and m < 2^31 give |acc * m| < 2^62, and r <= 2^62.
Shifts lie in [0, 63]: M must be < 2^31 (a larger M raises), and a tiny M < 2^-32 keeps shift 63
with a smaller (unnormalized, possibly 0) m.

A sum of several rescaled terms (QLinearAdd) uses one shared shift (:func:`quantize_multipliers`)
so that it rounds once: ``q = clamp(z_out + rrs(Σ_i (q_i - z_i) * m_i, s), lo, hi)``; here
|q_i - z_i| <= 255, so each term is below 2^39.

The clamp range [lo, hi] is the storage range narrowed by a fused Relu/Clip
(:func:`activation_clamp`), computed once at compile time.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..ir.types import INT_RANGES, QuantParams, quantize

MAX_SHIFT = 63


def quantize_multiplier(M: float) -> tuple[int, int]:
    """``(m, shift)`` with m = round(M * 2^shift) (half even) in [2^30, 2^31) for M in [2^-32, 2^31).

    quantize_multiplier(0.5)   -> (1073741824, 31)
    quantize_multiplier(0.003) -> (1649267442, 39)
    """
    M = float(M)
    if not (math.isfinite(M) and M > 0):
        raise ValueError(f"requantization multiplier must be finite and > 0, got {M}")
    mant, exp = math.frexp(M)                     # M = mant * 2^exp, mant in [0.5, 1)
    shift = 31 - exp
    if shift < 0:
        raise ValueError(f"requantization multiplier {M} >= 2^31: the output scale is far too small")
    if shift > MAX_SHIFT:
        return _round(M, MAX_SHIFT), MAX_SHIFT
    m = _round(M, shift)
    if m == 2 ** 31:                              # mant rounded up to 1.0
        if shift == 0:
            raise ValueError(f"requantization multiplier {M} rounds to 2^31")
        m, shift = 2 ** 30, shift - 1
    return m, shift


def quantize_multipliers(Ms: Sequence[float]) -> tuple[list[int], int]:
    """Several multipliers with ONE shared shift (for sums such as QLinearAdd): the largest is
    normalized to [2^30, 2^31), the others have as many fractional bits: m_i = round(M_i 2^s)."""
    Ms = [float(M) for M in Ms]
    if not Ms or not all(math.isfinite(M) and M > 0 for M in Ms):
        raise ValueError(f"requantization multipliers must be finite and > 0, got {Ms}")
    _, shift = quantize_multiplier(max(Ms))
    ms = [_round(M, shift) for M in Ms]
    if max(ms) >= 2 ** 31:                        # cannot happen (max(M) rounds below 2^31), but be safe
        shift -= 1
        ms = [_round(M, shift) for M in Ms]
    return ms, shift


def _round(M: float, shift: int) -> int:
    """round(M * 2^shift), half to even, exactly: scaling a double by a power of two is exact
    (no overflow for shift <= MAX_SHIFT and M < 2^31), and Python rounds a float half to even
    (a float >= 2^52 is already an integer)."""
    return round(math.ldexp(M, shift))


def conv_multipliers(s_in: float, s_w: Sequence[float], s_out: float) -> tuple[list[int], list[int]]:
    """Per-channel (or one) ``(multipliers, shifts)`` for M_c = s_in * s_w[c] / s_out, the products
    formed in float64 from the float32 scales (exact) and divided once."""
    out = [quantize_multiplier(float(np.float32(s_in)) * float(np.float32(s)) / float(np.float32(s_out)))
           for s in s_w]
    return [m for m, _ in out], [s for _, s in out]


def rounding_right_shift(v: np.ndarray, shift) -> np.ndarray:
    """``(v + 2^(s-1)) >> s`` (``v`` unchanged where s = 0) on int64: floor(v / 2^s + 1/2)."""
    v = np.asarray(v, np.int64)
    s = np.asarray(shift, np.int64)
    r = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    return np.right_shift(v + r, s)


def requantize(acc: np.ndarray, multiplier, shift, zero_point: int, lo: int, hi: int,
               ties_even: bool = False) -> np.ndarray:
    """``clamp(zero_point + rrs(acc * multiplier, shift), lo, hi)`` as int64 (cast to the storage
    type by the caller). ``multiplier``/``shift`` are scalars or arrays broadcasting against ``acc``
    (per channel). ``ties_even``: an exact half rounds to even, as ONNX QuantizeLinear does
    (``(v + 2^(s-1) - 1 + ((v >> s) & 1)) >> s``; the same as half up everywhere else): the average
    pools, whose sum over a window of 2^k inputs at equal scales is an exact half in 1 of 2^k cases."""
    s = np.asarray(shift, np.int64)
    v = np.multiply(np.asarray(acc, np.int64), np.asarray(multiplier, np.int64))   # in place from here on
    r = np.where(s > 0, np.left_shift(np.int64(1), np.maximum(s - 1, 0)), 0)
    if ties_even:
        r = r - (s > 0) + (np.right_shift(v, s) & 1) * (s > 0)
    v += r
    v >>= s
    v += np.int64(zero_point)
    return np.clip(v, lo, hi, out=v)


def activation_clamp(activation: str, params: Sequence[float], qp: QuantParams) -> tuple[int, int]:
    """The integer clamp range of an output with params ``qp`` after a fused ``activation``:
    the storage range, narrowed to [z, hi] by Relu and to [Q(min), Q(max)] by Clip, where Q is
    ONNX QuantizeLinear (round half even, saturating) with the output's params."""
    lo, hi = INT_RANGES[qp.storage]
    if activation == "Relu":
        lo = max(lo, qp.zero_point[0])
    elif activation == "Clip":
        a, b = float(params[0]), float(params[1])
        if math.isfinite(a):
            lo = max(lo, int(quantize(np.float32(a), qp)))
        if math.isfinite(b):
            hi = min(hi, int(quantize(np.float32(b), qp)))
    elif activation:
        raise ValueError(f"activation '{activation}' does not fold into an integer clamp (only Relu, Clip)")
    return lo, hi


def dequant_scales(s_in: float, s_w: Sequence[float]) -> np.ndarray:
    """The per-channel float32 factors of a dequantizing epilogue (a QLinearGemm with a float32
    result): ``f32(f32(s_in) * f32(s_w[c]))``, so that ``y = f32(acc) * f_c``."""
    return (np.float32(s_in) * np.asarray(s_w, np.float32)).astype(np.float32)


def float_clamp(activation: str, params: Sequence[float]) -> tuple[float, float]:
    """The float32 bounds of a dequantizing epilogue's fused Relu/Clip (-inf, inf: none)."""
    if activation == "Relu":
        return 0.0, math.inf
    if activation == "Clip":
        return float(params[0]), float(params[1])
    if activation:
        raise ValueError(f"activation '{activation}' does not fold into a dequantizing epilogue (only Relu, Clip)")
    return -math.inf, math.inf


def dequantized(acc: np.ndarray, s_in: float, s_w: Sequence[float], activation: str = "",
                params: Sequence[float] = (), axis: int = 1) -> np.ndarray:
    """``clamp(f32(acc) * f_c)`` (:func:`dequant_scales`, :func:`float_clamp`) with channels on
    ``axis`` of the int32 accumulator ``acc`` (bias included)."""
    f = dequant_scales(s_in, s_w)
    shape = [1] * acc.ndim
    shape[axis] = f.size
    y = acc.astype(np.float32) * f.reshape(shape)
    lo, hi = float_clamp(activation, params)
    return np.clip(y, np.float32(lo), np.float32(hi))
