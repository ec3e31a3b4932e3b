"""ONNX Runtime's weight-only 4-bit operators (com.microsoft MatMulNBits, GatherBlockQuantized) in
and out of the IR: a small float model quantized by ONNX Runtime's own ``MatMulNBitsQuantizer``
imports into MatMulNBits / GatherBlockQuantized with its integers and scales, the reference runs
it as ONNX Runtime does (float32 summation order apart), and our ``quantize-weights`` graphs export
as those operators, run by ONNX Runtime, and import back to the same weights."""
from __future__ import annotations

import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from qcompiler.errors import UserError
from qcompiler.frontend.onnx_export import export_onnx
from qcompiler.frontend.onnx_import import import_onnx
from qcompiler.ir.types import dequantize
from qcompiler.passes import PassContext, PassManager
from qcompiler.passes.quantize_weights import QuantizeWeightsOptions
from qcompiler.quant import reference

K, N, V = 96, 40, 50


def float_model(seed: int = 0) -> onnx.ModelProto:
    """ids [2, 3] -> Gather of an embedding table [V, K] -> MatMul by [K, N] -> Add bias."""
    rng = np.random.default_rng(seed)
    inits = [onnx.numpy_helper.from_array((rng.standard_normal((V, K)) * 0.1).astype(np.float32), "table"),
             onnx.numpy_helper.from_array((rng.standard_normal((K, N)) * 0.1).astype(np.float32), "w"),
             onnx.numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b")]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="emb"),
             helper.make_node("MatMul", ["e", "w"], ["y0"], name="fc"),
             helper.make_node("Add", ["y0", "b"], ["y"], name="bias")]
    g = helper.make_graph(nodes, "nbits", [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, N])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def ort_4bit(model: onnx.ModelProto, block: int, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    ops = ("MatMul", "Gather")
    q = MatMulNBitsQuantizer(model, block_size=block, is_symmetric=symmetric, op_types_to_quantize=ops,
                             algo_config=DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=symmetric,
                                                                      op_types_to_quantize=ops))
    q.process()
    return q.model.model


def ort_run(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def _bound(x: np.ndarray, w_abs: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """The float32 rounding of a K-term sum in another order: K 2^-24 Σ|x ŵ| + 2^-24 |ref|."""
    return K * 2.0 ** -24 * (np.abs(x.astype(np.float64)) @ w_abs.T) + 2.0 ** -24 * np.abs(ref)


IDS = {"ids": np.array([[0, 49, 7], [3, 3, 21]], np.int64)}


@pytest.mark.parametrize("block,symmetric", [(32, False), (32, True), (16, False), (128, True)])
def test_ort_quantized_model_imports_and_matches_ort(block, symmetric):
    m4 = ort_4bit(float_model(), block, symmetric)
    assert {n.op_type for n in m4.graph.node} >= {"MatMulNBits", "GatherBlockQuantized"}
    g = import_onnx(m4)
    kinds = [op.kind for op in g.ops]
    assert kinds == ["GatherBlockQuantized", "MatMulNBits", "Add"], kinds
    w = g.ops[1].operands[1]
    qp = w.type.quant
    assert qp.block_size == block and qp.axis == 1 and w.shape == (N, K)
    assert qp.storage == ("int4" if symmetric else "uint4")
    e = reference.run_values(g, IDS)
    want_y = ort_run(m4, IDS)
    wd = dequantize(w.data, qp)
    assert np.all(np.abs(e["y"] - want_y) <= _bound(e["e"], np.abs(wd), want_y) + 2.0 ** -23 * np.abs(want_y))
    # the float weights within a step of ORT's own dequantization: the same integers and scales
    wf = onnx.numpy_helper.to_array(float_model().graph.initializer[1]).T
    s, _ = qp.element_params(wd.shape)
    assert np.all(np.abs(wd - wf) <= np.abs(s) * (1 + 1e-6))


@pytest.mark.parametrize("scale_dtype", ["float32", "float16"])
@pytest.mark.parametrize("symmetric", [False, True])
def test_our_4bit_graph_exports_runs_in_ort_and_imports_back(symmetric, scale_dtype):
    g = import_onnx(float_model())
    ctx = PassContext(options={"quantize-weights": QuantizeWeightsOptions(
        block_size=32, symmetric=symmetric, scale_dtype=scale_dtype)})
    PassManager("quantize-weights", ctx=ctx).run(g)
    assert [op.kind for op in g.ops] == ["GatherBlockQuantized", "MatMulNBits", "Add"]
    model = export_onnx(g)
    assert {(n.op_type, n.domain) for n in model.graph.node} >= {("MatMulNBits", "com.microsoft"),
                                                                  ("GatherBlockQuantized", "com.microsoft")}
    vals = reference.run_values(g, IDS)
    got = ort_run(model, IDS)
    w = g.ops[1].operands[1]
    wd = dequantize(w.data, w.type.quant)
    assert np.all(np.abs(got - vals["y"]) <= _bound(vals["e"], np.abs(wd), vals["y"]) + 2.0 ** -23 * np.abs(got))
    back = import_onnx(model)
    for a, b in zip((op for op in g.ops if op.kind != "Add"), (op for op in back.ops if op.kind != "Add")):
        wa, wb = a.operands[0 if a.kind == "GatherBlockQuantized" else 1], b.operands[0 if b.kind == "GatherBlockQuantized" else 1]
        assert np.array_equal(dequantize(wa.data, wa.type.quant), dequantize(wb.data, wb.type.quant)), a.kind


def _nbits_node(**attrs) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inputs = ["x", "B", "s"]
    inits = [onnx.numpy_helper.from_array(rng.integers(0, 256, (4, 1, 8)).astype(np.uint8), "B"),
             onnx.numpy_helper.from_array(np.full(4, 0.1, np.float32), "s")]
    if attrs.pop("g_idx", False):
        inputs += ["", "g"]
        inits.append(onnx.numpy_helper.from_array(np.zeros(16, np.int32), "g"))
    n = helper.make_node("MatMulNBits", inputs, ["y"], domain="com.microsoft", K=16, N=4, block_size=16,
                         **{"bits": 4, **attrs})
    g = helper.make_graph([n], "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


@pytest.mark.parametrize("attrs,msg", [({"bits": 8}, "8-bit weights"), ({"g_idx": True}, "g_idx")])
def test_refusals(attrs, msg):
    with pytest.raises(UserError, match=msg):
        import_onnx(_nbits_node(**attrs))


def test_opset21_blocked_dequantize_linear_matmul_imports_as_matmul_nbits():
    """ONNX Runtime's quantizer in QDQ format writes DequantizeLinear(INT4/UINT4 B [K, N], axis 0,
    block_size) -> MatMul: imported as MatMulNBits (B transposed), the model a float one (not
    pre-quantized). ORT itself fuses that pair into MatMulNBits with int8 activations (accuracy level
    4: 5.5e-4 of max|y| here), so the reference is checked against ORT without graph optimizations."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer
    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.ERROR)
    for sym in (False, True):
        cfg = DefaultWeightOnlyQuantConfig(block_size=32, is_symmetric=sym, quant_format=QuantFormat.QDQ,
                                           op_types_to_quantize=("MatMul",))
        q = MatMulNBitsQuantizer(float_model(), block_size=32, is_symmetric=sym, quant_format=QuantFormat.QDQ,
                                 op_types_to_quantize=("MatMul",), algo_config=cfg)
        q.process()
        m = q.model.model
        assert [n.op_type for n in m.graph.node] == ["Gather", "DequantizeLinear", "MatMul", "Add"]
        g = import_onnx(m)
        assert "MatMulNBits" in [op.kind for op in g.ops] and not g.meta.get("prequantized")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        want = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, IDS)[0]
        vals = reference.run_values(g, IDS)
        w = next(op for op in g.ops if op.kind == "MatMulNBits").operands[1]
        wd = dequantize(w.data, w.type.quant)
        assert w.shape == (N, K) and w.type.quant.axis == 1
        assert np.all(np.abs(vals["y"] - want) <= _bound(vals["e"], np.abs(wd), want) + 2.0 ** -23 * np.abs(want))


def test_conv_nbits_exports_as_blocked_dequantize_linear_and_back():
    """ConvNBits -> opset 21 DequantizeLinear(INT4/UINT4, axis 1, block_size) -> Conv: ONNX Runtime runs
    it as the reference does; imported back, the same ConvNBits weight."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
    from test_x86_nbits import conv_graph
    from qcompiler.ir.windows import conv_sum
    for storage, sd in (("uint4", "float32"), ("int4", "float16")):
        g, feeds = conv_graph(32, 24, 3, pad=1, blk=16, storage=storage, scale_dtype=sd, seed=4)
        model = export_onnx(g)
        assert [n.op_type for n in model.graph.node] == ["DequantizeLinear", "Conv", "Relu"]
        got, ref = ort_run(model, feeds), reference.run(g, feeds)[0]
        op = g.ops[0]
        w = op.operands[1]
        wd = dequantize(w.data, w.type.quant)
        mag = conv_sum(np.abs(feeds["x"]), np.abs(wd), dict(op.attrs), ref.shape[2:])
        assert np.all(np.abs(got - ref) <= 288 * 2.0 ** -24 * mag + 2.0 ** -23 * np.abs(ref))
        back = import_onnx(model)
        w2 = next(o for o in back.ops if o.kind == "ConvNBits").operands[1]
        assert np.array_equal(dequantize(w2.data, w2.type.quant), wd) and not back.meta.get("prequantized")


def test_gather_block_quantized_without_zero_points_is_zero_point_0():
    """ONNX Runtime reads a UINT4 GatherBlockQuantized table without zero points as zero point 0
    (not MatMulNBits' 8): the import follows it."""
    q = (np.arange(32).reshape(2, 16) * 7) % 16
    packed = (q.reshape(-1)[0::2] | (q.reshape(-1)[1::2] << 4)).astype(np.uint8)
    data = helper.make_tensor("t", TensorProto.UINT4, [2, 16], packed.tobytes(), raw=True)
    sc = onnx.numpy_helper.from_array(np.array([[0.5], [0.25]], np.float32), "s")
    n = helper.make_node("GatherBlockQuantized", ["t", "i", "s"], ["y"], domain="com.microsoft", block_size=16,
                         gather_axis=0, quantize_axis=1, bits=4)
    g = helper.make_graph([n], "g", [helper.make_tensor_value_info("i", TensorProto.INT64, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 16])], [data, sc])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 10
    feeds = {"i": np.array([1, 0, 1])}
    assert np.array_equal(reference.run(import_onnx(m), feeds)[0], ort_run(m, feeds))
