"""The reference interpreter (oracle of the int8 kernels): its windowed kernels against onnxruntime
(float) and against a naive loop (integer), over strides, dilations, groups, pads and ceil_mode."""
import itertools

import numpy as np
import onnxruntime as ort
import pytest

from qcompiler.frontend.onnx_export import export_onnx
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.ir.interp import EvalError
from qcompiler.ir.ops import infer_types
from qcompiler.quant import reference
from qcompiler.quant.requant import conv_multipliers, requantize

CONVS = [  # (C, O, group, kernel, strides, dilations, pads)
    (4, 6, 1, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1)),
    (4, 4, 4, (3, 3), (2, 2), (1, 1), (1, 0, 1, 2)),          # depthwise, asymmetric pads
    (4, 6, 2, (2, 3), (1, 2), (2, 1), (0, 1, 2, 0)),          # grouped, dilated
    (3, 5, 1, (1, 1), (2, 1), (1, 1), (0, 0, 0, 0)),
]


def ort_single(g: Graph, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(export_onnx(g).SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def single(kind, x_shape, attrs, consts=(), dtype="float32"):
    g = Graph("op")
    x = g.add_input("x", TensorType(x_shape, dtype))
    ops = [x] + [g.add_const(c, f"c{i}") for i, c in enumerate(consts)]
    g.outputs = [g.create_op(kind, ops, attrs).result]
    return g


@pytest.mark.parametrize("c, o, group, k, s, d, p", CONVS)
def test_float_conv_matches_onnxruntime(c, o, group, k, s, d, p):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((o, c // group, *k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    g = single("Conv", (2, c, 7, 8), {"strides": list(s), "dilations": list(d), "pads": list(p), "group": group}, [w, b])
    x = rng.standard_normal((2, c, 7, 8)).astype(np.float32)
    np.testing.assert_allclose(reference.run(g, {"x": x})[0], ort_single(g, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind, ceil, cip, p, d", [
    ("MaxPool", 0, 0, (1, 1, 1, 1), (1, 1)), ("MaxPool", 1, 0, (0, 1, 0, 1), (2, 1)),
    ("AveragePool", 0, 0, (1, 1, 1, 1), None), ("AveragePool", 0, 1, (1, 0, 1, 0), None),
    ("AveragePool", 1, 0, (0, 0, 0, 0), None), ("AveragePool", 1, 1, (1, 1, 1, 1), None)])
def test_float_pools_match_onnxruntime(kind, ceil, cip, p, d):
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": list(p), "ceil_mode": ceil}
    if kind == "MaxPool":
        attrs["dilations"] = list(d)
    else:
        attrs["count_include_pad"] = cip
    g = single(kind, (2, 3, 8, 9), attrs)
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 9)).astype(np.float32)
    np.testing.assert_allclose(reference.run(g, {"x": x})[0], ort_single(g, {"x": x})[0], rtol=1e-6, atol=1e-6)


def naive_qconv(xq, zx, wq, bq, s, d, p, group):
    """acc[n, o, i, j] = Σ (x - zx) * w over the window, integers, one output at a time."""
    n, c, h, w_ = xq.shape
    o, cg, kh, kw = wq.shape
    xp = np.full((n, c, h + p[0] + p[2], w_ + p[1] + p[3]), zx, np.int64)
    xp[:, :, p[0]:p[0] + h, p[1]:p[1] + w_] = xq
    ho = (h + p[0] + p[2] - d[0] * (kh - 1) - 1) // s[0] + 1
    wo = (w_ + p[1] + p[3] - d[1] * (kw - 1) - 1) // s[1] + 1
    acc = np.zeros((n, o, ho, wo), np.int64)
    og = o // group
    for oc, i, j in itertools.product(range(o), range(ho), range(wo)):
        g = oc // og
        win = xp[:, g * cg:(g + 1) * cg, i * s[0]:i * s[0] + d[0] * (kh - 1) + 1:d[0],
                 j * s[1]:j * s[1] + d[1] * (kw - 1) + 1:d[1]]
        acc[:, oc, i, j] = ((win - zx) * wq[oc].astype(np.int64)).sum(axis=(1, 2, 3)) + bq[oc]
    return acc


@pytest.mark.parametrize("c, o, group, k, s, d, p", CONVS)
def test_qlinearconv_matches_a_naive_integer_loop(c, o, group, k, s, d, p):
    rng = np.random.default_rng(2)
    sx, so_ = 0.02, 0.05
    qx = QuantParams("uint8", (sx,), (117,))
    ws = tuple(float(v) for v in rng.uniform(0.001, 0.01, o))
    qw = QuantParams("int8", ws, (0,) * o, axis=0)
    qb = QuantParams("int32", tuple(float(np.float32(sx) * np.float32(v)) for v in ws), (0,) * o, axis=0)
    qo = QuantParams("uint8", (so_,), (90,))
    wq = rng.integers(-127, 128, (o, c // group, *k)).astype(np.int8)
    bq = rng.integers(-3000, 3000, o).astype(np.int32)
    ms, ss = conv_multipliers(sx, ws, so_)
    g = Graph("q")
    x = g.add_input("x", TensorType((2, c, 7, 8), "uint8", qx))
    operands = [x, g.add_const(wq, "w", qw), g.add_const(bq, "b", qb)]
    attrs = {"strides": list(s), "dilations": list(d), "pads": list(p), "group": group,
             "activation": "Relu", "activation_params": [], "multiplier": ms, "shift": ss}
    shape = infer_types("QLinearConv", [v.type for v in operands], attrs)[0].shape
    g.outputs = [g.create_op("QLinearConv", operands, attrs, result_types=[TensorType(shape, "uint8", qo)]).result]
    g.verify()
    xq = rng.integers(0, 256, (2, c, 7, 8)).astype(np.uint8)
    acc = naive_qconv(xq.astype(np.int64), 117, wq, bq, s, d, p, group)
    want = requantize(acc, np.array(ms)[None, :, None, None], np.array(ss)[None, :, None, None], 90, 90, 255)
    got = reference.run(g, {"x": xq})[0]
    assert got.dtype == np.uint8 and np.array_equal(got, want)


def test_int32_overflow_is_reported():
    qx = QuantParams("uint8", (1.0,), (0,))
    qw = QuantParams("int8", (1.0,), (0,))
    g = Graph("q")
    x = g.add_input("x", TensorType((1, 70000), "uint8", qx))
    w = g.add_const(np.full((1, 70000), 127, np.int8), "w", qw)
    g.outputs = [g.create_op("QLinearGemm", [x, w], {"multiplier": [1 << 30], "shift": [40]},
                             result_types=[TensorType((1, 1), "uint8", qx)], name="big").result]
    with pytest.raises(EvalError, match="'big': int32 accumulator overflow"):
        reference.run(g, {"x": np.full((1, 70000), 255, np.uint8)})


@pytest.mark.parametrize("group", [1, 2])
def test_long_integer_conv_sums_are_exact_in_bounded_float32(group):
    """K = 9 * 256 taps of worst-case products exceed float32's 2^24: the window bound sends most
    positions to one float32 GEMM and the saturated ones (x - z = 255 on every tap) to float32
    slices added in float64; both must equal the int64 sum."""
    from qcompiler.ir.windows import conv_sum
    rng = np.random.default_rng(0)
    c, o = 256, 8
    x = rng.integers(0, 40, (2, c, 6, 6)).astype(np.float64)
    x[1, :, :3, :3] = 255                                   # windows over the bound
    w = rng.integers(-127, 128, (o, c // group, 3, 3)).astype(np.float64)
    w[0] = 127                                              # a sum of 2^26
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [1, 1, 1, 1], "group": group}
    chunk = (2 ** 24 - 1) // (255 * 127)
    got = conv_sum(x, w, a, (6, 6), np.float64, chunk)
    want = conv_sum(x.astype(np.int64), w.astype(np.int64), a, (6, 6), np.int64)
    assert 2 ** 24 < np.abs(want).max() < 2 ** 31
    np.testing.assert_array_equal(got.astype(np.int64), want)
