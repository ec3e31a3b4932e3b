"""bias-correct: E[clip(N(β, γ²))] against sampling; b -= (W̃ − W)·E[x] with W̃ the quantize pass's
int8 weights (per tensor or per channel, from its own option or the quantize options)."""
from __future__ import annotations

import numpy as np
import pytest
from ir_check import run_ir, unchanged

from qcompiler.ir import parse_graph
from qcompiler.ir.printer import fmt_dense
from qcompiler.passes import PassContext
from qcompiler.passes.bias_correct import BiasCorrectOptions, clipped_normal_mean
from qcompiler.passes.quantize import QuantizeOptions
from qcompiler.quant import qparams as qpm


@pytest.mark.parametrize("lo,hi", [(0.0, np.inf), (0.0, 6.0), (-np.inf, np.inf), (-1.0, 0.5)])
def test_clipped_normal_mean_matches_sampling(lo, hi):
    rng = np.random.default_rng(0)
    mu, sigma = np.array([-2.0, 0.0, 1.0, 5.0, 0.3]), np.array([1.0, 2.0, 0.5, 3.0, 0.0])
    z = rng.standard_normal((400_000, 1))
    mc = np.clip(mu + sigma * z, lo, hi).mean(axis=0)
    np.testing.assert_allclose(clipped_normal_mean(mu, sigma, lo, hi), mc, atol=0.01)


def chain(w1, w2, act="Relu", between=""):
    """c1: 1x1 conv 3->4 (act) -> [between] -> c2: grouped 3x3 conv 4->4, group 2, with bias."""
    line = f'  %m = {between} : tensor<1x4x3x3xf32>\n' if between else ""
    return f"""graph @g(%x: tensor<1x3x6x6xf32>) {{
  %w1 = const {fmt_dense(w1)} : tensor<4x3x1x1xf32>
  %w2 = const {fmt_dense(w2)} : tensor<4x2x3x3xf32>
  %b2 = const dense<[0.0, 0.0, 0.0, 0.0]> : tensor<4xf32>
  %h = FusedConv(%x, %w1) {{activation = "{act}", activation_params = [], dilations = [1, 1], group = 1, pads = [0, 0, 0, 0], strides = [1, 1]}} : tensor<1x4x6x6xf32> loc("c1")
{line}  %y = Conv({'%m' if between else '%h'}, %w2, %b2) {{dilations = [1, 1], group = 2, pads = [0, 0, 0, 0], strides = [1, 1]}} : tensor<1x4x{1 if between else 4}x{1 if between else 4}xf32> loc("c2")
  return %y
}}"""


STATS = {"c1": {"gamma": [1.0, 0.5, 2.0, 1.0], "beta": [0.5, -1.0, 3.0, 0.0], "mean": [0.0] * 4, "var": [1.0] * 4,
                "eps": 1e-5}}


def _weights():
    rng = np.random.default_rng(3)
    return rng.standard_normal((4, 3, 1, 1)).astype(np.float32), rng.standard_normal((4, 2, 3, 3)).astype(np.float32)


@pytest.mark.parametrize("per_channel,how", [(False, "own"), (True, "own"), (False, "quantize"), (True, "default")])
def test_correction_is_weight_error_times_input_mean(per_channel, how):
    w1, w2 = _weights()
    g = parse_graph(chain(w1, w2))
    g.meta["bn_stats"] = {k: dict(v) for k, v in STATS.items()}
    opts = {"own": {"bias-correct": BiasCorrectOptions(per_channel=per_channel)},
            "quantize": {"quantize": QuantizeOptions(per_channel=per_channel)}, "default": {}}[how]
    run_ir(g, "bias-correct", PassContext(options=opts))
    ex = clipped_normal_mean(np.array(STATS["c1"]["beta"]), np.array(STATS["c1"]["gamma"]), 0.0, np.inf)
    qp = qpm.per_channel_symmetric(w2, 0) if per_channel else qpm.symmetric(float(w2.min()), float(w2.max()))
    eps = qpm.fake_quantize(w2, qp).astype(np.float64) - w2
    chan = np.array([[0, 1], [0, 1], [2, 3], [2, 3]])                  # group 2: inputs 0-1 and 2-3
    want = -(eps * ex[chan][:, :, None, None]).sum(axis=(1, 2, 3))
    got = {v.name: v.data for v in g.consts.values()}["b2_bc"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    assert g.meta["bias_correct"]["c2"] == pytest.approx(np.abs(want).max(), rel=1e-5)


def test_mean_keeping_ops_pass_maxpool_stops():
    w1, w2 = _weights()
    for between, fires in [("AveragePool(%h) {kernel_shape = [2, 2], strides = [2, 2]}", True),
                           ("MaxPool(%h) {kernel_shape = [2, 2], strides = [2, 2]}", False)]:
        g = parse_graph(chain(w1, w2, between=between))
        g.meta["bn_stats"] = {k: dict(v) for k, v in STATS.items()}
        assert ("bias_correct" in run_ir(g, "bias-correct").meta) == fires


def test_no_statistics_no_change():
    unchanged(chain(*_weights()), "bias-correct")


def test_empirical_variant_removes_the_mean_output_shift_exactly():
    """With calibration feeds, the corrected layer with int8 weights has the float layer's mean
    output per channel over those feeds, zero padding included (here: a padded grouped conv)."""
    from qcompiler.quant import reference
    w1, w2 = _weights()
    text = chain(w1, w2).replace("pads = [0, 0, 0, 0], strides = [1, 1]} : tensor<1x4x4x4xf32>",
                                 "pads = [1, 1, 1, 1], strides = [1, 1]} : tensor<1x4x6x6xf32>")
    g = parse_graph(text)
    rng = np.random.default_rng(5)
    calib = [{"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)} for _ in range(4)]
    ref = np.mean([reference.run(g, f)[0] for f in calib], axis=0).mean(axis=(0, 2, 3))
    opts = BiasCorrectOptions(per_channel=False, empirical=True, calib=calib)
    run_ir(g, "bias-correct", PassContext(options={"bias-correct": opts}))
    assert "c1" in g.meta["bias_correct"]            # every layer, with or without BN statistics
    c1, c2 = g.ops
    c1.set_operands([g.value("x"), g.add_const(w1, "w1_float")])      # c2 alone: its input stays float
    qp = qpm.symmetric(float(w2.min()), float(w2.max()))
    c2.set_operand(1, g.add_const(qpm.fake_quantize(w2, qp), "w2_fq"))
    got = np.mean([reference.run(g, f)[0] for f in calib], axis=0).mean(axis=(0, 2, 3))
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_hardswish_normal_mean_matches_sampling():
    """E[hardswish(x)], x ~ N(μ, σ²), from the partial moments of the normal (used for the inputs of
    layers after a HardSwish, fused or rescaled by equalize) against 400k samples."""
    from qcompiler.passes.bias_correct import hardswish_normal_mean
    mu, sigma = np.array([-4.0, -1.0, 0.0, 1.0, 2.5, 5.0, 1.0]), np.array([1.0, 2.0, 0.5, 3.0, 1.0, 0.1, 0.0])
    x = mu + sigma * np.random.default_rng(0).standard_normal((400_000, 1))
    mc = (x * np.clip(x / 6 + 0.5, 0, 1)).mean(axis=0)
    np.testing.assert_allclose(hardswish_normal_mean(mu, sigma), mc, atol=0.01)
