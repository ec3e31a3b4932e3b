"""The ``quantize-weights`` pass (``--weights int4``): IR text in -> IR text out (hand-checked
values; the default options in the module docstring, tests/passes/test_docstrings.py), the
round-to-nearest weights within half a step of the float ones, GPTQ on the same grid with less
output error than round-to-nearest on held-out correlated inputs, what the pass declines and
records, and its option refusals."""
from __future__ import annotations

import numpy as np
import pytest
from ir_check import assert_ir, run_ir

from qcompiler.errors import UserError
from qcompiler.ir import Graph, TensorType
from qcompiler.ir.types import dequantize
from qcompiler.passes import PassContext
from qcompiler.passes.quantize_weights import QuantizeWeightsOptions
from qcompiler.quant.gptq import rounding_loss

BEFORE = """graph @g(%x: tensor<1x16xf32>, %ids: tensor<2xi64>) {
  %w = const dense<[-0.8, -0.7, -0.6, -0.5, -0.4, -0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.6, 1.4, 1.2, 1.0, 0.8, 0.6, 0.4, 0.2, 0.0, -0.2, -0.4, -0.6, -0.8, -1.0, -1.2, -1.4]> : tensor<2x16xf32>
  %c = const dense<[0.5, -0.5]> : tensor<2xf32>
  %y = Gemm(%x, %w, %c) {alpha = 1.0, beta = 1.0, transA = 0, transB = 1} : tensor<1x2xf32> loc("fc")
  %v = const dense<[1.0, 2.0]> : tensor<2x1xf32>
  %z = FusedGemm(%y, %v) {activation = "Relu", activation_params = [], alpha = 1.0, beta = 1.0, transA = 0, transB = 0} : tensor<1x1xf32> loc("head")
  %t = const dense<[0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75]> : tensor<1x16xf32>
  %e = Gather(%t, %ids) {axis = 0} : tensor<2x16xf32> loc("emb")
  return %z, %e
}
"""

# symmetric, float16 scales, blocks of 16. fc (transB: w is N x K already): row 0's extreme is -0.8, s =
# -0.8 / -8 = 0.1 -> f16 0.099975586; row 1's is +1.6, s = 1.6 / -8 = -0.2 -> f16 -0.19995117 (negative: the
# extreme at -8); w / s rounds to -8..7 in both rows (blob below: bytes f8..ff 00..07 twice). head: B [2, 1]
# -> w [1, 2] = [1, 2], s = 2 / -8 = -0.25, q = [-4, -8]; the Relu stays after it. emb: s = 3.75 / -8 =
# -0.46875 (a float16 value), q = round(-0.25 k / 0.46875) = round(-0.533 k).
AFTER = """graph @g(%x: tensor<1x16xf32>, %ids: tensor<2xi64>) {
  %w_q = const blob<w_q> : tensor<2x16x!quant.uniform<i4:f32:{1:16}, scales f16, {0.099975586:0, -0.19995117:0}>>
  %c_f = const dense<[0.5, -0.5]> : tensor<2xf32>
  %v_q = const dense<[-4, -8]> : tensor<1x2x!quant.uniform<i4:f32:{1:16}, scales f16, {-0.25:0}>>
  %t_q = const dense<[0, -1, -1, -2, -2, -3, -3, -4, -4, -5, -5, -6, -6, -7, -7, -8]> : tensor<1x16x!quant.uniform<i4:f32:{1:16}, scales f16, {-0.46875:0}>>
  %y = MatMulNBits(%x, %w_q, %c_f) : tensor<1x2xf32>
  %z_nbits = MatMulNBits(%y, %v_q) : tensor<1x1xf32>
  %z = Relu(%z_nbits) : tensor<1x1xf32>
  %e = GatherBlockQuantized(%t_q, %ids) : tensor<2x16xf32>
  return %z, %e
}
blobs {
  w_q = "+Pn6+/z9/v8AAQIDBAUGB/j5+vv8/f7/AAECAwQFBgc="
}
"""


def _ctx(**kw) -> PassContext:
    return PassContext(options={"quantize-weights": QuantizeWeightsOptions(**kw)})


def test_golden_symmetric_fp16_gemm_fused_gemm_gather():
    g = run_ir(BEFORE, "quantize-weights", _ctx(block_size=16, symmetric=True, scale_dtype="float16"))
    assert_ir(g, AFTER)
    assert g.value("w_q").data.tolist() == [list(range(-8, 8))] * 2
    rec = g.meta["weights"]
    assert rec["scheme"]["weights"] == "int4 symmetric, blocks of 16 along K, float16 scales"
    assert {k: (v["from"], v["bytes"], v["fp32_bytes"]) for k, v in rec["layers"].items()} == {
        "fc": ("Gemm", 16 + 2 * 2, 128), "head": ("FusedGemm", 1 + 2, 8), "emb": ("Gather", 8 + 2, 64)}


def test_declines_and_keep_float():
    g = run_ir(BEFORE, "quantize-weights", _ctx(keep_float=frozenset({"fc"}), embeddings=False))
    kinds = [op.kind for op in g.ops]
    assert kinds == ["Gemm", "MatMulNBits", "Relu", "Gather"]
    layers = g.meta["weights"]["layers"]
    assert layers["fc"]["reason"] == "kept float (--keep-float)" and layers["emb"]["reason"] == "embeddings left float"


def _matmul(k: int, n: int, seed: int = 0) -> Graph:
    rng = np.random.default_rng(seed)
    g = Graph("mm")
    x = g.add_input("x", TensorType((32, k), "float32"))
    w = g.add_const((rng.standard_normal((k, n)) * 0.1).astype(np.float32), "w")
    g.outputs = [g.create_op("MatMul", [x, w], name="mm").result]
    return g


@pytest.mark.parametrize("sym", [False, True])
def test_nearest_is_within_half_a_step(sym):
    g = _matmul(96, 24)
    w = g.value("w").data.T.copy()
    run_ir(g, "quantize-weights", _ctx(block_size=32, symmetric=sym))
    wq = g.ops[0].operands[1]
    qp = wq.type.quant
    s, _ = qp.element_params(w.shape)
    err = np.abs(dequantize(wq.data, qp) - w)
    clipped = (wq.data == 7) & (w / s > 7.5) if sym else np.zeros(w.shape, bool)   # [-8, 7]: the far side's top
    assert np.all(err[~clipped] <= np.abs(s[~clipped]) / 2 * (1 + 1e-6)) and np.all(err <= np.abs(s) * (1 + 1e-6))
    assert clipped.any() == sym
    assert qp.block_size == 32 and qp.storage == ("int4" if sym else "uint4")


def _correlated(n: int, k: int, seed: int) -> list[dict]:
    """Feeds of inputs with correlated columns (one mixing matrix; ``seed`` draws the samples)."""
    mix = np.random.default_rng(0).standard_normal((k, k)) * (3 / np.sqrt(k)) + np.eye(k)
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((32, k)) @ mix).astype(np.float32)} for _ in range(n)]


def test_gptq_same_grid_less_error_on_held_out_inputs():
    k, n = 128, 32
    calib, held = _correlated(24, k, 1), _correlated(16, k, 2)
    built = {}
    for rnd in ("nearest", "gptq"):
        g = _matmul(k, n)
        w = g.value("w").data.T.copy()
        run_ir(g, "quantize-weights", _ctx(block_size=32, rounding=rnd, calib=calib))
        wq = g.ops[0].operands[1]
        built[rnd] = (wq.type.quant, dequantize(wq.data, wq.type.quant))
        assert g.meta["weights"]["layers"]["mm"]["rounding"] == rnd
    assert built["gptq"][0] == built["nearest"][0]                 # same scales and zero points
    x = np.concatenate([f["x"] for f in held]).astype(np.float64)
    h = (x.T @ x)[None]
    loss = {r: rounding_loss(w[None], v[1][None], h, damp=0).sum() for r, v in built.items()}
    assert loss["gptq"] < 0.6 * loss["nearest"], loss            # measured 0.53


def test_gptq_without_calibration_data_is_refused():
    with pytest.raises(UserError, match="GPTQ weight rounding fits the weights to calibration data"):
        run_ir(_matmul(32, 8), "quantize-weights", _ctx(rounding="gptq"))


@pytest.mark.parametrize("kw,msg", [({"block_size": 48}, "block size 48"), ({"bits": 3}, "4-bit"),
                                    ({"scale_dtype": "bfloat16"}, "scale dtype"), ({"rounding": "stochastic"}, "rounding")])
def test_bad_options(kw, msg):
    with pytest.raises(UserError, match=msg):
        QuantizeWeightsOptions(**kw)


CONV_BEFORE = """graph @g(%x: tensor<1x16x4x4xf32>, %r: tensor<1x1x4x4xf32>) {
  %w = const dense<[-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2]> : tensor<1x16x1x1xf32>
  %b = const dense<[0.25]> : tensor<1xf32>
  %y = FusedConv(%x, %w, %b, %r) {activation = "Relu", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x4x4xf32> loc("conv")
  %d = const dense<0.5> : tensor<16x1x3x3xf32>
  %z = Conv(%x, %d) {dilations = [1, 1], group = 16, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x16x4x4xf32> loc("dw")
  return %y, %z
}
"""

# the 1x1 conv's 16 input channels: one (short) block of 128, the module docstring's values (s = 0.1,
# z = 3); the residual and the Relu after ConvNBits; the depthwise conv (1 input channel a group) float
CONV_AFTER = """graph @g(%x: tensor<1x16x4x4xf32>, %r: tensor<1x1x4x4xf32>) {
  %d = const dense<0.5> : tensor<16x1x3x3xf32>
  %w_q = const dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]> : tensor<1x16x1x1x!quant.uniform<u4:f32:{1:128}, {0.1:3}>>
  %b_f = const dense<[0.25]> : tensor<1xf32>
  %y_nbits = ConvNBits(%x, %w_q, %b_f) {dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x1x4x4xf32>
  %conv_add_out = Add(%y_nbits, %r) : tensor<1x1x4x4xf32>
  %y = Relu(%conv_add_out) : tensor<1x1x4x4xf32>
  %z = Conv(%x, %d) {dilations = [1, 1], group = 16, pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x16x4x4xf32>
  return %y, %z
}
"""


def test_golden_convs():
    g = run_ir(CONV_BEFORE, "quantize-weights", PassContext())
    assert_ir(g, CONV_AFTER)
    layers = g.meta["weights"]["layers"]
    assert layers["dw"]["reason"] == "1 input channels per group (fewer than 16)"
    assert layers["conv"]["from"] == "FusedConv" and layers["conv"]["k"] == 16


def test_conv_blocks_run_along_input_channels_of_each_tap():
    """A 3x3 conv's weight [O, C, 3, 3] in blocks of 16 of C: scales [O, C/16, 3, 3], each the
    ONNX Runtime rule applied to w[o, 16j:16j+16, i, k] alone."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((4, 32, 3, 3)) * 0.1).astype(np.float32)
    g = Graph("c")
    x = g.add_input("x", TensorType((1, 32, 6, 6), "float32"))
    g.outputs = [g.create_op("Conv", [x, g.add_const(w, "w")], {"pads": [1, 1, 1, 1]}, name="c").result]
    run_ir(g, "quantize-weights", _ctx(block_size=16))
    qp = g.ops[0].operands[1].type.quant
    s = np.asarray(qp.scale, np.float32).reshape(4, 2, 3, 3)
    blk = w[2, 16:32, 1, 0]
    want = (max(blk.max(), 0) - min(blk.min(), 0)) / np.float32(15)
    assert s[2, 1, 1, 0] == np.float32(want)
