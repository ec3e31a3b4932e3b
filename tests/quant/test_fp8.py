"""Float8 quantization (qcompiler.quant.fp8, qcompiler.ir.types): the 256 codes of each format, the
reference rounding against an independent oracle and against ONNX Runtime on every rounding
boundary (ties to even, saturation, subnormals, NaN), the quantized type's text form and its
verifier messages, the scales, and the float8-step distance."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from qcompiler.ir import IRError, Graph, QuantParams, TensorType, parse_graph, print_graph
from qcompiler.ir.types import dequantize, quantize, round_fp8
from qcompiler.quant.fp8 import Fp8Format, fp8_params, ordinal, per_channel_fp8, step, ulps

# storage: (exponent bits, mantissa bits, bias, max)
FORMATS = {"float8_e4m3fn": (4, 3, 7, 448.0), "float8_e5m2": (5, 2, 15, 57344.0)}


def decode_code(c: int, storage: str) -> float:
    """The value of float8 code ``c`` from the format's definition (OCP 8-bit floating point spec)."""
    eb, mb, bias, _ = FORMATS[storage]
    sign = -1.0 if c & 0x80 else 1.0
    e, f = (c >> mb) & ((1 << eb) - 1), c & ((1 << mb) - 1)
    if storage == "float8_e4m3fn" and e == 15 and f == 7:
        return math.nan                         # E4M3FN: S.1111.111 is NaN, there is no inf
    if storage == "float8_e5m2" and e == 31:
        return sign * math.inf if f == 0 else math.nan
    if e == 0:
        return sign * f * 2.0 ** (1 - bias - mb)
    return sign * (1 + f / 2 ** mb) * 2.0 ** (e - bias)


def oracle_codes(x: np.ndarray, storage: str) -> np.ndarray:
    """Round float32 ``x`` to the nearest finite float8 value, ties to the even code, saturating at
    +-max, NaN to NaN: a brute-force search over the code table in float64 (exact: the differences
    of float32 values are float64 values)."""
    table = [(c, decode_code(c, storage)) for c in range(128)]
    finite = [(c, v) for c, v in table if math.isfinite(v)]
    vals = np.array([v for _, v in finite])
    codes = np.array([c for c, _ in finite])
    nan_code = int(np.array([np.nan], np.float32).astype(getattr(ml_dtypes, storage)).view(np.uint8)[0])
    out = np.empty(x.size, np.uint8)
    for i, xi in enumerate(np.asarray(x, np.float32).ravel().astype(np.float64)):
        if math.isnan(xi):
            out[i] = nan_code | (0x80 if math.copysign(1, xi) < 0 else 0)
            continue
        a = min(abs(xi), vals.max())
        d = np.abs(vals - a)
        best = np.flatnonzero(d == d.min())
        c = codes[best[0]] if len(best) == 1 else next(codes[b] for b in best if codes[b] % 2 == 0)
        out[i] = c | (0x80 if math.copysign(1, xi) < 0 else 0)
    return out.reshape(np.shape(x))


def boundaries(storage: str) -> np.ndarray:
    """Every float8 value, every midpoint of two neighbours (a tie), the float32 values on each side
    of each midpoint, the saturation region and its tie (464 for E4M3, 61440 for E5M2), float32
    subnormals, huge values and infinities, positive and negative."""
    vals = np.array([decode_code(c, storage) for c in range(128)])
    vals = np.unique(vals[np.isfinite(vals)])
    mids = ((vals[1:] + vals[:-1]) / 2).astype(np.float32)
    mx = FORMATS[storage][3]
    top = mx + 2.0 ** (math.floor(math.log2(mx)) - FORMATS[storage][1])          # the next value past max
    sat = np.array([mx, (mx + top) / 2, top, top * 1.5, 1e30, np.inf, 1e-45, 1e-40, 2.0 ** -126], np.float32)
    pos = np.concatenate([vals.astype(np.float32), mids, np.nextafter(mids, np.float32(np.inf)),
                          np.nextafter(mids, np.float32(0)), sat])
    return np.concatenate([pos, -pos, np.array([np.nan], np.float32)])


@pytest.mark.parametrize("storage", sorted(FORMATS))
def test_every_code_decodes_as_the_format_defines(storage):
    """ml_dtypes (the reference's numpy type) decodes all 256 codes as the OCP definition does, and
    rounding each finite value gives its own code back (-0 included)."""
    codes = np.arange(256, dtype=np.uint8)
    got = codes.view(getattr(ml_dtypes, storage)).astype(np.float64)
    want = np.array([decode_code(int(c), storage) for c in codes])
    assert np.array_equal(got, want, equal_nan=True)
    finite = np.isfinite(want)
    assert np.array_equal(round_fp8(want[finite].astype(np.float32), storage).view(np.uint8), codes[finite])
    assert want[finite].max() == FORMATS[storage][3]
    assert int(finite.sum()) == {"float8_e4m3fn": 254, "float8_e5m2": 248}[storage]


@pytest.mark.parametrize("storage", sorted(FORMATS))
def test_rounding_matches_the_oracle_on_every_boundary(storage):
    """Ties go to the even code (2^-10 -> 0 and 3 * 2^-10 -> 2^-8 in E4M3), one float32 step either
    side of a tie goes to the nearer value, everything at or beyond the last tie saturates to max
    (E4M3: 464 and above, where ml_dtypes alone gives NaN; E5M2: 61440, where it gives inf), NaN
    stays NaN."""
    x = boundaries(storage)
    got = quantize(x, QuantParams(storage, (1.0,), (0,))).view(np.uint8)
    want = oracle_codes(x, storage)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{bad.size} differ, e.g. x={x[bad[:5]]}: {got[bad[:5]]} vs {want[bad[:5]]}"
    e4 = storage == "float8_e4m3fn"
    spot = np.array([2.0 ** -10, 3 * 2.0 ** -10, 464.0, 1e9, -np.inf] if e4 else [61440.0, np.inf], np.float32)
    vals = quantize(spot, QuantParams(storage, (1.0,), (0,))).astype(np.float64)
    assert vals.tolist() == ([0.0, 2.0 ** -8, 448.0, 448.0, -448.0] if e4 else [57344.0, 57344.0])


@pytest.mark.parametrize("storage", sorted(FORMATS))
def test_scaled_quantize_divides_in_float32_then_rounds(storage):
    """q = round(f32(x / s)) per channel, dequantize f32(q) * s; random values over many binades."""
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((4, 300)) * 10.0 ** rng.integers(-4, 4, (4, 300))).astype(np.float32)
    qp = QuantParams(storage, (0.37, 1e-3, 2.5, 1.0), (0,) * 4, axis=0)
    q = quantize(x, qp)
    s = np.asarray(qp.scale, np.float32).reshape(4, 1)
    assert np.array_equal(q.view(np.uint8), oracle_codes(x / s, storage))
    assert np.array_equal(dequantize(q, qp), q.astype(np.float32) * s)
    assert np.array_equal(dequantize(q.view(np.uint8), qp), dequantize(q, qp))     # stored bits read alike


@pytest.mark.parametrize("storage", sorted(FORMATS))
def test_onnxruntime_quantize_linear_agrees_on_every_boundary(storage):
    """ONNX Runtime's opset-19 float8 QuantizeLinear (saturate = 1) on the same values, scale 0.5:
    the same float8 values (fetched through a Cast to float32)."""
    import onnx
    from onnx import TensorProto as TP
    from onnx import helper as h
    from fp8_models import ZERO_POINT_TYPE, ort_session
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]), h.make_node("Cast", ["q"], ["y"], to=TP.FLOAT)]
    x = boundaries(storage) * np.float32(0.5)
    g = h.make_graph(nodes, "q", [h.make_tensor_value_info("x", TP.FLOAT, [x.size])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [x.size])],
                     initializer=[h.make_tensor("s", TP.FLOAT, [], [0.5]),
                                  h.make_tensor("z", ZERO_POINT_TYPE[storage], [], [0.0])])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 19)])
    m.ir_version = 9
    onnx.checker.check_model(m)
    (theirs,) = ort_session(m, "all").run(None, {"x": x})
    ours = quantize(x, QuantParams(storage, (0.5,), (0,))).astype(np.float32)
    assert np.array_equal(ours, theirs, equal_nan=True)


def test_quantized_type_prints_and_parses_back():
    """Scale only (MLIR's form without a zero point), per tensor and per axis; the parser also takes
    an explicit ':0'; float8 constants print as their exact values and come back bit for bit
    (NaN and -0 included)."""
    g = Graph("g")
    x = g.add_input("x", TensorType((2, 4), "float32"))
    qw = QuantParams("float8_e4m3fn", (0.25, 0.5), (0, 0), axis=0)
    data = quantize(np.array([[1, -2, 3, 1e4], [0.001, -0.0, np.nan, 7]], np.float32), qw)
    w = g.add_const(data, "w", quant=qw)
    qx = QuantParams("float8_e5m2", (0.01,), (0,))
    q = g.create_op("QuantizeLinear", [x], result_types=[x.type.with_quant(qx)], result_names=["q"]).result
    y = g.create_op("DequantizeLinear", [q], result_names=["y"]).result
    g.outputs = [y, g.create_op("DequantizeLinear", [w], result_names=["wd"]).result]
    text = print_graph(g, locs=False)
    assert "tensor<2x4x!quant.uniform<f8E4M3FN:f32:0, {0.25, 0.5}>>" in text
    assert "%q = QuantizeLinear(%x) : tensor<2x4x!quant.uniform<f8E5M2:f32, 0.01>>" in text
    assert "dense<[4.0, -8.0, 12.0, 448.0, 0.001953125, -0.0, nan, 14.0]>" in text
    back = parse_graph(text)
    assert print_graph(back, locs=False) == text
    assert np.array_equal(back.value("w").data.view(np.uint8), data.view(np.uint8))
    explicit = parse_graph(text.replace("{0.25, 0.5}", "{0.25:0, 0.5:0}"))
    assert explicit.value("w").type == w.type


def test_verifier_messages():
    with pytest.raises(ValueError, match="float8_e4m3fn quantization takes zero point 0, got 3"):
        QuantParams("float8_e4m3fn", (0.5,), (3,))
    with pytest.raises(Exception, match="takes zero point 0"):
        parse_graph("graph @g(%x: tensor<2x!quant.uniform<f8E4M3FN:f32, 0.5:3>>) {\n  return %x\n}")
    base = """graph @g(%x: tensor<1x4xf32>) {
  %w = const dense<[1.0, 2.0, 0.5, -1.0, 0.25, 4.0, -2.0, 1.5]> : tensor<2x4x!quant.uniform<@W, 0.01>>
  %xq = QuantizeLinear(%x) : tensor<1x4x!quant.uniform<f8E4M3FN:f32, 0.02>>
  %y = QLinearGemm(%xq, %w) {activation = "", activation_params = [], multiplier = @M, shift = []} : tensor<1x2xf32>
  return %y
}"""
    ok = base.replace("@W", "f8E4M3FN:f32").replace("@M", "[]")
    parse_graph(ok).verify()
    with pytest.raises(IRError, match="float8 input with a float8 weight"):
        parse_graph(base.replace("@W", "i8:f32").replace("@M", "[]")).verify()
    with pytest.raises(IRError, match=r"float8 operands returns its float32 result \(multiplier = \[\]\)"):
        parse_graph(base.replace("@W", "f8E4M3FN:f32").replace("@M", "[1073741824]").replace(
            ": tensor<1x2xf32>", ": tensor<1x2x!quant.uniform<f8E4M3FN:f32, 0.1>>")).verify()


def test_scales_amax_over_max():
    """E4M3: amax / 448 rounded up to float32 (amax then lands on 448 exactly); E5M2: / 57344; per
    output channel; an all-zero channel takes scale 1."""
    p = fp8_params(-1.0, 3.5, "float8_e4m3fn")
    assert p.scale == (0.0078125,) and p.zero_point == (0,)
    assert fp8_params(-2.0, 1.0, "float8_e5m2").scale == (float(np.float32(2.0 / 57344)),)
    w = np.array([[[0.5, -7.0]], [[0.0, 0.0]], [[3e-3, 1e-3]]], np.float32)
    pc = per_channel_fp8(w, 0, "float8_e4m3fn")
    assert pc.axis == 0 and pc.scale[1] == 1.0
    assert pc.scale[0] >= 7.0 / 448 and np.float32(7.0) / np.float32(pc.scale[0]) <= 448
    q = quantize(w, pc).astype(np.float32)
    assert q[0, 0, 1] == -448.0 and q[2, 0, 0] == 448.0
    assert Fp8Format("e5m2").storage == "float8_e5m2" and Fp8Format.E4M3.max == 448.0


def test_ulps_count_steps_across_zero():
    c = np.array([0x00, 0x80, 0x01, 0x81, 0x7E, 0x08], np.uint8)
    assert ordinal(c).tolist() == [0, 0, 1, -1, 126, 8]
    a = np.array([0.0, 2.0 ** -9, 448.0, 1.0], np.float32)
    b = np.array([-0.0, -2.0 ** -9, 416.0, 1.125], np.float32)
    assert ulps(a, b, "float8_e4m3fn").tolist() == [0, 2, 1, 1]
    assert step(np.array([1.0, 1.9, 448.0, 1e-9]), "float8_e4m3fn").tolist() == [0.125, 0.125, 32.0, 2.0 ** -9]
