"""x86 lowering of float8 (qcompiler/codegen/kernels/fp8.py) against the reference interpreter:

* QuantizeLinear / DequantizeLinear kernels BIT-EXACT on every float8 value, every rounding tie
  and the float32 values beside it, saturation, subnormals and NaN, per tensor and per channel;
* float8 convs (3x3 padded, depthwise strided, 1x1, grouped, per-tensor weights) and gemms:
  bit-exact where every partial sum is exact in float32 (integer-valued operands: the kernels'
  decode, packing, epilogue and clamp are then checked alone), and otherwise within the float32
  rounding of their summation order, |ours - ref| <= f_c (K 2^-24 Σ|x w|) + 2^-23 (f_c Σ|x w| + |b|);
* the library stores the weights as float8 bytes: a weight-bound model.so is about a quarter of
  the fp32 one.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import tvm

from qcompiler.codegen.artifact import write_artifact
from qcompiler.codegen.lower import LoweringError, build_module
from qcompiler.codegen.target import TargetSpec
from qcompiler.ir import Graph, QuantParams, TensorType
from qcompiler.ir.types import quantize
from qcompiler.ir.windows import conv_sum
from qcompiler.quant import reference

SPEC = TargetSpec("x86")
FP8 = ("float8_e4m3fn", "float8_e5m2")
RNG = np.random.default_rng(11)


def run_tvm(g: Graph, feeds: dict) -> list[np.ndarray]:
    vm = tvm.runtime.vm.VirtualMachine(build_module(g, SPEC), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(np.ascontiguousarray(feeds[v.name])) for v in g.inputs])
    return [o.numpy() for o in (list(out) if len(g.outputs) > 1 else [out])]


def code_values(storage: str) -> np.ndarray:
    v = np.arange(256, dtype=np.uint8).view(getattr(ml_dtypes, storage)).astype(np.float32)
    return v[np.isfinite(v)]


def boundaries(storage: str) -> np.ndarray:
    """Every finite float8 value, the midpoints of neighbours and the float32 values beside them,
    saturation, float32 subnormals, infinities and NaN."""
    vals = np.unique(np.abs(code_values(storage)))
    mids = ((vals[1:].astype(np.float64) + vals[:-1]) / 2).astype(np.float32)
    mx = vals.max()
    extra = np.array([mx * 1.03, mx * 1.1, mx * 4, 1e30, np.inf, 1e-45, 1e-39], np.float32)
    pos = np.concatenate([vals, mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, np.float32(0)), extra])
    return np.concatenate([pos, -pos, np.array([np.nan, -np.nan], np.float32)])


@pytest.mark.parametrize("storage", FP8)
def test_quantize_dequantize_bit_exact_on_every_boundary(storage):
    """x -> QuantizeLinear (per tensor: the encode of every value; per channel along axis 0) ->
    DequantizeLinear: the kernels' float32 output equals the reference bit for bit (NaN stays NaN)."""
    x = boundaries(storage)
    n = x.size - x.size % 4
    for qp, shape in ((QuantParams(storage, (0.75,), (0,)), (n,)),
                      (QuantParams(storage, (1.0, 0.25, 3.0, 2.0 ** -10), (0,) * 4, axis=0), (4, n // 4))):
        g = Graph("qdq")
        xi = g.add_input("x", TensorType(shape, "float32"))
        q = g.create_op("QuantizeLinear", [xi], result_types=[xi.type.with_quant(qp)]).result
        g.outputs = [g.create_op("DequantizeLinear", [q]).result]
        g.verify()
        feed = {"x": (x[:n] * np.float32(qp.scale[0])).reshape(shape)}
        (want,), (got,) = reference.run(g, feed), run_tvm(g, feed)
        same = (want.view(np.uint32) == got.view(np.uint32)) | (np.isnan(want) & np.isnan(got))
        assert same.all(), f"{(~same).sum()} differ: x={feed['x'].ravel()[~same.ravel()][:5]}"


def _weights(storage: str, shape, exact: bool) -> np.ndarray:
    """float8 weights: small integers (exact sums) or normal values scaled over the format's range."""
    if exact:
        return RNG.integers(-6, 7, shape).astype(np.float32).astype(getattr(ml_dtypes, storage))
    mx = float(ml_dtypes.finfo(getattr(ml_dtypes, storage)).max)
    return quantize(RNG.standard_normal(shape).astype(np.float32) * np.float32(mx / 4), QuantParams(storage, (1.0,), (0,)))


def _input(shape, exact: bool) -> np.ndarray:
    """Float inputs for an x scale of 1/16: multiples of 1/16 up to 8 (exact: float8 values whose
    products with the small-integer weights sum exactly) or normal values."""
    if exact:
        return (RNG.integers(-8, 9, shape) / 16).astype(np.float32)
    return (RNG.standard_normal(shape) * 3).astype(np.float32)


def conv_graph(storage, c, o, k, *, group=1, stride=1, pad=0, exact=False, per_channel=True, act="Relu"):
    g = Graph("fp8conv")
    x = g.add_input("x", TensorType((1, c, 9, 9), "float32"))
    xq = g.create_op("QuantizeLinear", [x], result_types=[x.type.with_quant(QuantParams(storage, (1 / 16,), (0,)))]).result
    ws = tuple(float(v) for v in RNG.uniform(0.001, 0.01, o)) if per_channel else (0.004,)
    wq = g.add_const(_weights(storage, (o, c // group, k, k), exact), "w",
                     QuantParams(storage, ws, (0,) * len(ws), axis=0 if per_channel else None))
    b = g.add_const((RNG.integers(-8, 9, o) / 8).astype(np.float32), "b")
    y = g.create_op("QLinearConv", [xq, wq, b], {"strides": [stride] * 2, "dilations": [1, 1], "pads": [pad] * 4,
                                                 "group": group, "activation": act, "activation_params": [],
                                                 "multiplier": [], "shift": []}).result
    g.outputs = [y]
    g.verify()
    return g


def gemm_graph(storage, m, k, n, *, exact=False):
    g = Graph("fp8gemm")
    x = g.add_input("x", TensorType((m, k), "float32"))
    xq = g.create_op("QuantizeLinear", [x], result_types=[x.type.with_quant(QuantParams(storage, (1 / 16,), (0,)))]).result
    ws = tuple(float(v) for v in RNG.uniform(0.001, 0.01, n))
    wq = g.add_const(_weights(storage, (n, k), exact), "w", QuantParams(storage, ws, (0,) * n, axis=0))
    b = g.add_const((RNG.integers(-8, 9, n) / 8).astype(np.float32), "b")
    g.outputs = [g.create_op("QLinearGemm", [xq, wq, b], {"activation": "", "activation_params": [],
                                                          "multiplier": [], "shift": []}).result]
    g.verify()
    return g


def _bound(g: Graph, feeds: dict) -> np.ndarray:
    """f_c K 2^-24 Σ|x w| + 2^-23 (f_c Σ|x w| + |b|) per output: a float32 sum of K products in
    any order is within (K - 1) 2^-24 Σ|x w| of the exact one; one more rounding each for the
    scale's product and the bias."""
    op = next(o for o in g.ops if o.kind in ("QLinearConv", "QLinearGemm"))
    v = reference.run_values(g, feeds)
    xa = np.abs(v[op.operands[0].name].astype(np.float64))
    wa = np.abs(op.operands[1].data.astype(np.float64))
    f = np.float32(op.operands[0].type.quant.scale[0]) * np.asarray(op.operands[1].type.quant.scale, np.float32)
    b = np.abs(op.operands[2].data.astype(np.float64))
    if op.kind == "QLinearConv":
        a = {"strides": op.attrs["strides"], "dilations": op.attrs["dilations"], "pads": op.attrs["pads"],
             "group": op.attrs["group"]}
        s = conv_sum(xa, wa, a, op.result.shape[2:])
        k = int(np.prod(wa.shape[1:]))
        shape = (1, -1, 1, 1)
    else:
        s, k, shape = xa @ wa.T, wa.shape[1], (1, -1)
    f = np.broadcast_to(f.astype(np.float64), (wa.shape[0],)).reshape(shape)
    return f * k * 2.0 ** -24 * s + 2.0 ** -23 * (f * s + b.reshape(shape)) + 1e-30


CONVS = {"3x3 pad 1": dict(c=16, o=32, k=3, pad=1), "depthwise 3x3 stride 2": dict(c=16, o=16, k=3, group=16, stride=2, pad=1),
         "1x1 no act": dict(c=16, o=24, k=1, act=""), "grouped 3x3": dict(c=16, o=16, k=3, group=2, pad=1),
         "per-tensor 3x3": dict(c=8, o=16, k=3, pad=1, per_channel=False)}


@pytest.mark.parametrize("storage", FP8)
@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv_exact_sums_bit_exact(storage, case):
    g = conv_graph(storage, exact=True, **CONVS[case])
    feeds = {"x": _input((1, CONVS[case]["c"], 9, 9), exact=True)}
    (want,), (got,) = reference.run(g, feeds), run_tvm(g, feeds)
    assert np.array_equal(want, got), f"{case}: {(want != got).sum()} of {want.size} differ"


@pytest.mark.parametrize("storage", FP8)
@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv_within_float32_sum_order(storage, case):
    g = conv_graph(storage, **CONVS[case])
    feeds = {"x": _input((1, CONVS[case]["c"], 9, 9), exact=False)}
    (want,), (got,) = reference.run(g, feeds), run_tvm(g, feeds)
    diff = np.abs(want.astype(np.float64) - got)
    assert (diff <= _bound(g, feeds)).all(), f"{case}: max diff {diff.max()}"
    assert np.mean(diff == 0) > 0.5                        # most outputs round the same


@pytest.mark.parametrize("storage", FP8)
def test_gemm(storage):
    g = gemm_graph(storage, 3, 200, 40, exact=True)
    feeds = {"x": _input((3, 200), exact=True)}
    assert np.array_equal(reference.run(g, feeds)[0], run_tvm(g, feeds)[0])
    g = gemm_graph(storage, 5, 300, 48)
    feeds = {"x": _input((5, 300), exact=False)}
    (want,), (got,) = reference.run(g, feeds), run_tvm(g, feeds)
    assert (np.abs(want.astype(np.float64) - got) <= _bound(g, feeds)).all()


def test_float8_graph_output_refused():
    g = Graph("out8")
    x = g.add_input("x", TensorType((4,), "float32"))
    g.outputs = [g.create_op("QuantizeLinear", [x], result_types=[
        x.type.with_quant(QuantParams("float8_e4m3fn", (1.0,), (0,)))]).result]
    with pytest.raises(LoweringError, match="float8 graph output"):
        build_module(g, SPEC)


def test_weights_stored_as_float8_bytes(tmp_path):
    """A 1024 x 512 gemm (2 MB of float32 weights): the fp8 model.so holds them as bytes, below
    0.3x the fp32 library of the same layer (no float32 copy of the weights anywhere)."""
    g = gemm_graph("float8_e4m3fn", 1, 512, 1024)
    f = Graph("fp32")
    x = f.add_input("x", TensorType((1, 512), "float32"))
    w = f.add_const(g.value("w").data.astype(np.float32), "w")
    f.outputs = [f.create_op("Gemm", [x, w], {"transB": 1}).result]
    sizes = {}
    for name, graph in (("fp8", g), ("fp32", f)):
        out = write_artifact(graph, SPEC, tmp_path / name)
        sizes[name] = (out / "model.so").stat().st_size
    assert sizes["fp8"] < 0.3 * sizes["fp32"], sizes
    assert sizes["fp8"] > 512 * 1024                       # the float8 weights themselves are in it


def test_long_fused_chain_of_float8_ops_lowers():
    """x -> (QuantizeLinear -> DequantizeLinear -> Mul) x 16 (the form ONNX Runtime's FP8 quantizer
    writes around BatchNormalization and residual Adds): every float8 QuantizeLinear is stored
    (:func:`qcompiler.codegen.fusion._float8_quantized`), so no kernel composes a chain of encodes
    and decodes, each of which reads its operand 4-6 times (composed, 4 pairs took minutes to
    compile, TVM inlining the expression into every use); bit-exact with the reference."""
    import time
    g = Graph("chain")
    x = g.add_input("x", TensorType((4, 64), "float32"))
    v = x
    for i in range(16):
        qp = QuantParams("float8_e4m3fn", (float(2.0 ** -(i % 3)) / 7,), (0,))
        q = g.create_op("QuantizeLinear", [v], result_types=[v.type.with_quant(qp)]).result
        d = g.create_op("DequantizeLinear", [q]).result
        v = g.create_op("Mul", [d, g.add_const(np.full((1,), 1.25, np.float32), f"k{i}")]).result
    g.outputs = [v]
    g.verify()
    feeds = {"x": RNG.standard_normal((4, 64)).astype(np.float32)}
    t = time.perf_counter()
    (got,) = run_tvm(g, feeds)
    assert time.perf_counter() - t < 60
    assert np.array_equal(reference.run(g, feeds)[0], got)
