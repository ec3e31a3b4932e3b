"""export_qdq: the quantized IR as standard QDQ ONNX that onnxruntime runs (and fuses into its own
integer kernels), agreeing with the reference interpreter."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from qcompiler.ir import parse_graph
from qcompiler.passes import PassContext, PassManager
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import reference
from qcompiler.frontend.qdq_export import export_qdq, to_qdq_graph

from test_quantize import CONCAT, NET, RANGES


def quantized(text, ranges):
    g = parse_graph(text)
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(ranges=ranges)})).run(g)
    return g


@pytest.fixture(scope="module")
def net():
    g = quantized(NET, RANGES)
    return g, export_qdq(g)


def test_standard_onnx_with_integer_initializers(net):
    g, m = net
    onnx.checker.check_model(m, full_check=True)
    assert m.opset_import[0].domain == "" and m.opset_import[0].version >= 13
    assert {n.op_type for n in m.graph.node} <= {"QuantizeLinear", "DequantizeLinear", "Conv", "Relu", "Add",
                                                  "GlobalAveragePool", "Flatten", "Gemm", "Softmax"}
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    assert inits["w_q"].dtype == np.int8 and inits["b_q"].dtype == np.int32 and inits["fw_q"].shape == (3, 2)
    dq_w = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == "w_q")
    assert [a.i for a in dq_w.attribute if a.name == "axis"] == [0]
    assert inits[dq_w.input[1]].shape == (2,) and inits[dq_w.input[2]].dtype == np.int8


def test_quantized_values_keep_their_names_and_each_use_gets_a_dq(net):
    g, m = net
    produced = {o for n in m.graph.node for o in n.output}
    for v in g.values():
        if v.type.quant is not None and not v.is_const:
            assert v.name in produced
    # %x_q feeds the conv and the residual add: two DequantizeLinear nodes
    assert sum(n.op_type == "DequantizeLinear" and n.input[0] == "x_q" for n in m.graph.node) == 2
    qg = to_qdq_graph(g)
    assert not [op for op in qg.ops if op.kind.startswith("QLinear")]
    qg.verify()


def test_onnxruntime_fuses_and_agrees_with_the_reference(net, tmp_path):
    """With uint8 weights (ORT's exact U8U8 kernels): with the int8 ones ORT's AVX2 kernel on a CPU
    without VNNI saturates (measured 2 LSB off on one value of %y on a Zen 3)."""
    g, _ = net
    m = export_qdq(g, uint8_weights=True)
    so = ort.SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    fused = {n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node}
    assert "QLinearConv" in fused                       # ORT recognized DQ -> Conv -> Q
    rng = np.random.default_rng(0)
    names = [v.name for v in g.values() if v.type.quant is not None and not v.is_const]
    from realmodels import with_outputs
    sess = ort.InferenceSession(with_outputs(m, names).SerializeToString(), providers=["CPUExecutionProvider"])
    for _ in range(4):
        x = rng.uniform(-1, 1, (1, 2, 3, 3)).astype(np.float32)
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
        want = reference.run_values(g, {"x": x})
        for n in names:
            assert np.abs(got[n].astype(int) - want[n].astype(int)).max() <= 1, n
        assert max(reference.layer_diffs(g, got).values()) <= 1


def test_concat_and_requantize_export_runs():
    g = quantized(CONCAT, {"x": (-1, 1), "a": (-1, 1), "b": (-0.5, 0.5), "s": (0, 1), "c": (-1, 2)})
    m = export_qdq(g)
    onnx.checker.check_model(m)
    x = np.random.default_rng(2).uniform(-1, 1, (1, 2, 2, 2)).astype(np.float32)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    want = reference.run(g, {"x": x})[0]
    assert np.abs(got - want).max() <= g.find_ops("Concat")[0].result.type.quant.scale[0] * 1.001


MISC = """graph @g(%x: tensor<1x2x6x6xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 2.0]> : tensor<2x2x1x1xf32>
  %y = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x6x6xf32>
  %p = Pad(%y) {mode = "constant", pads = [0, 0, 1, 1, 0, 0, 1, 1], value = 0.0} : tensor<1x2x8x8xf32>
  %a = AveragePool(%p) {ceil_mode = 0, count_include_pad = 1, kernel_shape = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : tensor<1x2x4x4xf32>
  %c = Clip(%a) {max = 0.5, min = -0.25} : tensor<1x2x4x4xf32>
  %t = Transpose(%c) {perm = [0, 1, 3, 2]} : tensor<1x2x4x4xf32>
  %m = GlobalMaxPool(%t) : tensor<1x2x1x1xf32>
  %i = const dense<[1.0, 0.0, 0.0, 1.0]> : tensor<2x2x1x1xf32>
  %o = Conv(%m, %i) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x1x1xf32>
  return %o
}"""


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_pad_avgpool_clip_transpose_globalmaxpool(dtype):
    g = parse_graph(MISC)
    opts = QuantizeOptions(ranges={"x": (-1, 1), "y": (-2, 2), "a": (-1, 1)}, activation_dtype=dtype)
    PassManager("quantize", ctx=PassContext(options={"quantize": opts})).run(g)
    assert [op.kind for op in g.ops] == ["QuantizeLinear", "QLinearConv", "Pad", "QLinearAveragePool", "Clip",
                                         "Transpose", "GlobalMaxPool", "QLinearConv"]     # (a float32 result)
    m = export_qdq(g, uint8_weights=True)             # int8 weights: 10 LSB off on a Zen 3 (saturation)
    onnx.checker.check_model(m)
    rng = np.random.default_rng(5)
    from realmodels import with_outputs
    names = [v.name for v in g.values() if v.type.quant is not None and not v.is_const]
    sess = ort.InferenceSession(with_outputs(m, names).SerializeToString(), providers=["CPUExecutionProvider"])
    fl = parse_graph(MISC)
    for _ in range(3):
        x = rng.uniform(-1, 1, (1, 2, 6, 6)).astype(np.float32)
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, {"x": x})))
        assert max(reference.layer_diffs(g, got).values()) <= 1
        want = reference.run(fl, {"x": x})[0]
        assert np.abs(reference.run(g, {"x": x})[0] - want).max() <= 0.03


def test_save_qdq(net, tmp_path):
    from qcompiler.frontend.qdq_export import save_qdq
    g, m = net
    save_qdq(g, tmp_path / "m.int8.onnx")
    assert onnx.load(tmp_path / "m.int8.onnx").graph.node[0].op_type == m.graph.node[0].op_type


def test_symmetric_int8_activations_and_float_bias_for_tensorrt():
    """TensorRT's explicit quantization: int8 with zero point 0 everywhere, float biases."""
    g = parse_graph(NET)
    opts = QuantizeOptions(ranges=RANGES, activation_dtype="int8", symmetric_activations=True)
    PassManager("quantize", ctx=PassContext(options={"quantize": opts})).run(g)
    qps = [v.type.quant for v in g.values() if v.type.quant is not None]
    assert all(z == 0 for qp in qps for z in qp.zero_point)
    m = export_qdq(g, float_bias=True)
    onnx.checker.check_model(m)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    assert inits["b_q_float"].dtype == np.float32 and "b_q" not in inits
    assert not any(n.op_type == "DequantizeLinear" and n.input[0] == "b_q" for n in m.graph.node)
    x = np.random.default_rng(3).uniform(-1, 1, (1, 2, 3, 3)).astype(np.float32)
    got = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, reference.run(g, {"x": x})[0], atol=0.03)
    with pytest.raises(Exception, match="symmetric activations need activation_dtype int8"):
        QuantizeOptions(symmetric_activations=True)


SATURATING = """graph @g(%x: tensor<1x8x2x2xf32>) {
  %w = const dense<[1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0, 0.5, 1.0]> : tensor<4x8x1x1xf32>
  %y = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x2x2xf32>
  %i = const dense<[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0]> : tensor<4x4x1x1xf32>
  %o = Conv(%y, %i) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x2x2xf32>
  return %o
}"""


def test_uint8_weights_give_the_same_reals_and_ort_computes_them_exactly():
    """x = 1 (stored 255) times weights +-1 (stored +-127): every pair of u8*s8 products is
    2*255*127 = 64770, past int16, where ORT's U8S8 AVX2 kernel (vpmaddubsw, CPUs without VNNI)
    saturates. Written as uint8 w + 128 (zero point 128) the weights dequantize to the same
    reals, ORT still fuses DQ -> Conv -> Q into its QLinearConv, and its result equals the
    reference interpreter's within 1 LSB on any CPU. (An identity conv reads the conv's result:
    without an integer reader it would return float32, with no Q for ORT to fuse.)"""
    g = quantized(SATURATING, {"x": (0, 1), "y": (-9, 9)})
    m = export_qdq(g, uint8_weights=True)
    onnx.checker.check_model(m, full_check=True)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    plain = {t.name: numpy_helper.to_array(t) for t in export_qdq(g).graph.initializer}
    (wn,) = [n for n, a in inits.items() if a.dtype == np.uint8 and a.shape == (4, 8, 1, 1)]
    dq = next(n for n in m.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == wn)
    (pn,) = [n for n, a in plain.items() if a.dtype == np.int8 and a.shape == (4, 8, 1, 1)]
    pdq = next(n for n in export_qdq(g).graph.node if n.op_type == "DequantizeLinear" and n.input[0] == pn)

    def real(arrs, node):
        q, s, z = (arrs[i] for i in node.input)
        return (q.astype(np.int64) - z.reshape(-1, 1, 1, 1)) * s.reshape(-1, 1, 1, 1)
    np.testing.assert_array_equal(real(inits, dq), real(plain, pdq))
    assert np.abs(plain[pn]).max() == 127
    so = ort.SessionOptions()
    so.log_severity_level = 3
    import tempfile, os
    with tempfile.TemporaryDirectory() as tmp:
        so.optimized_model_filepath = os.path.join(tmp, "opt.onnx")
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        assert "QLinearConv" in {n.op_type for n in onnx.load(so.optimized_model_filepath).graph.node}
    x = np.ones((1, 8, 2, 2), np.float32)
    got = sess.run(None, {"x": x})[0]
    want = reference.run(g, {"x": x})[0]
    step = g.outputs[0].producer.operands[0].type.quant.scale[0] if g.outputs[0].type.quant is None else 1
    assert np.abs(got - want).max() <= 1.01 * step, (got.ravel(), want.ravel())
