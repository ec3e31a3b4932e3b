"""The verifier rejects hand-broken IR, and every message names the op (kind and name) or value."""
from __future__ import annotations

import numpy as np
import pytest

from qcompiler.ir import Graph, IRError, QuantParams, TensorType, collect_errors

F = "float32"


def base():
    """x -> Conv 'conv1' -> Relu 'relu1' -> Sigmoid 'sig1' -> y"""
    g = Graph("g")
    x = g.add_input("x", TensorType((1, 2, 4, 4), F))
    w = g.add_const(np.ones((3, 2, 1, 1), np.float32), "w")
    conv = g.create_op("Conv", [x, w], {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1},
                       name="conv1")
    relu = g.create_op("Relu", [conv.result], name="relu1")
    sig = g.create_op("Sigmoid", [relu.result], name="sig1", result_names=["y"])
    g.outputs = [sig.result]
    g.verify()
    return g, x, w, conv, relu, sig


def bad_type(shape, dtype, quant):
    """A TensorType that skipped its own validation (as a buggy pass could build by hand)."""
    t = object.__new__(TensorType)
    for k, v in (("shape", tuple(shape)), ("dtype", dtype), ("quant", quant)):
        object.__setattr__(t, k, v)
    return t


def broken(case):
    g, x, w, conv, relu, sig = base()
    if case == "dangling use":
        x.uses.append((sig, 0))                      # sig's operand 0 is relu's result, not x
    elif case == "use-before-def":
        g._ops.reverse()
    elif case == "erased producer":
        g._ops.remove(relu)                          # removed behind the API's back
    elif case == "missing use":
        relu.result.uses.clear()
    elif case == "dtype mismatch":
        sig.result.type = TensorType((1, 3, 4, 4), "float16")
    elif case == "shape mismatch":
        relu.result.type = TensorType((1, 3, 4, 5), F)
    elif case == "operand dtypes differ":
        i = g.add_const(np.ones((1, 3, 4, 4), np.int32), "i")
        g.create_op("Add", [sig.result, i], result_types=[TensorType((1, 3, 4, 4), F)], name="add1")
    elif case == "operand count":
        g.create_op("Conv", [sig.result], result_types=[TensorType((1, 3, 4, 4), F)], name="conv2")
    elif case == "bad quant axis":
        q = QuantParams("int8", (0.1, 0.2, 0.3), (0, 0, 0), axis=1)
        g.create_op("QuantizeLinear", [sig.result], result_types=[bad_type((1, 4, 4, 4), "int8", q)], name="q1")
    elif case == "quant axis out of range":
        q = QuantParams("int8", (0.1,), (0,), axis=5)
        g.create_op("QuantizeLinear", [sig.result], result_types=[bad_type((1, 3, 4, 4), "int8", q)], name="q2")
    elif case == "const data":
        w.data = w.data.astype(np.float64)
    elif case == "duplicate outputs":
        g.outputs = [sig.result, sig.result]
    elif case == "undefined output":
        g.outputs = [relu.result]
        g.erase_op(sig)
        g._ops.remove(relu)                          # the output's producer vanished behind the API
    elif case == "bad attribute":
        conv.attrs["group"] = 3
    else:
        raise AssertionError(case)
    return g


CASES = {
    "dangling use": r"value %x: dangling use by Sigmoid 'sig1' \(operand 0\)",
    "use-before-def": r"op Sigmoid 'sig1': operand 0 %relu1_out is not defined before use",
    "erased producer": r"op Sigmoid 'sig1': operand 0 %relu1_out is not defined before use",
    "missing use": r"op Sigmoid 'sig1': operand 0 %relu1_out is missing from its use list",
    "dtype mismatch": r"op Sigmoid 'sig1': result %y has dtype float16, operands imply float32",
    "shape mismatch": r"op Relu 'relu1': result %relu1_out has shape \[1, 3, 4, 5\], operands imply \[1, 3, 4, 4\]",
    "operand dtypes differ": r"op Add 'add1': operand dtypes differ: float32 vs int32",
    "operand count": r"op Conv 'conv2': Conv takes 2\.\.3 operands, got 1",
    "bad quant axis": r"op QuantizeLinear 'q1': result %q1_out: quant axis 1 has 4 channels but 3 scales",
    "quant axis out of range": r"op QuantizeLinear 'q2': result %q2_out: quant axis 5 out of range for rank 4",
    "const data": r"constant %w: data float64\[3, 2, 1, 1\] does not match type tensor<3x2x1x1xf32>",
    "duplicate outputs": r"duplicate graph output names",
    "undefined output": r"graph output %relu1_out is not defined",
    "bad attribute": r"op Conv 'conv1': Conv input has 2 channels, weight expects 2×group 3",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_broken_ir_is_rejected_with_a_message_naming_the_op(case):
    g = broken(case)
    with pytest.raises(IRError, match=CASES[case]):
        g.verify()


def test_collect_errors_lists_every_problem():
    g, x, w, conv, relu, sig = base()
    relu.result.type = TensorType((1, 3, 4, 5), F)
    sig.result.type = TensorType((1, 3, 4, 4), "float16")
    errs = collect_errors(g)
    assert any("Relu 'relu1'" in e for e in errs) and any("Sigmoid 'sig1'" in e for e in errs)


@pytest.mark.parametrize("attrs, message", [
    ({"multiplier": [], "shift": [30]}, r"op QLinearConv 'qc': QLinearConv with a float32 result \(multiplier = \[\]\) "
                                        r"takes no shift and only a Relu/Clip activation"),
    ({"multiplier": [], "shift": [], "activation": "HardSwish"}, r"takes no shift and only a Relu/Clip activation"),
    ({"multiplier": [], "shift": []}, None),
])
def test_qlinearconv_float_result_takes_no_requantization(attrs, message):
    """QLinearConv with ``multiplier = []`` returns f32(acc) s_x s_w[c]: its result is float32 and
    a shift or an epilogue other than a clamp is an error."""
    g = Graph("g")
    x = g.add_input("x", TensorType((1, 2, 3, 3), "uint8", QuantParams("uint8", (0.02,), (128,))))
    w = g.add_const(np.ones((4, 2, 1, 1), np.int8), "w", QuantParams("int8", (0.01,) * 4, (0,) * 4, axis=0))
    a = {"strides": [1, 1], "dilations": [1, 1], "pads": [0, 0, 0, 0], "group": 1, "activation": "",
         "activation_params": [], **attrs}
    op = g.create_op("QLinearConv", [x, w], a, result_types=[TensorType((1, 4, 3, 3), F)], name="qc")
    g.outputs = [op.result]
    if message is None:
        g.verify()
    else:
        with pytest.raises(IRError, match=message):
            g.verify()
