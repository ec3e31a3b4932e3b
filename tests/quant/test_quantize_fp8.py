"""quantize with ``fp8``: IR text in -> float8 IR text out (ranges given, so the text is
deterministic), what stays float32 and why, and the numerics: the reference interpreter against
float, and against ONNX Runtime on the opset-19 QDQ export."""
from __future__ import annotations

import numpy as np
import pytest
from fp8_models import NET, ort_session
from test_quantize import assert_ir, quantize

from qcompiler.errors import UserError
from qcompiler.frontend.qdq_export import export_qdq
from qcompiler.ir import parse_graph
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import reference, sqnr_db
from qcompiler.quant.fp8 import ulps

RANGES = {"x": (-1.0, 2.0), "f": (0.0, 3.0)}

# By hand. Conv weight rows [0.5, -1], [0.25, 2], [0.125, -0.75], [1.5, 0]: scale amax / 448 per
# channel (1/448 = 0.002232143, 2/448, 0.75/448, 1.5/448), so each row's largest magnitude is 448;
# 0.125 / (0.75/448) = 74.67 lies between the E4M3 values 72 and 80 (step 8 in [64, 128)): 72. Gemm
# rows (N x K, transB = 1) [1, -0.5, 0.25, 0.75] and [0.5, -2, 3, 0]: 0.75 * 448 = 336 is the tie
# of 320 and 352 (step 32 in [256, 512)) and goes to the even code 320; 3/448 scales the second
# row: 0.5 -> 74.67 -> 72, -2 -> -298.67 -> -288. x: amax 2 -> 2/448; f: 3/448. The bias stays
# float32; the GlobalAveragePool and Flatten stay float; every conv/gemm returns float32.
E4M3 = """graph @g(%x: tensor<1x2x4x4xf32>) {
  %w_q = const dense<[224.0, -448.0, 56.0, 448.0, 72.0, -448.0, 448.0, 0.0]> : tensor<4x2x1x1x!quant.uniform<f8E4M3FN:f32:0, {0.002232143, 0.004464286, 0.0016741072, 0.0033482143}>>
  %b_q = const dense<[0.5, -0.25, 0.0, 1.0]> : tensor<4xf32>
  %fw_q = const dense<[448.0, -224.0, 112.0, 320.0, 72.0, -288.0, 448.0, 0.0]> : tensor<2x4x!quant.uniform<f8E4M3FN:f32:0, {0.002232143, 0.0066964286}>>
  %x_q = QuantizeLinear(%x) : tensor<1x2x4x4x!quant.uniform<f8E4M3FN:f32, 0.004464286>>
  %y = QLinearConv(%x_q, %w_q, %b_q) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, multiplier = [], pads = [0, 0, 0, 0], shift = [], strides = [1, 1]} : tensor<1x4x4x4xf32>
  %p = GlobalAveragePool(%y) : tensor<1x4x1x1xf32>
  %f = Flatten(%p) {axis = 1} : tensor<1x4xf32>
  %f_q = QuantizeLinear(%f) : tensor<1x4x!quant.uniform<f8E4M3FN:f32, 0.0066964286>>
  %o = QLinearGemm(%f_q, %fw_q) {activation = "", activation_params = [], multiplier = [], shift = []} : tensor<1x2xf32>
  return %o
}"""

# E5M2 per tensor: one scale 2/57344 for the conv weight (amax 2), 3/57344 for the gemm's; E5M2 has
# 2 mantissa bits: -0.75 -> -21504 between 20480 and 24576 (step 4096): 20480; 1.5 -> 43008 -> 40960.
E5M2 = """graph @g(%x: tensor<1x2x4x4xf32>) {
  %w_q = const dense<[14336.0, -28672.0, 7168.0, 57344.0, 3584.0, -20480.0, 40960.0, 0.0]> : tensor<4x2x1x1x!quant.uniform<f8E5M2:f32, 3.4877234e-05>>
  %b_q = const dense<[0.5, -0.25, 0.0, 1.0]> : tensor<4xf32>
  %fw_q = const dense<[20480.0, -10240.0, 5120.0, 14336.0, 10240.0, -40960.0, 57344.0, 0.0]> : tensor<2x4x!quant.uniform<f8E5M2:f32, 5.231585e-05>>
  %x_q = QuantizeLinear(%x) : tensor<1x2x4x4x!quant.uniform<f8E5M2:f32, 3.4877234e-05>>
  %y = QLinearConv(%x_q, %w_q, %b_q) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, multiplier = [], pads = [0, 0, 0, 0], shift = [], strides = [1, 1]} : tensor<1x4x4x4xf32>
  %p = GlobalAveragePool(%y) : tensor<1x4x1x1xf32>
  %f = Flatten(%p) {axis = 1} : tensor<1x4xf32>
  %f_q = QuantizeLinear(%f) : tensor<1x4x!quant.uniform<f8E5M2:f32, 5.231585e-05>>
  %o = QLinearGemm(%f_q, %fw_q) {activation = "", activation_params = [], multiplier = [], shift = []} : tensor<1x2xf32>
  return %o
}"""


def test_golden_e4m3_per_channel():
    g = quantize(NET, ranges=RANGES, fp8="e4m3")
    assert_ir(g, E4M3)
    layers = g.meta["quant"]["layers"]
    assert layers["conv"]["precision"] == layers["fc"]["precision"] == "fp8"
    assert layers["gap"] == {"kind": "GlobalAveragePool", "precision": "float",
                             "reason": "float32 in an fp8 build (only Conv/Gemm/MatMul run on float8 operands)"}
    assert g.meta["quant"]["scheme"]["bias"] == "float32"


def test_golden_e5m2_per_tensor():
    assert_ir(quantize(NET, ranges=RANGES, fp8="e5m2", per_channel=False), E5M2)


def test_conv_chain_residual_and_hardswish_stay_float_between_fp8_convs():
    """conv -> conv (each conv's float32 result quantized by the next one's QuantizeLinear), a
    residual FusedConv split into QLinearConv + a float Add, a HardSwish left standalone (no integer
    epilogue in fp8)."""
    text = """graph @g(%x: tensor<1x4x4x4xf32>) {
  %w = const dense<0.5> : tensor<4x4x1x1xf32>
  %a = FusedConv(%x, %w) {activation = "HardSwish", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x4x4xf32> loc("c1")
  %bias = const dense<[0.1, -0.1, 0.2, 0.0]> : tensor<4xf32>
  %b = FusedConv(%a, %w, %bias, %x) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x4x4xf32> loc("c2")
  %c = Conv(%b, %w) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x4x4xf32> loc("c3")
  return %c
}"""
    g = quantize(text, ranges={"x": (-1, 1), "a": (0, 2), "b": (0, 3)}, fp8="e4m3")
    kinds = [op.kind for op in g.ops]
    assert kinds == ["QuantizeLinear", "QLinearConv", "HardSwish", "QuantizeLinear", "QLinearConv", "Add", "Relu",
                     "QuantizeLinear", "QLinearConv"]
    assert all(op.result.dtype == "float32" for op in g.ops if op.kind == "QLinearConv")
    x = np.random.default_rng(0).uniform(-1, 1, (1, 4, 4, 4)).astype(np.float32)
    assert sqnr_db(reference.run(parse_graph(text), {"x": x})[0], reference.run(g, {"x": x})[0]) > 25


def test_reference_close_to_float():
    """64 inputs: E4M3 (3 mantissa bits, a relative step of 1/8 to 1/16: ~31 dB per rounding, here
    three roundings deep) 24.7 dB; E5M2's 2 bits 19.3 dB, about one bit (6 dB) worse."""
    f = parse_graph(NET)
    x = np.random.default_rng(1).uniform(-1, 2, (64, 2, 4, 4)).astype(np.float32)
    ref = reference.run(f, {"x": x})[0]
    db = {fmt: sqnr_db(ref, reference.run(quantize(NET, ranges=RANGES, fp8=fmt), {"x": x})[0])
          for fmt in ("e4m3", "e5m2")}
    assert db["e4m3"] > 23.0 and db["e5m2"] > 17.0
    assert db["e4m3"] - db["e5m2"] > 3.0


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_qdq_export_runs_in_onnxruntime_as_the_reference(fmt):
    """The opset-19 export: ONNX Runtime (default optimizations) computes the float8 values the
    reference does (within one float8 step: its float32 sums are ordered otherwise) and outputs
    within float32 rounding of them."""
    g = quantize(NET, ranges=RANGES, fp8=fmt)
    m = export_qdq(g)
    assert m.opset_import[0].version == 19
    rng = np.random.default_rng(2)
    sess = ort_session(m, "all")
    for _ in range(8):
        x = rng.uniform(-1, 2, (1, 2, 4, 4)).astype(np.float32)
        (theirs,) = sess.run(None, {"x": x})
        ours = reference.run(g, {"x": x})[0]
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_options_refuse_unknown_formats():
    with pytest.raises(UserError, match="unknown fp8 'e3m4'"):
        QuantizeOptions(fp8="e3m4")
    assert QuantizeOptions(fp8="e5m2").fp8_storage == "float8_e5m2" and QuantizeOptions().fp8_storage is None


def test_float8_steps_of_the_reference_quantize_linear():
    """The reference's QuantizeLinear values are within 0 steps of the exact rounding of the float
    values it is given (the stored codes are ml_dtypes' round-to-nearest-even of x / s)."""
    g = quantize(NET, ranges=RANGES, fp8="e4m3")
    x = np.random.default_rng(3).uniform(-1, 2, (1, 2, 4, 4)).astype(np.float32)
    v = reference.run_values(g, {"x": x})
    s = np.float32(g.value("x_q").type.quant.scale[0])
    assert ulps(v["x_q"], x / s, "float8_e4m3fn").max() == 0
