"""export_onnx / save_onnx on hand-built IR: quant params become scale/zero-point initializers,
fused ops expand to standard nodes, the opset rises only when an op needs it, saving is atomic."""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest

import realmodels as rm
from qcompiler.errors import UserError
from qcompiler.frontend import ExportError, export_onnx, import_onnx, save_onnx
from qcompiler.ir import Graph, QuantParams, TensorType

F = "float32"


def fake_quant(x, q: QuantParams):
    """ONNX QuantizeLinear then DequantizeLinear, in numpy."""
    shape = [1] * x.ndim
    if q.axis is not None:
        shape[q.axis] = -1
    s = q.scale_array().reshape(shape)
    z = q.zero_point_array().astype(np.int64).reshape(shape)
    lo, hi = np.iinfo(q.storage).min, np.iinfo(q.storage).max
    stored = np.clip(np.round(x / s) + z, lo, hi)
    return ((stored - z) * s).astype(np.float32), stored.astype(q.storage)


@pytest.mark.parametrize("q, opset", [
    (QuantParams("uint8", (0.05,), (128,)), 17),
    (QuantParams("int8", (0.05, 0.1, 0.02), (0, 1, -2), axis=1), 17),
    (QuantParams("int16", (0.001,), (0,)), 21),
])
def test_quantize_dequantize_params_become_initializers(q, opset):
    g = Graph("qdq")
    x = g.add_input("x", TensorType((2, 3, 4), F))
    qv = g.create_op("QuantizeLinear", [x], result_types=[TensorType((2, 3, 4), q.storage, q)], name="q",
                     result_names=["xq"]).result
    y = g.create_op("DequantizeLinear", [qv], result_types=[TensorType((2, 3, 4), F)], name="dq",
                    result_names=["y"]).result
    g.outputs = [y, qv]
    m = export_onnx(g)
    onnx.checker.check_model(m)
    assert m.opset_import[0].version == opset
    node = m.graph.node[0]
    assert node.op_type == "QuantizeLinear" and node.name == "q"
    assert ([a.i for a in node.attribute if a.name == "axis"] or [None]) == [q.axis]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    np.testing.assert_array_equal(inits[node.input[1]].reshape(-1), q.scale_array())
    assert inits[node.input[2]].dtype == np.dtype(q.storage)
    xs = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32) * 3
    got_y, got_q = rm.ort_run(m, {"x": xs})
    want_y, want_q = fake_quant(xs, q)
    np.testing.assert_array_equal(got_q, want_q)
    np.testing.assert_allclose(got_y, want_y, rtol=1e-6, atol=1e-7)


def test_unknown_kind_names_the_op():
    g = Graph("g")
    x = g.add_input("x", TensorType((2,), F))
    g.outputs = [g.create_op("Frobnicate", [x], result_types=[TensorType((2,), F)], name="frob").result]
    with pytest.raises(ExportError, match="cannot export Frobnicate 'frob': op kind 'Frobnicate' has no ONNX mapping"):
        export_onnx(g)


def _conv_gemm(act, params, residual, fused: bool) -> Graph:
    """Conv(+Z)+act -> Flatten -> Gemm+act, as FusedConv/FusedGemm or as separate standard ops."""
    rng = np.random.default_rng(1)
    g = Graph("fused" if fused else "plain")
    x = g.add_input("x", TensorType((1, 2, 5, 5), F))
    ops = [x, g.add_const(rng.standard_normal((3, 2, 3, 3)).astype(np.float32), "w"),
           g.add_const(rng.standard_normal(3).astype(np.float32), "b")]
    z = g.add_const(rng.standard_normal((1, 3, 5, 5)).astype(np.float32), "z") if residual else None
    conv_attrs = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": 1}
    gw = g.add_const(rng.standard_normal((4, 75)).astype(np.float32), "gw")
    act_attrs = {"Clip": {"min": params[0], "max": params[-1]} if params else {},
                 "LeakyRelu": {"alpha": params[0]} if params else {},
                 "HardSigmoid": dict(zip(("alpha", "beta"), params))}.get(act, {})

    def activation(v):
        return g.create_op(act, [v], act_attrs).result if act else v
    if fused:
        fa = {"activation": act, "activation_params": params}
        c = g.create_op("FusedConv", ops + ([z] if z else []), {**conv_attrs, **fa}, name="fc").result
        f = g.create_op("Flatten", [c], {"axis": 1}).result
        y = g.create_op("FusedGemm", [f, gw], {"transB": 1, **fa}, name="fg").result
    else:
        c = g.create_op("Conv", ops, conv_attrs).result
        c = activation(g.create_op("Add", [c, z]).result if z else c)
        f = g.create_op("Flatten", [c], {"axis": 1}).result
        y = activation(g.create_op("Gemm", [f, gw], {"transB": 1}).result)
    g.outputs = [y]
    g.verify()
    return g


@pytest.mark.parametrize("act, params, residual", [
    ("", [], False), ("Relu", [], True), ("Clip", [0.0, 6.0], False), ("LeakyRelu", [0.1], True),
    ("HardSigmoid", [0.2, 0.5], False), ("HardSwish", [], False)])
def test_fused_ops_expand_to_standard_nodes(act, params, residual):
    fused = export_onnx(_conv_gemm(act, params, residual, fused=True))
    onnx.checker.check_model(fused)
    assert all(n.domain == "" for n in fused.graph.node)
    assert fused.graph.node[-1].name == "fg" and fused.graph.output[0].name == fused.graph.node[-1].output[0]
    plain = export_onnx(_conv_gemm(act, params, residual, fused=False))
    xs = np.random.default_rng(2).standard_normal((1, 2, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(rm.ort_run(fused, {"x": xs})[0], rm.ort_run(plain, {"x": xs})[0], rtol=1e-5, atol=1e-6)


def test_gelu_raises_the_opset_and_reduce_axes_follow():
    g = Graph("g")
    x = g.add_input("x", TensorType((2, 3), F))
    y = g.create_op("Gelu", [x]).result
    g.outputs = [g.create_op("ReduceMean", [y], {"axes": [1], "keepdims": 0}, result_names=["y"]).result]
    m = export_onnx(g)
    onnx.checker.check_model(m)
    assert m.opset_import[0].version == 20
    assert len(m.graph.node[1].input) == 2                  # opset 18+: axes is an input
    xs = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    from math import erf
    want = np.array([[v * 0.5 * (1 + erf(v / 2 ** 0.5)) for v in row] for row in xs]).mean(axis=1)
    np.testing.assert_allclose(rm.ort_run(m, {"x": xs})[0], want, rtol=1e-5)


def test_pass_made_ops_with_default_attrs_export():
    """Ops a pass creates may leave registry defaults (None) unset; the exporter omits them."""
    g = Graph("g")
    x = g.add_input("x", TensorType((1, 2, 6, 6), F))
    w = g.add_const(np.ones((2, 2, 3, 3), np.float32), "w")
    c = g.create_op("Conv", [x, w]).result
    p = g.create_op("MaxPool", [c], {"kernel_shape": [2, 2]}).result
    t = g.create_op("Transpose", [p]).result
    g.outputs = [g.create_op("Clip", [t], {"max": 3.0}).result]
    m = export_onnx(g)
    onnx.checker.check_model(m)
    xs = np.random.default_rng(0).standard_normal((1, 2, 6, 6)).astype(np.float32)
    assert rm.ort_run(m, {"x": xs})[0].shape == (3, 3, 2, 1)


def test_save_onnx_is_atomic_and_reimports(tmp_path):
    m = next(m for m in rm.rapidocr_models() if m.name == "rapidocr-cls")
    g = import_onnx(m.load(), m.input_shapes)
    out = tmp_path / "cls.onnx"
    out.write_bytes(b"old contents")
    save_onnx(g, out)
    assert sorted(os.listdir(tmp_path)) == ["cls.onnx"]          # no temp file left behind
    g2 = import_onnx(out)
    assert g2.op_histogram() == g.op_histogram() and [v.name for v in g2.inputs] == [v.name for v in g.inputs]
    feeds = m.feeds()
    np.testing.assert_allclose(rm.ort_run(str(out), feeds)[0], rm.ort_run(m.load(), feeds)[0], rtol=1e-5, atol=1e-6)
    with pytest.raises(UserError, match="output folder does not exist"):
        save_onnx(g, tmp_path / "missing" / "x.onnx")
