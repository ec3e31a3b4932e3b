"""Float8 quantization: the two OCP formats, their scales, and distances in float8 steps.

A real value r is stored as the float8 value q with r = s q (zero point 0; ONNX opset 19's float8
QuantizeLinear with ``saturate=1``). The formats (sign, exponent, mantissa bits; bias):

==========  ==================  ====================  ==========  ========================  =========
format      storage (numpy)     bits / exponent bias  largest     smallest (subnormal)      inf / NaN
==========  ==================  ====================  ==========  ========================  =========
E4M3        ``float8_e4m3fn``   1.4.3 / 7             448         2^-6 (2^-9)               none / S.1111.111
E5M2        ``float8_e5m2``     1.5.2 / 15            57344       2^-14 (2^-16)             IEEE-like
==========  ==================  ====================  ==========  ========================  =========

E4M3 keeps 3 mantissa bits over 18 binades (inference); E5M2 2 bits over 32 (gradients, range).
One scale covers a tensor or an output channel, from the largest magnitude seen:

    s = amax / max      (E4M3: amax / 448, E5M2: amax / 57344; rounded *up* to float32)

so that amax lands on the largest float8 value and nothing saturates on the calibration data; a
smaller amax (a percentile) clips outliers to +-max instead. Rounding is to nearest, ties to even,
saturating at +-max (:func:`qcompiler.ir.types.round_fp8`; E4M3 has no inf, so a cast that did not
saturate would give NaN above 464).

A conv/gemm of float8 operands multiplies exactly in float32 (two 4-bit significands make at most
8 bits) and sums in float32: :mod:`qcompiler.quant.reference` forms the sum in float64 and rounds
it once, which for E4M3 is the exact sum correctly rounded (every product is a multiple of 2^-18
below 2^18 in magnitude: the float64 sum is exact below 2^35, any K that fits a layer); a float32
kernel differs by the float32 rounding of its own summation order, at most K 2^-24 Σ|x w|.

:func:`ulps` counts float8 steps between two tensors of one format: the distance of their codes
in the order of the values (sign-magnitude codes made monotone), what "within one float8 ulp per
element" measures.
"""
from __future__ import annotations

import enum

import numpy as np

from ..ir.types import FP8_MAX, QuantParams, np_dtype, round_fp8
from .qparams import f32_at_least


class Fp8Format(str, enum.Enum):
    """``--fp8-format``: E4M3 (default: precision) or E5M2 (range)."""
    E4M3 = "e4m3"
    E5M2 = "e5m2"

    @property
    def storage(self) -> str:
        return {"e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2"}[self.value]

    @property
    def max(self) -> float:
        return FP8_MAX[self.storage]

    @classmethod
    def of_storage(cls, storage: str) -> "Fp8Format":
        """The format whose storage dtype is ``storage`` (``float8_e4m3fn`` -> E4M3)."""
        return next(f for f in cls if f.storage == storage)


FORMATS = tuple(f.value for f in Fp8Format)


def _scale(amax: float, storage: str) -> float:
    return f32_at_least(amax / FP8_MAX[storage]) if amax > 0 and np.isfinite(amax) else 1.0


def fp8_params(lo: float, hi: float, storage: str) -> QuantParams:
    """Per-tensor float8 parameters for the range [lo, hi]: scale max(|lo|, |hi|) / max, zero point 0.

    fp8_params(-1.0, 3.5, "float8_e4m3fn")   ->  !quant.uniform<f8E4M3FN:f32, 0.0078125>
    """
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ValueError(f"invalid range [{lo}, {hi}]: need finite lo <= hi")
    return QuantParams(storage, (_scale(max(abs(lo), abs(hi)), storage),), (0,))


def per_channel_fp8(w: np.ndarray, axis: int, storage: str) -> QuantParams:
    """One float8 scale per index along ``axis`` of a weight (a conv's or gemm's output channels)."""
    w = np.asarray(w, np.float64)
    axis = axis % w.ndim
    others = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=others) if w.size else np.zeros(w.shape[axis])
    if not np.all(np.isfinite(amax)):
        raise ValueError("weight holds NaN or Inf")
    scales = tuple(_scale(float(a), storage) for a in amax)
    return QuantParams(storage, scales, (0,) * len(scales), axis=axis)


def codes(a: np.ndarray, storage: str) -> np.ndarray:
    """The stored bytes of a float8 tensor (a float8 array, its uint8 bits, or float values that
    are float8 values of ``storage``, rounded if not)."""
    a = np.asarray(a)
    if a.dtype == np.uint8:
        return a
    if a.dtype != np_dtype(storage):
        a = round_fp8(a.astype(np.float32), storage)
    return a.view(np.uint8)


def ordinal(c: np.ndarray) -> np.ndarray:
    """float8 codes (uint8, sign-magnitude) as integers in the order of their values: +0 and -0
    both 0, adjacent finite values 1 apart."""
    c = c.astype(np.int64)
    mag = c & 0x7F
    return np.where(c & 0x80, -mag, mag)


NOISE_FLOOR = 2.0 ** -16
"""Relative to a tensor's largest magnitude, the difference below which two float8 values count as
equal in :func:`ulps` with ``floor``: both are zero to float32 precision. Near 0 the float8 grid is
finer than the float32 rounding of a sum (E5M2 steps down to 2^-16 s): an exact cancellation, 0 in
the kernels' products of float8 values, is 4e-8 in ONNX Runtime's products of dequantized ones,
and the two land tens of float8 steps apart."""


def ulps(a: np.ndarray, b: np.ndarray, storage: str, floor: float = 0.0) -> np.ndarray:
    """|a - b| in float8 steps, element-wise (NaN codes compare by their bits' rank); with ``floor``
    (float8 units), pairs within it count 0 steps (see :data:`NOISE_FLOOR`)."""
    ca, cb = codes(a, storage), codes(b, storage)
    d = np.abs(ordinal(ca) - ordinal(cb))
    if floor > 0:
        va, vb = (c.view(np_dtype(storage)).astype(np.float64) for c in (ca, cb))
        d = np.where(np.abs(va - vb) <= floor, 0, d)
    return d


def noise_floor(b: np.ndarray, storage: str) -> float:
    """:data:`NOISE_FLOOR` times the largest finite magnitude of float8 tensor ``b``, in float8 units."""
    v = np.abs(codes(b, storage).view(np_dtype(storage)).astype(np.float64))
    v = v[np.isfinite(v)]
    return NOISE_FLOOR * float(v.max()) if v.size else 0.0


def step(v: np.ndarray, storage: str) -> np.ndarray:
    """The spacing of ``storage`` float8 values at magnitude ``v`` (>= 0, in float8 units): 2^(e - m)
    for v in [2^e, 2^(e+1)) with m mantissa bits, the subnormal step below the smallest normal, the
    last step at and above max."""
    mbits, bias = (3, 7) if storage == "float8_e4m3fn" else (2, 15)
    v = np.minimum(np.asarray(v, np.float64), FP8_MAX[storage])
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.maximum(v, 2.0 ** (1 - bias))))
    return 2.0 ** (e - mbits)
