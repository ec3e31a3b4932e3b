"""ONNX Runtime's QOperator ops (QLinearConv, QLinearMatMul and the com.microsoft ones), one small
model each, imported as DequantizeLinear -> float op -> QuantizeLinear and folded onto the integer
ops by fold-qdq: the reference interpreter against ONNX Runtime on the same file (its kernels,
optimizations off), within one step of the output quantization (ONNX Runtime requantizes in
float32 and may round a value at .5 the other way) and exact on at least 99 % of the outputs.
The float build's import (no fold) within the same bound."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from qcompiler.errors import UserError
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.passes import run_passes
from qcompiler.quant import reference
from qdq_models import ort_plain

RNG = np.random.default_rng(3)
MS = h.make_opsetid("com.microsoft", 1)


def _model(nodes, inits, inputs, out_type=T.UINT8):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(k, T.FLOAT, list(v.shape)) for k, v in inputs.items()],
                     [h.make_tensor_value_info("y", out_type, None)],
                     [nh.from_array(np.asarray(v), k) for k, v in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 13), MS])
    m.ir_version = 8
    return m


def _q(x, s, z):
    return [h.make_node("QuantizeLinear", [x, s, z], [x + "_q"])]


SX, ZX = np.float32(0.04), np.uint8(120)
SY, ZY = np.float32(0.05), np.uint8(110)
BASE = {"sx": SX, "zx": ZX, "sy": SY, "zy": ZY}


def case(name):
    x = (RNG.standard_normal((1, 8, 5, 5)) * 1.5).astype(np.float32)
    if name == "QLinearConv":
        w = RNG.integers(-127, 128, (6, 8, 3, 3)).astype(np.int8)
        ws = (RNG.random(6) * 0.004 + 0.001).astype(np.float32)
        b = RNG.integers(-3000, 3000, 6).astype(np.int32)
        nodes = _q("x", "sx", "zx") + [h.make_node("QLinearConv", ["x_q", "sx", "zx", "w", "ws", "wz", "sy", "zy", "b"],
                                                   ["y"], pads=[1, 1, 1, 1], strides=[2, 1])]
        return _model(nodes, {**BASE, "w": w, "ws": ws, "wz": np.zeros(6, np.int8), "b": b}, {"x": x})
    if name == "QLinearMatMul":
        a = (RNG.standard_normal((3, 7, 16)) * 1.5).astype(np.float32)
        w = RNG.integers(-127, 128, (16, 9)).astype(np.int8)
        nodes = _q("x", "sx", "zx") + [h.make_node("QLinearMatMul", ["x_q", "sx", "zx", "w", "ws", "wz", "sy", "zy"],
                                                   ["y"])]
        return _model(nodes, {**BASE, "w": w, "ws": np.float32(0.01), "wz": np.int8(0)}, {"x": a})
    if name in ("QLinearAdd", "QLinearMul"):
        x2 = (RNG.standard_normal((1, 8, 5, 5))).astype(np.float32)
        nodes = _q("x", "sx", "zx") + _q("x2", "s2", "z2") + [
            h.make_node(name, ["x_q", "sx", "zx", "x2_q", "s2", "z2", "sy", "zy"], ["y"], domain="com.microsoft")]
        return _model(nodes, {**BASE, "s2": np.float32(0.03), "z2": np.uint8(100)}, {"x": x, "x2": x2})
    if name in ("QLinearSigmoid", "QLinearLeakyRelu", "QLinearGlobalAveragePool"):
        attrs = {"alpha": 0.2} if name == "QLinearLeakyRelu" else {}
        s_y = np.float32(1 / 255) if name == "QLinearSigmoid" else SY
        z_y = np.uint8(0) if name == "QLinearSigmoid" else ZY
        nodes = _q("x", "sx", "zx") + [h.make_node(name, ["x_q", "sx", "zx", "sy", "zy"], ["y"], domain="com.microsoft",
                                                   **attrs)]
        return _model(nodes, {**BASE, "sy": s_y, "zy": z_y}, {"x": x})
    if name == "QLinearConcat":
        x2 = (RNG.standard_normal((1, 3, 5, 5))).astype(np.float32)
        nodes = _q("x", "sx", "zx") + _q("x2", "s2", "z2") + [
            h.make_node(name, ["sy", "zy", "x_q", "sx", "zx", "x2_q", "s2", "z2"], ["y"], domain="com.microsoft",
                        axis=1)]
        return _model(nodes, {**BASE, "s2": np.float32(0.03), "z2": np.uint8(100)}, {"x": x, "x2": x2})
    if name.startswith("QGemm"):
        a = (RNG.standard_normal((4, 16)) * 1.5).astype(np.float32)
        w = RNG.integers(-127, 128, (9, 16)).astype(np.int8)
        ws = (RNG.random(9) * 0.01 + 0.001).astype(np.float32)
        c = RNG.integers(-2000, 2000, 9).astype(np.int32)
        outs = ["sy", "zy"] if name == "QGemm" else []
        nodes = _q("x", "sx", "zx") + [h.make_node("QGemm", ["x_q", "sx", "zx", "w", "ws", "wz", "c"] + outs, ["y"],
                                                   domain="com.microsoft", transB=1, alpha=0.5)]
        return _model(nodes, {**BASE, "w": w, "ws": ws, "wz": np.zeros(9, np.int8), "c": c}, {"x": a},
                      T.UINT8 if name == "QGemm" else T.FLOAT)
    if name == "DynamicQuantizeMatMul":
        a = (RNG.standard_normal((2, 5, 16)) * 1.5).astype(np.float32)
        w = RNG.integers(-127, 128, (16, 9)).astype(np.int8)
        nodes = [h.make_node(name, ["x", "w", "ws", "wz", "bias"], ["y"], domain="com.microsoft")]
        return _model(nodes, {"w": w, "ws": np.float32(0.02), "wz": np.int8(0),
                              "bias": RNG.standard_normal(9).astype(np.float32)}, {"x": a}, T.FLOAT)
    raise KeyError(name)


NAMES = ["QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu",
         "QLinearGlobalAveragePool", "QLinearConcat", "QGemm", "QGemm-float", "DynamicQuantizeMatMul"]


def _feeds(m):
    return {i.name: (RNG.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]) * 1.5)
            .astype(np.float32) for i in m.graph.input}


@pytest.mark.parametrize("name", NAMES)
def test_qoperator_matches_onnxruntime(name):
    m = case(name)
    feeds = _feeds(m)
    (ref,) = ort_plain(m, feeds)
    g = import_onnx(m)
    assert g.meta["prequantized"]
    run_passes(g, "default,fold-qdq")
    (got,) = reference.run(g, feeds)
    if ref.dtype == np.uint8:                      # steps of the output quantization
        d = np.abs(got.astype(np.int32) - ref.astype(np.int32))
        assert d.max() <= 1 and np.mean(d == 0) >= 0.99, (d.max(), np.mean(d == 0))
    else:                                          # float output: within 1e-5 of its range
        np.testing.assert_allclose(got, ref, atol=1e-5 * np.abs(ref).max(), rtol=0)
    integer = [op.kind for op in g.ops if op.kind.startswith("QLinear")]
    if name in ("QLinearConv", "QLinearMatMul", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QGemm"):
        assert integer, [op.kind for op in g.ops]            # folded onto an integer kernel


def test_channels_last_average_pool_refused():
    m = case("QLinearGlobalAveragePool")
    m.graph.node[-1].attribute.append(h.make_attribute("channels_last", 1))
    with pytest.raises(UserError) as e:
        import_onnx(m)
    assert "channels_last" in str(e.value) and "\n" not in str(e.value)


def test_other_microsoft_ops_refused_with_the_list():
    m = case("QLinearSigmoid")
    m.graph.node[-1].op_type = "QLinearSoftmax"
    with pytest.raises(UserError) as e:
        import_onnx(m)
    assert "com.microsoft::QLinearSoftmax" in str(e.value) and "QLinearAdd" in str(e.value)
