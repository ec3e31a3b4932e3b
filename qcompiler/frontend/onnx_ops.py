"""ONNX node -> IR op converters, one small function per operator (a table, ``CONVERTERS``).

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
from typing import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ir.types import DTYPES
from .onnx_fold import axes_arg, onnx_slice, resolve_reshape

Converter = Callable[..., None]
CONVERTERS: dict[str, Converter] = {}


def converter(*kinds):
    def deco(fn):
        for k in kinds:
            CONVERTERS[k] = fn
        return fn
    return deco


def _opt(n: onnx.NodeProto, i: int) -> str | None:
    return n.input[i] if len(n.input) > i and n.input[i] else None


def _nonempty_const(b, n, i):
    """A constant optional input; None when omitted or an empty tensor."""
    name = _opt(n, i)
    if name is None:
        return None
    v = b.need_const(n, i, f"input {i}")
    return v if v.size else None


def _axis(b, n, ax: int, rank: int) -> int:
    if not -rank <= ax < rank:
        raise b.fail(n, f"axis {ax} out of range for rank {rank}", "fix the model's axis attribute")
    return ax % rank


def _only_first_output(b, n, what: str):
    for o in n.output[1:]:
        if o and b.used(o):
            raise b.fail(n, f"the {what} output is used", "qcompiler imports inference graphs: "
                         "export in eval/inference mode so this output is not needed")


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
    if _opt(n, 1):
        lo = b.need_const(n, 1, "min").reshape(-1)[0].item()
    if _opt(n, 2):
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
        b.emit(n, n.op_type, [x], {"axis": _axis(b, n, a.get("axis", -1), r)})
        return
    ax = _axis(b, n, a.get("axis", 1), r)        # before opset 13: coerce to 2-D at axis
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
    _only_first_output(b, n, "running mean/variance")
    b.emit(n, "BatchNormalization", [b.val(x) for x in n.input[:5]], {"epsilon": float(a.get("epsilon", 1e-5))})


@converter("LayerNormalization")
def _layernorm(b, n, a):
    _only_first_output(b, n, "mean/inv-std-dev")
    x = b.val(n.input[0])
    ops = [x] + [b.val(v) for v in n.input[1:3] if v]
    b.emit(n, "LayerNormalization", ops, {"axis": _axis(b, n, a.get("axis", -1), x.type.rank),
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


def _window(b, n, a, x, kernel):
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
    s, d, p = _window(b, n, a, x, kernel)
    bias = [b.val(n.input[2])] if _opt(n, 2) else []
    if x.type.rank == 3:
        _conv1d_as_2d(b, n, x, w, bias, s, d, p, int(a.get("group", 1)))
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
    ops = [x, w] + ([b.val(n.input[2])] if _opt(n, 2) else [])
    b.emit(n, "ConvTranspose", ops, {"strides": s, "dilations": d, "pads": pads, "group": int(a.get("group", 1)),
                                     "output_padding": outpad})


@converter("MaxPool", "AveragePool")
def _pool(b, n, a):
    x = b.val(n.input[0])
    k = list(a["kernel_shape"])
    s, d, p = _window(b, n, a, x, k)
    attrs = {"kernel_shape": k, "strides": s, "pads": p, "ceil_mode": int(a.get("ceil_mode", 0))}
    if n.op_type == "MaxPool":
        _only_first_output(b, n, "Indices")
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
    ops = [b.val(n.input[0]), b.val(n.input[1])] + ([b.val(n.input[2])] if _opt(n, 2) else [])
    b.emit(n, "Gemm", ops, {"alpha": float(a.get("alpha", 1.0)), "beta": float(a.get("beta", 1.0)),
                            "transA": int(a.get("transA", 0)), "transB": int(a.get("transB", 0))})


@converter("MatMul")
def _matmul(b, n, a):
    b.emit(n, "MatMul", [b.val(n.input[0]), b.val(n.input[1])], {})


# ---- shape manipulation -----------------------------------------------------------------------
def _shape_from_input_or_inference(b, n, i, what):
    """A shape input that should be constant; falls back to ONNX's inferred static output shape."""
    v = b.const(n.input[i]) if _opt(n, i) else None
    if v is not None:
        return v
    inferred = b.onnx_shape(n.output[0])
    if inferred is None:
        raise b.fail(n, f"{what} is computed at run time", "fix the input sizes with --input-shape so it folds")
    return None


@converter("Reshape")
def _reshape(b, n, a):
    x = b.val(n.input[0])
    v = _shape_from_input_or_inference(b, n, 1, "the target shape")
    try:
        shape = resolve_reshape(x.shape, v.reshape(-1), a.get("allowzero", 0)) if v is not None \
            else b.onnx_shape(n.output[0])
    except ValueError as e:
        raise b.fail(n, str(e), "check --input-shape against the sizes the model accepts") from None
    b.emit(n, "Reshape", [x], {"shape": list(shape)})


@converter("Expand")
def _expand(b, n, a):
    x = b.val(n.input[0])
    v = _shape_from_input_or_inference(b, n, 1, "the target shape")
    target = tuple(int(d) for d in v.reshape(-1)) if v is not None else b.onnx_shape(n.output[0])
    try:
        shape = np.broadcast_shapes(x.shape, target)
    except ValueError:
        raise b.fail(n, f"cannot expand {x.shape} to {target}", "fix the model") from None
    b.emit(n, "Expand", [x], {"shape": list(shape)})


@converter("Flatten")
def _flatten(b, n, a):
    x = b.val(n.input[0])
    ax = int(a.get("axis", 1))
    if not -x.type.rank <= ax <= x.type.rank:
        raise b.fail(n, f"axis {ax} out of range for rank {x.type.rank}", "fix the model")
    b.emit(n, "Flatten", [x], {"axis": ax + x.type.rank if ax < 0 else ax})


@converter("Transpose")
def _transpose(b, n, a):
    x = b.val(n.input[0])
    perm = list(a["perm"]) if "perm" in a else list(reversed(range(x.type.rank)))
    b.emit(n, "Transpose", [x], {"perm": perm})


@converter("Concat")
def _concat(b, n, a):
    vals = [b.val(v) for v in n.input if v and not b.is_empty(v)]
    if not vals:
        raise b.fail(n, "all inputs are empty", "fix the model")
    b.emit(n, "Concat", vals, {"axis": _axis(b, n, a["axis"], vals[0].type.rank)})


@converter("Split")
def _split(b, n, a):
    x = b.val(n.input[0])
    ax = _axis(b, n, a.get("axis", 0), x.type.rank)
    dim = x.shape[ax]
    outs = list(n.output)
    if _opt(n, 1):
        sizes = [int(v) for v in b.need_const(n, 1, "split").reshape(-1)]
    elif "split" in a:
        sizes = list(a["split"])
    elif "num_outputs" in a:                          # opset 18: the last chunk may be smaller
        k = int(a["num_outputs"])
        chunk = -(-dim // k)
        sizes = [chunk] * (k - 1) + [dim - chunk * (k - 1)]
    else:
        if dim % len(outs):
            raise b.fail(n, f"cannot split {dim} evenly into {len(outs)}", "give explicit split sizes")
        sizes = [dim // len(outs)] * len(outs)
    if len(sizes) != len(outs) or sum(sizes) != dim or min(sizes) < 0:
        raise b.fail(n, f"split sizes {sizes} do not fit dimension {dim} into {len(outs)} outputs", "fix the model")
    b.emit(n, "Split", [x], {"axis": ax, "split": sizes}, outputs=outs)


@converter("Pad")
def _pad(b, n, a):
    x = b.val(n.input[0])
    r = x.type.rank
    mode = a.get("mode", "constant")
    if "pads" in a:                                # opset < 11: attributes
        pads, value = list(a["pads"]), float(a.get("value", 0.0))
    else:
        pads = [int(v) for v in b.need_const(n, 1, "pads").reshape(-1)]
        cv = _nonempty_const(b, n, 2)
        value = cv.reshape(-1)[0].item() if cv is not None else 0.0
        axes = _nonempty_const(b, n, 3)
        if axes is not None:                       # opset 18: pads only for the listed axes
            axes = [_axis(b, n, int(v), r) for v in axes.reshape(-1)]
            full = [0] * (2 * r)
            for i, ax in enumerate(axes):
                full[ax], full[ax + r] = pads[i], pads[i + len(axes)]
            pads = full
    if mode not in ("constant", "reflect", "edge"):
        raise b.fail(n, f"Pad mode '{mode}' is not supported", "use constant, reflect or edge padding")
    if len(pads) != 2 * r:
        raise b.fail(n, f"pads {pads} should have {2 * r} values", "fix the model")
    b.emit(n, "Pad", [x], {"pads": pads, "mode": mode, "value": float(value)})


def _const_inputs(b, n):
    return [None] + [b.const(v) if v else None for v in n.input[1:]]


@converter("Squeeze")
def _squeeze(b, n, a):
    x = b.val(n.input[0])
    if _opt(n, 1):
        b.need_const(n, 1, "axes")
    axes = axes_arg(n, _const_inputs(b, n), a)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    b.emit(n, "Squeeze", [x], {"axes": sorted(_axis(b, n, ax, x.type.rank) for ax in axes)})


@converter("Unsqueeze")
def _unsqueeze(b, n, a):
    x = b.val(n.input[0])
    if _opt(n, 1):
        b.need_const(n, 1, "axes")
    axes = axes_arg(n, _const_inputs(b, n), a) or []
    r = x.type.rank + len(axes)
    b.emit(n, "Unsqueeze", [x], {"axes": sorted(_axis(b, n, ax, r) for ax in axes)})


@converter("Dropout")
def _dropout(b, n, a):
    if _opt(n, 2):
        tm = b.need_const(n, 2, "training_mode")
        if bool(tm.reshape(-1)[0]):
            raise b.fail(n, "training_mode is true", "export the model in eval/inference mode")
    x = b.val(n.input[0])
    if len(n.output) > 1 and n.output[1] and b.used(n.output[1]):
        b.set_const(n.output[1], np.ones(x.shape, bool))      # inference: the mask keeps everything
    b.emit(n, "Dropout", [x], {})


@converter("Resize")
def _resize(b, n, a):
    x = b.val(n.input[0])
    r = x.type.rank
    mode = a.get("mode", "nearest")
    ctm = a.get("coordinate_transformation_mode", "half_pixel")
    if ctm == "tf_crop_and_resize":
        raise b.fail(n, "coordinate_transformation_mode tf_crop_and_resize is not supported", "use another mode")
    if a.get("antialias", 0):
        raise b.fail(n, "antialias=1 is not supported", "export without antialiasing")
    axes = [_axis(b, n, ax, r) for ax in a["axes"]] if "axes" in a else list(range(r))
    scales, sizes = _nonempty_const(b, n, 2), _nonempty_const(b, n, 3)
    out = list(x.shape)
    if sizes is not None:
        if a.get("keep_aspect_ratio_policy", "stretch") != "stretch":
            raise b.fail(n, "keep_aspect_ratio_policy other than stretch is not supported", "give exact sizes")
        for ax, s in zip(axes, sizes.reshape(-1)):
            out[ax] = int(s)
    elif scales is not None:
        for ax, s in zip(axes, scales.reshape(-1)):
            out[ax] = int(math.floor(x.shape[ax] * float(s)))
            if out[ax] != x.shape[ax] * float(s):
                raise b.fail(n, f"scale {float(s)} gives a fractional size on axis {ax} ({x.shape[ax]} x {float(s)})",
                             "re-export with output sizes instead of scales, or change --input-shape")
    else:
        raise b.fail(n, "has no constant scales or sizes", "fix the input sizes with --input-shape so they fold")
    b.emit(n, "Resize", [x], {
        "sizes": out, "mode": mode, "coordinate_transformation_mode": ctm,
        "nearest_mode": a.get("nearest_mode", "round_prefer_floor"), "cubic_coeff_a": float(a.get("cubic_coeff_a", -0.75)),
        "exclude_outside": int(a.get("exclude_outside", 0)),
        "extrapolation_value": float(a.get("extrapolation_value", 0.0))})


@converter("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce(b, n, a):
    x = b.val(n.input[0])
    if _opt(n, 1):
        b.need_const(n, 1, "axes")
    axes = axes_arg(n, _const_inputs(b, n), a)
    if not axes:
        if a.get("noop_with_empty_axes", 0):
            b.emit(n, "Identity", [x], {})
            return
        axes = list(range(x.type.rank))
    b.emit(n, n.op_type, [x], {"axes": sorted({_axis(b, n, ax, x.type.rank) for ax in axes}),
                               "keepdims": int(a.get("keepdims", 1))})


@converter("Gather")
def _gather(b, n, a):
    x = b.val(n.input[0])
    b.emit(n, "Gather", [x, b.val(n.input[1])], {"axis": _axis(b, n, a.get("axis", 0), x.type.rank)})


@converter("Slice")
def _slice(b, n, a):
    x = b.val(n.input[0])
    starts = b.need_const(n, 1, "starts").reshape(-1).tolist()
    ends = b.need_const(n, 2, "ends").reshape(-1).tolist()
    axes = b.need_const(n, 3, "axes").reshape(-1).tolist() if _opt(n, 3) else None
    steps = b.need_const(n, 4, "steps").reshape(-1).tolist() if _opt(n, 4) else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = list(steps) if steps is not None else [1] * len(starts)
    norm = {}
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = _axis(b, n, int(ax), x.type.rank)
        if sp == 0:
            raise b.fail(n, "slice step 0", "fix the model")
        dim = x.shape[ax]
        sl = onnx_slice(st, en, int(sp), dim)    # clamped: 0 <= start, end <= dim
        # an open end of a negative step is "before index 0": -dim-1 says that in ONNX and Python
        norm[ax] = (sl.start, -dim - 1 if sl.stop is None else sl.stop, sl.step)
    order = sorted(norm)
    b.emit(n, "Slice", [x], {"starts": [norm[k][0] for k in order], "ends": [norm[k][1] for k in order],
                             "axes": order, "steps": [norm[k][2] for k in order]})


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


# ---- ConstantOfShape, Range, Tile with run-time inputs (all-constant ones fold: onnx_fold.py) ----
@converter("ConstantOfShape")
def _constant_of_shape(b, n, a):
    """The values depend only on the shape: a constant whenever ONNX knows the output shape."""
    v = _shape_from_input_or_inference(b, n, 0, "the shape")
    shape = tuple(int(d) for d in v.reshape(-1)) if v is not None else b.onnx_shape(n.output[0])
    fill = numpy_helper.to_array(a["value"]).reshape(-1) if "value" in a else np.zeros(1, np.float32)
    b.set_const(n.output[0], np.full(shape, fill[0], fill.dtype))


@converter("Range")
def _range(b, n, a):
    """Reached only when start, limit or delta is computed at run time: the length is then dynamic."""
    raise b.fail(n, "its length depends on values computed at run time",
                 "fix the input sizes with --input-shape so start/limit/delta fold to constants")


@converter("Tile")
def _tile(b, n, a):
    """Tile as Reshape -> Expand -> Reshape: x[d0, d1] tiled (r0, r1) is x viewed as [1, d0, 1, d1],
    expanded to [r0, d0, r1, d1] and flattened to [r0 d0, r1 d1]."""
    x = b.val(n.input[0])
    reps = b.const(n.input[1])
    if reps is None:
        out = b.onnx_shape(n.output[0])
        if out is None:
            raise b.fail(n, "the repeats are computed at run time", "fix the input sizes with --input-shape so they fold")
        reps = np.array([o // d for o, d in zip(out, x.shape)])
    reps = [int(r) for r in reps.reshape(-1)]
    if len(reps) != x.type.rank or min(reps, default=1) < 1:
        raise b.fail(n, f"repeats {reps} do not fit an input of rank {x.type.rank}", "fix the model")
    out = [r * d for r, d in zip(reps, x.shape)]
    if all(r == 1 for r in reps):
        b.emit(n, "Identity", [x], {})
        return
    ones = [v for d in x.shape for v in (1, d)]
    t = b.aux(n, "Reshape", [x], {"shape": ones}, "interleave")
    t = b.aux(n, "Expand", [t], {"shape": [v for r, d in zip(reps, x.shape) for v in (r, d)]}, "expand")
    b.emit(n, "Reshape", [t], {"shape": out})


# ---- Einsum, lowered to Transpose / ReduceSum / Reshape / MatMul / Mul ------------------------
class _Term:
    """An einsum operand: an IR value (or the spec of an op not yet emitted) with one label per axis."""

    def __init__(self, value, labels, shape, pending=None):
        self.value, self.labels, self.shape, self.pending = value, list(labels), tuple(shape), pending


def _einsum_parse(b, n, eq: str, ranks: list[int]):
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise b.fail(n, f"equation '{eq}' names {len(terms)} operands, the node has {len(ranks)}", "fix the model")
    n_ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    ell = [f".{i}" for i in range(n_ell)]

    def labels(t, r):
        if "..." in t:
            head, tail = t.split("...")
            k = r - len(head) - len(tail)
            return list(head) + ell[n_ell - k:] + list(tail)
        if len(t) != r:
            raise b.fail(n, f"einsum term '{t}' does not fit an operand of rank {r}", "fix the model")
        return list(t)
    ins = [labels(t, r) for t, r in zip(terms, ranks)]
    if arrow:
        out = labels(rhs, n_ell + len(rhs.replace("...", ""))) if "..." in rhs else list(rhs)
    else:                       # implicit: the ellipsis, then the labels used once, alphabetically
        flat = [c for t in ins for c in t if not c.startswith(".")]
        out = ell + sorted(c for c in set(flat) if flat.count(c) == 1)
    return ins, out


@converter("Einsum")
def _einsum(b, n, a):
    vals = [b.val(x) for x in n.input]
    ins, out = _einsum_parse(b, n, a["equation"], [v.type.rank for v in vals])
    for t in ins:
        if len(set(t)) != len(t):
            raise b.fail(n, f"einsum '{a['equation']}' takes a diagonal (a label repeated in one operand)",
                         "rewrite the model without diagonals")
    sizes: dict = {}
    for t, v in zip(ins, vals):
        for lab, d in zip(t, v.shape):
            if sizes.setdefault(lab, d) != d and 1 not in (d, sizes[lab]):
                raise b.fail(n, f"einsum label '{lab}' has sizes {sizes[lab]} and {d}", "fix the model")
            sizes[lab] = max(sizes[lab], d)
    counter = [0]

    def real(t: _Term):
        if t.pending is not None:
            counter[0] += 1
            kind, ops, attrs = t.pending
            t.value, t.pending = b.aux(n, kind, [real(o) for o in ops], attrs, f"einsum{counter[0]}"), None
        return t.value

    def op(kind, ops, attrs, labels, shape):
        return _Term(None, labels, shape, (kind, ops, attrs))

    def arrange(t: _Term, order: list, shape=None):
        """Transpose ``t`` to label ``order``, then (optionally) reshape to ``shape``."""
        if t.labels != order:
            perm = [t.labels.index(lab) for lab in order]
            t = op("Transpose", [t], {"perm": perm}, order, [t.shape[p] for p in perm])
        if shape is not None and tuple(shape) != t.shape:
            t = op("Reshape", [t], {"shape": list(shape)}, order, shape)
        return t

    terms = [_Term(v, lab, v.shape) for v, lab in zip(vals, ins)]
    # labels in one operand only and not in the output: summed away first
    for i, t in enumerate(terms):
        others = set(out).union(*(set(o.labels) for j, o in enumerate(terms) if j != i))
        gone = [k for k, lab in enumerate(t.labels) if lab not in others]
        if gone:
            keep = [lab for lab in t.labels if lab in others]
            terms[i] = op("ReduceSum", [t], {"axes": gone, "keepdims": 0}, keep,
                          [d for k, d in enumerate(t.shape) if k not in gone])
    x = terms[0]
    for j, y in enumerate(terms[1:], 1):
        keep = set(out).union(*(set(o.labels) for o in terms[j + 1:]))
        batch = [lab for lab in x.labels if lab in y.labels and lab in keep]
        contr = [lab for lab in x.labels if lab in y.labels and lab not in keep]
        fx = [lab for lab in x.labels if lab not in y.labels]
        fy = [lab for lab in y.labels if lab not in x.labels]
        dx = dict(zip(x.labels, x.shape))
        dy = dict(zip(y.labels, y.shape))
        bshape = [sizes[lab] for lab in batch]
        res_shape = bshape + [dx[lab] for lab in fx] + [dy[lab] for lab in fy]
        if not contr:            # no summation: a broadcasting product
            xs = arrange(x, batch + fx, [dx[lab] for lab in batch + fx] + [1] * len(fy))
            ys = arrange(y, batch + fy, [dy[lab] for lab in batch] + [1] * len(fx) + [dy[lab] for lab in fy])
            x = op("Mul", [xs, ys], {}, batch + fx + fy, res_shape)
            continue
        m, k = int(np.prod([dx[lab] for lab in fx])), int(np.prod([dx[lab] for lab in contr]))
        nn = int(np.prod([dy[lab] for lab in fy]))
        ys = arrange(y, batch + contr + fy, [dy[lab] for lab in batch] + [k, nn])
        if batch:
            xs = arrange(x, batch + fx + contr, [dx[lab] for lab in batch] + [m, k])
            mm = op("MatMul", [xs, ys], {}, batch + ["?m", "?n"], bshape + [m, nn])
        else:       # x's free axes stay axes (an N-D MatMul): a leading batch is never merged into rows
            xs = arrange(x, fx + contr, [dx[lab] for lab in fx] + [k])
            mm = op("MatMul", [xs, ys], {}, fx + ["?n"], [dx[lab] for lab in fx] + [nn])
        x = arrange(mm, mm.labels, res_shape)
        x.labels = batch + fx + fy
    res = arrange(x, out)
    if tuple(res.shape) != tuple(sizes[lab] for lab in out):
        raise b.fail(n, f"einsum result shape {res.shape} is not the output's", "report this importer bug")
    if res.pending is None:
        b.emit(n, "Identity", [res.value], {})
    else:
        kind, ops, attrs = res.pending
        b.emit(n, kind, [real(o) for o in ops], attrs)


# ---- operators in their own modules (they register into CONVERTERS on import) ------------------
from . import onnx_control, onnx_rnn  # noqa: E402,F401
