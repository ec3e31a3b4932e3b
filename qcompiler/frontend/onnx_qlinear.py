"""Converters for ONNX Runtime's QOperator format: ``QLinearConv`` and ``QLinearMatMul`` (ai.onnx)
and the com.microsoft ops its quantizer emits most (``QLinearAdd``, ``QLinearMul``,
``QLinearGlobalAveragePool``, ``QLinearSigmoid``, ``QLinearLeakyRelu``, ``QLinearConcat``,
``QGemm``, ``DynamicQuantizeMatMul``; ``onnx_load.MICROSOFT_OPS`` lets them past the domain check).

Each is imported as what it means in QDQ form, DequantizeLinear of every quantized input, the
float op, QuantizeLinear with the output's parameters::

    QLinearConv(x, s_x, z_x, w, s_w, z_w, s_y, z_y, B)
        ->  Q_y(Conv(DQ(x; s_x, z_x), DQ(w; s_w, z_w), DQ(B; s_x s_w, 0)))
    QGemm(A, s_a, z_a, B, s_b, z_b, C, s_y, z_y) {alpha, transA, transB}
        ->  Q_y(Gemm(DQ(A), DQ(B), DQ(C; alpha s_a s_b, 0)) {alpha, beta = 1})     (float Y without s_y)
    DynamicQuantizeMatMul(A, B, s_b, z_b, bias)
        ->  (MatMulInteger(DynamicQuantizeLinear(A), B) * s_a * s_b) + bias

so the fold-qdq pass maps them onto the integer kernels exactly as it maps a QDQ model, and the
float build computes ONNX's formulas. A ``channels_last`` QLinearGlobalAveragePool is refused with
one line. ``dynamic_quantize`` and ``integer_matmul`` (DynamicQuantizeMatMul's two halves) also
build com.microsoft ``DynamicQuantizeLSTM``'s products (:mod:`.onnx_rnn`).
"""
from __future__ import annotations

import numpy as np
from onnx import helper

from .onnx_ops import conv_window
from .onnx_qdq import dequantized, quantize_to
from .onnx_registry import CONVERTERS, converter, opt_input


def _qparam_inputs(n, i_scale: int, i_zp: int) -> tuple[str, str]:
    return n.input[i_scale], (n.input[i_zp] if opt_input(n, i_zp) else "")


def _dq(b, n, i_x: int, i_scale: int, i_zp: int, suffix: str, axis: int | None = None):
    s, z = _qparam_inputs(n, i_scale, i_zp)
    return dequantized(b, n, n.input[i_x], s, z, suffix, axis)


@converter("QLinearConv")
def _qlinear_conv(b, n, a):
    x = _dq(b, n, 0, 1, 2, "x")
    w = _dq(b, n, 3, 4, 5, "w", axis=0)
    ops = [x, w]
    if opt_input(n, 8):
        ops.append(_bias(b, n, 8, [1, 4], "B"))
    kernel = list(w.shape[2:])
    s, d, p = conv_window(b, n, a, x, kernel)
    y = b.aux(n, "Conv", ops, {"strides": s, "dilations": d, "pads": p, "group": int(a.get("group", 1))}, "conv")
    quantize_to(b, n, y, *_qparam_inputs(n, 6, 7))


def _bias(b, n, i: int, scales: list[int], suffix: str, factor: float = 1.0):
    """An int32 bias input at scale factor * prod(the scale inputs ``scales``), zero point 0."""
    step = np.float32(factor)
    for k in scales:
        step = (step * b.need_const(n, k, "a scale").astype(np.float32)).astype(np.float32)
    name = f"{n.output[0]}/{suffix}_scale"
    b.set_const(name, np.asarray(step, np.float32).reshape(-1) if np.size(step) > 1 else np.float32(step))
    return dequantized(b, n, n.input[i], name, "", suffix, axis=0 if np.size(step) > 1 else None)


@converter("QLinearMatMul")
def _qlinear_matmul(b, n, a):
    x = _dq(b, n, 0, 1, 2, "a")
    wr = b.val(n.input[3]).type.rank if b.const(n.input[3]) is None else b.const(n.input[3]).ndim
    w = _dq(b, n, 3, 4, 5, "b", axis=wr - 1)
    y = b.aux(n, "MatMul", [x, w], {}, "matmul")
    quantize_to(b, n, y, *_qparam_inputs(n, 6, 7))


def _binary(kind):
    def convert(b, n, a):
        x = _dq(b, n, 0, 1, 2, "a")
        y = _dq(b, n, 3, 4, 5, "b")
        quantize_to(b, n, b.aux(n, kind, [x, y], {}, kind.lower()), *_qparam_inputs(n, 6, 7))
    return convert


converter("QLinearAdd")(_binary("Add"))
converter("QLinearMul")(_binary("Mul"))


@converter("QLinearGlobalAveragePool")
def _qlinear_gap(b, n, a):
    if int(a.get("channels_last", 0)):
        raise b.fail(n, "channels_last QLinearGlobalAveragePool is not supported",
                     "quantize the model with NCHW layouts (ONNX Runtime's default)")
    x = _dq(b, n, 0, 1, 2, "x")
    quantize_to(b, n, b.aux(n, "GlobalAveragePool", [x], {}, "gap"), *_qparam_inputs(n, 3, 4))


@converter("QLinearSigmoid")
def _qlinear_sigmoid(b, n, a):
    x = _dq(b, n, 0, 1, 2, "x")
    quantize_to(b, n, b.aux(n, "Sigmoid", [x], {}, "sigmoid"), *_qparam_inputs(n, 3, 4))


@converter("QLinearLeakyRelu")
def _qlinear_leaky_relu(b, n, a):
    x = _dq(b, n, 0, 1, 2, "x")
    y = b.aux(n, "LeakyRelu", [x], {"alpha": float(a.get("alpha", 0.01))}, "leakyrelu")
    quantize_to(b, n, y, *_qparam_inputs(n, 3, 4))


@converter("QLinearConcat")
def _qlinear_concat(b, n, a):
    if (len(n.input) - 2) % 3 or len(n.input) < 5:
        raise b.fail(n, f"has {len(n.input)} inputs, not Y_scale, Y_zero_point and (X, scale, zero point) triples",
                     "fix the model")
    xs = [_dq(b, n, i, i + 1, i + 2, f"x{(i - 2) // 3}") for i in range(2, len(n.input), 3)]
    y = b.aux(n, "Concat", xs, {"axis": int(a["axis"])}, "concat")
    quantize_to(b, n, y, *_qparam_inputs(n, 0, 1))


@converter("QGemm")
def _qgemm(b, n, a):
    alpha = float(a.get("alpha", 1.0))
    x = _dq(b, n, 0, 1, 2, "a")
    trans_b = int(a.get("transB", 0))
    w = _dq(b, n, 3, 4, 5, "b", axis=0 if trans_b else 1)
    ops = [x, w]
    if opt_input(n, 6):
        ops.append(_bias(b, n, 6, [1, 4], "C", factor=alpha))
    attrs = {"alpha": alpha, "beta": 1.0, "transA": int(a.get("transA", 0)), "transB": trans_b}
    if not opt_input(n, 7):                        # float output
        b.emit(n, "Gemm", ops, attrs)
        return
    quantize_to(b, n, b.aux(n, "Gemm", ops, attrs, "gemm"), *_qparam_inputs(n, 7, 8))


def dynamic_quantize(b, n, x: str, tag: str) -> tuple:
    """Tensor ``x`` through DynamicQuantizeLinear (ONNX Runtime's uint8 quantization over the whole
    tensor, :mod:`.onnx_qdq`): its (q, scale, zero point) values."""
    q, s, z = (b.fresh(f"{n.output[0]}/{tag}_{k}") for k in ("q", "scale", "zp"))
    CONVERTERS["DynamicQuantizeLinear"](b, helper.make_node("DynamicQuantizeLinear", [x], [q, s, z],
                                                            name=f"{b.node_name(n)}/{tag}_quantize"), {})
    return b.val(q), b.val(s), b.val(z)


def integer_matmul(b, n, qa: tuple, w: str, w_scale: str, w_zp: str, tag: str, out: str | None = None):
    """``Cast(MatMulInteger(q_a, w, z_a, z_w)) * (s_a * s_w)`` for ``qa`` = (q_a, s_a, z_a) of
    :func:`dynamic_quantize`: ONNX Runtime's dynamically quantized product (MLAS scales the int32
    sums by the one float32 product of the scales; ``w_scale`` may be per column). Emitted as
    node ``n``'s output ``out``, or returned."""
    q, s, z = qa
    acc = b.fresh(f"{n.output[0]}/{tag}_acc")
    CONVERTERS["MatMulInteger"](b, helper.make_node("MatMulInteger", [q.name, w, z.name, w_zp], [acc],
                                                    name=f"{b.node_name(n)}/{tag}_matmul"), {})
    f = b.aux(n, "Cast", [b.val(acc)], {"to": "float32"}, f"{tag}_float")
    scale = b.aux(n, "Mul", [s, b.val(w_scale)], {}, f"{tag}_scale")
    if out is None:
        return b.aux(n, "Mul", [f, scale], {}, f"{tag}_scaled")
    b.emit(n, "Mul", [f, scale], {}, outputs=[out])


@converter("DynamicQuantizeMatMul")
def _dynamic_quantize_matmul(b, n, a):
    qa = dynamic_quantize(b, n, n.input[0], "a")
    bz = n.input[3] if opt_input(n, 3) else ""
    if not opt_input(n, 4):
        integer_matmul(b, n, qa, n.input[1], n.input[2], bz, "a", out=n.output[0])
        return
    y = integer_matmul(b, n, qa, n.input[1], n.input[2], bz, "a")
    b.emit(n, "Add", [y, b.val(n.input[4])], {})
