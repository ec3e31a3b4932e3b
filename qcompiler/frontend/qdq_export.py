"""The quantized IR as standard QDQ ONNX (QuantizeLinear / DequantizeLinear around float ops).

    model = export_qdq(graph)        # onnx.ModelProto (opset 17) that onnxruntime and TensorRT run
    save_qdq(graph, "model.int8.onnx")

Every integer op becomes DequantizeLinear on each quantized operand, the float op, and a
QuantizeLinear whose output keeps the quantized value's name (so a value of the IR can be fetched
from the ONNX model under the same name)::

    QLinearConv(xq, wq, bq) {Relu}   ->  DQ(xq), DQ(wq, axis 0), DQ(bq int32, axis 0) -> Conv -> Relu -> Q
    ... {HardSwish}                  ->  ... -> Conv -> HardSwish -> Q   (no Q between: ORT computes it in float)
    ... {HardSwish [alpha, beta, S]} ->  ... -> Conv -> Mul(S) -> HardSigmoid -> Mul(conv, .) -> Q
    QLinearGemm(aq, wq, bq)          ->  DQ ... -> Gemm(transB = 1) -> Q
    ... with a float32 result        ->  DQ ... -> Conv|Gemm [-> Relu|Clip]   (no Q: multiplier = [])
    QLinearAdd(aq, bq) {Relu}        ->  DQ, DQ -> Add -> Relu -> Q
    QLinearMul(aq, bq) {Relu}        ->  DQ, DQ -> Mul -> Relu -> Q
    QLinear(Global)AveragePool(xq)   ->  DQ -> (Global)AveragePool -> Q
    Requantize(q)                    ->  DQ -> Q
    Relu/Clip/Pad/GlobalMaxPool      ->  DQ -> op -> Q     (on quantized values; ONNX has no uint8 form)
    MaxPool, Reshape, Flatten, Transpose, Concat, ... on quantized: the op on the uint8 tensor

int8 weights and int32 biases stay integer initializers (per-channel DequantizeLinear, axis 0);
``float_bias=True`` writes biases as float initializers instead. For TensorRT (int8, zero point 0
only) quantize with ``activation_dtype="int8", symmetric_activations=True`` and export with
``float_bias=True``.
Each use of a quantized value gets its own DequantizeLinear, as onnxruntime's QDQ fusion wants.
Runtimes fuse DQ -> Conv -> Q into their own integer conv with a *float* requantization scale, so
their results may differ from qcompiler's fixed-point arithmetic by 1 LSB where a value rounds
near .5.

Float islands (layers kept float: ``--keep-float``, the budgeted selection) are plain float ops
between a DequantizeLinear and a QuantizeLinear, with float weights. ONNX Runtime >= 1.20 would
quantize them anyway: its WeightBiasQuantization transformer (ORT_ENABLE_ALL) gives a
Conv/ConvTranspose/Gemm whose input comes from a per-tensor DequantizeLinear and whose weight is a
float initializer int8 per-tensor weights, and then fuses it into its integer conv (measured on
fashion_mobilenet with a depthwise conv kept float: 4 LSB off on 15 % of its outputs). So the
DequantizeLinear entering such an op is written per axis, its one scale and zero point repeated
along a channel axis: the same numbers, which that transformer does not match
(:func:`keep_islands_float`). ``float_bias=True`` (TensorRT) leaves them per tensor: TensorRT
takes per-axis scales on weights only and does not quantize float weights by itself.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

from ..ir.activations import make_activation
from ..ir.graph import Graph, Op, Value
from ..ir.ops import REGISTRY
from ..ir.types import QuantParams, TensorType, dequantize
from .onnx_export import export_onnx, write_model

_FLOAT_FORM = {"QLinearConv": "FusedConv", "QLinearGemm": "FusedGemm", "QLinearAdd": "Add",
               "QLinearMul": "Mul",
               "QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
               "Requantize": None, "Relu": "Relu", "Clip": "Clip", "Pad": "Pad", "GlobalMaxPool": "GlobalMaxPool"}
_DROP = ("multiplier", "shift", "hardswish")


def export_qdq(graph: Graph, *, float_bias: bool = False, uint8_weights: bool = False) -> onnx.ModelProto:
    """``float_bias``: biases as float initializers (b_q * s_x * s_w) instead of int32 + DQ, as
    TensorRT wants (with ``symmetric_activations`` int8 params from the quantize pass).
    ``uint8_weights``: the int8 weights of a conv/gemm with a uint8 input written as uint8 ``w + 128``
    with zero point ``z_w + 128`` (the same real weights), so that ONNX Runtime runs its exact
    U8U8 kernels (see :func:`to_qdq_graph`); ``qcompile verify`` exports with it."""
    dynamic = next((op for op in graph.ops if op.kind in ("DynamicQuantParams", "DynamicQLinearGemm")), None)
    if dynamic is not None:
        from ..errors import UserError
        raise UserError(f"{dynamic.describe()} quantizes its input at run time (dynamic int8), which QDQ ONNX "
                        "cannot state: its scales are not constants", "QDQ export",
                        "compile the model with qcompile, or export the float model (ONNX Runtime's "
                        "quantize_dynamic makes its own dynamic int8 file)")
    g = to_qdq_graph(graph, float_bias=float_bias, uint8_weights=uint8_weights)
    model = export_onnx(g)
    if not float_bias:
        keep_islands_float(model, g)
    fp8_clamps_as_max_min(model)
    return model


def save_qdq(graph: Graph, path: "str | os.PathLike", *, float_bias: bool = False,
             uint8_weights: bool = False) -> None:
    """Export ``graph`` as QDQ ONNX and write it to ``path`` atomically (as save_onnx does)."""
    if float_bias:
        model = export_onnx(to_qdq_graph(graph, float_bias=float_bias, uint8_weights=uint8_weights))
        fp8_clamps_as_max_min(model)
        write_model(model, path)
        return
    write_model(export_qdq(graph, uint8_weights=uint8_weights), path)


_FP8_ZERO_POINTS = (onnx.TensorProto.FLOAT8E4M3FN, onnx.TensorProto.FLOAT8E5M2)


def fp8_clamps_as_max_min(model: onnx.ModelProto) -> int:
    """Rewrite in place every Relu / Clip whose output a float8 QuantizeLinear reads as Max(x, 0) /
    Max(Min(x, hi), lo): the same values, in a form ONNX Runtime's QDQ fusions leave alone. ONNX
    Runtime 1.32 (ORT_ENABLE_EXTENDED and above, so by default) drops a Relu before a QuantizeLinear
    whose zero point is 0 (ReluQuantFusion: right for uint8, whose grid starts at 0, wrong for
    float8, which keeps the negative side: a conv -> Relu -> float8 Q model then computes the conv
    without its Relu), and refuses to load a Clip before a float8 QuantizeLinear (ClipQuantFusion:
    "Unexpected data type for QuantizeLinear input y_zero_point of 17"). Returns how many."""
    inits = {t.name: t for t in model.graph.initializer}
    fp8_q = set()
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and len(n.input) > 2 and n.input[2] in inits \
                and inits[n.input[2]].data_type in _FP8_ZERO_POINTS:
            fp8_q.add(n.input[0])
    taken = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input} | \
        {o for n in model.graph.node for o in n.output} | {n.name for n in model.graph.node}

    def fresh(hint: str) -> str:
        name, i = hint, 0
        while name in taken:
            i += 1
            name = f"{hint}_{i}"
        taken.add(name)
        return name
    nodes, done = [], 0
    for n in model.graph.node:
        if n.op_type not in ("Relu", "Clip") or n.output[0] not in fp8_q:
            nodes.append(n)
            continue
        done += 1
        x, y = n.input[0], n.output[0]
        if n.op_type == "Relu":
            zero = numpy_helper.from_array(np.zeros((), np.float32), fresh(f"{y}/zero"))
            model.graph.initializer.append(zero)
            nodes.append(onnx.helper.make_node("Max", [x, zero.name], [y], name=n.name))
            continue
        lo = n.input[1] if len(n.input) > 1 and n.input[1] else ""
        hi = n.input[2] if len(n.input) > 2 and n.input[2] else ""
        if hi:
            below = fresh(f"{y}/below_max") if lo else y
            nodes.append(onnx.helper.make_node("Min", [x, hi], [below], name=fresh(f"{n.name}/min")))
            x = below
        if lo:
            nodes.append(onnx.helper.make_node("Max", [x, lo], [y], name=n.name))
        elif not hi:
            nodes.append(onnx.helper.make_node("Identity", [x], [y], name=n.name))
    if done:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return done


_WEIGHT_QUANTIZED_BY_ORT = ("Conv", "ConvTranspose", "Gemm")


def keep_islands_float(model: onnx.ModelProto, graph: Graph) -> int:
    """Rewrite in place every per-tensor DequantizeLinear whose output is the data input of a
    Conv/ConvTranspose/Gemm with a float weight initializer (a float island's entry) as a per-axis
    one with the same scale and zero point repeated along the largest non-batch axis (exact; see
    the module docstring). Returns how many were rewritten. A tensor whose non-batch axes all have
    size 1 cannot be written per axis with more than one element and is left as is."""
    inits = {t.name: t for t in model.graph.initializer}
    readers: dict[str, list] = {}
    for n in model.graph.node:
        for i, x in enumerate(n.input):
            readers.setdefault(x, []).append((n, i))
    done = 0
    for n in model.graph.node:
        if n.op_type != "DequantizeLinear" or any(a.name == "axis" for a in n.attribute) or len(n.input) < 2:
            continue
        if not any(r.op_type in _WEIGHT_QUANTIZED_BY_ORT and i == 0 and len(r.input) > 1 and r.input[1] in inits
                   and inits[r.input[1]].data_type == onnx.TensorProto.FLOAT
                   for r, i in readers.get(n.output[0], [])):
            continue
        if not graph.has_value(n.input[0]) or n.input[1] not in inits:
            continue
        shape = graph.value(n.input[0]).shape
        axes = [a for a in range(1, len(shape)) if shape[a] > 1]
        if not axes:
            continue
        axis = max(axes, key=lambda a: (shape[a], -a))
        scale = numpy_helper.to_array(inits[n.input[1]]).reshape(-1)[:1]
        names = [numpy_helper.from_array(np.repeat(scale, shape[axis]), n.name + "/scale_per_axis")]
        if len(n.input) > 2 and n.input[2] in inits:
            zp = numpy_helper.to_array(inits[n.input[2]]).reshape(-1)[:1]
            names.append(numpy_helper.from_array(np.repeat(zp, shape[axis]), n.name + "/zero_point_per_axis"))
        model.graph.initializer.extend(names)
        for k, t in enumerate(names):
            n.input[1 + k] = t.name
        n.attribute.append(onnx.helper.make_attribute("axis", axis))
        done += 1
    if done:                                       # drop the per-tensor scalars no node reads now
        used = {x for n in model.graph.node for x in n.input}
        keep = [t for t in model.graph.initializer if t.name in used]
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)
    return done


def to_qdq_graph(graph: Graph, *, float_bias: bool = False, uint8_weights: bool = False) -> Graph:
    """A copy of ``graph`` with every integer op expanded to DQ -> float op -> Q.

    ``uint8_weights``: ONNX Runtime's U8S8 integer GEMM on x86 CPUs with AVX2 but without VNNI
    (AMD Zen 1-3, Intel before Ice Lake / Alder Lake) multiplies with ``vpmaddubsw``, which adds
    two u8·s8 products into a *saturating* int16 (255·127·2 > 32767), so its QLinearConv can be
    tens of LSB off the exact result (measured on a Zen 3 with ORT 1.32: 53 LSB on a rapidocr-cls
    1x1 conv; ORT's quantization guide names the issue and suggests ``reduce_range``). Its U8U8
    kernels widen to int16 and use ``vpmaddwd``, which is exact. ``w + 128`` with zero point
    ``z + 128`` dequantizes to the same reals, so the QDQ model means the same and ORT computes it
    exactly on every CPU."""
    g = graph.clone()
    for op in g.ops:
        if op.kind in _FLOAT_FORM and op.results and (op.result.type.quant is not None
                                                      or op.kind in ("QLinearConv", "QLinearGemm")):
            if uint8_weights and op.kind in ("QLinearConv", "QLinearGemm"):
                _weights_as_uint8(g, op)
            _expand(g, op, float_bias)
    g.remove_unused_consts()
    return g


def _weights_as_uint8(g: Graph, op: Op) -> None:
    """Replace ``op``'s int8 weight constant by uint8 ``w + 128`` with zero points ``z + 128``
    (only where the activation is uint8: ONNX Runtime has no s8 x u8 kernel)."""
    x, w = op.operands[0], op.operands[1]
    qw = w.type.quant
    if x.dtype != "uint8" or not w.is_const or qw is None or qw.storage != "int8":
        return
    data = (w.data.astype(np.int16) + 128).astype(np.uint8)
    qp = QuantParams("uint8", qw.scale, tuple(z + 128 for z in qw.zero_point), qw.axis, qw.expressed)
    op.set_operand(1, g.add_const(data, w.name + "_u8", quant=qp))


def _dq(g: Graph, v: Value, anchor: Op, float_bias: bool = False) -> Value:
    if v.type.quant is None:
        return v
    if float_bias and v.is_const and v.dtype == "int32":
        return g.add_const(dequantize(v.data, v.type.quant), v.name + "_float")
    return g.create_op("DequantizeLinear", [v], name=f"{anchor.name}/dq", result_names=[v.name + "_dq"],
                       before=anchor).result


def _scaled_hardswish(g: Graph, z: Value, params, name: str, anchor: Op) -> Value:
    """z · HardSigmoid(S·z; alpha, beta) as the float graph had it (Mul, HardSigmoid, Mul)."""
    import numpy as np
    S = np.asarray(params[2:], np.float32)
    if S.size > 1:
        S = S.reshape((1, S.size) + (1,) * (z.type.rank - 2))
    sv = g.add_const(S, g.unique_name(name + "_hswish_scale"))
    m = g.create_op("Mul", [z, sv], name=f"{name}/hswish_scale", before=anchor).result
    h = g.create_op("HardSigmoid", [m], {"alpha": float(params[0]), "beta": float(params[1])},
                    name=f"{name}/hswish_gate", before=anchor).result
    return g.create_op("Mul", [z, h], name=f"{name}/hswish", before=anchor).result


def _expand(g: Graph, op: Op, float_bias: bool) -> None:
    r, name, rname = op.result, op.name, op.result.name
    kind = _FLOAT_FORM[op.kind]
    xs = [_dq(g, v, op, float_bias) for v in op.operands]
    y = xs[0]
    if kind is not None:
        attrs = {k: v for k, v in op.attrs.items() if k not in _DROP}
        act, params = "", []
        if kind == "FusedGemm":
            attrs.update(alpha=1.0, beta=1.0, transA=0, transB=1)
        if attrs.get("activation") == "HardSwish" and attrs.get("activation_params"):
            act, params = "ScaledHardSwish", attrs["activation_params"]     # the equalized form, spelled out
            attrs.update(activation="", activation_params=[])
        elif kind in ("Add", "Mul"):
            act, params = attrs.pop("activation", ""), attrs.pop("activation_params", [])
        attrs = {**REGISTRY[kind].defaults, **attrs}
        y = g.create_op(kind, xs, attrs, name=f"{name}/float", result_names=[rname + "_float"], before=op).result
        if act == "ScaledHardSwish":
            y = _scaled_hardswish(g, y, params, name, op)
        elif act:
            y = make_activation(g, act, params, y, name=f"{name}/{act.lower()}", before=op).result
    if r.type.quant is None:                        # a dequantizing QLinearConv/Gemm: its float result as it is
        g.replace_op(op, [y])
        g.rename_op(y.producer, name)
        if not g.has_value(rname):
            g.rename(y, rname)
        return
    q = g.create_op("QuantizeLinear", [y], result_types=[TensorType(r.shape, r.dtype, r.type.quant)],
                    name=f"{name}/q", result_names=[rname + "_qdq"], before=op)
    g.replace_op(op, [q.result])
    g.rename_op(q, name)
    if not g.has_value(rname):
        g.rename(q.result, rname)
