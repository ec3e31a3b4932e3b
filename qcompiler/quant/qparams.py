"""From observed ranges to :class:`~qcompiler.ir.types.QuantParams`, and the numpy reference
quantizer with ONNX ``QuantizeLinear`` / ``DequantizeLinear`` semantics.

A real value r is stored as q with r = scale * (q - zero_point). The schemes:

=============================  ======================================  ==========================
scheme                         scale, zero point                       typical use
=============================  ======================================  ==========================
:func:`asymmetric` (uint8)     (hi - lo) / 255 over [min(lo,0),        activations
                               max(hi,0)]; zp = round(-lo / scale)
:func:`symmetric` (int8)       amax / 127, zp = 0 (``restricted``:     activations, weights
                               [-127, 127]); amax / 127.5 full range
:func:`per_channel_symmetric`  one symmetric int8 scale per channel    conv / gemm weights
:func:`bias_params` (int32)    s_in * s_w, zp = 0                      bias of a quantized conv
=============================  ======================================  ==========================

The zero point is an integer, so real 0 is exactly representable (zero padding and ReLU stay
exact). :func:`asymmetric` keeps the scale (hi - lo) / 255 and rounds the ideal zero point
-lo / scale to the nearest integer (as ONNX Runtime, TFLite and PyTorch do): the grid then moves
by less than half a step, so lo and hi themselves are still quantized with at most half a step of
error, like any value inside. (Widening the scale instead, so that lo and hi land exactly on the
grid, made every value's step up to 1/127 coarser: 0.14 dB of SQNR lost on mnistnet.)
Symmetric scales are rounded *up* to float32, so their range stays covered.

``quantize`` follows ONNX: ``q = saturate(round_half_to_even(x / scale) + zero_point)``, with the
division in float32 (as ONNX Runtime computes it), so it is bit-exact with ONNX Runtime; int32
(bias) is computed in float64, as ONNX has no int32 QuantizeLinear.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import INT_RANGES, QuantParams, dequantize, quantize


def qrange(storage: str, restricted: bool = False) -> tuple[int, int]:
    """The integer range of ``storage``; ``restricted`` drops the most negative value of a signed
    type so that it is symmetric ([-127, 127] for int8)."""
    lo, hi = INT_RANGES[storage]
    return (lo + 1, hi) if restricted and lo < 0 else (lo, hi)


MIN_SCALE = float(np.finfo(np.float32).tiny)      # the smallest normal float32


def f32_at_least(x: float) -> float:
    """The smallest float32 >= max(x, MIN_SCALE) (QuantParams stores scales as float32)."""
    x = max(float(x), MIN_SCALE)
    s = np.float32(x)
    if float(s) < x:
        s = np.nextafter(s, np.float32(np.inf))
    return float(s)


def _check_range(lo: float, hi: float) -> tuple[float, float]:
    lo, hi = float(lo), float(hi)
    if not (np.isfinite(lo) and np.isfinite(hi)) or lo > hi:
        raise ValueError(f"invalid range [{lo}, {hi}]: need finite lo <= hi")
    return lo, hi


def asymmetric(lo: float, hi: float, storage: str = "uint8") -> QuantParams:
    """Affine parameters for [lo, hi] (widened to include 0) over ``storage``'s full range:
    scale = (hi - lo) / (qmax - qmin) (float32), zp = round(qmin - lo / scale) (half to even),
    kept inside the storage range. lo and hi lie within half a step of the grid.

    asymmetric(0.0, 6.0)   ->  !quant.uniform<u8:f32, 0.023529412:0>     (ReLU6 output)
    asymmetric(-1.0, 3.0)  ->  !quant.uniform<u8:f32, 0.015686275:64>  (zp 63.75 rounded: 3 -> 3.0039)
    """
    lo, hi = _check_range(lo, hi)
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    qmin, qmax = qrange(storage)
    if hi == lo:                                   # all zeros: any scale represents them
        return QuantParams(storage, (1.0,), (int(np.clip(0, qmin, qmax)),))
    scale = float(np.float32(max((hi - lo) / (qmax - qmin), MIN_SCALE)))
    zp = int(np.clip(np.rint(qmin - lo / scale), qmin, qmax))
    return QuantParams(storage, (scale,), (zp,))


def _symmetric_scale(amax: np.ndarray, storage: str, restricted: bool) -> np.ndarray:
    qmin, qmax = qrange(storage, restricted)
    half = (qmax - qmin) / 2.0                     # 127 restricted, 127.5 full range
    amax = np.asarray(amax, np.float64)
    scale = np.where(amax > 0, amax / half, 1.0)   # an all-zero tensor/channel: any scale works
    return np.array([f32_at_least(s) for s in np.ravel(scale)])


def symmetric(lo: float, hi: float, storage: str = "int8", restricted: bool = True) -> QuantParams:
    """Zero point 0, scale = max(|lo|, |hi|) / 127 (``restricted``: [-127, 127] as TensorRT and
    most int8 kernels want) or / 127.5 (full [-128, 127]; +amax then saturates half a step)."""
    lo, hi = _check_range(lo, hi)
    if INT_RANGES[storage][0] >= 0:
        raise ValueError(f"symmetric quantization needs a signed storage type, not {storage}")
    scale = _symmetric_scale(max(abs(lo), abs(hi)), storage, restricted)
    return QuantParams(storage, (float(scale[0]),), (0,))


def per_channel_symmetric(w: np.ndarray, axis: int = 0, storage: str = "int8",
                          restricted: bool = True) -> QuantParams:
    """Symmetric parameters per index along ``axis`` of a weight array (axis 0: a conv's output
    channels; for Gemm with transB=0 the output channels are axis 1)."""
    w = np.asarray(w)
    if w.ndim == 0:
        raise ValueError("per-channel quantization needs a weight of rank >= 1")
    axis = axis % w.ndim
    if INT_RANGES[storage][0] >= 0:
        raise ValueError(f"symmetric quantization needs a signed storage type, not {storage}")
    others = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w.astype(np.float64)), axis=others) if w.size else np.zeros(w.shape[axis])
    if not np.all(np.isfinite(amax)):
        raise ValueError("weight holds NaN or Inf")
    scale = _symmetric_scale(amax, storage, restricted)
    return QuantParams(storage, tuple(scale), (0,) * len(scale), axis=axis)


def bias_params(input_qp: QuantParams, weight_qp: QuantParams) -> QuantParams:
    """int32 parameters for the bias of a quantized Conv/Gemm: scale = s_in * s_w, zero point 0;
    per-channel (axis 0 of the bias) when the weight is per-channel."""
    if input_qp.per_channel:
        raise ValueError("the input of a quantized conv/gemm must be quantized per tensor")
    s_in = np.float32(input_qp.scale[0])
    scales = tuple(float(s_in * np.float32(s)) for s in weight_qp.scale)
    axis = 0 if weight_qp.per_channel else None
    return QuantParams("int32", scales, (0,) * len(scales), axis=axis)


# ---- reference quantizer (quantize/dequantize: qcompiler.ir.types) -----------------------------
def fake_quantize(x: np.ndarray, qp: QuantParams) -> np.ndarray:
    """dequantize(quantize(x)): x as the quantized model sees it."""
    return dequantize(quantize(x, qp), qp)


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """Signal-to-quantization-noise ratio 10*log10(sum(ref^2) / sum((ref - test)^2)) in dB;
    inf when equal. Each bit of precision is worth about 6 dB (8-bit uniform: ~40-50 dB)."""
    ref = np.asarray(ref, np.float64)
    test = np.asarray(test, np.float64)
    if ref.shape != test.shape:
        raise ValueError(f"shapes differ: {ref.shape} vs {test.shape}")
    return sqnr_from_energies(float(np.sum(ref ** 2)), float(np.sum((ref - test) ** 2)))


def sqnr_from_energies(signal: float, noise: float) -> float:
    """10*log10(signal / noise) in dB from the summed energies Σ ref² and Σ (ref - test)²: inf when
    the noise is 0, -inf when the signal is (sums kept over many runs give a dataset's SQNR)."""
    if noise == 0.0:
        return float("inf")
    if signal == 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(signal / noise))
