"""equalize: golden IR on a two-conv chain (expected weights computed with numpy), depthwise-separable
chains, the cases it must skip, the recorded metadata, and fp32 preservation on real models."""
from __future__ import annotations

import importlib

import numpy as np
import pytest
from ir_check import assert_ir, ort_outputs, run_ir, unchanged
from test_docstrings import example

from qcompiler.ir import parse_graph
from qcompiler.ir.printer import fmt_dense
from qcompiler.passes.equalize import in_ranges, out_ranges

CONV = 'dilations = [1, 1], group = {g}, pads = [{p}, {p}, {p}, {p}], strides = [1, 1]'
RELU = 'activation = "Relu", activation_params = []'


def two_conv(w1, b1, w2, act=RELU, extra=""):
    t1 = f"tensor<1x{w1.shape[0]}x5x5xf32>"
    return f"""graph @g(%x: tensor<1x{w1.shape[1]}x5x5xf32>{extra}) {{
  %w1 = const {fmt_dense(w1)} : tensor<{'x'.join(map(str, w1.shape))}xf32>
  %b1 = const {fmt_dense(b1)} : tensor<{len(b1)}xf32>
  %w2 = const {fmt_dense(w2)} : tensor<{'x'.join(map(str, w2.shape))}xf32>
  %h = FusedConv(%x, %w1, %b1) {{{act + ', ' if act else ''}{CONV.format(g=1, p=0)}}} : {t1} loc("c1")
  %y = Conv(%h, %w2) {{{CONV.format(g=1, p=1)}}} : tensor<1x{w2.shape[0]}x5x5xf32> loc("c2")
  return %y
}}"""


def imbalanced(seed=0):
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((4, 3, 1, 1)) * np.array([100.0, 1.0, 0.01, 3.0])[:, None, None, None]).astype(np.float32)
    b1 = rng.standard_normal(4).astype(np.float32)
    w2 = rng.standard_normal((2, 4, 3, 3)).astype(np.float32)
    return w1, b1, w2


def test_two_conv_chain_golden():
    w1, b1, w2 = imbalanced()
    g = run_ir(two_conv(w1, b1, w2), "equalize")
    r1 = np.abs(w1.astype(np.float64)).reshape(4, -1).max(1)
    r2 = np.abs(w2.astype(np.float64)).transpose(1, 0, 2, 3).reshape(4, -1).max(1)
    s = np.sqrt(r1 * r2) / r2
    want = two_conv((w1 / s[:, None, None, None]).astype(np.float32), (b1 / s).astype(np.float32),
                    (w2 * s[None, :, None, None]).astype(np.float32))
    want = want.replace("%w1 ", "%w1_eq ").replace("%w1,", "%w1_eq,").replace("%b1)", "%b1_eq)") \
               .replace("%w2)", "%w2_eq)").replace("%b1 ", "%b1_eq ").replace("%w2 ", "%w2_eq ")
    # constants in creation order: w1_eq, b1_eq, w2_eq (all made by the first sweep)
    got = g.clone()
    assert_ir(got, want)
    after = {op.name: op for op in g.ops}
    np.testing.assert_allclose(out_ranges(after["c1"]), in_ranges(after["c2"]), rtol=1e-6)


def test_preserves_function_and_updates_bn_stats_and_meta():
    w1, b1, w2 = imbalanced(1)
    g = parse_graph(two_conv(w1, b1, w2))
    g.meta["bn_stats"] = {"c1": {"gamma": [1.0, 2.0, 3.0, 4.0], "beta": [0.5, -0.5, 1.0, 2.0], "mean": [0.0] * 4,
                                 "var": [1.0] * 4, "eps": 1e-5}}
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, 5, 5)).astype(np.float32)}
    ref = ort_outputs(g, feeds)
    before = out_ranges(g.ops[0])
    run_ir(g, "equalize")
    got = ort_outputs(g, feeds)
    assert np.abs(got[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()
    s = before / out_ranges(g.ops[0])
    np.testing.assert_allclose(g.meta["bn_stats"]["c1"]["gamma"], np.array([1.0, 2, 3, 4]) / s, rtol=1e-6)
    np.testing.assert_allclose(g.meta["bn_stats"]["c1"]["beta"], np.array([0.5, -0.5, 1, 2]) / s, rtol=1e-6)
    rec = g.meta["equalize"]
    assert rec["pairs"] == [["c1", "c2"]] and rec["sweeps"] >= 1
    np.testing.assert_allclose(rec["layers"]["c1"]["before"], before)
    assert max(rec["layers"]["c1"]["after"]) / min(rec["layers"]["c1"]["after"]) < \
        max(before) / min(before) / 50       # r1 -> sqrt(r1 r2): 14,000x -> 150x


def separable(wa, wd, wb, pool=""):
    """pointwise (Relu) -> [pool] -> depthwise 3x3 (Relu) -> pointwise."""
    c, hw = wa.shape[0], (3 if pool else 6)
    shape = lambda ch, n: f"tensor<1x{ch}x{n}x{n}xf32>"                       # noqa: E731
    dims = lambda w: "x".join(map(str, w.shape))                              # noqa: E731
    pool_line = f"  %p = {pool} : {shape(c, 3)}\n" if pool else ""
    return f"""graph @g(%x: {shape(wa.shape[1], 6)}) {{
  %wa = const {fmt_dense(wa)} : tensor<{dims(wa)}xf32>
  %wd = const {fmt_dense(wd)} : tensor<{dims(wd)}xf32>
  %wb = const {fmt_dense(wb)} : tensor<{dims(wb)}xf32>
  %a = FusedConv(%x, %wa) {{{RELU}, {CONV.format(g=1, p=0)}}} : {shape(c, 6)} loc("pa")
{pool_line}  %d = FusedConv({"%p" if pool else "%a"}, %wd) {{{RELU}, {CONV.format(g=c, p=1)}}} : {shape(c, hw)} loc("dw")
  %y = Conv(%d, %wb) {{{CONV.format(g=1, p=0)}}} : {shape(wb.shape[0], hw)} loc("pb")
  return %y
}}"""


@pytest.mark.parametrize("pool", ["", "MaxPool(%a) {kernel_shape = [2, 2], strides = [2, 2]}",
                                  "AveragePool(%a) {kernel_shape = [2, 2], strides = [2, 2]}"])
def test_depthwise_separable_chain(pool):
    rng = np.random.default_rng(2)
    big = np.where(np.arange(8) % 4 == 0, 50.0, 1.0)
    wa = rng.standard_normal((8, 3, 1, 1)).astype(np.float32)
    wd = (rng.standard_normal((8, 1, 3, 3)) * big[:, None, None, None]).astype(np.float32)
    wb = (rng.standard_normal((4, 8, 1, 1)) / big[None, :, None, None]).astype(np.float32)
    g = parse_graph(separable(wa, wd, wb, pool))
    feeds = {"x": rng.standard_normal((1, 3, 6, 6)).astype(np.float32)}
    ref = ort_outputs(g, feeds)
    dw0 = out_ranges([op for op in g.ops if op.name == "dw"][0])
    run_ir(g, "equalize")
    ops = {op.name: op for op in g.ops}
    assert g.meta["equalize"]["pairs"] == [["pa", "dw"], ["dw", "pb"]]
    # converged: each pair's ranges meet (a depthwise channel is its own input and output channel)
    np.testing.assert_allclose(out_ranges(ops["pa"]), in_ranges(ops["dw"]), rtol=2e-3)
    np.testing.assert_allclose(out_ranges(ops["dw"]), in_ranges(ops["pb"]), rtol=2e-3)
    dw1 = out_ranges(ops["dw"])
    assert dw1.max() / dw1.min() < dw0.max() / dw0.min() / 5
    got = ort_outputs(g, feeds)
    assert np.abs(got[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()


def test_skips_clip_residual_and_fanout():
    w1, b1, w2 = imbalanced()
    unchanged(two_conv(w1, b1, w2, act='activation = "Clip", activation_params = [0.0, 6.0]'), "equalize")
    unchanged(two_conv(w1, b1, w2, act='activation = "Sigmoid", activation_params = []'), "equalize")
    # a residual input Z on the first layer
    text = two_conv(w1, b1, w2, extra=", %z: tensor<1x4x5x5xf32>").replace("%x, %w1, %b1)", "%x, %w1, %b1, %z)")
    unchanged(text, "equalize")
    # the first layer's output also leaves the graph
    text = two_conv(w1, b1, w2).replace("return %y", "return %y, %h")
    unchanged(text, "equalize")


@pytest.mark.parametrize("module,name,meta", [
    ("equalize", "equalize", {}),
    ("absorb_bias", "absorb-bias", {"bn_stats": {"c1": {"gamma": [1 / 6, 1.0], "beta": [2.5, 0.1]}}}),
    ("bias_correct", "bias-correct", {"bn_stats": {"c1": {"gamma": [1.0], "beta": [2.0]}}})])
def test_docstring_examples(module, name, meta):
    from qcompiler.passes import PassContext
    from qcompiler.passes.bias_correct import BiasCorrectOptions
    doc = importlib.import_module(f"qcompiler.passes.{module}").__doc__
    g = parse_graph(example(doc, "Before"))
    g.meta.update(meta)
    ctx = PassContext(options={"bias-correct": BiasCorrectOptions(per_channel=False)})
    assert_ir(run_ir(g, name, ctx), example(doc, "After"))


def test_hardswish_rescaled_exactly():
    """HardSwish(y)/S = z·hsig(S·z) with z = y/S: the chain is equalized and the activation becomes
    Mul(z, S) -> HardSigmoid(1/6, 1/2) -> Mul(z, ·); a second run updates S in place."""
    w1, b1, w2 = imbalanced(3)
    g = parse_graph(two_conv(w1, b1, w2, act='activation = "HardSwish", activation_params = []'))
    feeds = {"x": (3 * np.random.default_rng(1).standard_normal((1, 3, 5, 5))).astype(np.float32)}
    ref = ort_outputs(g, feeds)
    before = out_ranges(g.ops[0])
    run_ir(g, "equalize")
    kinds = [op.kind for op in g.ops]
    assert kinds == ["FusedConv", "Mul", "HardSigmoid", "Mul", "Conv"] and g.ops[0].attrs["activation"] == ""
    assert g.meta["equalize"]["hardswish"] == ["c1"]
    after = {op.name: op for op in g.ops}
    np.testing.assert_allclose(out_ranges(after["c1"]), in_ranges(after["c2"]), rtol=2e-3)
    scale = g.ops[1].operands[1].data.reshape(-1)
    np.testing.assert_allclose(scale, before / out_ranges(after["c1"]), rtol=1e-5)   # S = the total s
    got = ort_outputs(g, feeds)
    assert np.abs(got[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()
    # the rescaled form is recognised: scaling c1 by 2 and c2 by 1/2 is undone by a second run
    w = after["c1"].operands[1].data
    from qcompiler.passes.equalize import set_weights, weight_oc
    set_weights(g, after["c1"], w * 2.0, after["c1"].operands[2].data * 2.0, suffix="_x2")
    g.ops[1].operands[1].data = (scale / 2.0).reshape(g.ops[1].operands[1].shape).astype(np.float32)
    set_weights(g, after["c2"], weight_oc(after["c2"]) / 2.0, suffix="_x2")
    assert np.abs(ort_outputs(g, feeds)[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()
    run_ir(g, "equalize")
    assert [op.kind for op in g.ops] == kinds
    np.testing.assert_allclose(g.ops[1].operands[1].data.reshape(-1), scale, rtol=1e-4)
    assert np.abs(ort_outputs(g, feeds)[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()


SE_BLOCK = """graph @g(%x: tensor<1x3x6x6xf32>) {{
  %we = const {we} : tensor<8x3x1x1xf32>
  %wd = const {wd} : tensor<8x1x3x3xf32>
  %bd = const {bd} : tensor<8xf32>
  %ws1 = const {ws1} : tensor<2x8x1x1xf32>
  %ws2 = const {ws2} : tensor<8x2x1x1xf32>
  %wp = const {wp} : tensor<4x8x1x1xf32>
  %e = FusedConv(%x, %we) {{activation = "HardSwish", activation_params = [], {c1}}} : tensor<1x8x6x6xf32> loc("expand")
  %d = FusedConv(%e, %wd, %bd) {{activation = "HardSwish", activation_params = [], {c3}}} : tensor<1x8x6x6xf32> loc("dw")
  %p = GlobalAveragePool(%d) : tensor<1x8x1x1xf32>
  %s1 = FusedConv(%p, %ws1) {{activation = "Relu", activation_params = [], {c1}}} : tensor<1x2x1x1xf32> loc("se1")
  %s2 = FusedConv(%s1, %ws2) {{activation = "HardSigmoid", activation_params = [0.2, 0.5], {c1}}} : tensor<1x8x1x1xf32> loc("se2")
  %m = Mul(%d, %s2) : tensor<1x8x6x6xf32>
  %y = Conv(%m, %wp) {{{c1}}} : tensor<1x4x6x6xf32> loc("project")
  return %y
}}"""


def test_squeeze_excite_fanout_and_hardswish_chains():
    """MobileNetV3 block: expand (HardSwish) -> depthwise (HardSwish) -> {SE via GlobalAveragePool,
    project via the gate Mul}: the depthwise output fans out to two layers that both take the scale."""
    rng = np.random.default_rng(4)
    big = np.where(np.arange(8) % 3 == 0, 30.0, 1.0)
    arrs = dict(we=rng.standard_normal((8, 3, 1, 1)), wd=rng.standard_normal((8, 1, 3, 3)) * big[:, None, None, None],
                bd=rng.standard_normal(8), ws1=rng.standard_normal((2, 8, 1, 1)),
                ws2=rng.standard_normal((8, 2, 1, 1)), wp=rng.standard_normal((4, 8, 1, 1)) / big[None, :, None, None])
    text = SE_BLOCK.format(**{k: fmt_dense(v.astype(np.float32)) for k, v in arrs.items()},
                           c1=CONV.format(g=1, p=0), c3=CONV.format(g=8, p=1))
    g = parse_graph(text)
    feeds = {"x": (2 * rng.standard_normal((1, 3, 6, 6))).astype(np.float32)}
    ref = ort_outputs(g, feeds)
    dw0 = out_ranges([op for op in g.ops if op.name == "dw"][0])
    run_ir(g, "equalize")
    meta = g.meta["equalize"]
    assert sorted(map(tuple, meta["pairs"])) == sorted([("expand", "dw"), ("dw", "se1"), ("dw", "project"),
                                                        ("se1", "se2")])
    assert meta["hardswish"] == ["expand", "dw"]
    dw1 = out_ranges([op for op in g.ops if op.name == "dw"][0])
    assert dw1.max() / dw1.min() < dw0.max() / dw0.min() / 5
    got = ort_outputs(g, feeds)
    assert np.abs(got[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()


def test_residual_stream_option():
    """EqualizeOptions(residual=True): a residual stream (producer + the layer adding it back through
    its Z input) takes one shared scale; off by default (measured worse on the real models)."""
    from qcompiler.passes import PassContext
    from qcompiler.passes.equalize import EqualizeOptions
    rng = np.random.default_rng(5)
    big = np.array([20.0, 1.0, 0.05, 1.0])
    w = {k: fmt_dense(v.astype(np.float32)) for k, v in dict(
        wa=rng.standard_normal((4, 3, 1, 1)) * big[:, None, None, None], wb=rng.standard_normal((6, 4, 1, 1)),
        wc=rng.standard_normal((4, 6, 1, 1)) * big[:, None, None, None], wd=rng.standard_normal((2, 4, 1, 1))).items()}
    c = CONV.format(g=1, p=0)
    text = f"""graph @g(%x: tensor<1x3x4x4xf32>) {{
  %wa = const {w["wa"]} : tensor<4x3x1x1xf32>
  %wb = const {w["wb"]} : tensor<6x4x1x1xf32>
  %wc = const {w["wc"]} : tensor<4x6x1x1xf32>
  %wd = const {w["wd"]} : tensor<2x4x1x1xf32>
  %a = Conv(%x, %wa) {{{c}}} : tensor<1x4x4x4xf32> loc("a")
  %b = FusedConv(%a, %wb) {{{RELU}, {c}}} : tensor<1x6x4x4xf32> loc("b")
  %r = FusedConv(%b, %wc) {{activation = "", activation_params = [], {c}}} : tensor<1x4x4x4xf32> loc("r")
  %s = Add(%r, %a) : tensor<1x4x4x4xf32>
  %y = Conv(%s, %wd) {{{c}}} : tensor<1x2x4x4xf32> loc("d")
  return %y
}}"""
    unchanged_pairs = run_ir(text, "equalize").meta["equalize"]["pairs"]
    assert ["a", "d"] not in unchanged_pairs
    g = parse_graph(text)
    feeds = {"x": rng.standard_normal((1, 3, 4, 4)).astype(np.float32)}
    ref = ort_outputs(g, feeds)
    run_ir(g, "equalize", PassContext(options={"equalize": EqualizeOptions(residual=True)}))
    pairs = g.meta["equalize"]["pairs"]
    assert ["a", "b"] in pairs and ["r", "d"] in pairs and ["a", "d"] in pairs
    got = ort_outputs(g, feeds)
    assert np.abs(got[0] - ref[0]).max() <= 1e-5 * np.abs(ref[0]).max()
