"""com.microsoft DynamicQuantizeLSTM (qcompiler/frontend/onnx_rnn.py, ``_QLstm``): tiny onnx.helper
models (forward, reverse, bidirectional; with and without initial states; int8 per-tensor and uint8
per-column weights; sequence length 5) imported and run by the reference interpreter, after the
int8 pipeline's passes and in an x86 build, against onnxruntime running the same file.

Tolerance: ``TOL * max(1, max|ref|)`` with TOL = 2e-6 (about 16 float32 ulps at 1). The lowering
repeats ONNX Runtime's arithmetic: the same uint8 quantization of X (once, the whole sequence) and
of h (each step, the whole batch), exact integer products, the same float32 scale products,
the same order of the sums (input product, then recurrent product, then the fused bias). What
is left is ONNX Runtime's MLAS logistic/tanh against exact ones (an ulp or two per step, carried
through the recurrence: 2.4e-7 at most here). A uint8 rounding of h that flips
would move the gates by s_h * |R - z_R| * s_R, about 1e-3 here, so the bound also shows none did.

ONNX Runtime quantizes h per block of batch rows when it runs a batch over several threads
(uni_directional_lstm.cc, ``batch_parallel_``); the graph has one quantization per step for the
whole batch, what it computes on one thread, so the reference runs with intra_op_num_threads=1.
The bad inputs are one-line UserErrors naming the node."""
from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from qcompiler.errors import UserError
from qcompiler.frontend import import_onnx
from qcompiler.passes import run_passes
from qcompiler.quant import reference

SEQ, BATCH, INP, HID = 5, 3, 6, 8
TOL = 2e-6


def dq_lstm(direction="forward", init=False, weights="int8", bias=True, seq=SEQ, outputs=("Y", "Y_h", "Y_c"),
            attrs=None, drop=()):
    """One DynamicQuantizeLSTM node named 'rnn' with random integer weights; returns (model, feeds).
    ``weights``: "int8" (per-tensor scales, zero point 0) or "uint8" (per-column scales, zero point
    128); ``drop``: input indices to leave empty."""
    nd = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(hash((direction, init, weights, bias, seq)) % 2 ** 32)
    lo, hi, dt, zp = (-127, 128, np.int8, 0) if weights == "int8" else (0, 256, np.uint8, 128)
    qshape = (nd,) if weights == "int8" else (nd, 4 * HID)
    inits = {"W": rng.integers(lo, hi, (nd, INP, 4 * HID)).astype(dt),
             "R": rng.integers(lo, hi, (nd, HID, 4 * HID)).astype(dt),
             "B": (rng.standard_normal((nd, 8 * HID)) * 0.3).astype(np.float32),
             "ws": rng.uniform(0.002, 0.01, qshape).astype(np.float32), "wz": np.full(qshape, zp, dt),
             "rs": rng.uniform(0.002, 0.01, qshape).astype(np.float32), "rz": np.full(qshape, zp, dt)}
    feeds = {"X": rng.standard_normal((seq, BATCH, INP)).astype(np.float32)}
    ins = ["X", "W", "R", "B" if bias else "", "", "", "", "", "ws", "wz", "rs", "rz"]
    if init:
        feeds["h0"] = rng.standard_normal((nd, BATCH, HID)).astype(np.float32)
        feeds["c0"] = rng.standard_normal((nd, BATCH, HID)).astype(np.float32)
        ins[5:7] = ["h0", "c0"]
    for i in drop:
        ins[i] = ""
    while not ins[-1]:
        ins.pop()
    inits = {k: v for k, v in inits.items() if k in ins}
    outs = [o if o in outputs else "" for o in ("Y", "Y_h", "Y_c")]
    while not outs[-1]:
        outs.pop()
    node = helper.make_node("DynamicQuantizeLSTM", ins, outs, name="rnn", domain="com.microsoft",
                            **{"hidden_size": HID, "direction": direction, **(attrs or {})})
    g = helper.make_graph([node], "dq_lstm",
                          [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape) for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14), helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m, feeds


def ort_one_thread(m, feeds) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_matches(got, ref):
    assert len(got) == len(ref)
    for y, r in zip(got, ref):
        assert y.shape == r.shape
        np.testing.assert_allclose(y, r, atol=TOL * max(1.0, float(np.abs(r).max())), rtol=0)


@pytest.mark.parametrize("direction,init,weights", list(itertools.product(
    ["forward", "reverse", "bidirectional"], [False, True], ["int8", "uint8"])))
def test_matches_onnxruntime(direction, init, weights):
    m, feeds = dq_lstm(direction, init, weights)
    ref = ort_one_thread(m, feeds)
    g = import_onnx(m)
    assert g.meta["prequantized"]
    assert {"MatMulInteger", "ReduceMin"} <= {op.kind for op in g.ops}
    assert_matches(reference.run(g, feeds), ref)
    run_passes(g, "default,fold-qdq")              # what the int8 build runs on a pre-quantized model
    assert_matches(reference.run(g, feeds), ref)


def test_optional_pieces():
    """No bias, one step, Y_h alone, zero initial states given as constants."""
    for kw in ({"bias": False}, {"seq": 1}, {"outputs": ("Y_h",)}):
        m, feeds = dq_lstm("bidirectional", **kw)
        assert_matches(reference.run(import_onnx(m), feeds), ort_one_thread(m, feeds))
    m, feeds = dq_lstm("bidirectional", init=True)
    for k in ("h0", "c0"):
        m.graph.initializer.append(numpy_helper.from_array(np.zeros_like(feeds.pop(k)), k))
        m.graph.input.remove(next(v for v in m.graph.input if v.name == k))
    assert_matches(reference.run(import_onnx(m), feeds), ort_one_thread(m, feeds))


def test_x86_build_matches_onnxruntime():
    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import build_module
    from qcompiler.codegen.target import TargetSpec
    m, feeds = dq_lstm("bidirectional", init=True, weights="uint8")
    g = import_onnx(m)
    vm = relax.VirtualMachine(build_module(g, TargetSpec("x86", dtype="fp32")), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    assert_matches([o.numpy() for o in out], ort_one_thread(m, feeds))


def _differing_zero_points():
    """uint8 per-column W zero points that are not all one value (ONNX Runtime uses the first)."""
    m, _ = dq_lstm(weights="uint8")
    z = next(t for t in m.graph.initializer if t.name == "wz")
    arr = numpy_helper.to_array(z).copy()
    arr[0, 1] += 1
    z.CopyFrom(numpy_helper.from_array(arr, "wz"))
    return m


@pytest.mark.parametrize("make,msg", [
    (lambda: dq_lstm(drop=(10,))[0], r"input 10 \(R_scale\) is missing"),
    (lambda: dq_lstm(attrs={"layout": 1})[0], "layout"),
    (lambda: dq_lstm(attrs={"clip": 3.0})[0], "clip"),
    (lambda: dq_lstm(attrs={"activations": ["Relu", "Tanh", "Tanh"]})[0], "activations"),
    (lambda: dq_lstm(attrs={"hidden_size": HID + 1})[0], "do not fit"),
    (_differing_zero_points, "zero points of W differ"),
])
def test_bad_inputs_are_one_line_user_errors(make, msg):
    with pytest.raises(UserError, match=msg) as e:
        import_onnx(make())
    assert "DynamicQuantizeLSTM 'rnn'" in str(e.value) and "\n" not in str(e.value)
