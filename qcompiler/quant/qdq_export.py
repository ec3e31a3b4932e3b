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
"""
from __future__ import annotations

import os

import onnx

from ..frontend.onnx_export import export_onnx, save_onnx
from ..ir.graph import Graph, Op, Value
from ..ir.ops import REGISTRY
from ..ir.types import TensorType
from ..passes._common import make_activation
from .qparams import dequantize

_FLOAT_FORM = {"QLinearConv": "FusedConv", "QLinearGemm": "FusedGemm", "QLinearAdd": "Add",
               "QLinearMul": "Mul",
               "QLinearGlobalAveragePool": "GlobalAveragePool", "QLinearAveragePool": "AveragePool",
               "Requantize": None, "Relu": "Relu", "Clip": "Clip", "Pad": "Pad", "GlobalMaxPool": "GlobalMaxPool"}
_DROP = ("multiplier", "shift", "hardswish")


def export_qdq(graph: Graph, *, float_bias: bool = False) -> onnx.ModelProto:
    """``float_bias``: biases as float initializers (b_q * s_x * s_w) instead of int32 + DQ, as
    TensorRT wants (with ``symmetric_activations`` int8 params from the quantize pass)."""
    return export_onnx(to_qdq_graph(graph, float_bias=float_bias))


def save_qdq(graph: Graph, path: "str | os.PathLike", *, float_bias: bool = False) -> None:
    """Export ``graph`` as QDQ ONNX and write it to ``path`` atomically (as save_onnx does)."""
    save_onnx(to_qdq_graph(graph, float_bias=float_bias), path)


def to_qdq_graph(graph: Graph, *, float_bias: bool = False) -> Graph:
    """A copy of ``graph`` with every integer op expanded to DQ -> float op -> Q."""
    g = graph.clone()
    for op in g.ops:
        if op.kind in _FLOAT_FORM and op.results and op.result.type.quant is not None:
            _expand(g, op, float_bias)
    g.remove_unused_consts()
    return g


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
    q = g.create_op("QuantizeLinear", [y], result_types=[TensorType(r.shape, r.dtype, r.type.quant)],
                    name=f"{name}/q", result_names=[rname + "_qdq"], before=op)
    g.replace_op(op, [q.result])
    g.rename_op(q, name)
    if not g.has_value(rname):
        g.rename(q.result, rname)
