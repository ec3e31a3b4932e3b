"""ONNX node -> IR op converters, one small function per operator, registered in
:data:`.onnx_registry.CONVERTERS`: elementwise, normalization, convolution and pooling, linear
algebra, comparisons and logic (shape operators and Einsum: :mod:`.onnx_shape_ops`).

Each converter reads the node through the importer's builder ``b`` and emits normalized IR ops
(see :mod:`qcompiler.ir.ops`): every attribute spelled out, ``auto_pad`` resolved into ``pads``,
inputs that must be constant (Reshape's shape, Clip's bounds, Pad's pads, Slice's starts/ends,
Resize's scales/sizes, Squeeze/Unsqueeze/Reduce axes, Split sizes) turned into attributes, negative
axes made non-negative, and opset differences (Softmax before 13, attribute vs input forms) removed.
Some operators have no IR op and are lowered here: Einsum (Transpose/ReduceSum/Reshape/MatMul/Mul),
Tile (Reshape/Expand/Reshape), Sum (Add chains), ConstantOfShape of a static shape (a constant).

Builder API used here: ``b.val(name)`` (IR value; constants are materialized), ``b.const(name)``
(numpy value or None), ``b.need_const(n, i, what)``, ``b.emit(n, kind, operands, attrs, outputs=...)``,
``b.aux(n, kind, operands, attrs, suffix)`` (an extra op with a fresh result name), ``b.used(name)``,
``b.fail(n, what, fix)``, ``b.set_const(name, array)``, ``b.onnx_shape(name)`` and ``b.opset``.
"""
from __future__ import annotations

import math
import numpy as np
from onnx import helper

from ..ir.types import DTYPES, QuantParams
from .onnx_registry import blocked_weight, checked_axis, converter, only_first_output, opt_input

# ---- elementwise ------------------------------------------------------------------------------
_UNARY = ("Relu", "Sigmoid", "Tanh", "Sqrt", "Erf", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity",
          "HardSwish", "Softplus", "Floor", "Ceil", "Round")


@converter(*_UNARY)
def _unary(b, n, a):
    b.emit(n, n.op_type, [b.val(n.input[0])], {})


@converter("LeakyRelu")
def _leaky(b, n, a):
    b.emit(n, "LeakyRelu", [b.val(n.input[0])], {"alpha": float(a.get("alpha", 0.01))})


@converter("HardSigmoid")
def _hard_sigmoid(b, n, a):
    b.emit(n, "HardSigmoid", [b.val(n.input[0])], {"alpha": float(a.get("alpha", 0.2)),
                                                   "beta": float(a.get("beta", 0.5))})


@converter("Gelu")
def _gelu(b, n, a):
    b.emit(n, "Gelu", [b.val(n.input[0])], {"approximate": a.get("approximate", "none")})


@converter("LRN")
def _lrn(b, n, a):
    b.emit(n, "LRN", [b.val(n.input[0])], {"alpha": float(a.get("alpha", 1e-4)), "beta": float(a.get("beta", 0.75)),
                                          "bias": float(a.get("bias", 1.0)), "size": int(a["size"])})


@converter("Clip")
def _clip(b, n, a):
    lo, hi = a.get("min", -math.inf), a.get("max", math.inf)      # opset < 11: attributes
    if opt_input(n, 1):
        lo = b.need_const(n, 1, "min").reshape(-1)[0].item()
    if opt_input(n, 2):
        hi = b.need_const(n, 2, "max").reshape(-1)[0].item()
    b.emit(n, "Clip", [b.val(n.input[0])], {"min": lo, "max": hi})


@converter("Add", "Sub", "Mul", "Div", "Pow")
def _binary(b, n, a):
    b.emit(n, n.op_type, [b.val(n.input[0]), b.val(n.input[1])], {})


@converter("Max", "Min", "Sum")
def _variadic(b, n, a):
    kind = "Add" if n.op_type == "Sum" else n.op_type
    vals = [b.val(x) for x in n.input if x]
    if len(vals) == 1:
        b.emit(n, "Identity", vals, {})
        return
    acc = vals[0]
    for i, v in enumerate(vals[1:-1], 1):
        acc = b.aux(n, kind, [acc, v], {}, f"{i}")
    b.emit(n, kind, [acc, vals[-1]], {})


@converter("Softmax", "LogSoftmax")
def _softmax(b, n, a):
    x = b.val(n.input[0])
    r = x.type.rank
    if b.opset >= 13:
        b.emit(n, n.op_type, [x], {"axis": checked_axis(b, n, a.get("axis", -1), r)})
        return
    ax = checked_axis(b, n, a.get("axis", 1), r)        # before opset 13: coerce to 2-D at axis
    if ax == r - 1:
        b.emit(n, n.op_type, [x], {"axis": ax})
        return
    flat = [int(np.prod(x.shape[:ax])), int(np.prod(x.shape[ax:]))]
    t = b.aux(n, "Reshape", [x], {"shape": flat}, "flatten")
    s = b.aux(n, n.op_type, [t], {"axis": 1}, "2d", op_name=b.node_name(n))
    b.emit(n, "Reshape", [s], {"shape": list(x.shape)}, op_name=b.node_name(n) + "/unflatten")


@converter("Cast")
def _cast(b, n, a):
    dt = helper.tensor_dtype_to_np_dtype(a["to"]).name
    if dt not in DTYPES:
        raise b.fail(n, f"casts to unsupported element type {dt}", "use a numeric tensor type")
    b.emit(n, "Cast", [b.val(n.input[0])], {"to": dt})


# ---- normalization ----------------------------------------------------------------------------
@converter("BatchNormalization")
def _batchnorm(b, n, a):
    if a.get("training_mode", 0):
        raise b.fail(n, "training_mode=1", "export the model in eval/inference mode")
    only_first_output(b, n, "running mean/variance")
    b.emit(n, "BatchNormalization", [b.val(x) for x in n.input[:5]], {"epsilon": float(a.get("epsilon", 1e-5))})


@converter("LayerNormalization")
def _layernorm(b, n, a):
    only_first_output(b, n, "mean/inv-std-dev")
    x = b.val(n.input[0])
    ops = [x] + [b.val(v) for v in n.input[1:3] if v]
    b.emit(n, "LayerNormalization", ops, {"axis": checked_axis(b, n, a.get("axis", -1), x.type.rank),
                                          "epsilon": float(a.get("epsilon", 1e-5))})


# ---- convolution and pooling ------------------------------------------------------------------
def resolve_pads(b, n, a, in_sizes, kernel, strides, dilations) -> list[int]:
    """Explicit [begin..., end...] pads from ``pads`` or ``auto_pad``."""
    nsp = len(in_sizes)
    auto = a.get("auto_pad", "NOTSET")
    if auto == "NOTSET":
        pads = list(a.get("pads", [0] * (2 * nsp)))
        if len(pads) != 2 * nsp:
            raise b.fail(n, f"pads {pads} should have {2 * nsp} values", "fix the model's pads attribute")
        return pads
    if auto == "VALID":
        return [0] * (2 * nsp)
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise b.fail(n, f"unknown auto_pad '{auto}'", "use NOTSET, VALID, SAME_UPPER or SAME_LOWER")
    begin, end = [], []
    for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, big = total // 2, total - total // 2
        begin.append(small if auto == "SAME_UPPER" else big)
        end.append(big if auto == "SAME_UPPER" else small)
    return begin + end


def conv_window(b, n, a, x, kernel):
    nsp = x.type.rank - 2
    strides = list(a.get("strides") or [1] * nsp)
    dilations = list(a.get("dilations") or [1] * nsp)
    return strides, dilations, resolve_pads(b, n, a, x.shape[2:], kernel, strides, dilations)


@converter("Conv")
def _conv(b, n, a):
    x, w = b.val(n.input[0]), b.val(n.input[1])
    kernel = list(w.shape[2:])
    if "kernel_shape" in a and list(a["kernel_shape"]) != kernel:
        raise b.fail(n, f"kernel_shape {a['kernel_shape']} does not match the weight's {kernel}", "fix the model")
    s, d, p = conv_window(b, n, a, x, kernel)
    bias = [b.val(n.input[2])] if opt_input(n, 2) else []
    if x.type.rank == 3:
        _conv1d_as_2d(b, n, x, w, bias, s, d, p, int(a.get("group", 1)))
        return
    q = blocked_weight(w)              # opset 21's blocked DequantizeLinear of a 4-bit weight
    if q is not None and q.type.quant.axis == 1 and x.type.rank == 4 and all(v.is_const for v in bias):
        b.emit(n, "ConvNBits", [x, q] + bias, {"strides": s, "dilations": d, "pads": p, "group": int(a.get("group", 1))})
        return
    b.emit(n, "Conv", [x, w] + bias, {"strides": s, "dilations": d, "pads": p, "group": int(a.get("group", 1))})


def _conv1d_as_2d(b, n, x, w, bias, s, d, p, group):
    """A 1-D convolution (N, C, L) as the 2-D one over (N, C, 1, L) with a 1 x k kernel, between an
    Unsqueeze and a Squeeze of axis 2: every backend lowers 2-D convolutions, and the quantizer and
    the conv passes (BN folding, activation fusion, padding folding) see an ordinary Conv."""
    wc = b.const(n.input[1])
    if wc is not None:
        w2 = b.g.add_const(np.ascontiguousarray(wc[:, :, None, :]), b.fresh(f"{n.input[1]}/2d"))
    else:
        w2 = b.aux(n, "Unsqueeze", [w], {"axes": [2]}, "weight_2d")
    x2 = b.aux(n, "Unsqueeze", [x], {"axes": [2]}, "input_2d")
    y2 = b.aux(n, "Conv", [x2, w2] + bias, {"strides": [1, s[0]], "dilations": [1, d[0]],
                                            "pads": [0, p[0], 0, p[1]], "group": group},
               "conv_2d", op_name=b.node_name(n))
    b.emit(n, "Squeeze", [y2], {"axes": [2]}, op_name=f"{b.node_name(n)}/output_1d")


@converter("ConvTranspose")
def _conv_transpose(b, n, a):
    x, w = b.val(n.input[0]), b.val(n.input[1])
    nsp = x.type.rank - 2
    kernel = list(w.shape[2:])
    s = list(a.get("strides") or [1] * nsp)
    d = list(a.get("dilations") or [1] * nsp)
    outpad = list(a.get("output_padding") or [0] * nsp)
    auto = a.get("auto_pad", "NOTSET")
    pads = list(a.get("pads") or [0] * (2 * nsp))
    target = list(a.get("output_shape") or [])[-nsp:] if a.get("output_shape") else None
    if target is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [x.shape[2 + i] * s[i] for i in range(nsp)]
    if target is not None:
        begin, end = [], []
        for i in range(nsp):
            total = s[i] * (x.shape[2 + i] - 1) + outpad[i] + (kernel[i] - 1) * d[i] + 1 - target[i]
            if total < 0:
                raise b.fail(n, f"output_shape {target} is larger than the convolution can produce",
                             "give explicit pads and output_padding instead")
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        pads = begin + end
    elif auto == "VALID":
        pads = [0] * (2 * nsp)
    ops = [x, w] + ([b.val(n.input[2])] if opt_input(n, 2) else [])
    b.emit(n, "ConvTranspose", ops, {"strides": s, "dilations": d, "pads": pads, "group": int(a.get("group", 1)),
                                     "output_padding": outpad})


@converter("MaxPool", "AveragePool")
def _pool(b, n, a):
    x = b.val(n.input[0])
    k = list(a["kernel_shape"])
    s, d, p = conv_window(b, n, a, x, k)
    attrs = {"kernel_shape": k, "strides": s, "pads": p, "ceil_mode": int(a.get("ceil_mode", 0))}
    if n.op_type == "MaxPool":
        only_first_output(b, n, "Indices")
        attrs["dilations"] = d
    else:
        if any(v != 1 for v in d):
            raise b.fail(n, f"AveragePool with dilations {d} is not supported", "use dilations of 1")
        attrs["count_include_pad"] = int(a.get("count_include_pad", 0))
    b.emit(n, n.op_type, [x], attrs)


@converter("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(b, n, a):
    b.emit(n, n.op_type, [b.val(n.input[0])], {})


# ---- linear algebra ---------------------------------------------------------------------------
@converter("Gemm")
def _gemm(b, n, a):
    ops = [b.val(n.input[0]), b.val(n.input[1])] + ([b.val(n.input[2])] if opt_input(n, 2) else [])
    b.emit(n, "Gemm", ops, {"alpha": float(a.get("alpha", 1.0)), "beta": float(a.get("beta", 1.0)),
                            "transA": int(a.get("transA", 0)), "transB": int(a.get("transB", 0))})


@converter("MatMul")
def _matmul(b, n, a):
    x, w = b.val(n.input[0]), b.val(n.input[1])
    q = blocked_weight(w)              # B [K, N] from opset 21's blocked DequantizeLinear along K
    if q is not None and q.type.rank == 2 and q.type.quant.axis == 0 and x.dtype == "float32":
        qp = q.type.quant
        sh = qp.scale_shape(q.shape)
        t = QuantParams(qp.storage, np.asarray(qp.scale).reshape(sh).T.reshape(-1),
                        np.asarray(qp.zero_point).reshape(sh).T.reshape(-1), axis=1, block_size=qp.block_size,
                        scale_dtype=qp.scale_dtype)
        b.emit(n, "MatMulNBits", [x, b.g.add_const(np.ascontiguousarray(q.data.T), q.name + "_t", quant=t)], {})
        return
    b.emit(n, "MatMul", [x, w], {})


# ---- comparisons, logic, selection (bool results) and index ops --------------------------------
@converter("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Where",
           "PRelu", "GatherND")
def _plain_nary(b, n, a):
    attrs = {"batch_dims": int(a.get("batch_dims", 0))} if n.op_type == "GatherND" else {}
    b.emit(n, n.op_type, [b.val(x) for x in n.input], attrs)


@converter("Not", "IsNaN", "Sign")
def _plain_unary(b, n, a):
    b.emit(n, n.op_type, [b.val(n.input[0])], {})


@converter("IsInf")
def _isinf(b, n, a):
    b.emit(n, "IsInf", [b.val(n.input[0])], {"detect_negative": int(a.get("detect_negative", 1)),
                                             "detect_positive": int(a.get("detect_positive", 1))})


@converter("Mod")
def _mod(b, n, a):
    x, y = b.val(n.input[0]), b.val(n.input[1])
    fmod = int(a.get("fmod", 0))
    if not fmod and x.dtype.startswith(("float", "bfloat")):
        raise b.fail(n, "Mod of floats needs fmod=1", "the model is malformed (ONNX requires fmod=1 for floats)")
    b.emit(n, "Mod", [x, y], {"fmod": fmod})


@converter("ScatterND")
def _scatter_nd(b, n, a):
    red = a.get("reduction", "none")
    if red != "none":
        raise b.fail(n, f"ScatterND reduction '{red}' is not supported", "only reduction='none' imports")
    b.emit(n, "ScatterND", [b.val(x) for x in n.input[:3]], {"reduction": red})
