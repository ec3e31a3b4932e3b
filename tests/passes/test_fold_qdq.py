"""fold-qdq: a pre-quantized model's Q/DQ groups become the quantize pass's integer ops, with the
model's own scales.

* small QDQ convs (tests/qdq_models.py): one QLinearConv, the model's int32 bias used as stored,
  the multipliers of its scales; the reference interpreter within 1 LSB of ONNX Runtime running
  the ONNX formulas (and exact on >= 99 % of the outputs: only values within float rounding of .5 differ);
* what has no integer kernel (Softmax) or weights the kernels cannot take (uint8, zero point 3)
  stays float with its reason, and the folded graph computes exactly what the unfolded one does;
* round trip: fashion_mobilenet quantized by our quantize pass, exported as QDQ (int8 and uint8
  weights), imported and folded gives the same integer ops (weights, biases, multipliers, shifts,
  output params) and bit-identical outputs;
* ONNX Runtime's ``quantize_static`` of fashion_mobilenet: every layer integer, top-1 on the 1,000
  test images equal to ONNX Runtime's on the same QDQ file.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper as h

import realmodels as rm
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.frontend.qdq_export import export_qdq
from qcompiler.passes import PassContext, PassManager, run_passes
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import reference
from qcompiler.quant.requant import conv_multipliers
from qdq_models import RNG, X, model, ort_plain, ort_quantize_static, qdq_conv

INTEGER_KINDS = ("QLinearConv", "QLinearGemm", "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool",
                 "QLinearAveragePool", "Requantize")


def folded(m) -> tuple:
    g = import_onnx(m)
    run_passes(g, "default")
    before = g.clone()
    run_passes(g, "fold-qdq")
    return before, g


@pytest.mark.parametrize("per_channel,act,zp", [(True, "uint8", True), (False, "uint8", True),
                                                (True, "int8", True), (True, "uint8", False)])
def test_qdq_conv_becomes_one_qlinearconv(per_channel, act, zp):
    m = qdq_conv(per_channel=per_channel, act=act, zp=zp)
    _, g = folded(m)
    kinds = g.op_histogram()
    assert kinds.get("QLinearConv") == 1 and "Conv" not in kinds and kinds.get("DequantizeLinear") == 1
    conv = next(op for op in g.ops if op.kind == "QLinearConv")
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in m.graph.initializer}
    np.testing.assert_array_equal(conv.operands[2].data, inits["b"])          # the model's own int32 bias
    np.testing.assert_array_equal(conv.operands[1].data, inits["w"])
    ms, ss = conv_multipliers(float(inits["s"]), np.atleast_1d(inits["ws"]).tolist(), float(inits["s2"]))
    assert conv.attrs["multiplier"] == ms and conv.attrs["shift"] == ss
    assert g.meta["quant"]["layers"][conv.name]["precision"] == "int8"
    (ref,) = ort_plain(m, {"x": X})
    (got,) = reference.run(g, {"x": X})
    steps = np.abs(got - ref) / 0.1                                           # output scale 0.1
    assert steps.max() <= 1 + 1e-4 and np.mean(steps < 1e-4) >= 0.99


def _softmax_and_uint8_weight_model():
    """x -Q/DQ-> Softmax -Q/DQ-> Conv(uint8 weight, zero point 3) -Q/DQ-> y: nothing integer but the Q/DQ."""
    s, z = np.float32(0.02), np.uint8(128)
    w = RNG.integers(0, 256, (3, 4, 1, 1)).astype(np.uint8)
    inits = {"s": s, "z": z, "sp": np.float32(1 / 255), "zp": np.uint8(0), "w": w, "ws": np.float32(0.01),
             "wz": np.uint8(3), "so": np.float32(0.05), "zo": np.uint8(100)}
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             h.make_node("Softmax", ["xd"], ["p"], axis=1),
             h.make_node("QuantizeLinear", ["p", "sp", "zp"], ["pq"]),
             h.make_node("DequantizeLinear", ["pq", "sp", "zp"], ["pd"]),
             h.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"]),
             h.make_node("Conv", ["pd", "wd"], ["c"]),
             h.make_node("QuantizeLinear", ["c", "so", "zo"], ["cq"]),
             h.make_node("DequantizeLinear", ["cq", "so", "zo"], ["y"])]
    return model(nodes, inits, X.shape, opset=13)


def test_ops_without_integer_kernels_stay_float_with_the_reason():
    before, g = folded(_softmax_and_uint8_weight_model())
    layers = g.meta["quant"]["layers"]
    reasons = {v["kind"]: v.get("reason", "") for v in layers.values() if v["precision"] == "float"}
    assert "no integer kernel for Softmax" in reasons["Softmax"]
    assert "zero point 3" in reasons["Conv"]
    assert not any(op.kind.startswith("QLinear") for op in g.ops)
    np.testing.assert_array_equal(reference.run(g, {"x": X})[0], reference.run(before, {"x": X})[0])


@pytest.fixture(scope="module")
def fashion_quantized():
    data = rm.fashion_test()
    if data is None or not rm.MODELS_DIR.joinpath("fashion_mobilenet.onnx").exists():
        pytest.skip("models/fashion_mobilenet.onnx or fashion_test.npz not present")
    x = data[0]
    g = import_onnx(str(rm.MODELS_DIR / "fashion_mobilenet.onnx"))
    run_passes(g)
    name = g.inputs[0].name
    calib = [{name: x[i:i + 1]} for i in range(32)]
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=calib)})).run(g)
    return g, name, x


def _integer_ops(g):
    return [op for op in g.ops if op.kind in INTEGER_KINDS]


@pytest.mark.parametrize("uint8_weights", [False, True])
def test_our_qdq_export_folds_back_to_the_same_integers(fashion_quantized, uint8_weights):
    g, name, x = fashion_quantized
    back = import_onnx(export_qdq(g, uint8_weights=uint8_weights))
    run_passes(back, "default,fold-qdq")
    ours, theirs = _integer_ops(g), _integer_ops(back)
    assert [op.kind for op in ours] == [op.kind for op in theirs] and len(ours) >= 25
    assert all(v["precision"] == "int8" for v in back.meta["quant"]["layers"].values())
    for a, b in zip(ours, theirs):
        assert a.result.type.quant == b.result.type.quant, a.name
        for k in ("multiplier", "shift", "activation", "activation_params"):
            assert a.attrs.get(k) == b.attrs.get(k), (a.name, k)
        for va, vb in zip(a.operands[1:], b.operands[1:]):
            if va.is_const:
                np.testing.assert_array_equal(va.data, vb.data)
                assert va.type.quant == vb.type.quant
    feed = {name: x[100:116]}
    for ya, yb in zip(reference.run(g, feed), reference.run(back, feed)):
        np.testing.assert_array_equal(ya, yb)


@pytest.mark.slow
def test_ort_quantize_static_fashion_mobilenet_matches_ort_top1(tmp_path):
    """ONNX Runtime's quantize_static (QDQ, per-channel int8 weights, uint8 activations, MinMax on 32
    test images, its ReLU6 left to the QuantizeLinear ranges): every layer folds to an integer op,
    and the reference interpreter's top-1 on all 1,000 images equals ONNX Runtime's on the file."""
    import onnxruntime as ort
    data = rm.fashion_test()
    if data is None:
        pytest.skip("models/fashion_test.npz not present")
    x, y = data
    src = str(rm.MODELS_DIR / "fashion_mobilenet.onnx")
    name = onnx.load(src).graph.input[0].name
    path = ort_quantize_static(src, [{name: x[i:i + 1]} for i in range(32)], tmp_path / "qdq.onnx")
    m = onnx.load(path)
    _, g = folded(m)
    layers = g.meta["quant"]["layers"]
    assert [k for k, v in layers.items() if v["precision"] != "int8"] == []
    assert sum(op.kind == "QLinearConv" for op in g.ops) == 23
    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    theirs = np.concatenate([s.run(None, {name: x[i:i + 1]})[0] for i in range(len(x))]).argmax(-1)
    ours = np.concatenate([reference.run(g, {name: x[i:i + 1]})[0] for i in range(len(x))]).argmax(-1)
    acc_ours, acc_ort = float(np.mean(ours == y)), float(np.mean(theirs == y))
    assert abs(acc_ours - acc_ort) <= 0.002, (acc_ours, acc_ort)
    assert np.mean(ours == theirs) >= 0.995


def test_conv_with_qdq_on_its_inputs_only_returns_float32():
    """A conv whose result no QuantizeLinear takes (PRelu reads it: what our export writes for a
    conv that only float ops read): one QLinearConv with a float32 result (``multiplier = []``),
    equal to ONNX Runtime's float Conv of the dequantized operands up to the float bias
    re-expressed at s_x s_w (half its step) and float32 rounding; the PRelu stays float."""
    c, o = 3, 4
    w = RNG.integers(-127, 128, (o, c, 3, 3)).astype(np.int8)
    ws = (RNG.random(o) * 0.01 + 0.001).astype(np.float32)
    inits = {"s": np.float32(0.02), "z": np.uint8(128), "w": w, "ws": ws,
             "b": RNG.normal(0, 0.1, o).astype(np.float32), "slope": np.full((o, 1, 1), 0.25, np.float32)}
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=0),
             h.make_node("Conv", ["xd", "wd", "b"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("PRelu", ["c", "slope"], ["y"])]
    x = RNG.uniform(-2, 2, (1, c, 6, 6)).astype(np.float32)
    m = model(nodes, inits, x.shape, opset=13)
    _, g = folded(m)
    conv = [op for op in g.ops if op.kind == "QLinearConv"]
    assert len(conv) == 1 and conv[0].result.dtype == "float32" and conv[0].attrs["multiplier"] == []
    assert [u.kind for u in conv[0].result.users] == ["PRelu"]
    (ref,) = ort_plain(m, {"x": x})
    (got,) = reference.run(g, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=0, atol=0.5 * 0.02 * float(ws.max()) + 2e-6)


def test_gemm_with_qdq_on_its_inputs_only_returns_float32():
    """TensorRT-style explicit quantization: Q/DQ on the activation, DQ on the int8 weight (per
    channel), a float bias, MatMul of a rank-3 input, no Q after it (Tanh reads it): one QLinearGemm
    over the rows with a float32 result, equal to ONNX Runtime's float MatMul of the dequantized
    operands up to float32 rounding (the same integers, summed in another order)."""
    k, n = 8, 5
    w = RNG.integers(-127, 128, (k, n)).astype(np.int8)
    ws = (RNG.random(n) * 0.01 + 0.001).astype(np.float32)
    inits = {"s": np.float32(0.03), "z": np.uint8(120), "w": w, "ws": ws,
             "b": RNG.normal(0, 0.1, n).astype(np.float32)}
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             h.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             h.make_node("DequantizeLinear", ["w", "ws"], ["wd"], axis=1),
             h.make_node("MatMul", ["xd", "wd"], ["m"]),
             h.make_node("Add", ["m", "b"], ["a"]),
             h.make_node("Tanh", ["a"], ["y"])]
    x = RNG.uniform(-3, 3, (1, 6, k)).astype(np.float32)
    m = model(nodes, inits, x.shape, opset=13)
    _, g = folded(m)
    gemm = [op for op in g.ops if op.kind == "QLinearGemm"]
    assert len(gemm) == 1 and gemm[0].result.dtype == "float32" and gemm[0].attrs["multiplier"] == []
    assert g.meta["quant"]["layers"][gemm[0].name]["output"] == {"dtype": "float32"}
    (ref,) = ort_plain(m, {"x": x})
    (got,) = reference.run(g, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-6)
