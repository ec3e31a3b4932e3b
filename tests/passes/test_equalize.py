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
    unchanged(two_conv(w1, b1, w2, act='activation = "HardSwish", activation_params = []'), "equalize")
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
