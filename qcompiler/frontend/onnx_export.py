"""IR -> ONNX exporter (opset 17, ai.onnx).

    model = export_onnx(graph)          # an onnx.ModelProto that passes onnx.checker
    save_onnx(graph, "out.onnx")        # atomic: temp file in the same folder, then os.replace

Normalized IR attributes are written back in opset-17 form: Reshape's shape, Clip's bounds, Pad's
pads and value, Slice's starts/ends/axes/steps, Squeeze/Unsqueeze axes, ReduceSum axes, Split
sizes, Expand's shape and Resize's sizes become constant inputs (initializers). Constants become
initializers under their IR names; value and op names are kept.

Quantization: a ``QuantizeLinear`` op takes its scale and zero point from its *result* type, a
``DequantizeLinear`` from its *operand* type (per-tensor, or per-axis with ``axis``). The opset is
raised only where an op needs it: float8 QuantizeLinear/DequantizeLinear (19: their zero point
float8e4m3fn / float8e5m2, saturating), Gelu (20), 16-bit QuantizeLinear/DequantizeLinear (21).
The weight-only 4-bit ops export as ONNX Runtime's com.microsoft MatMulNBits and GatherBlockQuantized,
ConvNBits as opset 21's blocked int4 DequantizeLinear and a Conv (:mod:`.onnx_nbits`). An op kind with no mapping raises :class:`ExportError` naming the op.
"""
from __future__ import annotations

import math
import os
import tempfile
from typing import Callable

import numpy as np
import onnx
from onnx import helper

from ..errors import UserError
from ..ir import Graph, Op, TensorType
from ..ir.ops import REGISTRY
from ..ir.types import INT4, is_fp8, np_dtype

TARGET_OPSET = 17


class ExportError(ValueError):
    """The graph holds an op that has no ONNX form; the message names the op."""


def export_onnx(graph: Graph) -> onnx.ModelProto:
    w = _Writer(graph)
    for op in graph.ops:
        fn = EXPORTERS.get(op.kind)
        if fn is None:
            raise ExportError(f"cannot export {op.describe()}: op kind '{op.kind}' has no ONNX mapping "
                              f"(known: {', '.join(sorted(EXPORTERS))})")
        fn(w, op)
    return w.finish()


def save_onnx(graph: Graph, path: "str | os.PathLike") -> None:
    """Export ``graph`` and write it to ``path`` atomically."""
    write_model(export_onnx(graph), path)


def write_model(model: onnx.ModelProto, path: "str | os.PathLike") -> None:
    """Write ``model`` to ``path`` atomically: a temporary file in the same folder, synced, then
    renamed over ``path`` (an interrupted write leaves the old file or none, never half of one)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError("the output folder does not exist", path, "create the folder first")
    data = model.SerializeToString()
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="." + os.path.basename(path) + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ---- writer -----------------------------------------------------------------------------------
def _elem_type(dtype: str) -> int:
    return helper.np_dtype_to_tensor_dtype(np_dtype(dtype))


def _value_info(name: str, t: TensorType) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, _elem_type(t.dtype), list(t.shape))


class _Writer:
    def __init__(self, graph: Graph):
        self.g = graph
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[tuple[str, np.ndarray]] = []
        self.taken = {v.name for v in graph.values()}
        self.opset = required_opset(graph)
        self.raw: list[onnx.TensorProto] = []       # initializers written as protos (4-bit tensors)
        self.domains: set[str] = set()
        used = {id(v) for op in graph.ops for v in op.operands} | {id(v) for v in graph.outputs}
        for v in graph.consts.values():
            if id(v) in used and v.dtype not in INT4:   # 4-bit weights: written by their op's exporter
                self.inits.append((v.name, v.data))

    def fresh(self, hint: str) -> str:
        name, i = hint, 0
        while name in self.taken:
            i += 1
            name = f"{hint}_{i}"
        self.taken.add(name)
        return name

    def const(self, array, hint: str) -> str:
        name = self.fresh(hint)
        self.inits.append((name, np.asarray(array)))
        return name

    def ints(self, op: Op, values, what: str) -> str:
        return self.const(np.asarray(list(values), np.int64), f"{op.name}/{what}")

    def scalar(self, op: Op, value, dtype: str, what: str) -> str:
        return self.const(np.asarray(value, np_dtype(dtype)), f"{op.name}/{what}")

    def node(self, op: Op, inputs, attrs: dict | None = None, op_type: str | None = None,
             outputs: list[str] | None = None, name: str | None = None, domain: str = "") -> None:
        """Write one ONNX node for ``op`` (by default: its kind, its results, its name)."""
        attrs = {k: v for k, v in (attrs or {}).items() if v is not None}
        outputs = [r.name for r in op.results] if outputs is None else outputs
        if domain:
            self.domains.add(domain)
        self.nodes.append(helper.make_node(op_type or op.kind, list(inputs), outputs, name=name or op.name,
                                           domain=domain or None, **attrs))

    def finish(self) -> onnx.ModelProto:
        """Assemble the model in place (big initializers are copied once, not three times)."""
        g = self.g
        model = onnx.ModelProto()
        model.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", self.opset)])
        if self.raw:
            model.ir_version = max(model.ir_version, 10)     # INT4/UINT4 tensors
        model.opset_import.add(domain="", version=self.opset)
        for d in sorted(self.domains):
            model.opset_import.add(domain=d, version=1)
        model.producer_name = "qcompiler"
        gr = model.graph
        gr.name = g.name
        gr.node.extend(self.nodes)
        gr.input.extend(_value_info(v.name, v.type) for v in g.inputs)
        gr.output.extend(_value_info(v.name, v.type) for v in g.outputs)
        outputs = {id(v) for v in g.outputs}
        gr.value_info.extend(_value_info(r.name, r.type) for op in g.ops for r in op.results if id(r) not in outputs)
        for name, a in self.inits:
            t = gr.initializer.add(name=name, data_type=helper.np_dtype_to_tensor_dtype(a.dtype))
            t.dims.extend(a.shape)
            t.raw_data = np.ascontiguousarray(a, a.dtype.newbyteorder("<")).tobytes()
        gr.initializer.extend(self.raw)
        return model


def required_opset(graph: Graph) -> int:
    """TARGET_OPSET, raised where an op needs a newer one."""
    v = TARGET_OPSET
    for op in graph.ops:
        if op.kind == "Gelu":
            v = max(v, 20)
        elif op.kind == "ConvNBits":
            v = max(v, 21)                  # blocked 4-bit DequantizeLinear
        elif op.kind in ("QuantizeLinear", "DequantizeLinear"):
            qp = (op.result if op.kind == "QuantizeLinear" else op.operands[0]).type.quant
            storage = qp.storage if qp else None
            v = max(v, 21 if storage in ("int16", "uint16") else 19 if is_fp8(storage) else v)
    return v


def _names(op: Op) -> list[str]:
    return [v.name for v in op.operands]


def _attrs(op: Op, *keys) -> dict:
    full = {**REGISTRY[op.kind].defaults, **op.attrs} if op.kind in REGISTRY else dict(op.attrs)
    return {k: full.get(k) for k in keys}


# ---- exporters: fn(writer, op) ----------------------------------------------------------------
EXPORTERS: dict[str, Callable[[_Writer, Op], None]] = {}


def exporter(*kinds):
    def deco(fn):
        for k in kinds:
            EXPORTERS[k] = fn
        return fn
    return deco


_ATTRS = {
    "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"), "Softmax": ("axis",), "LogSoftmax": ("axis",),
    "LRN": ("alpha", "beta", "bias", "size"), "BatchNormalization": ("epsilon",),
    "LayerNormalization": ("axis", "epsilon"), "Conv": ("strides", "dilations", "pads", "group"),
    "ConvTranspose": ("strides", "dilations", "pads", "group", "output_padding"),
    "MaxPool": ("kernel_shape", "strides", "pads", "dilations", "ceil_mode"),
    "AveragePool": ("kernel_shape", "strides", "pads", "ceil_mode", "count_include_pad"),
    "Gemm": ("alpha", "beta", "transA", "transB"), "Flatten": ("axis",), "Transpose": ("perm",),
    "Concat": ("axis",), "Gather": ("axis",), "Gelu": ("approximate",),
}
_PLAIN = ("Relu", "Sigmoid", "Tanh", "Sqrt", "Erf", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity",
          "HardSwish", "Softplus", "Floor", "Ceil", "Round", "GlobalAveragePool", "GlobalMaxPool", "MatMul",
          "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Dropout")


@exporter(*_PLAIN, *_ATTRS)
def _direct(w: _Writer, op: Op):
    w.node(op, _names(op), _attrs(op, *_ATTRS.get(op.kind, ())))


@exporter("Clip")
def _clip(w, op):
    a = _attrs(op, "min", "max")
    dt = op.operands[0].dtype
    lo = "" if a["min"] is None or math.isinf(a["min"]) else w.scalar(op, a["min"], dt, "min")
    hi = "" if a["max"] is None or math.isinf(a["max"]) else w.scalar(op, a["max"], dt, "max")
    w.node(op, [op.operands[0].name, lo, hi] if hi else ([op.operands[0].name, lo] if lo else [op.operands[0].name]))


@exporter("Cast")
def _cast(w, op):
    w.node(op, _names(op), {"to": _elem_type(op.attrs["to"])})


@exporter("Reshape")
def _reshape(w, op):
    shape = op.attrs["shape"]
    w.node(op, [op.operands[0].name, w.ints(op, shape, "shape")], {"allowzero": 1 if 0 in shape else None})


@exporter("Expand")
def _expand(w, op):
    w.node(op, [op.operands[0].name, w.ints(op, op.attrs["shape"], "shape")])


@exporter("Split")
def _split(w, op):
    a = _attrs(op, "axis", "split")
    w.node(op, [op.operands[0].name, w.ints(op, a["split"], "split")], {"axis": a["axis"]})


@exporter("Pad")
def _pad(w, op):
    a = _attrs(op, "pads", "mode", "value")
    x = op.operands[0]
    ins = [x.name, w.ints(op, a["pads"], "pads")]
    if a["mode"] == "constant":
        ins.append(w.scalar(op, a["value"], x.dtype, "value"))
    w.node(op, ins, {"mode": a["mode"]})


@exporter("Squeeze", "Unsqueeze")
def _squeeze(w, op):
    w.node(op, [op.operands[0].name, w.ints(op, op.attrs["axes"], "axes")])


@exporter("Slice")
def _slice(w, op):
    a = _attrs(op, "starts", "ends", "axes", "steps")
    ins = [op.operands[0].name] + [w.ints(op, a[k], k) for k in ("starts", "ends")]
    ins += [w.ints(op, a["axes"] if a["axes"] is not None else range(len(a["starts"])), "axes")]
    if a["steps"] is not None:
        ins.append(w.ints(op, a["steps"], "steps"))
    w.node(op, ins)


@exporter("Resize")
def _resize(w, op):
    a = _attrs(op, "sizes", "mode", "coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a",
               "exclude_outside", "extrapolation_value")
    sizes = a.pop("sizes")
    w.node(op, [op.operands[0].name, "", "", w.ints(op, sizes, "sizes")], a)


@exporter("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin")
def _reduce(w, op):
    a = _attrs(op, "axes", "keepdims")
    axes = a["axes"] or list(range(op.operands[0].type.rank))
    if op.kind == "ReduceSum" or w.opset >= 18:
        w.node(op, [op.operands[0].name, w.ints(op, axes, "axes")], {"keepdims": a["keepdims"]})
    else:
        w.node(op, [op.operands[0].name], {"axes": list(axes), "keepdims": a["keepdims"]})


def _quant_inputs(w, op, q) -> tuple[list[str], dict]:
    if q is None:
        raise ExportError(f"cannot export {op.describe()}: its quantized side has no quant params in its type")
    if q.storage == "int32" and op.kind == "QuantizeLinear":
        raise ExportError(f"cannot export {op.describe()}: ONNX QuantizeLinear has no int32 output")
    scale = q.scale_array() if q.axis is not None else np.asarray(q.scale[0], np.float32)
    zp = q.zero_point_array() if q.axis is not None else np.asarray(q.zero_point[0], np_dtype(q.storage))
    attrs = {"axis": q.axis} if q.axis is not None else {}
    return [w.const(scale, f"{op.name}/scale"), w.const(zp, f"{op.name}/zero_point")], attrs


@exporter("QuantizeLinear")
def _quantize(w, op):
    ins, attrs = _quant_inputs(w, op, op.result.type.quant)
    w.node(op, [op.operands[0].name] + ins, attrs)


@exporter("DequantizeLinear")
def _dequantize(w, op):
    ins, attrs = _quant_inputs(w, op, op.operands[0].type.quant)
    w.node(op, [op.operands[0].name] + ins, attrs)


_ACT_ATTRS = {"Clip": (), "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta")}


@exporter("FusedConv", "FusedGemm")
def _fused(w, op):
    """activation(Conv(X, W, B) + Z) / activation(Gemm(A, B, C)) as standard nodes."""
    base = "Conv" if op.kind == "FusedConv" else "Gemm"
    a = {**REGISTRY[op.kind].defaults, **op.attrs}
    act, params = a["activation"], list(a["activation_params"] or [])
    names = _names(op)
    steps = [(base, names[:3], {k: a[k] for k in _ATTRS[base]})]
    if len(names) == 4:
        steps.append(("Add", [None, names[3]], {}))
    if act == "Clip":
        dt = op.operands[0].dtype
        steps.append(("Clip", [None, w.scalar(op, params[0], dt, "min"), w.scalar(op, params[1], dt, "max")], {}))
    elif act:
        steps.append((act, [None], dict(zip(_ACT_ATTRS.get(act, ()), params))))
    prev = None
    for i, (kind, ins, attrs) in enumerate(steps):
        last = i == len(steps) - 1
        out = op.result.name if last else w.fresh(f"{op.result.name}/{kind.lower()}")
        w.node(op, [prev if x is None else x for x in ins], attrs, op_type=kind, outputs=[out],
               name=op.name if last else f"{op.name}/{kind.lower()}")
        prev = out


# ---- comparisons, logic, selection and index ops (all opset <= 17 as the IR holds them) --------
_LOGIC_ATTRS = {"IsInf": ("detect_negative", "detect_positive"), "Mod": ("fmod",), "GatherND": ("batch_dims",)}


@exporter("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where",
          "IsNaN", "Sign", "PRelu", *_LOGIC_ATTRS)
def _logic(w, op):
    w.node(op, _names(op), _attrs(op, *_LOGIC_ATTRS.get(op.kind, ())))


@exporter("ScatterND")
def _scatter_nd(w, op):
    w.node(op, _names(op))          # reduction "none" only (the IR rejects the others)


# com.microsoft weight-only 4-bit ops (their import converters live in the same module)
from .onnx_nbits import export_conv_nbits, export_gather_block_quantized, export_matmul_nbits  # noqa: E402

EXPORTERS["MatMulNBits"] = export_matmul_nbits
EXPORTERS["GatherBlockQuantized"] = export_gather_block_quantized
EXPORTERS["ConvNBits"] = export_conv_nbits
