"""The float32 HardSwish epilogue (qcompiler.quant.hardswish) against HardSwish computed in float64
and quantized once (round half to even, as QuantizeLinear): within 1 LSB everywhere, and off by one
only where the float value sits within the documented error bound (2^-6 step) of a rounding boundary."""
from __future__ import annotations

import numpy as np
import pytest

from qcompiler.ir.types import QuantParams
from qcompiler.ir import quant_ops
from qcompiler.quant import hardswish
from qcompiler.quant.requant import rounding_right_shift

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("storage, s_y, z_y, gate", [("uint8", 0.03, 20, "standard"), ("int8", 0.011, -110, "scaled"),
                                                      ("uint8", 0.002, 5, "scaled"), ("int8", 0.4, -120, "standard")])
def test_epilogue_matches_float_hardswish(storage, s_y, z_y, gate):
    channels, s_x = 6, 0.02
    s_w = RNG.uniform(0.001, 0.01, channels)
    params = [] if gate == "standard" else [1 / 6, 0.5, *RNG.uniform(0.3, 3.0, channels)]
    qo = QuantParams(storage, (s_y,), (z_y,))
    at = hardswish.epilogue_attrs(s_x, s_w, qo, params, channels)
    a, b = quant_ops.gate(params, channels)
    M = np.float32(s_x).astype(np.float64) * s_w.astype(np.float32).astype(np.float64)
    z_hi = 300 * s_y                                   # well past saturation
    acc = np.round(RNG.uniform(-z_hi, z_hi, (20000, channels)) / M).astype(np.int64)
    acc[:10] = np.array([[-2 ** 31 + 1] * channels, [2 ** 31 - 1] * channels] * 5)   # int32 extremes: no overflow
    sig, g, beta = at["hardswish"]
    col = lambda v: np.asarray(v, np.float32) if len(v) == 1 else np.asarray(v, np.float32)[None, :]
    lo, hi = (0, 255) if storage == "uint8" else (-128, 127)
    got = hardswish.requantize(acc, [col(sig), col(g), beta], z_y, lo, hi)
    z = acc * M
    y = z * np.clip(a * z + b, 0, 1) / np.float32(s_y).astype(np.float64) + z_y
    want = np.clip(np.rint(y), lo, hi)
    diff = np.abs(got - want)
    assert diff.max() <= 1
    near = np.abs(y - np.floor(y) - 0.5) < 2 ** -6     # within the error bound of a boundary
    assert not np.any((diff > 0) & ~near & (y > lo) & (y < hi)), "off by one away from a rounding boundary"
    gated = (a * z + b > 0) & (a * z + b < 1)
    assert gated.mean() > 0.005                        # the gate's open region is exercised


# ---- the quantize pass: FusedConv{HardSwish} and the equalized z·HardSigmoid(S·z) fold into the conv ----
from qcompiler.ir import parse_graph, print_graph  # noqa: E402
from qcompiler.passes import PassContext, PassManager  # noqa: E402
from qcompiler.passes.quantize import QuantizeOptions  # noqa: E402
from qcompiler.quant import reference, sqnr_db  # noqa: E402
from qcompiler.frontend.qdq_export import export_qdq  # noqa: E402

FUSED = """graph @g(%x: tensor<2x3x6x6xf32>) {
  %w = const dense<[%W%]> : tensor<4x3x3x3xf32>
  %b = const dense<[0.5, -0.25, 0.1, 0.0]> : tensor<4xf32>
  %y = FusedConv(%x, %w, %b) {activation = "HardSwish", activation_params = [], dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<2x4x6x6xf32>
  return %y
}"""

SCALED = """graph @g(%x: tensor<2x3x6x6xf32>) {
  %w = const dense<[%W%]> : tensor<4x3x3x3xf32>
  %b = const dense<[0.5, -0.25, 0.1, 0.0]> : tensor<4xf32>
  %s = const dense<[0.5, 2.0, 1.0, 3.0]> : tensor<1x4x1x1xf32>
  %z = Conv(%x, %w, %b) {dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<2x4x6x6xf32>
  %zs = Mul(%z, %s) : tensor<2x4x6x6xf32>
  %h = HardSigmoid(%zs) {alpha = 0.16666667, beta = 0.5} : tensor<2x4x6x6xf32>
  %y = Mul(%z, %h) : tensor<2x4x6x6xf32>
  return %y
}"""


PLAIN = """graph @g(%x: tensor<2x3x6x6xf32>) {
  %w = const dense<[%W%]> : tensor<4x3x3x3xf32>
  %b = const dense<[0.5, -0.25, 0.1, 0.0]> : tensor<4xf32>
  %z = Conv(%x, %w, %b) {dilations = [1, 1], group = 1, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<2x4x6x6xf32>
  %y = HardSwish(%z) : tensor<2x4x6x6xf32>
  return %y
}"""


def _model(text):
    w = np.random.default_rng(1).normal(0, 0.5, 108)
    return parse_graph(text.replace("%W%", ", ".join(f"{v:.4f}" for v in w)))


@pytest.mark.parametrize("text, gate", [(FUSED, 0), (SCALED, 6), (PLAIN, 0)])
def test_quantize_folds_hardswish_into_one_quantization_point(text, gate):
    g = _model(text)
    float_g = g.clone()
    x = np.random.default_rng(2).normal(0, 1, (2, 3, 6, 6)).astype(np.float32)
    PassManager("quantize", ctx=PassContext(options={"quantize": QuantizeOptions(calib=[{"x": x}])})).run(g)
    g.verify()
    assert [op.kind for op in g.ops] == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    conv = g.find_ops("QLinearConv")[0]
    assert conv.attrs["activation"] == "HardSwish" and len(conv.attrs["activation_params"]) == gate
    assert [len(v) for v in conv.attrs["hardswish"]][2] == 1 and len(conv.attrs["hardswish"]) == 3
    again = parse_graph(print_graph(g))                        # the new attributes round-trip
    again.verify()
    assert print_graph(again) == print_graph(g)
    want = reference.run(float_g, {"x": x})[0]
    got = reference.run(g, {"x": x})[0]
    s_y = g.find_ops("DequantizeLinear")[0].operands[0].type.quant.scale[0]
    assert sqnr_db(want, got) > 30                              # 8-bit in, 8-bit out, one rounding of y
    # QDQ: DQ -> Conv -> (HardSwish | Mul, HardSigmoid, Mul) -> Q, no Q in between
    import onnxruntime as ort
    m = export_qdq(g, uint8_weights=True)            # ORT exact on CPUs without VNNI too
    kinds = [n.op_type for n in m.graph.node]
    tail = ["HardSwish"] if gate == 0 else ["Mul", "HardSigmoid", "Mul"]
    i = kinds.index("Conv")
    assert kinds[i + 1:i + 1 + len(tail)] == tail and kinds[i + 1 + len(tail)] == "QuantizeLinear"
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ort_y = sess.run(None, {"x": x})[0]
    assert np.abs(ort_y - got).max() <= 1.01 * s_y              # same model in float: within 1 LSB
    print(f"SQNR vs fp32: ours {sqnr_db(want, got):.1f} dB, ORT QDQ {sqnr_db(want, ort_y):.1f} dB")
