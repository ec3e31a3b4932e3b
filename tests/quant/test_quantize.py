"""quantize: IR text in -> quantized IR text out (ranges given, so the text is deterministic), the
structural rules (prepare, fold, concat, keep-float), the verifier's messages for quantized ops,
and numerics of the reference interpreter against float and against onnxruntime on the QDQ export."""
import importlib
import json
import re
import textwrap
import warnings

import numpy as np
import pytest

from qcompiler.errors import UserError
from qcompiler.ir import IRError, parse_graph, print_graph
from qcompiler.passes import DEFAULT_PIPELINE, PassContext, PassManager, parse_pipeline
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import reference, sqnr_db
from qcompiler.frontend.qdq_export import export_qdq


def quantize(text, **opts):
    g = parse_graph(text) if isinstance(text, str) else text
    g.verify()
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(**opts)})).run(g)
    return g


def assert_ir(g, expected: str) -> None:
    want = print_graph(parse_graph(expected), locs=False)
    got = print_graph(g, locs=False)
    assert got == want, f"got:\n{got}\nexpected:\n{want}"


def kinds(g):
    return [op.kind for op in g.ops]


T = "tensor<1x2x3x3xf32>"
NET = f"""graph @g(%x: {T}) {{
  %w = const dense<[0.5, -1.0, 0.25, 2.0]> : tensor<2x2x1x1xf32>
  %b = const dense<[0.5, -0.25]> : tensor<2xf32>
  %y = FusedConv(%x, %w, %b) {{activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]}} : {T} loc("conv")
  %s = Add(%y, %x) : {T} loc("add")
  %r = Relu(%s) : {T} loc("relu")
  %p = GlobalAveragePool(%r) : tensor<1x2x1x1xf32> loc("gap")
  %f = Flatten(%p) {{axis = 1}} : tensor<1x2xf32> loc("flatten")
  %fw = const dense<[1.0, -0.5, 0.25, 0.75, 0.5, -2.0]> : tensor<2x3xf32>
  %fb = const dense<[0.1, 0.2, 0.3]> : tensor<3xf32>
  %o = Gemm(%f, %fw, %fb) {{alpha = 1.0, beta = 1.0, transA = 0, transB = 0}} : tensor<1x3xf32> loc("fc")
  %sm = Softmax(%o) {{axis = 1}} : tensor<1x3xf32> loc("softmax")
  return %sm
}}"""
RANGES = {"x": (-1.0, 1.0), "y": (0.0, 4.0), "r": (0.0, 5.0), "p": (0.0, 2.0), "o": (-3.0, 3.0)}


def test_golden_conv_residual_pool_gemm():
    """Conv+Relu -> QLinearConv; Add+Relu -> QLinearAdd (Relu folded); GAP -> integer pool;
    Flatten keeps params; Gemm (transB = 0) -> QLinearGemm with W stored N x K and, as only the float
    Softmax reads it, a float32 result (no output quantization); Softmax stays float.
    Checked by hand: x [-1, 1] -> 2/255 @ 127 (float32 2/255 rounds up: the ideal zero point is 127.4999);
    w[0] = [0.5, -1] / (1/127) = [63.4999 -> 63, -127]; b[0] = 0.5 / (s_x s_w0) = 8096;
    M_conv[0] = s_x s_w0 / s_y = 0.0039370 = 1082196608 * 2^-38; Add: M = [0.8, 0.4] * 2^31."""
    g = quantize(NET, ranges=RANGES)
    assert_ir(g, f"""graph @g(%x: {T}) {{
  %w_q = const dense<[63, -127, 16, 127]> : tensor<2x2x1x1x!quant.uniform<i8:f32:0, {{0.007874017:0, 0.015748033:0}}>>
  %b_q = const dense<[8096, -2024]> : tensor<2x!quant.uniform<i32:f32:0, {{6.1757e-05:0, 0.000123514:0}}>>
  %fw_q = const dense<[127, 95, -127, 127, 16, -127]> : tensor<3x2x!quant.uniform<i8:f32:0, {{0.007874017:0, 0.0039370083:0, 0.015748033:0}}>>
  %fb_q = const dense<[1619, 6477, 2429]> : tensor<3x!quant.uniform<i32:f32:0, {{6.1757e-05:0, 3.08785e-05:0, 0.000123514:0}}>>
  %x_q = QuantizeLinear(%x) : tensor<1x2x3x3x!quant.uniform<u8:f32, 0.007843138:127>>
  %y = QLinearConv(%x_q, %w_q, %b_q) {{activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, multiplier = [1082196608, 1082196608], pads = [0, 0, 0, 0], shift = [38, 37], strides = [1, 1]}} : tensor<1x2x3x3x!quant.uniform<u8:f32, 0.015686275:0>>
  %r = QLinearAdd(%y, %x_q) {{activation = "Relu", activation_params = [], multiplier = [1717986959, 858993480], shift = [31]}} : tensor<1x2x3x3x!quant.uniform<u8:f32, 0.019607844:0>>
  %p = QLinearGlobalAveragePool(%r) {{multiplier = [1193046443], shift = [32]}} : tensor<1x2x1x1x!quant.uniform<u8:f32, 0.007843138:0>>
  %f = Flatten(%p) {{axis = 1}} : tensor<1x2x!quant.uniform<u8:f32, 0.007843138:0>>
  %o = QLinearGemm(%f, %fw_q, %fb_q) {{activation = "", activation_params = [], multiplier = [], shift = []}} : tensor<1x3xf32>
  %sm = Softmax(%o) {{axis = 1}} : tensor<1x3xf32>
  return %sm
}}""")
    assert [op.name for op in g.ops if op.kind.startswith("QLinear")] == ["conv", "add", "gap", "fc"]  # names kept
    meta = g.meta["quant"]
    json.dumps(meta)                                                  # JSON-serializable for the report
    assert meta["layers"]["conv"]["kind"] == "QLinearConv" and meta["layers"]["conv"]["range"] == [0.0, 4.0]
    assert meta["layers"]["softmax"] == {"kind": "Softmax", "precision": "float", "reason": "float region"}
    assert meta["layers"]["fc"]["output"] == {"dtype": "float32"}
    assert meta["scheme"]["calibration"] == "given ranges"


def test_docstring_example():
    doc = importlib.import_module("qcompiler.passes.quantize").__doc__

    def block(label):
        m = re.search(re.escape(label) + r".*::\n\n((?:    .*\n|\n)+?)(?:\n\S|\Z)", doc + "\n")
        return textwrap.dedent(m.group(1))
    assert_ir(quantize(block("Before"), ranges={"x": (-1, 1), "y": (0, 3)}), block("After"))


def test_text_round_trip_and_not_in_default_pipeline():
    g = quantize(NET, ranges=RANGES)
    text = print_graph(g)
    again = parse_graph(text)
    again.verify()
    assert print_graph(again) == text                      # quantized constants parse back with their types
    assert "quantize" not in DEFAULT_PIPELINE and "quantize" in parse_pipeline("default,quantize")
    # a second run leaves a quantized graph alone
    quantize(again, ranges=RANGES)
    assert print_graph(again) == text


def test_reference_close_to_float_and_equal_to_onnxruntime_qdq():
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (8, 2, 3, 3)).astype(np.float32)
    fl = parse_graph(NET)
    calib = [{"x": x[i:i + 1]} for i in range(8)]
    q = quantize(NET, calib=calib)
    want = reference.run(fl, {"x": x})[0]
    got = reference.run(q, {"x": x})[0]
    assert sqnr_db(want, got) > 30
    import onnxruntime as ort
    sess = ort.InferenceSession(export_qdq(q, uint8_weights=True).SerializeToString(), providers=["CPUExecutionProvider"])
    ort_out = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(8)])
    assert np.abs(ort_out - got).max() <= 0.03 * 1.01          # within 1 LSB of the logits, after Softmax


SE = """graph @g(%x: tensor<1x2x3x4xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 2.0]> : tensor<2x2x1x1xf32>
  %y = FusedConv(%x, %w) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x3x4xf32> loc("conv")
  %p = GlobalAveragePool(%y) : tensor<1x2x1x1xf32> loc("gap")
  %g = HardSigmoid(%p) {alpha = 0.2, beta = 0.5} : tensor<1x2x1x1xf32> loc("gate")
  %m = Mul(%y, %g) : tensor<1x2x3x4xf32> loc("se")
  %k = const dense<[0.5, -2.0]> : tensor<1x2x1x1xf32>
  %c = Mul(%m, %k) : tensor<1x2x3x4xf32> loc("scale")
  %q = GlobalAveragePool(%m) : tensor<1x2x1x1xf32> loc("gap2")
  %w2 = const dense<[1.0, 0.5]> : tensor<1x2x1x1xf32>
  %h = Conv(%q, %w2) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x1x1xf32> loc("head")
  return %c, %h
}"""


def test_squeeze_excite_mul_becomes_qlinearmul():
    """Mul(x, HardSigmoid gate) -> QLinearMul: the float gate gets a QuantizeLinear (its range
    [0.5, 0.7], widened to hold 0: 0.7/255 @ 0); M = s_y s_g / s_m = s_g (s_y = s_m = 4/255),
    formed from the float32 scales: 0.7/255 = 1509133568 * 2^-39 (vs 1509133607 from the float64 0.7/255).
    A Mul by a constant stays float (a second pool reads the product in integers, and a conv head the
    pool: without an integer reader the product would stay float too). The gate's pool stays integer:
    Q(HardSigmoid(DQ(p))) is a table on its stored values. Text round trip, the oracle against float
    (within 1 LSB of the output plus the gate's half step times |y|), and onnxruntime on the QDQ
    export (within 1 LSB)."""
    ranges = {"x": (-1.0, 1.0), "y": (0.0, 4.0), "p": (0.0, 2.0), "g": (0.5, 0.7), "m": (0.0, 4.0), "q": (0.0, 4.0)}
    g = quantize(SE, ranges=ranges)
    assert kinds(g) == ["QuantizeLinear", "QLinearConv", "QLinearGlobalAveragePool", "DequantizeLinear",
                        "HardSigmoid", "QuantizeLinear", "QLinearMul", "DequantizeLinear", "Mul",
                        "QLinearGlobalAveragePool", "QLinearConv"]
    mul = g.find_ops("QLinearMul")[0]
    assert mul.name == "se" and [v.name for v in mul.operands] == ["y", "g_q"]
    gq = mul.operands[1].type.quant
    assert gq.zero_point == (0,) and gq.scale[0] == pytest.approx(0.7 / 255)   # asymmetric range keeps 0
    assert mul.attrs["multiplier"] == [1509133568] and mul.attrs["shift"] == [39]
    sy = float(np.float32(4 / 255))
    assert mul.attrs["multiplier"][0] == round(sy * float(np.float32(gq.scale[0])) / sy * 2 ** 39)
    assert g.meta["quant"]["layers"]["se"]["kind"] == "QLinearMul"
    assert g.meta["quant"]["layers"]["scale"]["precision"] == "float"
    text = print_graph(g)
    again = parse_graph(text)
    again.verify()
    assert print_graph(again) == text
    rng = np.random.default_rng(3)
    x = rng.uniform(-1, 1, (6, 2, 3, 4)).astype(np.float32)
    want = reference.run(parse_graph(SE), {"x": x})[0]
    got = reference.run(g, {"x": x})[0]
    sm = mul.result.type.quant.scale[0]
    assert np.abs(got - want).max() <= 2 * (sm + 4 * gq.scale[0] / 2)        # |k| <= 2
    import onnxruntime as ort
    sess = ort.InferenceSession(export_qdq(g, uint8_weights=True).SerializeToString(), providers=["CPUExecutionProvider"])
    ort_out = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(6)])
    assert np.abs(ort_out - got).max() <= 2 * sm * 1.01


PRELU = """graph @g(%x: tensor<1x2x4x4xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 2.0]> : tensor<2x2x1x1xf32>
  %b = const dense<[0.1, -0.2]> : tensor<2xf32>
  %y = Conv(%x, %w, %b) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32> loc("conv")
  %a = const dense<[0.25, 0.125]> : tensor<2x1x1xf32>
  %p = PRelu(%y, %a) : tensor<1x2x4x4xf32> loc("prelu")
  %w2 = const dense<[1.0, 0.5, -0.5, 0.25]> : tensor<2x2x1x1xf32>
  %o = Conv(%p, %w2) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32> loc("conv2")
  return %o
}"""


def test_conv_read_only_by_a_float_prelu_returns_float32():
    """A conv that only a float op (PRelu) reads returns f32(acc) s_x s_w[c] (``multiplier = []``):
    one rounding, on the grid of the PRelu's output (which conv2 reads), and none on a grid of the
    conv's own output, whose negative side PRelu shrinks by its slope (no range of %y is asked
    for: there is no calibration data, and no warning). conv2 is the graph output: float32 too.
    Against float: within conv2's gain times half of p's step plus x's rounding through both
    convs; against ONNX Runtime running the QDQ export: within float32 rounding, or a flipped
    rounding of p (one step times conv2's gain)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        g = quantize(PRELU, ranges={"x": (-1, 1), "p": (-0.5, 2.5)})
    assert_ir(g, """graph @g(%x: tensor<1x2x4x4xf32>) {
  %a = const dense<[0.25, 0.125]> : tensor<2x1x1xf32>
  %w_q = const dense<[63, -127, 16, 127]> : tensor<2x2x1x1x!quant.uniform<i8:f32:0, {0.007874017:0, 0.015748033:0}>>
  %b_q = const dense<[1619, -1619]> : tensor<2x!quant.uniform<i32:f32:0, {6.1757e-05:0, 0.000123514:0}>>
  %w2_q = const dense<[127, 63, -127, 63]> : tensor<2x2x1x1x!quant.uniform<i8:f32:0, {0.007874017:0, 0.0039370083:0}>>
  %x_q = QuantizeLinear(%x) : tensor<1x2x4x4x!quant.uniform<u8:f32, 0.007843138:127>>
  %y = QLinearConv(%x_q, %w_q, %b_q) {activation = "", activation_params = [], dilations = [1, 1], group = 1, multiplier = [], pads = [0, 0, 0, 0], shift = [], strides = [1, 1]} : tensor<1x2x4x4xf32>
  %p = PRelu(%y, %a) : tensor<1x2x4x4xf32>
  %p_q = QuantizeLinear(%p) : tensor<1x2x4x4x!quant.uniform<u8:f32, 0.011764706:42>>
  %o = QLinearConv(%p_q, %w2_q) {activation = "", activation_params = [], dilations = [1, 1], group = 1, multiplier = [], pads = [0, 0, 0, 0], shift = [], strides = [1, 1]} : tensor<1x2x4x4xf32>
  return %o
}""")
    assert g.meta["quant"]["layers"]["conv"]["output"] == {"dtype": "float32"}
    again = parse_graph(print_graph(g))
    again.verify()
    x = np.random.default_rng(5).uniform(-1, 1, (8, 2, 4, 4)).astype(np.float32)
    want = reference.run(parse_graph(PRELU), {"x": x})[0]
    got = reference.run(g, {"x": x})[0]
    gain = 1.5                                       # max row sum of |w2|
    s_x, s_p = 2 / 255, 3 / 255
    assert np.abs(got - want).max() <= gain * (s_p / 2 + 2.5 * s_x / 2 + 1e-4)   # |w| row sums <= 2.25
    import onnxruntime as ort
    sess = ort.InferenceSession(export_qdq(g, uint8_weights=True).SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = np.concatenate([sess.run(None, {"x": x[i:i + 1]})[0] for i in range(8)])
    d = np.abs(theirs - got)
    assert d.max() <= gain * s_p * 1.01 and np.mean(d <= 1e-5) >= 0.95


RESIDUAL = """graph @g(%x: tensor<1x2x4x4xf32>, %z: tensor<1x2x4x4xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 2.0]> : tensor<2x2x1x1xf32>
  %b = const dense<[0.5, -0.25]> : tensor<2xf32>
  %y = FusedConv(%x, %w, %b, %z) {activation = "HardSwish", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x4x4xf32> loc("conv")
  return %y
}"""


def test_prepare_splits_residual_and_float_activation():
    """FusedConv(X, W, B, Z){HardSwish} -> QLinearConv -> Add -> HardSwish (float): the residual
    Add, which only the float HardSwish reads, stays float, and so the conv, which only that Add
    reads, returns its float32 result (no quantization point without an integer reader)."""
    g = quantize(RESIDUAL, ranges={"x": (-1, 1), "z": (-2, 2), "y_acc": (-3, 3), "y_add": (-4, 4)})
    assert kinds(g) == ["QuantizeLinear", "QLinearConv", "Add", "HardSwish"]
    conv, add = g.find_ops("QLinearConv")[0], g.find_ops("Add")[0]
    assert conv.name == "conv" and conv.attrs["activation"] == "" and add.operands[0] is conv.result
    assert conv.result.type.quant is None and conv.attrs["multiplier"] == [] and conv.result.dtype == "float32"
    assert add.name == "conv_add" and g.meta["quant"]["layers"]["conv_add"]["reason"] == "its result feeds no integer op"
    assert g.outputs[0].name == "y" and g.outputs[0].producer.kind == "HardSwish"


def test_folded_clip_sets_the_clamp_and_unfoldable_relu_keeps_params():
    text = """graph @g(%x: tensor<1x4xf32>) {
  %w = const dense<0.5> : tensor<3x4xf32>
  %y = Gemm(%x, %w) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x3xf32>
  %c = Clip(%y) {max = 6.0, min = 0.0} : tensor<1x3xf32>
  %m = Reshape(%c) {shape = [3, 1]} : tensor<3x1xf32>
  %r = Relu(%m) : tensor<3x1xf32>
  %w2 = const dense<0.25> : tensor<2x1xf32>
  %o = Gemm(%r, %w2) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<3x2xf32>
  return %o
}"""
    g = quantize(text, ranges={"x": (-1, 1), "c": (0, 6)})
    assert kinds(g) == ["QuantizeLinear", "QLinearGemm", "Reshape", "Relu", "QLinearGemm"]
    gemm = g.find_ops("QLinearGemm")[0]
    assert (gemm.attrs["activation"], gemm.attrs["activation_params"]) == ("Clip", [0.0, 6.0])
    qp = gemm.result.type.quant
    assert g.find_ops("Relu")[0].result.type.quant == qp == g.find_ops("Reshape")[0].result.type.quant


CONCAT = """graph @g(%x: tensor<1x2x2x2xf32>) {
  %w = const dense<0.5> : tensor<2x2x1x1xf32>
  %a = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x2x2xf32>
  %b = Conv(%x, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x2x2x2xf32>
  %s = Sigmoid(%b) : tensor<1x2x2x2xf32>
  %c = Concat(%a, %s, %b) {axis = 1} : tensor<1x6x2x2xf32>
  %w3 = const dense<0.25> : tensor<1x6x1x1xf32>
  %o = Conv(%c, %w3) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x2x2xf32>
  return %o
}"""


def test_concat_inputs_share_the_output_params():
    """%a (used only by the concat) is emitted in the concat's params directly; the float %s is
    quantized straight into them; %b is also used by Sigmoid, so it keeps its params and is
    requantized. (A conv reads the concat: without an integer reader it would stay float.)"""
    g = quantize(CONCAT, ranges={"x": (-1, 1), "a": (-1, 1), "b": (-0.5, 0.5), "s": (0, 1), "c": (-1, 2)})
    cat = g.find_ops("Concat")[0]
    qp = cat.result.type.quant
    assert all(v.type.quant == qp for v in cat.operands)
    a, s, b = (v.producer for v in cat.operands)
    assert (a.kind, s.kind, b.kind) == ("QLinearConv", "QuantizeLinear", "Requantize")
    assert b.operands[0].type.quant != qp
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (1, 2, 2, 2)).astype(np.float32)
    want = reference.run(parse_graph(CONCAT), {"x": x})[0]
    assert sqnr_db(want, reference.run(g, {"x": x})[0]) > 30


def test_keep_float_by_name_and_kind():
    g = quantize(NET, ranges=RANGES, keep_float={"fc"})
    assert "QLinearGemm" not in kinds(g) and "Gemm" in kinds(g)
    assert g.meta["quant"]["layers"]["fc"]["reason"] == "kept float (keep_float)"
    g = quantize(NET, ranges={**RANGES, "f": (0, 2)}, keep_float={"FusedConv", "GlobalAveragePool"})
    assert "QLinearConv" not in kinds(g) and "QLinearGlobalAveragePool" not in kinds(g)
    assert "QLinearGemm" in kinds(g)


def test_per_tensor_weights_and_int8_activations():
    g = quantize(NET, ranges=RANGES, per_channel=False, activation_dtype="int8")
    conv = g.find_ops("QLinearConv")[0]
    w, b = conv.operands[1].type.quant, conv.operands[2].type.quant
    assert w.axis is None and b.axis is None and len(conv.attrs["multiplier"]) == 1
    assert conv.result.type.quant.storage == "int8" and conv.result.type.quant.zero_point == (-128,)
    assert g.meta["quant"]["scheme"]["weights"] == "int8 symmetric per tensor"


def test_matmul_and_bias_widening():
    """A channel whose bias is huge next to its weights would overflow int32: its weight scale
    widens so that |b_q| <= 2^30."""
    text = """graph @g(%x: tensor<2x3xf32>) {
  %w = const dense<[1.0, 1e-9, -1.0, 1e-9, 0.5, 1e-9]> : tensor<3x2xf32>
  %y = MatMul(%x, %w) : tensor<2x2xf32>
  %b = const dense<[0.5, 100.0]> : tensor<2xf32>
  %z = Add(%y, %b) : tensor<2x2xf32>
  return %z
}"""
    g = quantize(text, ranges={"x": (-1, 1), "y": (-3, 3), "z": (-3, 103)})
    gemm = g.find_ops("QLinearGemm")[0]
    assert gemm.operands[1].shape == (2, 3)                   # stored N x K
    g2 = quantize(text.replace("%y = MatMul(%x, %w)", "%y = Gemm(%x, %w, %b) {alpha = 1.0, beta = 1.0, transA = 0, transB = 0}")
                  .replace("  %b = const dense<[0.5, 100.0]> : tensor<2xf32>\n", "")
                  .replace("graph @g(%x: tensor<2x3xf32>) {\n", "graph @g(%x: tensor<2x3xf32>) {\n  %b = const dense<[0.5, 100.0]> : tensor<2xf32>\n")
                  .replace("  %z = Add(%y, %b) : tensor<2x2xf32>\n  return %z", "  return %y"),
                  ranges={"x": (-1, 1), "y": (-3, 103)})
    gemm = g2.find_ops("QLinearGemm")[0]
    bias = gemm.operands[2].data
    assert np.abs(bias).max() <= 2 ** 30
    assert g2.meta["quant"]["layers"][gemm.name]["bias_widened_channels"] == 1
    x = np.array([[0.5, -0.25, 1.0], [1.0, 1.0, -1.0]], np.float32)
    want = x @ np.array([[1.0, 1e-9], [-1.0, 1e-9], [0.5, 1e-9]], np.float32) + np.array([0.5, 100.0], np.float32)
    got = reference.run(g2, {"x": x})[0]
    assert np.abs(got - want).max() < 0.5


@pytest.mark.parametrize("method", ["percentile", "entropy", "mse"])
def test_calibration_methods(method):
    rng = np.random.default_rng(0)
    calib = [{"x": rng.uniform(-1, 1, (1, 2, 3, 3)).astype(np.float32)} for _ in range(8)]
    g = quantize(NET, calib=calib, method=method, percentile=99.0)
    assert g.meta["quant"]["scheme"]["method"] == method and g.meta["quant"]["scheme"]["calibration"] == "8 feeds"
    lo, hi = g.meta["quant"]["layers"]["conv"]["range"]
    assert 0.0 <= lo < hi


GEMM = """graph @g(%x: tensor<1x4xf32>) {
  %w = const dense<[0.5, -1.0, 0.3, 0.01, 1.0, 0.55, -0.45, 0.23]> : tensor<2x4xf32>
  %y = FusedGemm(%x, %w) {activation = "", activation_params = [], alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x2xf32> loc("fc")
  return %y
}"""


def test_bias_correction_removes_the_mean_weight_error():
    """Nagel et al. 2019 §5: b' = b - ε·E[x], ε = dequant(W_q) - W. Inputs with a large common mean
    (x in [2, 3]) make the shift from rounding the weights (ε up to half a step, 1/254) systematic."""
    rng = np.random.default_rng(0)
    xs = rng.uniform(2.0, 3.0, (64, 4)).astype(np.float32)
    calib = [{"x": xs[i:i + 1]} for i in range(64)]
    plain = quantize(GEMM, calib=calib, bias_correction=False)
    corr = quantize(GEMM, calib=calib)
    assert [v.name for v in plain.consts.values()] == ["w_q"]             # no bias without correction
    w = np.array([[0.5, -1.0, 0.3, 0.01], [1.0, 0.55, -0.45, 0.23]])
    wq = corr.value("w_q")
    eps = wq.data.astype(np.float64) * np.array(wq.type.quant.scale)[:, None] - w
    b = corr.value("fc_bias_q")
    want = np.rint(-(eps @ xs.astype(np.float64).mean(axis=0)) / np.array(b.type.quant.scale))
    assert b.data.tolist() == want.astype(int).tolist() and np.abs(want).max() >= 2
    assert corr.meta["quant"]["layers"]["fc"]["bias_correction"] == pytest.approx(np.abs(eps @ xs.mean(0)).max(), rel=1e-5)
    ref = xs.astype(np.float64) @ w.T
    err = {k: reference.run(g, {"x": xs})[0] - ref for k, g in (("plain", plain), ("corrected", corr))}
    assert np.abs(err["corrected"].mean(axis=0)).max() < np.abs(err["plain"].mean(axis=0)).max() / 2
    # no correction from random data or given ranges alone
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert "fc_bias_q" not in [v.name for v in quantize(GEMM, random_samples=4).consts.values()]


def test_calibration_without_data_warns_and_uses_random_inputs():
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        g = quantize(NET, ranges={"y": (0, 4)}, random_samples=4)
    assert any("no calibration data" in str(x.message) for x in w)
    assert g.meta["quant"]["scheme"]["calibration"] == "random (4 samples)"


def test_random_calibration_feeds_whole_batches_of_the_models_batch(tmp_path):
    """Random calibration on a batch-8 model: random feeds of the model's batch (they were batch 1,
    which a batch-8 graph cannot run: the ranges came out empty), rounded up to whole batches."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    from qcompiler.codegen.target import TargetSpec
    from qcompiler.driver import RANDOM, CalibOptions, CompileOptions, compile
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 3, 3, 3)).astype(np.float32), "w")
    g = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
                           helper.make_node("Relu", ["c"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 8, 16, 16])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "b8.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(str(tmp_path / "b8.onnx"), tmp_path / "out",
                CompileOptions(target=TargetSpec("x86", dtype="int8"), calib=CalibOptions(source=RANDOM, samples=12),
                               quiet=True))
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["calibration"]["source"] == "random" and rep["quantized_layers"] >= 2, rep


def test_bad_options():
    with pytest.raises(UserError, match="unknown method 'kl'"):
        QuantizeOptions(method="kl")
    with pytest.raises(UserError, match="activation_dtype"):
        QuantizeOptions(activation_dtype="int4")
    with pytest.raises(Exception, match="unknown option\\(s\\) methd"):
        PassManager("quantize", ctx=PassContext(options={"quantize": {"methd": "minmax"}})).run(parse_graph(NET))


# ---- the verifier on quantized ops ------------------------------------------------------------------
Q = "!quant.uniform<u8:f32, 0.1:128>"


@pytest.mark.parametrize("body, message", [
    ("%q = QuantizeLinear(%x) : tensor<4xf32>", "result %q must have a quantized type"),
    (f"%q = QuantizeLinear(%x) : tensor<4x{Q}>\n  %d = DequantizeLinear(%x) : tensor<4xf32>",
     "DequantizeLinear operand must have a quantized type"),
    (f"%q = QuantizeLinear(%x) : tensor<4x{Q}>\n  %a = QLinearAdd(%q, %q) {{multiplier = [1073741824], shift = [31]}} : tensor<4x{Q}>",
     "QLinearAdd takes multiplier \\[m_a, m_b\\] and one shared shift"),
    (f"%q = QuantizeLinear(%x) : tensor<4x{Q}>\n  %a = QLinearAdd(%q, %q) {{activation = \"Sigmoid\", multiplier = [1, 1], shift = [31]}} : tensor<4x{Q}>",
     "activation 'Sigmoid' cannot fold into the output clamp"),
    (f"%q = QuantizeLinear(%x) : tensor<4x{Q}>\n  %a = QLinearMul(%q, %q) {{multiplier = [1, 1], shift = [31]}} : tensor<4x{Q}>",
     "QLinearMul takes one multiplier and one shift"),
    (f"%q = QuantizeLinear(%x) : tensor<4x{Q}>\n  %a = Requantize(%q) {{multiplier = [1], shift = [64]}} : tensor<4x{Q}>",
     "shifts in \\[0, 63\\]"),
])
def test_verifier_messages(body, message):
    g = parse_graph(f"graph @g(%x: tensor<4xf32>) {{\n  {body}\n  return %x\n}}")
    with pytest.raises(IRError, match=message):
        g.verify()


def test_verifier_checks_conv_operands():
    base = """graph @g(%x: tensor<1x2x3x3x!quant.uniform<u8:f32, 0.5:128>>) {
  %w = const dense<1> : tensor<2x2x1x1x!quant.uniform<i8:f32:0, {0.25:0, 0.5:0}>>
  %b = const dense<1> : tensor<2x!quant.uniform<i32:f32:0, {BIAS}>>
  %y = QLinearConv(%x, %w, %b) {multiplier = [1073741824, 1073741824], shift = [31, 31]} : tensor<1x2x3x3x!quant.uniform<u8:f32, 1.0:0>>
  return %y
}"""
    parse_graph(base.replace("BIAS", "0.125:0, 0.25:0")).verify()
    with pytest.raises(IRError, match="bias scale must be input scale x weight scale"):
        parse_graph(base.replace("BIAS", "0.125:0, 0.5:0")).verify()
    with pytest.raises(IRError, match="weight must be quantized symmetrically"):
        parse_graph(base.replace("{0.25:0, 0.5:0}", "{0.25:1, 0.5:0}").replace("BIAS", "0.125:0, 0.25:0")).verify()
    with pytest.raises(IRError, match="3 multipliers / 3 shifts for 2 output channels"):
        parse_graph(base.replace("BIAS", "0.125:0, 0.25:0").replace("shift = [31, 31]", "shift = [31, 31, 31]")
                    .replace("multiplier = [1073741824, 1073741824]", "multiplier = [1073741824, 1073741824, 1]")).verify()


def test_bias_check_stops_once_the_sign_is_settled():
    """sign_settled: never before MIN_FEEDS feeds, always at the last; a consistent difference
    settles early, a noisy one around zero does not."""
    from qcompiler.passes.quantize_bias import MIN_FEEDS, sign_settled
    clear = [-1.0, -1.1, -0.9, -1.05, -0.95]
    assert not sign_settled(clear[:MIN_FEEDS - 1], 16)
    assert sign_settled(clear, 16)
    noisy = [1.0, -1.2, 0.9, -0.8, 1.1, -1.0]
    assert not sign_settled(noisy, 16)
    assert sign_settled(noisy, len(noisy))
    assert not sign_settled([0.0] * 8, 16)                  # identical variants: compare them all


LINEAR3 = """graph @g(%x: tensor<1x4x3xf32>) {
  %w = const dense<[0.5, -1.0, 0.25, 0.75, -0.5, 2.0]> : tensor<3x2xf32>
  %y = MatMul(%x, %w) : tensor<1x4x2xf32> loc("fc")
  %b = const dense<[0.5, -0.25]> : tensor<2xf32>
  %z = Add(%y, %b) : tensor<1x4x2xf32> loc("bias")
  %t = Tanh(%z) : tensor<1x4x2xf32> loc("tanh")
  return %t
}"""


def test_rank3_matmul_becomes_one_row_gemm_with_its_bias():
    """A transformer's linear layer, x (1, 4, 3) @ W (3, 2) + b: the 4 rows become one
    QLinearGemm between Reshapes, the bias Add absorbed into it, named as the MatMul; only the
    float Tanh reads it, so its result is float32; the reference and ONNX Runtime's run of the QDQ
    export agree to float32 rounding."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (8, 1, 4, 3)).astype(np.float32)
    q = quantize(LINEAR3, calib=[{"x": v} for v in x])
    assert kinds(q) == ["Reshape", "QuantizeLinear", "QLinearGemm", "Reshape", "Tanh"]    # float32 result
    gemm = q.find_ops("QLinearGemm")[0]
    assert gemm.name == "fc" and gemm.operands[0].shape == (4, 3) and gemm.operands[1].shape == (2, 3)
    assert len(gemm.operands) == 3 and gemm.operands[2].data.dtype == np.int32
    assert q.meta["quant"]["layers"]["fc"]["from"] == "Gemm"
    fl = parse_graph(LINEAR3)
    want = np.concatenate([reference.run(fl, {"x": v})[0] for v in x])
    got = np.concatenate([reference.run(q, {"x": v})[0] for v in x])
    assert sqnr_db(want, got) > 30
    import onnxruntime as ort
    sess = ort.InferenceSession(export_qdq(q, uint8_weights=True).SerializeToString(), providers=["CPUExecutionProvider"])
    ort_out = np.concatenate([sess.run(None, {"x": v})[0] for v in x])
    np.testing.assert_allclose(ort_out, got, rtol=0, atol=1e-6)   # float32 sums of the same integers: rounding only


def test_rank3_matmul_rows_form_is_the_same_function():
    """The prepare step alone (no quantization): Reshape -> Gemm -> Reshape computes the MatMul
    and its bias Add exactly; two MatMuls of one activation share its row view; a MatMul kept
    float, or whose weight is an activation, is left alone."""
    from qcompiler.passes.quantize_plan import prepare
    g = parse_graph(LINEAR3)
    prepare(g, QuantizeOptions())
    assert kinds(g) == ["Reshape", "Gemm", "Reshape", "Tanh"] and g.find_ops("Gemm")[0].name == "fc"
    x = np.random.default_rng(1).uniform(-1, 1, (1, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(reference.run(g, {"x": x})[0], reference.run(parse_graph(LINEAR3), {"x": x})[0],
                               rtol=1e-6, atol=1e-7)
    two = parse_graph(LINEAR3.replace('  return %t', '  %y2 = MatMul(%x, %w) : tensor<1x4x2xf32> loc("fc2")\n'
                                      '  %s = Add(%t, %y2) : tensor<1x4x2xf32>\n  return %s'))
    prepare(two, QuantizeOptions())
    assert kinds(two) == ["Reshape", "Gemm", "Reshape", "Tanh", "Gemm", "Reshape", "Add"]
    kept = parse_graph(LINEAR3)
    prepare(kept, QuantizeOptions(keep_float={"fc"}))
    assert kinds(kept) == ["MatMul", "Add", "Tanh"]
    act = parse_graph("""graph @g(%x: tensor<1x4x3xf32>, %v: tensor<3x2xf32>) {
  %y = MatMul(%x, %v) : tensor<1x4x2xf32> loc("fc")
  return %y
}""")
    prepare(act, QuantizeOptions())
    assert kinds(act) == ["MatMul"]
