"""Converters for the operators of pre-quantized ONNX models (QDQ and dynamic-int8 exports).

Registered in :data:`.onnx_registry.CONVERTERS` like every other converter (kept in this file so the
quantization support reads in one place):

* ``QuantizeLinear`` / ``DequantizeLinear`` (opset 10-21) become the IR ops of the same name, with
  their constant scale and zero point as the quantized *type* (:class:`~qcompiler.ir.types.QuantParams`:
  per tensor, or per axis when the scale is a vector) -- QuantizeLinear on its result,
  DequantizeLinear on its operand -- so the given parameters stay visible in the IR::

      %x_q = QuantizeLinear(%x) : tensor<1x80x800x!quant.uniform<u8:f32, 0.0353:134>>
      %x_d = DequantizeLinear(%x_q) : tensor<1x80x800xf32>
      %w   = const ... : tensor<384x80x3x!quant.uniform<i8:f32:0, {0.0012:0, ...}>>

  A DequantizeLinear of an integer constant (weights, int32 biases) dequantizes a constant of that
  quantized type; one of a value that does not carry these parameters (a uint8 model input, an
  integer tensor from another op) is ``(Cast(q) - zero_point) * scale`` in float32, ONNX's formula
  with ONNX Runtime's rounding. Opset 19's float8 (``float8e4m3fn`` / ``float8e5m2`` zero points,
  ``saturate = 1``) imports as the float8 quantized types (zero point 0; fold-qdq then runs its
  convs/gemms on float8 operands, :mod:`qcompiler.quant.fp8`). Opset 21's blocked DequantizeLinear
  (``block_size``) of a constant INT4/UINT4 weight imports as a constant of the blocked 4-bit type
  (:class:`~qcompiler.ir.types.QuantParams` ``block_size``), and the MatMul (blocks along K of
  B [K, N]) or Conv (along its input channels) reading it as MatMulNBits / ConvNBits
  (:func:`.onnx_registry.blocked_weight`); such a model is not pre-quantized (:func:`quantizes`). Other 4-bit or
  blocked quantization, the FNUZ float8 types, non-saturating float8 and scales computed at run
  time are refused with one line each.
* ``DynamicQuantizeLinear`` is lowered to float IR ops that compute exactly what ONNX Runtime
  computes (its ``GetQuantizationParameter`` + ``MlasQuantizeLinear``)::

      lo = min(ReduceMin(x), 0)   hi = max(ReduceMax(x), 0)
      scale = (hi - lo) / 255, or 1 when hi == lo (all zeros; ONNX Runtime's rule, the spec's 0 would divide by 0)
      zp = round_half_even(clip(-lo / scale, 0, 255))     y = clip(round_half_even(x / scale) + zp, 0, 255)

  ``scale`` is formed as ``(hi - lo) / 255 + (1 - ceil(d / (d + 1)))`` with ``d = hi - lo >= 0``: the
  second term is exactly 1 for d = 0 and exactly 0 otherwise, so the sum is the quotient itself.
* ``ConvInteger`` / ``MatMulInteger`` become the IR ops of the same name (int32 results, zero points
  as operands: DynamicQuantizeLinear makes the activation's at run time), computed in integer
  arithmetic by the numpy and x86 kernels.
"""
from __future__ import annotations

import numpy as np

from ..ir.types import FP8_MAX, QuantParams
from .onnx_ops import conv_window
from .onnx_registry import converter, opt_input

PREQUANTIZED = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "ConvInteger",
                          "MatMulInteger", "QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul",
                          "QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearConcat",
                          "QGemm", "DynamicQuantizeMatMul", "DynamicQuantizeLSTM"})
"""A model with these is pre-quantized: ``graph.meta["prequantized"]``. Its int8 build (qcompile's
default for it) runs the fold-qdq pass instead of quantize: the Q/DQ groups become integer ops with
the model's own scales (:mod:`qcompiler.passes.fold_qdq`)."""


def _main_graph(path: str):
    """The main graph of the ONNX file at ``path``, read without its external data; None for a file
    ONNX cannot parse (the importer reports a bad file with one line)."""
    import onnx
    try:
        return onnx.load(path, load_external_data=False).graph
    except Exception:                 # noqa: BLE001
        return None


def is_prequantized(path: str) -> bool:
    """Whether the ONNX file at ``path`` is a pre-quantized model (any node of :data:`PREQUANTIZED`
    in its main graph). False for a file ONNX cannot parse."""
    g = _main_graph(path)
    return g is not None and any(quantizes(n) for n in g.node)


def prequantized_formats(path: str) -> tuple[str | None, list[str]]:
    """The ``--dtype`` a pre-quantized model builds with by default and its ``--fp8-format`` values,
    from one reading of the file: ("fp8", ["e4m3"]) when a QuantizeLinear or DequantizeLinear of its
    main graph has a float8 zero point (or ``output_dtype``: "e4m3", "e5m2"), ("int8", []) for an
    integer one, (None, []) for a float model or a file ONNX cannot parse."""
    import onnx
    g = _main_graph(path)
    if g is None or not any(quantizes(n) for n in g.node):
        return None, []
    names = {onnx.TensorProto.FLOAT8E4M3FN: "e4m3", onnx.TensorProto.FLOAT8E5M2: "e5m2"}
    types = {t.name: t.data_type for t in g.initializer}
    found = set()
    for n in g.node:
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            if len(n.input) > 2 and types.get(n.input[2]) in names:
                found.add(names[types[n.input[2]]])
            found.update(names[a.i] for a in n.attribute if a.name == "output_dtype" and a.i in names)
    return ("fp8" if found else "int8"), sorted(found)


_STORAGE = ("uint8", "int8", "uint16", "int16")       # QuantizeLinear outputs the IR can hold
_FP8 = tuple(FP8_MAX)                                 # opset 19's OCP float8 (not the FNUZ variants)
_ONNX_OUTPUT_DTYPE = {2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 17: "float8_e4m3fn", 19: "float8_e5m2"}


def _storage(b, n, a, zp: np.ndarray | None, dq: bool) -> str:
    if zp is not None:
        dt = zp.dtype.name
    elif dq:
        dt = b.val(n.input[0]).dtype if b.const(n.input[0]) is None else b.const(n.input[0]).dtype.name
    else:
        code = int(a.get("output_dtype", 0))
        if code and code not in _ONNX_OUTPUT_DTYPE:
            raise b.fail(n, f"output_dtype {code} is not uint8/int8/uint16/int16/float8e4m3fn/float8e5m2",
                         "qcompiler imports 8- and 16-bit integer and OCP float8 quantization (no FNUZ float8, no int4)")
        dt = _ONNX_OUTPUT_DTYPE.get(code, "uint8")
    allowed = _STORAGE + _FP8 + (("int32",) if dq else ())
    if dt not in allowed:
        raise b.fail(n, f"quantizes to {dt}", f"qcompiler imports {'/'.join(allowed)} quantization "
                     "(no FNUZ float8, no int4)")
    if dt in _FP8 and not dq and not int(a.get("saturate", 1)):
        raise b.fail(n, "quantizes to float8 with saturate = 0 (out-of-range values become inf/NaN)",
                     "qcompiler's float8 quantization saturates at +-max: export with saturate = 1 (the default)")
    return dt


def quantizes(n) -> bool:
    """Whether node ``n`` makes its model pre-quantized (:data:`PREQUANTIZED`): every such node but a
    blocked DequantizeLinear (opset 21's ``block_size``: a weight-only 4-bit weight, which the
    MatMul/Conv reading it imports as MatMulNBits/ConvNBits; the model stays a float one)."""
    return n.op_type in PREQUANTIZED and not (
        n.op_type == "DequantizeLinear" and any(at.name == "block_size" and at.i for at in n.attribute))


def _blocked(b, n, a, shape: tuple[int, ...]) -> QuantParams:
    """Opset 21's blocked DequantizeLinear of a constant 4-bit weight: scales (and zero points) of
    the weight's shape with dim ``axis`` -> ceil(D / block_size)."""
    blk = int(a["block_size"])
    data = b.const(n.input[0])
    if data is None or data.dtype.name not in ("int4", "uint4"):
        raise b.fail(n, f"blocked quantization (block_size {blk}) of a non-constant or non-4-bit tensor",
                     "qcompiler imports blocked DequantizeLinear of constant INT4/UINT4 weights")
    scale = b.need_const(n, 1, "the scale")
    zp = b.need_const(n, 2, "the zero point") if opt_input(n, 2) else None
    if scale.dtype not in (np.float32, np.float16):
        raise b.fail(n, f"has a {scale.dtype} scale", "qcompiler imports float32 or float16 scales")
    ax = int(a.get("axis", 1)) % len(shape)
    try:
        qp = QuantParams(data.dtype.name, scale.astype(np.float32).reshape(-1),
                         np.zeros(scale.size, int) if zp is None else zp.astype(np.int64).reshape(-1), axis=ax,
                         block_size=blk, scale_dtype="float16" if scale.dtype == np.float16 else "float32")
        if tuple(scale.shape) != qp.scale_shape(shape):
            raise ValueError(f"scale shape {list(scale.shape)} is not {list(qp.scale_shape(shape))}")
    except ValueError as e:
        raise b.fail(n, f"bad blocked quantization parameters: {e}", "fix the model's scale / zero point") from None
    return qp


def qparams(b, n, a, shape: tuple[int, ...], dq: bool) -> QuantParams:
    """The node's scale / zero point / axis as :class:`QuantParams` for a tensor of ``shape``."""
    if int(a.get("block_size", 0)):
        if dq:
            return _blocked(b, n, a, shape)
        raise b.fail(n, f"blocked quantization (block_size {a['block_size']}) is not supported by QuantizeLinear",
                     "quantize per tensor or per axis")
    scale = b.need_const(n, 1, "the scale")
    zp = b.need_const(n, 2, "the zero point") if opt_input(n, 2) else None
    return _params(b, n, scale, zp, _storage(b, n, a, zp, dq), shape, int(a.get("axis", 1)))


def _params(b, n, scale: np.ndarray, zp: np.ndarray | None, storage: str, shape, ax: int) -> QuantParams:
    if scale.dtype != np.float32:
        raise b.fail(n, f"has a {scale.dtype} scale", "qcompiler imports float32 quantization scales")
    s = scale.reshape(-1)
    z = zp.reshape(-1).astype(np.float64).astype(np.int64) if zp is not None else np.zeros(s.size, np.int64)
    if z.size != s.size:
        raise b.fail(n, f"has {s.size} scales but {z.size} zero points", "fix the model")
    axis = None
    if s.size > 1:
        rank = len(shape)
        if not -rank <= ax < rank or shape[ax] != s.size:
            raise b.fail(n, f"{s.size} scales do not fit axis {ax} of shape {list(shape)}", "fix the model")
        axis = ax % rank
    try:
        return QuantParams(storage, tuple(float(v) for v in s), tuple(int(v) for v in z), axis)
    except ValueError as e:
        raise b.fail(n, f"bad quantization parameters: {e}", "fix the model's scale / zero point") from None


def _named_const(b, n, name: str, what: str) -> np.ndarray:
    v = b.const(name)
    if v is None:
        raise b.fail(n, f"{what} ('{name}') is not a constant", "qcompiler imports constant quantization parameters")
    return v


def dequantized(b, n, x_name: str, scale_name: str, zp_name: str, suffix: str, axis: int | None = None):
    """The float value of quantized input ``x_name`` of a QOperator node (its scale and zero point
    are the inputs named; ``axis``: of a per-axis scale): DequantizeLinear of a quantized constant
    or of a value carrying these parameters, ONNX's formula otherwise (:mod:`.onnx_qlinear`)."""
    scale = _named_const(b, n, scale_name, "a scale")
    zp = _named_const(b, n, zp_name, "a zero point") if zp_name else None
    data = b.const(x_name)
    shape = tuple(data.shape) if data is not None else b.val(x_name).shape
    storage = zp.dtype.name if zp is not None else (data.dtype.name if data is not None else b.val(x_name).dtype)
    if storage not in _STORAGE + ("int32",):
        raise b.fail(n, f"quantizes to {storage}", "qcompiler imports 8-, 16- and 32-bit integer quantization")
    qp = _params(b, n, scale, zp, storage, shape, 1 if axis is None else axis)
    return _dequantize(b, n, x_name, qp, suffix)


def _dequantize(b, n, x_name: str, qp: QuantParams, suffix: str | None = None):
    """Tensor ``x_name`` dequantized with ``qp``: DequantizeLinear of a constant of that quantized
    type, or of a value carrying ``qp`` (:func:`_carries`), else ONNX's float formula. Node ``n``'s
    output, or (``suffix``) an extra value returned."""
    data = b.const(x_name)
    if data is not None:                       # weights, biases: a constant of the quantized type
        if data.dtype.name in ("int4", "uint4"):     # ml_dtypes' 4-bit arrays: one value a byte as int8/uint8
            data = data.astype(np.int8 if data.dtype.name == "int4" else np.uint8)
        q = b.g.add_const(np.asarray(data, order="C"), x_name, quant=qp)   # (ascontiguousarray makes 0-d 1-d)
    else:
        q = b.val(x_name)
        if q.type.quant != qp and not _carries(q, qp):
            return _dequantize_float(b, n, q, qp, suffix)
    if suffix:
        return b.aux(n, "DequantizeLinear", [q], {}, suffix + "_dq")
    b.emit(n, "DequantizeLinear", [q], {})


def quantize_to(b, n, y, scale_name: str, zp_name: str) -> None:
    """Emit node ``n``'s output as QuantizeLinear of float ``y`` with the parameters named (uint8
    without a zero point, as ONNX's QuantizeLinear)."""
    scale = _named_const(b, n, scale_name, "the output scale")
    zp = _named_const(b, n, zp_name, "the output zero point") if zp_name else None
    storage = zp.dtype.name if zp is not None else "uint8"
    if storage not in _STORAGE:
        raise b.fail(n, f"quantizes its output to {storage}", "qcompiler imports 8- and 16-bit outputs")
    qp = _params(b, n, scale, zp, storage, y.shape, 1)
    b.emit(n, "QuantizeLinear", [y], {}, result_types=[y.type.with_quant(qp)])


@converter("QuantizeLinear")
def _quantize_linear(b, n, a):
    x = b.val(n.input[0])
    if x.dtype != "float32":
        raise b.fail(n, f"quantizes a {x.dtype} tensor", "qcompiler imports QuantizeLinear of float32 tensors")
    qp = qparams(b, n, a, x.shape, dq=False)
    b.emit(n, "QuantizeLinear", [x], {}, result_types=[x.type.with_quant(qp)])


@converter("DequantizeLinear")
def _dequantize_linear(b, n, a):
    data = b.const(n.input[0])
    shape = tuple(data.shape) if data is not None else b.val(n.input[0]).shape
    qp = qparams(b, n, a, shape, dq=True)
    if data is None:
        got = b.val(n.input[0]).type.quant
        if got is not None and got != qp:
            raise b.fail(n, f"dequantizes with {qp} a value its QuantizeLinear quantized with {got}",
                         "give the DequantizeLinear the scale and zero point of the QuantizeLinear it follows")
    _dequantize(b, n, n.input[0], qp)


_SAME_INTEGERS = ("Flatten", "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "MaxPool",
                  "GlobalMaxPool", "Slice")
"""Ops that move or select stored integers without changing them: a QDQ export may apply them to
the integer tensor between its QuantizeLinear and DequantizeLinear (``--export-qdq`` does)."""


def _carries(q, qp: QuantParams) -> bool:
    """Whether integer value ``q`` is a value quantized with ``qp`` moved by :data:`_SAME_INTEGERS`
    ops only; if so, every value of that chain is given ``qp`` in its type (True)."""
    chain, v = [], q
    while v.type.quant is None and v.producer is not None and v.producer.kind in _SAME_INTEGERS \
            and v.dtype == qp.storage and not qp.per_channel:
        chain.append(v)
        v = v.producer.operands[0]
    if v.type.quant != qp or not chain:
        return False
    for c in chain:
        c.type = c.type.with_quant(qp)
    return True


def _dequantize_float(b, n, q, qp: QuantParams, suffix: str | None = None):
    """(f32(q) - f32(zero_point)) * scale: ONNX Runtime's f32(q - zero_point) * scale (both integers
    are exact in float32 for 8/16-bit storage), for a value that does not carry ``qp``: node
    ``n``'s output, or (``suffix``) an extra value returned."""
    shape = [1] * q.type.rank
    if qp.axis is not None:
        shape[qp.axis] = len(qp.scale)
    tag = f"{n.output[0]}/{suffix}" if suffix else n.output[0]
    zp = b.g.add_const(np.asarray(qp.zero_point, np.float32).reshape(shape), f"{tag}/zero_point")
    sc = b.g.add_const(qp.scale_array().reshape(shape), f"{tag}/scale")
    if qp.storage in _FP8:
        raise b.fail(n, f"dequantizes a float8 tensor '{q.name}' that no QuantizeLinear of the model made with "
                     "these parameters", "qcompiler imports float8 DequantizeLinear of constants and of its own "
                     "QuantizeLinear's output")
    f = b.aux(n, "Cast", [q], {"to": "float32"}, f"{suffix}_cast" if suffix else "cast")
    f = b.aux(n, "Sub", [f, zp], {}, f"{suffix}_sub" if suffix else "sub") if any(qp.zero_point) else f
    if suffix:
        return b.aux(n, "Mul", [f, sc], {}, f"{suffix}_dq")
    b.emit(n, "Mul", [f, sc], {})


@converter("DynamicQuantizeLinear")
def _dynamic_quantize_linear(b, n, a):
    x = b.val(n.input[0])
    if x.dtype != "float32":
        raise b.fail(n, f"quantizes a {x.dtype} tensor", "qcompiler imports DynamicQuantizeLinear of float32")
    r = x.type.rank
    one = tuple([1] * r)

    def c(v, name):
        return b.g.add_const(np.full(one, v, np.float32), f"{n.output[0]}/{name}")

    def op(kind, ops, suffix, **attrs):
        return b.aux(n, kind, ops, attrs, suffix)
    every = {"axes": list(range(r)), "keepdims": 1}
    lo = op("Min", [op("ReduceMin", [x], "min", **every), c(0.0, "zero")], "lo")
    hi = op("Max", [op("ReduceMax", [x], "max", **every), c(0.0, "zero")], "hi")
    d = op("Sub", [hi, lo], "range")
    nonzero = op("Ceil", [op("Div", [d, op("Add", [d, c(1.0, "one")], "range1")], "ratio")], "nonzero")
    scale = op("Add", [op("Div", [d, c(255.0, "qrange")], "scale0"),
                       op("Sub", [c(1.0, "one"), nonzero], "all_zero")], "scale")
    zp = op("Round", [op("Clip", [op("Div", [op("Neg", [lo], "neg"), scale], "zp0")], "zp_clip",
                         min=0.0, max=255.0)], "zp")
    y = op("Clip", [op("Add", [op("Round", [op("Div", [x, scale], "div")], "round"), zp], "add")], "clip",
           min=0.0, max=255.0)
    outs = list(n.output) + [""] * (3 - len(n.output))
    b.emit(n, "Cast", [y], {"to": "uint8"}, outputs=[outs[0]])
    if outs[1]:
        b.emit(n, "Reshape", [scale], {"shape": []}, outputs=[outs[1]], op_name=f"{b.node_name(n)}/y_scale")
    if outs[2]:
        zs = op("Reshape", [zp], "zp_scalar", shape=[])
        b.emit(n, "Cast", [zs], {"to": "uint8"}, outputs=[outs[2]], op_name=f"{b.node_name(n)}/y_zero_point")


def _zero_point(b, n, i: int, like) -> object:
    """Input ``i`` (a zero point) as an IR value; an omitted one is a 0 of ``like``'s dtype."""
    if opt_input(n, i):
        return b.val(n.input[i])
    return b.g.add_const(np.zeros((), like.dtype), f"{n.output[0]}/zero_point{i}")


def _integer_inputs(b, n, names):
    vals = [b.val(n.input[0]), b.val(n.input[1])]
    for v, what in zip(vals, names):
        if v.dtype not in ("uint8", "int8"):
            raise b.fail(n, f"{what} is {v.dtype}", f"{n.op_type} takes uint8 or int8 inputs")
    return vals + [_zero_point(b, n, 2, vals[0]), _zero_point(b, n, 3, vals[1])]


@converter("ConvInteger")
def _conv_integer(b, n, a):
    ops = _integer_inputs(b, n, ("x", "w"))
    x, w = ops[0], ops[1]
    if x.type.rank < 3 or w.type.rank != x.type.rank:
        raise b.fail(n, f"input rank {x.type.rank} and weight rank {w.type.rank} do not fit", "fix the model")
    kernel = list(w.shape[2:])
    if "kernel_shape" in a and list(a["kernel_shape"]) != kernel:
        raise b.fail(n, f"kernel_shape {a['kernel_shape']} does not match the weight's {kernel}", "fix the model")
    s, d, p = conv_window(b, n, a, x, kernel)
    b.emit(n, "ConvInteger", ops, {"strides": s, "dilations": d, "pads": p, "group": int(a.get("group", 1))})


@converter("MatMulInteger")
def _matmul_integer(b, n, a):
    ops = _integer_inputs(b, n, ("A", "B"))
    if ops[0].type.rank < 2 or ops[1].type.rank < 2:
        raise b.fail(n, f"has a 1-D operand ({list(ops[0].shape)} @ {list(ops[1].shape)})",
                     "reshape the operand to 2-D before the MatMulInteger")
    b.emit(n, "MatMulInteger", ops, {})

