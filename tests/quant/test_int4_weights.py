"""Blocked 4-bit quantized types (``--weights int4``): the IR text of the type, the verifier's
refusals, ONNX's blocked DequantizeLinear semantics against brute-force loops, the reference's
MatMulNBits / GatherBlockQuantized against numpy, the block parameters against ONNX Runtime's own
MatMulNBits quantizer (bit for bit), and the nibble packing both ways."""
from __future__ import annotations

import numpy as np
import pytest

from qcompiler.ir import Graph, InferError, QuantParams, TensorType, parse_graph, print_graph
from qcompiler.ir.types import dequantize, quantize
from qcompiler.quant import reference
from qcompiler.ir.nbits_ops import from_matmul_nbits, pack, to_matmul_nbits, unpack
from qcompiler.quant.blockwise import block_params, nearest_integers

TEXT = """graph @g(%x: tensor<2x40xf32>, %ids: tensor<3xi64>) {
  %w = const dense<[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 15, 15, 15, 15, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8]> : tensor<2x40x!quant.uniform<u4:f32:{1:16}, {0.5:8, 0.25:0, 2:15, 0.125:3, 1:1, 4:7}>>
  %t = const dense<[-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7]> : tensor<1x16x!quant.uniform<i4:f32:{1:16}, scales f16, {-0.5:0}>>
  %y = MatMulNBits(%x, %w) : tensor<2x2xf32>
  %e = GatherBlockQuantized(%t, %ids) {gather_axis = 0} : tensor<3x16xf32>
  return %y, %e
}
"""


def test_text_roundtrip_and_hand_checked_values():
    g = parse_graph(TEXT)
    g.verify()
    text = print_graph(g)                 # the 80 stored values go to the blobs section: print -> parse -> print
    assert print_graph(parse_graph(text)) == text
    assert "%w = const blob<w> : tensor<2x40x!quant.uniform<u4:f32:{1:16}, {0.5:8, 0.25:0, 2:15, 0.125:3, 1:1, 4:7}>>" in text
    assert "%t = const dense<[-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7]> : " \
        "tensor<1x16x!quant.uniform<i4:f32:{1:16}, scales f16, {-0.5:0}>>" in text
    w = g.value("w")
    qp = w.type.quant
    assert (qp.storage, qp.axis, qp.block_size, qp.scale_dtype) == ("uint4", 1, 16, "float32")
    assert qp.scale_shape((2, 40)) == (2, 3) and w.type.nbytes == 40 and w.type.stored_bytes == 40 + 24 + 3
    d = dequantize(w.data, qp)
    # row 0: blocks [0,16) scale 0.5 z 8, [16,32) 0.25 z 0, [32,40) (short) 2 z 15
    assert d[0, 0] == (0 - 8) * 0.5 and d[0, 15] == (15 - 8) * 0.5
    assert d[0, 16] == 15 * 0.25 and d[0, 31] == 0.0
    assert d[0, 32] == (0 - 15) * 2.0 and d[0, 39] == 0.0
    # row 1: 0.125 z 3, 1 z 1, 4 z 7
    assert d[1, 0] == (1 - 3) * 0.125 and d[1, 17] == (2 - 1) * 1.0 and d[1, 39] == (8 - 7) * 4.0
    t = g.value("t")
    assert t.type.quant.scale_dtype == "float16" and t.type.stored_bytes == 8 + 2
    e = reference.run(g, {"x": np.ones((2, 40), np.float32), "ids": np.array([0, -1, 0])})[1]
    assert e.tolist() == [[(q * -0.5) for q in range(-8, 8)]] * 3


def _blocked(n, k, blk, storage="uint4", seed=0):
    rng = np.random.default_rng(seed)
    nb = -(-k // blk)
    lo, hi = (0, 15) if storage == "uint4" else (-8, 7)
    qp = QuantParams(storage, rng.uniform(0.01, 0.1, n * nb) * rng.choice([-1, 1], n * nb),
                     rng.integers(lo, hi + 1, n * nb) if storage == "uint4" else np.zeros(n * nb, int),
                     axis=1, block_size=blk)
    return rng.integers(lo, hi + 1, (n, k)).astype(np.uint8 if storage == "uint4" else np.int8), qp


@pytest.mark.parametrize("storage", ["uint4", "int4"])
@pytest.mark.parametrize("n,k,blk", [(3, 64, 32), (5, 70, 32), (2, 16, 128)])
def test_dequantize_is_onnx_blocked_dequantize_linear(n, k, blk, storage):
    """ONNX opset 21: y[n, k] = (x[n, k] - zp[n, k // B]) * scale[n, k // B], element by element."""
    q, qp = _blocked(n, k, blk, storage)
    s = np.asarray(qp.scale, np.float32).reshape(n, -1)
    z = np.asarray(qp.zero_point).reshape(n, -1)
    want = np.empty((n, k), np.float32)
    for i in range(n):
        for j in range(k):
            want[i, j] = np.float32(int(q[i, j]) - int(z[i, j // blk])) * s[i, j // blk]
    assert np.array_equal(dequantize(q, qp), want)
    assert np.array_equal(quantize(want, qp), q)            # on the grid: QuantizeLinear gives q back


def test_reference_kernels_against_numpy():
    q, qp = _blocked(6, 96, 32)
    rng = np.random.default_rng(1)
    g = Graph("g")
    x = g.add_input("x", TensorType((2, 3, 96), "float32"))
    ids = g.add_input("ids", TensorType((2, 2), "int64"))
    w = g.add_const(q, "w", quant=qp)
    b = g.add_const(rng.standard_normal(6).astype(np.float32), "b")
    y = g.create_op("MatMulNBits", [x, w, b]).result
    e = g.create_op("GatherBlockQuantized", [w, ids]).result
    g.outputs = [y, e]
    g.verify()
    xv = rng.standard_normal((2, 3, 96)).astype(np.float32)
    iv = np.array([[0, 5], [-1, 2]])
    got_y, got_e = reference.run(g, {"x": xv, "ids": iv})
    wd = dequantize(q, qp).astype(np.float64)
    want = np.einsum("bmk,nk->bmn", xv.astype(np.float64), wd).astype(np.float32) + b.data
    assert np.array_equal(got_y, want)
    assert np.array_equal(got_e, wd.astype(np.float32)[iv % 6])


def test_type_refusals():
    with pytest.raises(ValueError, match="need 6 scales"):
        TensorType((2, 40), "uint4", QuantParams("uint4", [1.0] * 5, [0] * 5, axis=1, block_size=16))
    with pytest.raises(ValueError, match="zero point 16 outside the uint4 range"):
        QuantParams("uint4", [1.0], [16], axis=1, block_size=16)
    with pytest.raises(ValueError, match="not a float16 value"):
        QuantParams("int4", [0.1], [0], axis=1, block_size=16, scale_dtype="float16")
    with pytest.raises(ValueError, match="need an axis"):
        QuantParams("int4", [0.1], [0], block_size=16)
    with pytest.raises(ValueError, match="finite and non-zero"):
        QuantParams("int4", [0.0], [0], axis=1, block_size=16)
    with pytest.raises(ValueError, match="finite and > 0"):           # per channel: positive, as before
        QuantParams("int8", [-1.0], [0], axis=0)
    g = parse_graph(TEXT)
    g.value("w").data[0, 0] = 16
    with pytest.raises(Exception, match="uint4 data outside"):
        g.verify()
    for qp in (QuantParams("int8", [0.5, 0.5], [0, 0], axis=0),                    # per channel, not blocked
               QuantParams("uint4", [0.5] * 40, [8] * 40, axis=0, block_size=16)):   # blocked along N
        h = Graph("h")
        x = h.add_input("x", TensorType((1, 40), "float32"))
        w = h.add_const(np.zeros((2, 40), np.uint8 if qp.storage == "uint4" else np.int8), "w", quant=qp)
        with pytest.raises(InferError, match="quantized in blocks along axis 1"):
            h.create_op("MatMulNBits", [x, w])


@pytest.mark.parametrize("k,n,blk,sym", [(384, 64, 32, False), (384, 64, 128, True), (200, 24, 64, False),
                                         (200, 24, 32, True), (96, 16, 16, False)])
def test_block_params_are_onnxruntimes(k, n, blk, sym):
    """Scales, zero points and integers bit for bit those of ONNX Runtime's MatMulNBits quantizer
    (quantize_matmul_4bits, what MatMulNBitsQuantizer calls) on a MatMul weight B [K, N]."""
    from onnxruntime.capi._pybind_state import quantize_matmul_4bits
    rng = np.random.default_rng(k + n)
    w = (rng.standard_normal((k, n)) * 0.05).astype(np.float32)
    w[:, 0] = 0.0                                                     # an all-zero column: scale 1, q = z
    nb = -(-k // blk)
    packed = np.zeros((n, nb, blk // 2), np.uint8)
    scales = np.zeros((n, nb), np.float32)
    zp = np.zeros((n, (nb + 1) // 2), np.uint8)
    quantize_matmul_4bits(packed, np.pad(w, ((0, nb * blk - k), (0, 0))), scales, zp, blk, n, k, sym)
    qp = block_params(w.T, blk, sym)
    q = nearest_integers(w.T, qp)
    b, s, z = to_matmul_nbits(q, qp)
    ours_s = s.reshape(n, nb)
    zero_col = ours_s[0] == 1
    assert np.array_equal(ours_s[1:], scales[1:]) and np.all(zero_col) and np.all(scales[0] == 0)
    assert np.array_equal(b, packed)
    if not sym:
        assert np.array_equal(z.reshape(zp.shape), zp)
    q2, qp2 = from_matmul_nbits(packed, np.where(scales == 0, 1, scales), None if sym else zp, n, k, blk)
    assert np.array_equal(dequantize(q2, qp2), dequantize(q, qp))
    assert qp2.storage == ("int4" if sym else "uint4")


def test_symmetric_scale_maps_the_extreme_to_minus_eight():
    w = np.array([[0.8, -0.2] + [0.0] * 30, [-0.8, 0.7] + [0.0] * 30], np.float32)
    qp = block_params(w, 32, symmetric=True)
    assert qp.scale == (np.float32(-0.1), np.float32(0.1)) and qp.storage == "int4"
    q = nearest_integers(w, qp)
    assert q[0, 0] == -8 and q[1, 0] == -8 and q[1, 1] == 7        # 0.7 / 0.1 = 7
    h = block_params(w, 32, symmetric=True, scale_dtype="float16")
    assert h.scale_dtype == "float16" and h.scale[0] == float(np.float16(-0.1))


def test_pack_unpack():
    rng = np.random.default_rng(0)
    for signed, lo, hi in ((False, 0, 15), (True, -8, 7)):
        q = rng.integers(lo, hi + 1, (3, 7)).astype(np.int8 if signed else np.uint8)
        b = pack(q)
        assert b.shape == (3, 4) and b.dtype == np.uint8
        assert (b[0, 0] & 0xF) == (int(q[0, 0]) & 0xF) and (b[0, 0] >> 4) == (int(q[0, 1]) & 0xF)
        assert np.array_equal(unpack(b, 7, signed), q)
