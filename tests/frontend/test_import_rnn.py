"""ONNX LSTM and GRU unrolled at import (qcompiler/frontend/onnx_rnn.py): tiny onnx.helper models in
every supported configuration, onnxruntime on the original == onnxruntime on
export_onnx(import_onnx(original)); one of each also built for x86 with TVM; the unsupported
attributes are one-line UserErrors naming the node."""
from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import realmodels as rm
from qcompiler.errors import UserError
from qcompiler.frontend import export_onnx, import_onnx

SEQ, BATCH, INP, HID = 5, 2, 3, 4


def rnn_model(kind, direction="forward", layout=0, bias=True, init_h=False, init_c=False, seq_lens=False,
              lbr=0, outputs=("Y", "Y_h", "Y_c"), batch=BATCH, seq=SEQ, attrs=None, peephole=None):
    """One LSTM/GRU node with random weights; returns (model, feeds)."""
    rng = np.random.default_rng(hash((kind, direction, layout, bias, init_h, init_c, lbr, batch)) % 2 ** 32)
    nd = 2 if direction == "bidirectional" else 1
    G = 4 if kind == "LSTM" else 3
    x = rng.standard_normal((batch, seq, INP) if layout else (seq, batch, INP)).astype(np.float32)
    state_shape = (batch, nd, HID) if layout else (nd, batch, HID)
    inits = {"W": rng.standard_normal((nd, G * HID, INP)).astype(np.float32) * 0.6,
             "R": rng.standard_normal((nd, G * HID, HID)).astype(np.float32) * 0.6}
    feeds = {"X": x}
    ins = ["X", "W", "R", "", "", ""]
    if bias:
        inits["B"] = rng.standard_normal((nd, 2 * G * HID)).astype(np.float32) * 0.5
        ins[3] = "B"
    if seq_lens:
        inits["L"] = np.full(batch, seq, np.int32)
        ins[4] = "L"
    if init_h:
        feeds["h0"] = rng.standard_normal(state_shape).astype(np.float32)
        ins[5] = "h0"
    if kind == "LSTM":
        ins.append("")
        if init_c:
            feeds["c0"] = rng.standard_normal(state_shape).astype(np.float32)
            ins[6] = "c0"
        if peephole is not None:
            inits["P"] = np.full((nd, 3 * HID), peephole, np.float32)
            ins.append("P")
    while ins and not ins[-1]:
        ins.pop()
    outs = [o if o in outputs else "" for o in (["Y", "Y_h", "Y_c"] if kind == "LSTM" else ["Y", "Y_h"])]
    while not outs[-1]:
        outs.pop()
    a = {"hidden_size": HID, "direction": direction, **(attrs or {})}
    if layout:
        a["layout"] = 1
    if kind == "GRU" and lbr:
        a["linear_before_reset"] = 1
    node = helper.make_node(kind, ins, outs, name="rnn", **a)
    g = helper.make_graph([node], "rnn", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                          for k, v in feeds.items()],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs if o],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m, feeds


def ort_reference(m: onnx.ModelProto, feeds) -> list[np.ndarray]:
    """onnxruntime has no layout=1 RNNs: run the same node with layout 0 between Transposes."""
    node = m.graph.node[0]
    if not any(a.name == "layout" and a.i == 1 for a in node.attribute):
        return rm.ort_run(m, feeds)
    r = onnx.ModelProto()
    r.CopyFrom(m)
    n = r.graph.node[0]
    for a in n.attribute:
        if a.name == "layout":
            a.i = 0
    pre, post = [], []
    for i in (0, 5, 6):
        if len(n.input) > i and n.input[i]:
            pre.append(helper.make_node("Transpose", [n.input[i]], [n.input[i] + "_l0"], perm=[1, 0, 2]))
            n.input[i] += "_l0"
    for i, o in enumerate(n.output):
        if o:
            post.append(helper.make_node("Transpose", [o + "_l0"], [o], perm=[2, 0, 1, 3] if i == 0 else [1, 0, 2]))
            n.output[i] = o + "_l0"
    nodes = pre + [n] + post
    del r.graph.node[:]
    r.graph.node.extend(nodes)
    return rm.ort_run(r, feeds)


def check(m, feeds, tol=1e-5):
    g = import_onnx(m)
    ref = ort_reference(m, feeds)
    got = rm.ort_run(export_onnx(g), {v.name: feeds[v.name] for v in g.inputs}, [o.name for o in m.graph.output])
    assert len(got) == len(ref)
    for y, r in zip(got, ref):
        assert y.shape == r.shape
        np.testing.assert_allclose(y, r, atol=tol * max(1.0, float(np.abs(r).max())), rtol=0)
    return g


DIRS = ["forward", "reverse", "bidirectional"]


@pytest.mark.parametrize("direction,layout,init,bias", list(itertools.product(DIRS, [0, 1], [False, True],
                                                                               [False, True])))
def test_lstm_matches_ort(direction, layout, init, bias):
    m, feeds = rnn_model("LSTM", direction, layout, bias=bias, init_h=init, init_c=init)
    check(m, feeds)


@pytest.mark.parametrize("direction,layout,init,lbr", list(itertools.product(DIRS, [0, 1], [False, True], [0, 1])))
def test_gru_matches_ort(direction, layout, init, lbr):
    m, feeds = rnn_model("GRU", direction, layout, init_h=init, lbr=lbr)
    check(m, feeds)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_optional_pieces(kind):
    """Only h0 (no c0), full constant sequence_lens, batch 1 with layout 1, a single output,
    a single step, explicit default activations, zero peepholes."""
    check(*rnn_model(kind, "bidirectional", init_h=True, seq_lens=True))
    check(*rnn_model(kind, "bidirectional", layout=1, batch=1, init_h=True))
    check(*rnn_model(kind, "reverse", outputs=("Y_h",)))
    check(*rnn_model(kind, "forward", outputs=("Y",), seq=1))
    acts = ["Sigmoid", "Tanh", "Tanh"] if kind == "LSTM" else ["Sigmoid", "Tanh"]
    check(*rnn_model(kind, "bidirectional", attrs={"activations": acts * 2}))
    if kind == "LSTM":
        check(*rnn_model(kind, "forward", peephole=0.0))


def test_op_count_per_step():
    """The unrolled graph stays small: at most 12 ops per step and direction, plus a few."""
    for kind in ("LSTM", "GRU"):
        g = import_onnx(rnn_model(kind, "bidirectional", init_h=True, init_c=True)[0])
        assert len(list(g.ops)) <= 12 * SEQ * 2 + 24, (kind, len(list(g.ops)))


@pytest.mark.parametrize("kw,msg", [
    ({"attrs": {"activations": ["Relu", "Tanh", "Tanh"]}}, "activations"),
    ({"attrs": {"clip": 3.0}}, "clip"),
    ({"attrs": {"input_forget": 1}}, "input_forget"),
    ({"peephole": 0.5}, "peephole"),
])
def test_unsupported_is_user_error(kw, msg):
    m, _ = rnn_model("LSTM", **kw)
    with pytest.raises(UserError, match=msg) as e:
        import_onnx(m)
    assert "LSTM 'rnn'" in str(e.value) and "\n" not in str(e.value)


def test_short_sequence_lens_is_user_error():
    m, _ = rnn_model("GRU", seq_lens=True)
    m.graph.initializer[-1].CopyFrom(numpy_helper.from_array(np.array([SEQ, SEQ - 1], np.int32), "L"))
    with pytest.raises(UserError, match="sequence_lens"):
        import_onnx(m)


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_x86_build_matches_ort(kind):
    import tvm
    from tvm import relax

    from qcompiler.codegen.lower import build_module
    from qcompiler.codegen.target import TargetSpec
    m, feeds = rnn_model(kind, "bidirectional", layout=0, init_h=True, init_c=True, lbr=1)
    g = import_onnx(m)
    vm = relax.VirtualMachine(build_module(g, TargetSpec("x86", dtype="fp32")), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in g.inputs])
    got = [o.numpy() for o in out] if not isinstance(out, tvm.runtime.Tensor) else [out.numpy()]
    rm.assert_close_to_ort(kind, got, rm.ort_run(m, feeds), 1e-4, top1=False)
