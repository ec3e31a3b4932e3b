"""HardSwish fused into the integer epilogue of QLinearConv / QLinearGemm.

A conv (or gemm) followed by HardSwish, or by the scaled form the ``equalize`` pass leaves
(``z · HardSigmoid(S·z)``, see :func:`qcompiler.passes.equalize.scaled_hardswish`), computes per
output channel c

    y = z · clamp(a_c z + b, 0, 1),    a_c = α S_c > 0   (HardSwish: α = 1/6, b = 1/2, S = 1)

Quantizing z to 8 bits before the activation (QLinearConv -> DQ -> HardSwish -> Q) adds a second
rounding, on a grid that must also cover z's negative tail which HardSwish maps near 0, so z's
step is coarser than y's. Here the activation is evaluated on the
int32 accumulator in integers, with ONE quantization point (y's), as TFLite's int8 HardSwish does
on 16-bit intermediates (Jacob et al., *Quantization and Training of Neural Networks for Efficient
Integer-Arithmetic-Only Inference*, CVPR 2018, §2.2; TFLite ``reference_ops::HardSwish``).

With s_y the output step and s_pre = s_y / 2^k (a pre-activation grid 2^k times finer than y's), the
real value a channel's accumulator stands for is z = s_x s_w acc, and (rrs: the rounding right shift
of :mod:`.requant`, floor(v / 2^s + 1/2), int64)::

    p   = clamp(rrs(acc · m_pre, s_pre), -c_b, p_hi)      m_pre 2^-s_pre ≈ s_x s_w / s_pre = 2^k M
    u   = min(p + c_b, c_1)                               c_b = round(b / (a s_pre)), c_1 = round(1 / (a s_pre))
    y_q = clamp(z_y + rrs(p · u · m2, s2), lo, hi)        m2 2^-s2 ≈ 1 / (2^k c_1)

p ≈ z / s_pre and u / c_1 ≈ clamp(a z + b, 0, 1) (u ∈ [0, c_1] since p >= -c_b), so
p·u / (2^k c_1) ≈ z·h(z) / s_y = y / s_y. The second multiplier is 1 / (2^k c_1) rather than
a s_pre² / s_y: then the saturated branch (u = c_1) is y = p / 2^k exactly, and the rounding of c_1
only moves the gate's slope by at most 1 / (2 c_1) relative.

Error before the final rounding, in output steps (|z| <= (1 + |b|)/a where the gate is open):

* p's rounding: |Δz| <= s_pre / 2 and |dy/dz| <= max(1, |b|, |2 - b|) (1.5 for HardSwish, at
  z = 3), so <= 1.5 · 2^-(k+1);
* c_b's rounding (1/2 of u's unit) times |z| a: <= max(|b|, |1-b|) · 2^-(k+1);
* c_1's rounding: y · 1/(2 c_1) <= (hi - lo) / (2 c_1);
* m2's rounding: relative 2^-(bits of m2) <= 2^-16, times (hi - lo).

:func:`plan` takes k = 12 where m2 can keep >= 24 bits (else the largest such k >= 6, with >= 16 bits)
and c_1 >= 2^12: the sum stays below 0.05 of a step in the worst case (k = 6) and near 2^-12 (k = 12),
so y_q is the correctly rounded y except where y sits within that much of a rounding boundary: at
most 1 LSB from a float HardSwish quantized once, and equal to it for all but ~0.05 % of values
(k = 12; a float32 conv in ONNX Runtime is itself about that far from the exact sum).

Clamping p is exact: below -c_b the gate is 0 (u = 0, y = 0 as at -c_b); above
p_hi = max(c_1 - c_b, 0) + 2^k (hi - lo + 2) the gate is 1 and y = p/2^k already exceeds
hi - lo + 1 > hi - z_y, so the output saturates. It bounds |p·u| <= B = max(p_hi, |c_b|) c_1; m2 gets
min(31, 62 - ceil(log2 B)) bits so that p·u·m2 + 2^(s2-1) < 2^63: no int64 overflow anywhere.

The op keeps ``multiplier``/``shift`` = (m_pre, s_pre) per channel and a ``hardswish`` attribute
``[c_b, c_1, m2, s2, p_hi]``, five lists of one entry or one per output channel.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Sequence

import numpy as np

from ..ir.types import INT_RANGES
from .requant import quantize_multiplier, rounding_right_shift

HSWISH_ALPHA = 1.0 / 6.0
HSWISH_BETA = 0.5
K_TARGET = 12             # p's grid: 2^12 finer than y's where the int64 products allow ...
MIN_K = 6                 # ... and never coarser than 2^-6 of a step
MIN_ONE = 2 ** 12         # c_1 >= 2^12: the gate's slope within 2^-13 relative
MAX_K = 24
GOOD_M2_BITS = 24         # m2 keeps >= 24 bits unless that forces k below K_TARGET ...
MIN_M2_BITS = 16          # ... and never fewer than 16


def gate(activation_params: Sequence[float], channels: int) -> tuple[np.ndarray, float]:
    """``(a_c, b)`` of y = z clamp(a_c z + b, 0, 1) from a QLinear op's HardSwish params:
    ``[]`` is HardSwish (a = 1/6, b = 1/2), ``[alpha, beta, S...]`` the scaled form with S of one
    entry or one per channel."""
    p = [float(v) for v in activation_params or []]
    if not p:
        return np.full(channels, HSWISH_ALPHA), HSWISH_BETA
    if len(p) < 3:
        raise ValueError(f"HardSwish params must be [] or [alpha, beta, S...], got {p}")
    alpha, beta, S = p[0], p[1], np.asarray(p[2:], np.float64)
    if S.size not in (1, channels):
        raise ValueError(f"HardSwish scale S has {S.size} entries for {channels} channels")
    a = np.broadcast_to(alpha * S.astype(np.float32).astype(np.float64), (channels,)).copy()
    if not np.all(np.isfinite(a)) or np.any(a <= 0):
        raise ValueError("HardSwish gate slopes alpha * S must be finite and > 0")
    return a, beta


def plan(M: Sequence[float], s_out: float, storage: str, slopes: np.ndarray, beta: float
         ) -> tuple[list[int], list[int], list[list[int]]]:
    """``(multiplier, shift, hardswish)`` attributes for per-channel real multipliers
    M_c = s_x s_w[c] / s_y (see the module docstring). Raises ValueError when a channel cannot be
    represented (a gate slope absurdly small or large against the output step)."""
    lo, hi = INT_RANGES[storage]
    M = np.broadcast_to(np.asarray(M, np.float64).reshape(-1), (len(slopes),))
    ms, ss, cb, c1, m2s, s2s, phs = [], [], [], [], [], [], []
    s_y = float(np.float32(s_out))
    for Mc, a in zip(M, slopes):
        inv = 1.0 / (float(a) * s_y)                         # 1 / (a s_y): the gate's width in y steps
        k_one = math.ceil(math.log2(MIN_ONE / inv)) if inv < MIN_ONE else 0
        best = None
        for k in range(max(K_TARGET, k_one), MIN_K - 1, -1):    # the finest grid whose m2 keeps its bits
            if k > MAX_K:
                continue
            best = _channel(float(Mc), inv, float(beta), k, lo, hi)
            if best is not None and (best[-1] >= GOOD_M2_BITS or k <= max(MIN_K, k_one)):
                break
        if best is None:
            raise ValueError(f"HardSwish gate slope {a} does not fit an int64 epilogue for output step {s_y}")
        m, s, cbias, one, m2, s2, p_hi, _ = best
        ms.append(m), ss.append(s), cb.append(cbias), c1.append(one)
        m2s.append(m2), s2s.append(s2), phs.append(p_hi)
    attr = [_compact(v) for v in (cb, c1, m2s, s2s, phs)]
    if len(set(ss)) == 1 and len(set(ms)) == 1:
        ms, ss = ms[:1], ss[:1]
    return ms, ss, attr


def _channel(Mc: float, inv: float, beta: float, k: int, lo: int, hi: int):
    """One channel's (m_pre, s_pre, c_b, c_1, m2, s2, p_hi, bits of m2) on the grid s_y / 2^k, or
    None when m2 would keep fewer than MIN_M2_BITS bits."""
    m, s = quantize_multiplier(Mc * 2 ** k)
    one = round(Fraction(inv) * 2 ** k)
    cbias = round(Fraction(beta) * Fraction(inv) * 2 ** k)
    p_hi = max(one - cbias, 0) + 2 ** k * (hi - lo + 2)
    bound = max(p_hi, abs(cbias)) * one
    bits = min(31, 62 - math.ceil(math.log2(bound + 1)))
    if bits < MIN_M2_BITS:
        return None
    _, s2 = quantize_multiplier(1.0 / (2 ** k * one))       # normalized: m2 in [2^30, 2^31)
    s2 -= 31 - bits
    m2 = round(Fraction(1, 2 ** k * one) * 2 ** s2)
    return m, s, cbias, one, m2, s2, p_hi, bits


def epilogue_attrs(s_in: float, s_w: Sequence[float], out_qp, activation_params, channels: int) -> dict:
    """``multiplier``, ``shift`` and ``hardswish`` of a QLinearConv/QLinearGemm with input step
    ``s_in``, weight steps ``s_w`` (one or per channel), output params ``out_qp`` and HardSwish
    ``activation_params`` (see :func:`gate`); M_c is formed in float64 from the float32 scales,
    as :func:`qcompiler.quant.requant.conv_multipliers` does."""
    sx, sy = float(np.float32(s_in)), float(np.float32(out_qp.scale[0]))
    M = [sx * float(np.float32(w)) / sy for w in s_w]
    a, b = gate(activation_params, channels)
    ms, ss, hs = plan(M, sy, out_qp.storage, a, b)
    return {"multiplier": ms, "shift": ss, "hardswish": hs}


def _compact(v: list[int]) -> list[int]:
    return v[:1] if len(set(v)) == 1 else [int(x) for x in v]


def check_attr(hs, channels: int) -> str | None:
    """Why a ``hardswish`` attribute is malformed (None: it is fine)."""
    if not isinstance(hs, (list, tuple)) or len(hs) != 5:
        return "hardswish must be five lists [c_b, c_1, m2, s2, p_hi]"
    for name, v in zip(("c_b", "c_1", "m2", "s2", "p_hi"), hs):
        if not isinstance(v, (list, tuple)) or len(v) not in (1, channels):
            return f"hardswish {name} must have 1 or {channels} entries"
    cb, c1, m2, s2, ph = (np.asarray(v, np.int64) for v in hs)
    if np.any(c1 <= 0) or np.any(m2 < 0) or np.any(m2 >= 2 ** 31) or np.any(s2 < 0) or np.any(s2 > 63):
        return "hardswish needs c_1 > 0, m2 in [0, 2^31) and s2 in [0, 63]"
    bound = np.maximum(ph, np.abs(cb)).astype(object) * c1.astype(object) * m2.astype(object)
    if any(int(b) + 2 ** 62 >= 2 ** 63 for b in np.atleast_1d(bound)):
        return "hardswish products p·u·m2 could overflow int64"
    return None


def requantize(acc: np.ndarray, multiplier, shift, hs, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """The epilogue on an int64 accumulator (``multiplier``, ``shift`` and the five ``hs`` entries
    scalars or arrays broadcasting against ``acc``, per channel)."""
    cb, c1, m2, s2, ph = (np.asarray(v, np.int64) for v in hs)
    v = np.multiply(np.asarray(acc, np.int64), np.asarray(multiplier, np.int64))
    p = np.clip(rounding_right_shift(v, shift), -cb, ph)
    u = np.minimum(p + cb, c1)
    y = rounding_right_shift(p * u * m2, s2) + np.int64(zero_point)
    return np.clip(y, lo, hi)
