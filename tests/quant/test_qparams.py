"""qparams: ranges -> QuantParams, and the numpy quantizer bit-exact against ONNX Runtime."""
import numpy as np
import onnxruntime as ort
import pytest
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper

from qcompiler.ir import QuantParams
from qcompiler.quant.qparams import (asymmetric, bias_params, dequantize, fake_quantize, per_channel_symmetric,
                                     qrange, quantize, sqnr_db, symmetric)

ONNX_T = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "int16": TensorProto.INT16,
          "uint16": TensorProto.UINT16}


def ort_qdq(x: np.ndarray, qp: QuantParams):
    """(QuantizeLinear(x), DequantizeLinear(QuantizeLinear(x))) computed by ONNX Runtime."""
    per = qp.axis is not None
    shape = [len(qp.scale)] if per else []
    attrs = {"axis": qp.axis} if per else {}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **attrs),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **attrs)]
    inits = [helper.make_tensor("s", TensorProto.FLOAT, shape, list(qp.scale)),
             helper.make_tensor("z", ONNX_T[qp.storage], shape, list(qp.zero_point))]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("q", ONNX_T[qp.storage], list(x.shape)),
                           helper.make_tensor_value_info("y", TensorProto.FLOAT, list(x.shape))], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
    m.ir_version = 10
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(["q", "y"], {"x": x})


def test_quantize_rounds_half_to_even_and_saturates():
    qp = QuantParams("uint8", (1.0,), (10,))
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 300.0, -300.0, 244.5, 245.5], np.float32)
    assert quantize(x, qp).tolist() == [10, 12, 12, 10, 8, 255, 0, 254, 255]
    q, y = ort_qdq(x, qp)
    assert np.array_equal(quantize(x, qp), q) and np.array_equal(dequantize(q, qp), y)


@pytest.mark.parametrize("storage", ["uint8", "int8", "int16", "uint16"])
@settings(max_examples=25, deadline=None)
@given(scale=st.floats(1e-4, 10.0), zp_frac=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_per_tensor_bit_exact_with_onnxruntime(storage, scale, zp_frac, seed):
    lo, hi = qrange(storage)
    qp = QuantParams(storage, (scale,), (int(lo + zp_frac * (hi - lo)),))
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(512) * scale * (hi - lo) / 3).astype(np.float32)
    x[:64] = (np.round(x[:64] / np.float32(scale)) + 0.5).astype(np.float32) * np.float32(scale)   # ties
    q, y = ort_qdq(x, qp)
    assert np.array_equal(quantize(x, qp), q)
    assert np.array_equal(dequantize(q, qp), y)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("storage", ["int8", "uint8"])
def test_per_channel_bit_exact_with_onnxruntime(axis, storage):
    rng = np.random.default_rng(axis + 7)
    x = (rng.standard_normal((4, 3, 5)) * rng.uniform(0.1, 5, (4, 3, 5))).astype(np.float32)
    n = x.shape[axis]
    zp = tuple(int(z) for z in rng.integers(*qrange(storage), n))
    qp = QuantParams(storage, tuple(rng.uniform(0.005, 0.05, n)), zp, axis=axis % 3)
    q, y = ort_qdq(x, qp)
    assert np.array_equal(quantize(x, qp), q)
    assert np.array_equal(dequantize(q, qp), y)


def test_per_channel_symmetric_weights_round_trip_through_onnxruntime():
    w = np.random.default_rng(1).standard_normal((8, 3, 3, 3)).astype(np.float32)
    qp = per_channel_symmetric(w, axis=0)
    assert qp.axis == 0 and qp.zero_point == (0,) * 8
    q, y = ort_qdq(w, qp)
    assert np.array_equal(quantize(w, qp), q) and q.min() >= -127
    assert np.all(np.abs(y - w) <= np.asarray(qp.scale)[:, None, None, None] / 2 + 1e-7)
    assert sqnr_db(w, y) > 38


@settings(max_examples=200, deadline=None)
@given(lo=st.floats(-1e4, 1e4), width=st.floats(0, 2e4), storage=st.sampled_from(["uint8", "int8"]))
def test_asymmetric_zero_exact_and_range_covered(lo, width, storage):
    hi = lo + width
    qp = asymmetric(lo, hi, storage)
    assert dequantize(quantize(np.zeros(1, np.float32), qp), qp)[0] == 0.0
    qmin, qmax = qrange(storage)
    s, z = qp.scale[0], qp.zero_point[0]
    lo0, hi0 = min(lo, 0.0), max(hi, 0.0)
    if width > 1e-3:                                  # the full range, not wider: no step wasted
        assert s == pytest.approx((hi0 - lo0) / (qmax - qmin), rel=1e-7)
    assert s * (qmin - z) <= lo0 + s / 2 and s * (qmax - z) >= hi0 - s / 2      # covered to half a step
    ends = np.array([lo0, hi0], np.float32)
    assert np.all(np.abs(fake_quantize(ends, qp) - ends) <= s / 2 * 1.001 + 1e-6)      # not clipped


def test_asymmetric_rounds_the_zero_point_instead_of_widening():
    """MNIST's normalized input range: the ideal zero point 33.33 is rounded to 33 and the scale
    stays 1/255 of the range (what ONNX Runtime's MinMax gives), not widened to cover -0.4242."""
    lo, hi = -0.1307 / 0.3081, (1 - 0.1307) / 0.3081
    qp = asymmetric(lo, hi)
    assert qp.zero_point == (33,) and qp.scale[0] == float(np.float32((hi - lo) / 255))
    assert qp.scale[0] == pytest.approx(0.0127282, abs=1e-7)
    x = np.linspace(lo, hi, 10001).astype(np.float32)
    assert np.abs(fake_quantize(x, qp) - x).max() <= qp.scale[0] / 2 * 1.001


def test_asymmetric_edge_cases():
    assert asymmetric(0.0, 6.0).zero_point == (0,)                 # ReLU: zero at the bottom
    assert asymmetric(-6.0, 0.0).zero_point == (255,)
    assert asymmetric(2.0, 3.0).zero_point == (0,)                 # widened to include 0
    z = asymmetric(0.0, 0.0)
    assert z.scale == (1.0,) and quantize(np.zeros(3), z).tolist() == [0, 0, 0]
    with pytest.raises(ValueError, match="invalid range"):
        asymmetric(1.0, -1.0)
    with pytest.raises(ValueError, match="invalid range"):
        asymmetric(0.0, float("nan"))


@settings(max_examples=100, deadline=None)
@given(lo=st.floats(-1e3, 0), hi=st.floats(0, 1e3))
def test_symmetric_restricted_and_full(lo, hi):
    amax = max(-lo, hi)
    r = symmetric(lo, hi)
    assert r.zero_point == (0,) and r.storage == "int8"
    x = np.array([-amax, amax], np.float32)
    if np.float32(amax) > 1e-30:
        assert quantize(x, r).tolist() == [-127, 127]               # restricted: never -128
    f = symmetric(lo, hi, restricted=False)
    assert f.scale[0] <= r.scale[0]


def test_symmetric_needs_signed_storage():
    with pytest.raises(ValueError, match="signed"):
        symmetric(-1, 1, "uint8")
    with pytest.raises(ValueError, match="signed"):
        per_channel_symmetric(np.ones((2, 2)), 0, "uint8")


def test_per_channel_zero_channel_and_axis():
    w = np.ones((2, 4), np.float32)
    w[:, 1] = 0
    qp = per_channel_symmetric(w, axis=1)
    assert qp.axis == 1 and qp.scale[1] == 1.0 and len(qp.scale) == 4
    assert np.allclose(fake_quantize(w, qp), w, rtol=1e-6, atol=0)


def test_bias_params_per_tensor_and_per_channel():
    x_qp = asymmetric(-1, 3)
    w = np.random.default_rng(0).standard_normal((4, 2, 3, 3)).astype(np.float32)
    w_qp = per_channel_symmetric(w)
    b_qp = bias_params(x_qp, w_qp)
    assert b_qp.storage == "int32" and b_qp.axis == 0 and b_qp.zero_point == (0,) * 4
    assert b_qp.scale == tuple(float(np.float32(x_qp.scale[0]) * np.float32(s)) for s in w_qp.scale)
    b = np.array([0.5, -0.25, 3.0, 1e-4], np.float32)
    q = quantize(b, b_qp)
    assert q.dtype == np.int32 and np.allclose(dequantize(q, b_qp), b, atol=max(b_qp.scale))
    t = bias_params(x_qp, symmetric(-1, 1))
    assert t.axis is None and len(t.scale) == 1
    with pytest.raises(ValueError, match="per tensor"):
        bias_params(w_qp, w_qp)


def test_int32_quantize_saturates():
    qp = QuantParams("int32", (1e-6,), (0,))
    assert quantize(np.array([1e6, -1e6, 0.4e-6, 2.5e-6]), qp).tolist() == [2**31 - 1, -2**31, 0, 3]


def test_quantize_rejects_mismatched_channels():
    qp = QuantParams("int8", (1.0, 1.0), (0, 0), axis=0)
    with pytest.raises(ValueError, match="channels"):
        quantize(np.zeros((3, 2)), qp)


def test_sqnr():
    x = np.linspace(-1, 1, 1001)
    assert sqnr_db(x, x) == float("inf")
    assert sqnr_db(x, x * 1.01) == pytest.approx(40.0, abs=0.01)
    y = fake_quantize(x.astype(np.float32), asymmetric(-1, 1))
    assert 40 < sqnr_db(x, y) < 55                                    # ~6 dB per bit
    with pytest.raises(ValueError, match="shapes"):
        sqnr_db(x, x[:3])
