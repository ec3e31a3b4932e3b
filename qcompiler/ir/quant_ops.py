"""The quantized op kinds of the registry (see :mod:`.ops`): the integer-only ops the quantize pass
makes (QuantizeLinear, DequantizeLinear, QLinearConv, QLinearGemm, QLinearAdd, QLinearMul, the
QLinear pools, Requantize) and the integer ops of pre-quantized ONNX models (ConvInteger,
MatMulInteger), with their type inference, and the form of the fused HardSwish epilogue's
attributes (:func:`gate`, :func:`check_attr`; the epilogue itself: :mod:`qcompiler.quant.hardswish`).

Importing :mod:`qcompiler.ir` registers them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .ops import InferError, _conv, _global_pool, _matmul, _pool, broadcast_shapes, register_op
from .types import TensorType, is_fp8

HSWISH_ALPHA = 1.0 / 6.0
HSWISH_BETA = 0.5
MAX_GATE_STEPS = 2 ** 15   # the gate's open region, in output steps, above which hardswish.plan() refuses


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


def check_attr(hs, channels: int) -> str | None:
    """Why a ``hardswish`` attribute is malformed (None: it is fine)."""
    if not isinstance(hs, (list, tuple)) or len(hs) != 3 or not all(isinstance(v, (list, tuple)) for v in hs):
        return "hardswish must be three lists [sigma, g, [b]]"
    sig, g, b = hs
    if len(sig) not in (1, channels) or len(g) not in (1, channels) or len(b) != 1:
        return f"hardswish sigma and g must have 1 or {channels} entries, b one"
    try:
        sig, g, b = (np.asarray(v, np.float64) for v in hs)
    except (TypeError, ValueError):
        return "hardswish entries must be numbers"
    if not (np.all(np.isfinite(sig)) and np.all(sig > 0) and np.all(np.isfinite(g)) and np.all(g > 0)
            and np.all(np.isfinite(b))):
        return "hardswish needs finite sigma > 0, g > 0 and b"
    if np.any((np.abs(b) + np.abs(1 - b)) / g > MAX_GATE_STEPS):
        return f"hardswish gate wider than {MAX_GATE_STEPS} output steps (g too small)"
    return None


# ---- quantized ops (made by the quantize pass; see qcompiler.passes.quantize) -----------------
# QuantizeLinear takes its scale/zero point from its RESULT type, DequantizeLinear from its OPERAND
# type. The integer-only ops compute in int32 and requantize with fixed-point ``multiplier``/``shift``
# lists (qcompiler.quant.requant):  q_out = clamp(z_out + rrs(acc * m, s), lo, hi)  with
#   QLinearConv(xq, wq[, bq])   acc = sum (xq - z_x) * wq + bq       (wq symmetric: z_w = 0), m/s per
#   QLinearGemm(aq, wq[, bq])   acc = sum_k (aq[i,k] - z_a) * wq[j,k] + bq[j]   output channel or one
#                               (wq is N x K: weight rows are output channels, like Gemm transB=1)
#   (QLinearConv and QLinearGemm with ``multiplier = []``: the float32 result f32(acc) * f32(s_x s_w[c]),
#    clamped by a Relu/Clip activation, for a layer whose result no integer op reads)
#   float8 (xq, wq float8_e4m3fn/float8_e5m2, zero points 0; qcompiler.quant.fp8): always the float32
#   result, with a float32 bias b added after the scale, and the accumulator a float32 sum:
#     acc = f32(Σ xq * wq)   (each product exact in float32)   y = clamp(acc * f32(s_x s_w[c]) + b[c])
#   QLinearAdd(aq, bq)          q = clamp(z_out + rrs((aq-z_a)*m_a + (bq-z_b)*m_b, s)), multiplier [m_a, m_b], shift [s]
#   QLinearMul(aq, bq)          acc = (aq - z_a) * (bq - z_b) (numpy broadcasting), M = s_a * s_b / s_out
#   QLinearGlobalAveragePool(xq), QLinearAveragePool(xq)   acc = window sum of (xq - z_x), M = s_x / (s_out * count)
#   Requantize(q)               acc = q - z_in, M = s_in / s_out
# ``activation`` "" | "Relu" | "Clip" (with ``activation_params`` [min, max]) narrows the clamp range
# [lo, hi] (qcompiler.quant.requant.activation_clamp). Results carry their quant params in their type.
# QLinearConv/QLinearGemm also take ``activation`` "HardSwish": y = z clamp(a_c z + b, 0, 1) evaluated in
# float32 on the accumulator with one rounding to the output grid (qcompiler.quant.hardswish),
# ``activation_params`` [] (HardSwish) or [alpha, beta, S...] (a_c = alpha S_c, b = beta: the equalized
# form), and ``hardswish`` = [sigma, g, [b]] (float32 lists: sigma_c = M_c, g_c = a_c s_out).
# Plain ops may also take quantized operands; their result keeps the operand's params: MaxPool,
# GlobalMaxPool, Reshape, Flatten, Transpose, Squeeze, Unsqueeze, Slice, Identity work on the stored
# integers (MaxPool pads with the storage minimum), Pad pads with Q(value) (the zero point for 0),
# Relu/Clip clamp at Q(0) / [Q(min), Q(max)], Concat needs all operands in the result's params.
QUANT_ACTIVATIONS = ("", "Relu", "Clip")


def _quant_operand(kind: str, t: TensorType, what: str, *, per_tensor: bool = True) -> None:
    if t.quant is None:
        raise InferError(f"{kind} {what} must have a quantized type, got {t}")
    if per_tensor and t.quant.per_channel:
        raise InferError(f"{kind} {what} must be quantized per tensor, got {t}")


def _requant_attrs(kind: str, a: dict, channels: int, *, act: bool | str = True) -> None:
    m, s = a["multiplier"], a["shift"]
    if not m or not s:
        raise InferError(f"{kind} needs 'multiplier' and 'shift' attributes")
    if len(s) not in (1, len(m)) or (channels and len(m) not in (1, channels)):
        raise InferError(f"{kind}: {len(m)} multipliers / {len(s)} shifts for {channels} output channels")
    if any(not 0 <= int(x) < 2 ** 31 for x in m) or any(not 0 <= int(x) <= 63 for x in s):
        raise InferError(f"{kind}: multipliers must lie in [0, 2^31) and shifts in [0, 63]")
    if act == "epilogue" and a["activation"] == "HardSwish":
        why = check_attr(a.get("hardswish"), channels)
        if why is None:
            try:
                gate(a["activation_params"], channels)
            except ValueError as e:
                why = str(e)
        if why is not None:
            raise InferError(f"{kind}: {why}")
    elif act and a["activation"] not in QUANT_ACTIVATIONS:
        raise InferError(f"{kind}: activation '{a['activation']}' cannot fold into the output clamp "
                         f"(known: Relu, Clip{', HardSwish' if act == 'epilogue' else ''})")
    if act == "epilogue" and a["activation"] != "HardSwish" and a.get("hardswish"):
        raise InferError(f"{kind}: a 'hardswish' epilogue attribute without activation HardSwish")


def _quantize_linear(ts, a):
    if ts[0].quant is not None or ts[0].dtype not in ("float32", "float16", "float64", "bfloat16"):
        raise InferError(f"QuantizeLinear operand must be float, got {ts[0]}")
    return [TensorType(ts[0].shape, "uint8")]      # storage and params: the result type


def _dequantize_linear(ts, a):
    _quant_operand("DequantizeLinear", ts[0], "operand", per_tensor=False)
    return [TensorType(ts[0].shape, ts[0].quant.expressed)]


def _check_weight_bias(kind: str, ts, channels: int, a: dict) -> None:
    x, w = ts[0], ts[1]
    _quant_operand(kind, x, "input")
    _quant_operand(kind, w, "weight", per_tensor=False)
    if w.quant.per_channel and w.quant.axis % w.rank != 0:
        raise InferError(f"{kind} weight must be quantized per tensor or along axis 0, got axis {w.quant.axis}")
    if any(z != 0 for z in w.quant.zero_point):
        raise InferError(f"{kind} weight must be quantized symmetrically (zero point 0)")
    if is_fp8(x.dtype) or is_fp8(w.dtype):
        _check_fp8(kind, ts, channels, a)
        return
    if len(ts) == 3:
        b = ts[2]
        _quant_operand(kind, b, "bias", per_tensor=False)
        if b.dtype != "int32" or any(z != 0 for z in b.quant.zero_point) or b.shape != (channels,):
            raise InferError(f"{kind} bias must be int32 of shape ({channels},) with zero point 0, got {b}")
        sx = np.float32(x.quant.scale[0])
        want = [float(sx * np.float32(s)) for s in w.quant.scale]
        got = list(b.quant.scale)
        if len(got) != len(want) or not np.allclose(got, want, rtol=1e-6, atol=0):
            raise InferError(f"{kind} bias scale must be input scale x weight scale")


def _check_fp8(kind: str, ts, channels: int, a: dict) -> None:
    """A float8 conv/gemm (see above): float8 input and weight, a float32 result, a float32 bias."""
    x, w = ts[0], ts[1]
    if not (is_fp8(x.dtype) and is_fp8(w.dtype)):
        raise InferError(f"{kind} takes a float8 input with a float8 weight (or integers with integers), "
                         f"got {x.dtype} and {w.dtype}")
    if not dequantizes(a):
        raise InferError(f"{kind} of float8 operands returns its float32 result (multiplier = [])")
    if len(ts) == 3 and (ts[2].quant is not None or ts[2].dtype != "float32" or ts[2].shape != (channels,)):
        raise InferError(f"{kind} of float8 operands takes a float32 bias of shape ({channels},), got {ts[2]}")


def _qlinear_conv(ts, a):
    _check_weight_bias("QLinearConv", ts, ts[1].shape[0], a)
    out = _conv([TensorType(t.shape, "float32") for t in ts[:2]], a)[0]
    if _float_result("QLinearConv", a):            # float32 result: y = f32(acc) * f32(s_x s_w[c])
        return [TensorType(out.shape, "float32")]
    _requant_attrs("QLinearConv", a, ts[1].shape[0], act="epilogue")
    return [TensorType(out.shape, ts[0].dtype)]


def _qlinear_gemm(ts, a):
    A, W = ts[0], ts[1]
    if A.rank != 2 or W.rank != 2 or A.shape[1] != W.shape[1]:
        raise InferError(f"QLinearGemm needs A (M x K) and W (N x K), got {A.shape} and {W.shape}")
    _check_weight_bias("QLinearGemm", ts, W.shape[0], a)
    if _float_result("QLinearGemm", a):            # float32 result: y = f32(acc) * f32(s_a s_w[n])
        return [TensorType((A.shape[0], W.shape[0]), "float32")]
    _requant_attrs("QLinearGemm", a, W.shape[0], act="epilogue")
    return [TensorType((A.shape[0], W.shape[0]), A.dtype)]


def _float_result(kind: str, a: dict) -> bool:
    """Whether a QLinearConv/QLinearGemm returns its float32 (dequantized) result (``multiplier =
    []``), checking that such an op has no shift and at most a Relu/Clip (a float clamp)."""
    if not dequantizes(a):
        return False
    if a.get("shift") or a["activation"] not in ("", "Relu", "Clip") or a.get("hardswish"):
        raise InferError(f"{kind} with a float32 result (multiplier = []) takes no shift and only a "
                         "Relu/Clip activation")
    return True


def dequantizes(a: dict) -> bool:
    """Whether a QLinearConv/QLinearGemm's attributes ask for its float32 (dequantized) result:
    ``multiplier = []``."""
    m = a.get("multiplier")
    return m is not None and len(m) == 0


def _qlinear_add(ts, a):
    for i, t in enumerate(ts):
        _quant_operand("QLinearAdd", t, f"operand {i}")
    _requant_attrs("QLinearAdd", a, 0)
    if len(a["multiplier"]) != 2 or len(a["shift"]) != 1:
        raise InferError("QLinearAdd takes multiplier [m_a, m_b] and one shared shift")
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), ts[0].dtype)]


def _qlinear_mul(ts, a):
    for i, t in enumerate(ts):
        _quant_operand("QLinearMul", t, f"operand {i}")
    _requant_attrs("QLinearMul", a, 0)
    if len(a["multiplier"]) != 1 or len(a["shift"]) != 1:
        raise InferError("QLinearMul takes one multiplier and one shift (M = s_a s_b / s_out)")
    return [TensorType(broadcast_shapes(ts[0].shape, ts[1].shape), ts[0].dtype)]


def _qlinear_pool(kind, base):
    def infer(ts, a):
        _quant_operand(kind, ts[0], "input")
        _requant_attrs(kind, a, 1, act=False)
        if kind == "QLinearAveragePool" and any(a["pads"] or []) and not a["count_include_pad"]:
            raise InferError("QLinearAveragePool needs a constant window count: no pads or count_include_pad = 1")
        if kind == "QLinearAveragePool" and a["ceil_mode"]:
            raise InferError("QLinearAveragePool needs ceil_mode = 0 (a constant window count)")
        return [TensorType(base(ts, a)[0].shape, ts[0].dtype)]
    return infer


def _requantize(ts, a):
    _quant_operand("Requantize", ts[0], "operand")
    _requant_attrs("Requantize", a, 1, act=False)
    return [TensorType(ts[0].shape, ts[0].dtype)]


_RQ = {"multiplier": None, "shift": None}
_ACT = {"activation": "", "activation_params": []}
register_op("QuantizeLinear", _quantize_linear, quantized_result=True,
            doc="q = saturate(round_half_even(x / scale) + zero_point); params in the result type")
register_op("DequantizeLinear", _dequantize_linear, doc="x = (q - zero_point) * scale; params in the operand type")
register_op("QLinearConv", _qlinear_conv, {"strides": None, "dilations": None, "pads": None, "group": 1,
                                           **_ACT, **_RQ, "hardswish": []}, (2, 3),
            quantized_result=lambda a: not dequantizes(a),
            doc="int8 conv: xq, wq[, bq int32]; fixed-point requantization, or with multiplier = [] the "
                "float32 result f32(acc) * f32(s_x s_w[c]) (no integer op reads it)")
register_op("QLinearGemm", _qlinear_gemm, {**_ACT, **_RQ, "hardswish": []}, (2, 3),
            quantized_result=lambda a: not dequantizes(a),
            doc="int8 A (M x K) times W^T (W: N x K) plus int32 bias; fixed-point requantization, or with "
                "multiplier = [] the float32 result f32(acc) * f32(s_a s_w[n]) (ONNX Runtime's QGemm without y_scale)")
register_op("QLinearAdd", _qlinear_add, {**_ACT, **_RQ}, (2, 2), quantized_result=True,
            doc="both operands rescaled to the output scale with one shared shift")
register_op("QLinearMul", _qlinear_mul, {**_ACT, **_RQ}, (2, 2), quantized_result=True,
            doc="integer product (aq - z_a)(bq - z_b), broadcasting, requantized by M = s_a s_b / s_out")
register_op("QLinearGlobalAveragePool", _qlinear_pool("QLinearGlobalAveragePool", _global_pool), _RQ,
            quantized_result=True, doc="integer sum over the spatial axes, requantized")
register_op("QLinearAveragePool", _qlinear_pool("QLinearAveragePool", _pool),
            {"kernel_shape": None, "strides": None, "pads": None, "ceil_mode": 0, "count_include_pad": 0, **_RQ},
            quantized_result=True, doc="integer window sum, requantized (constant window count)")
register_op("Requantize", _requantize, _RQ, quantized_result=True, doc="q_out = requant(q - z_in): change params")


# Dynamic int8 (qcompiler.quant.dynamic): an activation quantized at run time to asymmetric uint8.
#   DynamicQuantParams(a)               a float32 (M x K) -> float32 (R x 3), rows [s, 1/s, z]: R = M
#                                       (``granularity`` "token": one per row) or 1 ("tensor")
#   DynamicQLinearGemm(a, p, wq[, b])   wq int8 (N x K, symmetric, per tensor or per output channel),
#                                       b float32 (N,); q = clamp(round(a * p[:,1]) + p[:,2], 0, 255),
#   acc = Σ_k q[m,k] wq[n,k] - z[m] Σ_k wq[n,k]      y = f32(acc) * f32(s[m] s_w[n]) + b[n]   (float32)
DYNAMIC_GRANULARITIES = ("token", "tensor")


def _dynamic_quant_params(ts, a):
    A = ts[0]
    if A.quant is not None or A.dtype != "float32" or A.rank != 2:
        raise InferError(f"DynamicQuantParams takes a 2-D float32 activation, got {A}")
    if a["granularity"] not in DYNAMIC_GRANULARITIES:
        raise InferError(f"DynamicQuantParams granularity must be one of {DYNAMIC_GRANULARITIES}, "
                         f"got {a['granularity']!r}")
    return [TensorType((A.shape[0] if a["granularity"] == "token" else 1, 3), "float32")]


def _dynamic_qlinear_gemm(ts, a):
    A, P, W = ts[0], ts[1], ts[2]
    if A.quant is not None or A.dtype != "float32":
        raise InferError(f"DynamicQLinearGemm input must be float32 (quantized at run time), got {A}")
    if A.rank != 2 or W.rank != 2 or A.shape[1] != W.shape[1]:
        raise InferError(f"DynamicQLinearGemm needs A (M x K) and W (N x K), got {A.shape} and {W.shape}")
    if P.dtype != "float32" or P.rank != 2 or P.shape[1] != 3 or P.shape[0] not in (1, A.shape[0]):
        raise InferError(f"DynamicQLinearGemm params must be DynamicQuantParams' (1 or {A.shape[0]}) x 3, got {P}")
    _quant_operand("DynamicQLinearGemm", W, "weight", per_tensor=False)
    if W.dtype != "int8" or (W.quant.per_channel and W.quant.axis % 2 != 0) or any(W.quant.zero_point):
        raise InferError(f"DynamicQLinearGemm weight must be int8, symmetric, per tensor or along axis 0, got {W}")
    if len(ts) == 4 and (ts[3].quant is not None or ts[3].dtype != "float32" or ts[3].shape != (W.shape[0],)):
        raise InferError(f"DynamicQLinearGemm bias must be float32 of shape ({W.shape[0]},), got {ts[3]}")
    if a["activation"] not in ("", "Relu", "Clip"):
        raise InferError("DynamicQLinearGemm takes only a Relu/Clip activation")
    return [TensorType((A.shape[0], W.shape[0]), "float32")]


register_op("DynamicQuantParams", _dynamic_quant_params, {"granularity": "token"}, (1, 1),
            doc="the run-time uint8 parameters [scale, 1/scale, zero point] of a float32 activation, per row "
                "or per tensor (ONNX Runtime's DynamicQuantizeLinear)")
register_op("DynamicQLinearGemm", _dynamic_qlinear_gemm, dict(_ACT), (3, 4),
            doc="float32 A quantized to uint8 with its run-time params, times int8 W^T, int32 accumulation, "
                "float32 result f32(acc) * f32(s_a s_w[n]) + bias")

# ---- integer ops of pre-quantized ONNX models (imported as they are; see qcompiler.frontend.onnx_qdq) ----
# ONNX semantics, results int32, zero points as operands (DynamicQuantizeLinear makes x's at run time):
#   ConvInteger(x, w, x_zp, w_zp)    y = Σ (x - x_zp) * (w - w_zp[c]), padding contributes 0 (x = x_zp);
#                                    x_zp a scalar, w_zp a scalar or one per output channel c
#   MatMulInteger(a, b, a_zp, b_zp)  y = (a - a_zp) @ (b - b_zp), a_zp a scalar or one per row of a,
#                                    b_zp a scalar or one per column of b
# The sums are exact integers (formed in int64 by the numpy kernels, int32 products in the x86 ones).
_INTEGER_INPUTS = ("uint8", "int8")


def _integer_operands(kind: str, ts, names) -> None:
    for t, what in zip(ts, names):
        if t.dtype not in _INTEGER_INPUTS:
            raise InferError(f"{kind} {what} must be uint8 or int8, got {t}")


def _conv_integer(ts, a):
    _integer_operands("ConvInteger", ts, ("x", "w", "x_zero_point", "w_zero_point"))
    if ts[2].size != 1:
        raise InferError(f"ConvInteger x_zero_point must be a scalar, got {ts[2]}")
    if ts[3].size not in (1, ts[1].shape[0]):
        raise InferError(f"ConvInteger w_zero_point must be a scalar or one per output channel, got {ts[3]}")
    out = _conv([TensorType(t.shape, "float32") for t in ts[:2]], a)[0]
    return [TensorType(out.shape, "int32")]


def _matmul_integer(ts, a):
    _integer_operands("MatMulInteger", ts, ("a", "b", "a_zero_point", "b_zero_point"))
    A, B = ts[0], ts[1]
    if A.rank < 2 or B.rank < 2:
        raise InferError(f"MatMulInteger takes operands of rank >= 2, got {A.shape} and {B.shape}")
    if ts[2].size not in (1, A.shape[-2]) or ts[3].size not in (1, B.shape[-1]):
        raise InferError(f"MatMulInteger zero points must be scalars or one per row of a / column of b, "
                         f"got {ts[2]} and {ts[3]}")
    out = _matmul([TensorType(t.shape, "float32") for t in ts[:2]], a)[0]
    return [TensorType(out.shape, "int32")]


register_op("ConvInteger", _conv_integer, {"strides": None, "dilations": None, "pads": None, "group": 1}, (4, 4),
            doc="int32 Σ (x - x_zp)(w - w_zp) over the window (ONNX ConvInteger)")
register_op("MatMulInteger", _matmul_integer, num_operands=(4, 4),
            doc="int32 (a - a_zp) @ (b - b_zp) (ONNX MatMulInteger)")
