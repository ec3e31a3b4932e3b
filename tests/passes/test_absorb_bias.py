"""absorb-bias: c = max(0, β − 3γ) moves from a layer's bias across ReLU into the next layer's bias;
only where the next layer reads no zero padding; BN statistics required and updated; with
calibration data, c is lowered to the smallest pre-activation seen on it."""
from __future__ import annotations

import numpy as np
from ir_check import ort_outputs, run_ir, unchanged

from qcompiler.passes import PassContext
from qcompiler.passes.quantize import QuantizeOptions

from qcompiler.ir import parse_graph
from qcompiler.ir.printer import fmt_dense

RELU = 'activation = "Relu", activation_params = []'


def chain(w1, b1, wd, bd, pads=0, act=RELU):
    """pointwise 2->4 (act) -> depthwise 3x3 (pads) with bias."""
    hw = 5 - 2 + 2 * pads
    return f"""graph @g(%x: tensor<1x2x5x5xf32>) {{
  %w1 = const {fmt_dense(w1)} : tensor<4x2x1x1xf32>
  %b1 = const {fmt_dense(b1)} : tensor<4xf32>
  %wd = const {fmt_dense(wd)} : tensor<4x1x3x3xf32>
  %bd = const {fmt_dense(bd)} : tensor<4xf32>
  %h = FusedConv(%x, %w1, %b1) {{{act}, dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]}} : tensor<1x4x5x5xf32> loc("c1")
  %y = Conv(%h, %wd, %bd) {{dilations = [1, 1], group = 4, pads = [{pads}, {pads}, {pads}, {pads}], strides = [1, 1]}} : tensor<1x4x{hw}x{hw}xf32> loc("dw")
  return %y
}}"""


def weights(seed=0):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((4, 2, 1, 1)) * 0.1).astype(np.float32)
    b1 = np.array([5.0, 0.2, 3.0, -1.0], np.float32)
    wd = rng.standard_normal((4, 1, 3, 3)).astype(np.float32)
    bd = rng.standard_normal(4).astype(np.float32)
    stats = {"c1": {"gamma": [1.0, 1.0, 0.5, 1.0], "beta": [5.0, 0.2, 3.0, -1.0], "mean": [0.0] * 4,
                    "var": [1.0] * 4, "eps": 1e-5}}
    return w1, b1, wd, bd, stats


def test_depthwise_golden_and_fp32():
    w1, b1, wd, bd, stats = weights()
    g = parse_graph(chain(w1, b1, wd, bd))
    g.meta["bn_stats"] = {k: dict(v) for k, v in stats.items()}
    feeds = {"x": np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)}
    ref = ort_outputs(g, feeds)
    run_ir(g, "absorb-bias")
    c = np.maximum(0.0, np.array(stats["c1"]["beta"]) - 3 * np.array(stats["c1"]["gamma"]))
    np.testing.assert_allclose(c, [2.0, 0.0, 1.5, 0.0])
    consts = {v.name: v.data for v in g.consts.values()}
    np.testing.assert_allclose(consts["b1_absorbed"], b1 - c, rtol=1e-6)
    np.testing.assert_allclose(consts["bd_absorbed"], bd + wd.reshape(4, -1).sum(1) * c, rtol=1e-5)
    assert g.meta["absorb_bias"]["c1"] == [2.0, 0.0, 1.5, 0.0]
    np.testing.assert_allclose(g.meta["bn_stats"]["c1"]["beta"], [3.0, 0.2, 1.5, -1.0])
    # pre-activations stay above c here (|w1·x| small), so the function is unchanged
    got = ort_outputs(g, feeds)
    assert np.abs(got[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()


def test_calibration_data_lowers_c_to_the_observed_minimum():
    """Inputs 100x larger than the BN statistics assume push channel 0's pre-activation (β = 5)
    below c = 2: c becomes min over the data of w1·x + b1 (clipped at 0), and the outputs stay
    exact on that data. Channel 2 (c = 1.5) is checked the same way."""
    w1, b1, wd, bd, stats = weights()
    rng = np.random.default_rng(2)
    calib = [{"x": (rng.standard_normal((1, 2, 5, 5)) * 100).astype(np.float32)} for _ in range(4)]
    pre = np.stack([np.einsum("oc,chw->ohw", w1[:, :, 0, 0], f["x"][0]) + b1[:, None, None] for f in calib])
    m = pre.min(axis=(0, 2, 3))
    want = np.maximum(0.0, np.minimum([2.0, 0.0, 1.5, 0.0], m))
    assert 0 < want[0] < 2.0                                       # the data really contradicts the BN stats
    for ctx in (PassContext(options={"absorb-bias": {"calib": calib}}),
                PassContext(options={"quantize": QuantizeOptions(calib=calib)})):   # the compile's data
        g = parse_graph(chain(w1, b1, wd, bd))
        g.meta["bn_stats"] = {k: dict(v) for k, v in stats.items()}
        refs = [ort_outputs(g, f)[0] for f in calib]
        run_ir(g, "absorb-bias", ctx)
        np.testing.assert_allclose(g.meta.get("absorb_bias", {}).get("c1", [0.0] * 4), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g.meta["absorb_bias_check"]["c1"]["observed_min"], m, rtol=1e-5, atol=1e-5)
        for f, ref in zip(calib, refs):
            assert np.abs(ort_outputs(g, f)[0] - ref).max() <= 1e-5 * np.abs(ref).max()


def test_skips_padded_consumer_missing_stats_and_clip():
    w1, b1, wd, bd, stats = weights()
    g = parse_graph(chain(w1, b1, wd, bd, pads=1))
    g.meta["bn_stats"] = stats
    assert run_ir(g, "absorb-bias").meta.get("absorb_bias") is None     # padded: border taps read 0, not -c
    unchanged(chain(w1, b1, wd, bd), "absorb-bias")                      # no bn_stats recorded
    g = parse_graph(chain(w1, b1, wd, bd, act='activation = "Clip", activation_params = [0.0, 6.0]'))
    g.meta["bn_stats"] = stats
    assert run_ir(g, "absorb-bias").meta.get("absorb_bias") is None
